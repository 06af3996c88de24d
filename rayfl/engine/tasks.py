"""Client tasks on the simulated clock: what was planned at dispatch, what happened, and the
rules (sync, deadline, over-selection) that decide which finished tasks a round counts.

Everything here is plain Python over numbers, so the policies are tested without Ray."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayfl.engine.exact_sum import KeptValue
from rayfl.engine.payload import payload_nbytes
from rayfl.engine.system import SystemModel, TaskTiming
from rayfl.rng import numpy_rng

OK, LATE, DROPPED, OFFLINE, STALE, NONFINITE = "ok", "late", "dropped", "offline", "stale", "nonfinite"
OUTCOMES = (OK, LATE, DROPPED, OFFLINE, STALE, NONFINITE)


class NonFiniteUpdateError(FloatingPointError):
    """A client returned NaN or Inf and `algorithm.nonfinite` is `fail`."""


@dataclass(frozen=True)
class TaskPlan:
    """Fixed at dispatch, before the client runs: when it starts, on which model version,
    whether (and how far into its duration) it will drop out, when it goes offline."""

    client: int
    seq: int
    dispatch_time: float
    version: int
    drop_fraction: float | None
    offline_time: float | None


@dataclass
class ClientResult:
    """One client task as the server sees it. `values` is what the client function returned
    (None is never handed to an algorithm: failed tasks are only logged)."""

    client: int
    host: int
    values: dict[str, Any]
    num_samples: int
    forward_samples: int
    backward_samples: int
    local_steps: int
    bytes_up: int
    bytes_down: int
    timing: TaskTiming
    dispatch_time: float
    finish_time: float
    outcome: str = OK
    version: int = 0
    staleness: int = 0
    truncated: bool = False
    seq: int = 0
    round: int = 0
    task: int = -1
    state_changed: bool = True
    state_bytes: int | None = None  # the client's new state's size, where the task changed it
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the server accepted the task (outcome `ok`): only then its state is committed."""
        return self.outcome == OK

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def plan_task(system: SystemModel, seed: int, client: int, seq: int, key: int, now: float, version: int) -> TaskPlan:
    """Draw a task's dropout from (seed, 'dropout', key, client) and look up when the client
    goes offline, both before it runs, so they never depend on execution order."""
    drop = None
    p = system.dropout[client]
    if p > 0:
        rng = numpy_rng(seed, "dropout", key, client)
        if rng.random() < p:
            drop = float(rng.uniform(0.05, 0.95))
    offline = system.availability.offline_at(client, now, math.inf)
    return TaskPlan(client, seq, now, version, drop, offline)


def settle(plan: TaskPlan, rec: dict[str, Any], system: SystemModel, round: int) -> ClientResult:
    """Turn a finished host record into a result on the clock: its duration from the work it
    did and bytes it moved, cut short by a dropout or by going offline."""
    timing = system.timing(rec["client"], rec["forward_samples"], rec["backward_samples"], rec["bytes_down"], rec["bytes_up"])
    finish, outcome = plan.dispatch_time + timing.total, OK
    if plan.drop_fraction is not None:
        finish, outcome = plan.dispatch_time + plan.drop_fraction * timing.total, DROPPED
    if plan.offline_time is not None and plan.offline_time < finish:
        finish, outcome = plan.offline_time, OFFLINE
    if outcome == OK and nonfinite_keys(rec["values"], rec["local_steps"]):
        outcome = NONFINITE
    return ClientResult(
        client=rec["client"],
        host=rec["host"],
        values=rec["values"],
        num_samples=rec["num_samples"],
        forward_samples=rec["forward_samples"],
        backward_samples=rec["backward_samples"],
        local_steps=rec["local_steps"],
        bytes_up=rec["bytes_up"],
        bytes_down=rec["bytes_down"],
        timing=timing,
        dispatch_time=plan.dispatch_time,
        finish_time=finish,
        outcome=outcome,
        version=plan.version,
        truncated=rec.get("truncated", False),
        state_changed=rec.get("state_changed", True),
        state_bytes=rec.get("state_bytes"),
        seq=plan.seq,
        round=round,
        extra={"pipeline": rec["pipeline"]} if rec.get("pipeline") else {},
    )


