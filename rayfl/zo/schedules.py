"""Per-client, per-round local-step counts H_{i,r} and the in-call local step size.

ZO-HFL (arXiv 2504.01839, Thm 1(ii), Sec. IV) uses H_{i,r} = ceil(tau_i sqrt(r + 1)) local
steps (the revised version adds the ceiling) and gamma~_{i,t} = gamma~_i / (t + Gamma), with t
restarting at 0 in every call of Alg. 2. H_{i,r} = 0 models a straggler (Remark 2). The
baselines import the same schedule so that every method spends the same local-step budget on
the same (client, round) pairs: the paper's "same total number of local steps".
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.rng import numpy_rng

STRAGGLER_PURPOSE = "steps.straggler"


@dataclass
class StepsSchedule:
    """H_{i,r}, the local steps of client i in round r (ZO-HFL Thm 1(ii), Remark 2, Sec. IV).

    `sqrt`: ceil(tau_i sqrt(r + 1)), the paper's schedule (tau in {5, 20, 50}; 20 in Table I:
    20, 29, ..., 448 steps, 149,507 over 500 rounds). `constant`: ceil(tau_i) every round.
    `table`: a CSV `client,round,steps` (round -1 = every round of that client). `function`:
    `package.module:name`, any fn(client, round) -> int. tau_i is `client_tau[i]` when given,
    else `tau`. `multiplier` scales every H (2 gives a baseline ZO-HFL's compute: two solves of
    H each, one reading of Sec. IV (ii)'s equal "total number of local steps"). `straggler_prob`
    sets H = 0 for each (i, r) with that probability, drawn from the stream (seed,
    'steps.straggler', r, i)."""

    # H_{i,r}, client i's local steps in round r: sqrt (ceil(tau_i sqrt(r + 1)), ZO-HFL's); constant
    # (ceil(tau_i)); table (a CSV); function (a Python callable).
    kind: Literal["sqrt", "constant", "table", "function"] = "sqrt"
    # tau_i for every client without a client_tau entry (>= 0).
    tau: float = 20.0
    # Per-client tau_i, indexed by client id (each >= 0); empty: tau for all.
    client_tau: list[float] = field(default_factory=list)
    # Scales every H (>= 0); 2 matches a baseline's compute to ZO-HFL's two solves per round.
    multiplier: int = 1
    # Probability, per client and round, that H = 0 (a straggler that does no work), in [0, 1].
    straggler_prob: float = 0.0
    # kind table: a CSV with columns client,round,steps (round -1: every round of that client).
    table: str | None = None
    # kind function: 'package.module:name' of fn(client, round) -> int.
    function: str | None = None

    def validate_as(self, key: str) -> None:
        if self.tau < 0 or any(t < 0 for t in self.client_tau):
            raise ConfigError(f"{key}.tau", "tau must be >= 0")
        if self.multiplier < 0:
            raise ConfigError(f"{key}.multiplier", f"must be >= 0, got {self.multiplier}")
        if not 0.0 <= self.straggler_prob <= 1.0:
            raise ConfigError(f"{key}.straggler_prob", f"must be in [0, 1], got {self.straggler_prob}")
        if self.kind == "table":
            if self.table is None or not Path(self.table).expanduser().is_file():
                raise ConfigError(f"{key}.table", f"kind 'table' needs an existing CSV file, got {self.table!r}")
            _read_table(str(Path(self.table).expanduser()))
        if self.kind == "function":
            if not self.function or ":" not in self.function:
                raise ConfigError(f"{key}.function", "kind 'function' needs 'package.module:name'")
            _import(self.function)

    def tau_of(self, client: int) -> float:
        if self.client_tau:
            if client >= len(self.client_tau):
                raise ConfigError("algorithm.local_schedule.client_tau", f"has no tau for client {client}")
            return float(self.client_tau[client])
        return float(self.tau)


def local_steps(schedule: StepsSchedule, client: int, round: int, seed: int) -> int:
    """H_{client, round} under `schedule` for a run with seed `seed`."""
    if schedule.straggler_prob > 0 and numpy_rng(seed, STRAGGLER_PURPOSE, round, client).random() < schedule.straggler_prob:
        return 0
    if schedule.kind == "sqrt":
        base = math.ceil(schedule.tau_of(client) * math.sqrt(round + 1) - 1e-9)
    elif schedule.kind == "constant":
        base = math.ceil(schedule.tau_of(client) - 1e-9)
    elif schedule.kind == "table":
        base = _lookup(_read_table(str(Path(schedule.table or "").expanduser())), client, round)
    else:
        base = int(_import(schedule.function or "")(client, round))
    if base < 0:
        raise ValueError(f"local-step schedule gave H = {base} < 0 for client {client}, round {round}")
    return base * schedule.multiplier


def total_steps(schedule: StepsSchedule, client: int, rounds: int, seed: int = 0) -> int:
    """sum_{r < rounds} H_{client, r}: a client's budget over a run (Thm 1(iv)'s K_i)."""
    return sum(local_steps(schedule, client, r, seed) for r in range(rounds))


def step_size(lr: float, t: int, offset: float | None) -> float:
    """The local step size at in-call step t: lr / (t + offset) (ZO-HFL's gamma~/(t + Gamma),
    restarting every call), or the constant lr when offset is None."""
    return lr if offset is None else lr / (t + offset)


def check_budget_fields(cfg: AlgorithmConfig, schedule: StepsSchedule | None, key: str) -> None:
    """Run the shared AlgorithmConfig checks when a `local_schedule` replaces local_epochs /
    local_steps (which must then both be null)."""
    if schedule is None:
        AlgorithmConfig.validate(cfg)
        return
    if cfg.local_epochs is not None or cfg.local_steps is not None:
        raise ConfigError(key, "a local_schedule replaces local_epochs and local_steps; set both to null")
    AlgorithmConfig.validate(dataclasses.replace(cfg, local_steps=0))
    schedule.validate_as(key)


# ---------------------------------------------------------------- user schedules


@lru_cache(maxsize=8)
def _read_table(path: str) -> dict[tuple[int, int], int]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"client", "round", "steps"} - set(reader.fieldnames or [])
        if missing:
            raise ConfigError("algorithm.local_schedule.table", f"{path} lacks columns {sorted(missing)}")
        return {(int(row["client"]), int(row["round"])): int(row["steps"]) for row in reader}


def _lookup(table: dict[tuple[int, int], int], client: int, round: int) -> int:
    for key in ((client, round), (client, -1)):
        if key in table:
            return table[key]
    raise KeyError(f"local-step table has no row for client {client}, round {round} (nor round -1)")


def _import(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError("algorithm.local_schedule.function", f"cannot import {spec!r}: {e}") from e
    if not callable(fn):
        raise ConfigError("algorithm.local_schedule.function", f"{spec!r} is not callable")
    return fn