def nonfinite_keys(values: Any, local_steps: int) -> list[str]:
    """The keys of a client's answer holding NaN or Inf (the task is then never applied).
    A NaN `loss` after zero local steps is no measurement, not a failure."""
    return [
        key
        for key, value in _leaves(values, "")
        if not (key == "loss" and local_steps == 0 and _is_nan_scalar(value)) and not _finite(value)
    ]


def _leaves(value: Any, key: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, value


def _finite(value: Any) -> bool:
    if isinstance(value, KeptValue):  # an array its host kept (pre-aggregation)
        return value.finite
    if isinstance(value, np.ndarray):
        return not np.issubdtype(value.dtype, np.inexact) or bool(np.isfinite(value).all())
    if isinstance(value, (float, np.floating, complex, np.complexfloating)):
        return bool(np.isfinite(value))
    return True


def _is_nan_scalar(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def lower_bound_finish(plan: TaskPlan, system: SystemModel, bytes_down: int, min_flops: float) -> float:
    """The earliest simulated time this task's event (finish or failure) can happen, known
    before it runs. The async pool commits an earlier event only once no running task can
    still beat it, which is what keeps parallel execution exact."""
    c = plan.client
    full = bytes_down / system.down_bandwidth[c] + system.latency[c] + min_flops / system.speed[c]
    t = plan.dispatch_time + (plan.drop_fraction if plan.drop_fraction is not None else 1.0) * full
    if plan.offline_time is not None:
        t = min(t, plan.offline_time)
    return t


def close_round(results: list[ClientResult], policy: str, start: float, deadline: float | None, keep: int | None) -> float:
    """Apply a synchronous policy in place (marking late tasks) and return when the round ends.

    sync: the round ends when the last selected client has finished or failed.
    deadline: it ends at start + deadline at the latest; ok tasks finishing later are late.
    over_selection: it ends when the `keep`-th ok task finishes; later ok tasks are late.
    A non-finite answer arriving after the close is late too: the server never read it."""
    if not results:
        return start
    last_event = max(r.finish_time for r in results)
    arrived = (OK, NONFINITE)
    if policy == "sync":
        return last_event
    if policy == "deadline":
        assert deadline is not None
        close = start + deadline
        for r in results:
            if r.outcome in arrived and r.finish_time > close:
                r.outcome = LATE
        return min(close, last_event)
    if policy == "over_selection":
        ok = sorted((r for r in results if r.ok), key=lambda r: (r.finish_time, r.client))
        if keep is None or len(ok) < keep:
            return last_event  # fewer than K made it: the server heard from everyone
        close = ok[keep - 1].finish_time
        for r in ok[keep:]:
            r.outcome = LATE
        for r in results:
            if r.outcome == NONFINITE and r.finish_time > close:
                r.outcome = LATE
        return close
    raise ValueError(f"unknown policy {policy}")


def deadline_budgets(system: SystemModel, ids: list[int], deadline: float, payload: Mapping[str, Any],
                     per_client: Mapping[int, Mapping[str, Any]] | None, uploads: Any, num_params: int) -> dict[int, float]:
    """The FLOPs each client may spend under a deadline with partial work and still answer in
    time. Its download is the payload (and its own part of it); its upload is assumed as large
    (model in, model out), or the encoded size of the model's update when the round pipeline
    (`uploads`, an UploadSpec) compresses it."""
    base = payload_nbytes(payload)
    budgets: dict[int, float] = {}
    for c in ids:
        down = base + (payload_nbytes(per_client.get(c)) if per_client else 0)
        up = down if uploads is None else uploads.estimate(num_params, down)
        budgets[c] = system.compute_budget(c, deadline, down, up)
    return budgets
