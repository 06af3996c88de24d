"""Record every job in jobs/ (a few rounds each) plus a matrix of algorithms, round policies,
pipeline sections and asynchrony, and compare two recordings table by table, bit for bit.

It is what shows that moving the algorithms onto the round driver changed no result:

    git worktree add /tmp/base 526da4e
    PYTHONPATH=/tmp/base python scripts/compare_migration.py record /tmp/tables-base
    python scripts/compare_migration.py record /tmp/tables-new
    python scripts/compare_migration.py compare /tmp/tables-base /tmp/tables-new

`compare` names the reason for each difference a later change meant to make (EXPLAINED: which
columns may differ, and by how much) and fails on any other.

Each case runs in this process on one local Ray (2 hosts), under results of its own name.
Columns measured on the wall clock (`wall_time`) are left out of the comparison; every other
column, NaN included, must be equal. Jobs whose data this machine cannot read (EMNIST, GLDv2,
StackOverflow, CIFAR-10 files) run on the offline look-alike of their shape instead, the same
for both recordings."""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RAYFL_SHARED_DATA", REPO.parent / "shared" / "data"))
ROUNDS = 4  # server rounds per case (steps for asynchronous ones)
WALL = ("wall_time", "wall_seconds")

# Offline stand-ins for data this machine cannot read: (data section, model section).
STAND_INS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "emnist": ({"dataset": "lookalike", "like": "femnist"}, {"name": "femnist_cnn"}),
    "gldv2": ({"dataset": "lookalike", "like": "femnist"}, {"name": "femnist_cnn"}),
    "cifar10": ({"dataset": "lookalike", "like": "cifar10"}, {"name": "relu1"}),
    "stackoverflow": ({"dataset": "lookalike", "like": "shakespeare"}, {"name": "char_lstm"}),
}

SYNTH = {"dataset": "synthetic", "alpha": 0.5, "beta": 0.5, "size_mu": 3.5, "size_sigma": 0.5, "max_client_samples": 120}
QUAD = {"dataset": "ffgg_quadratic", "n": 400, "d_theta": 8, "d_w": 4}


def job_cases() -> dict[str, dict[str, Any]]:
    """Every job file, shrunk to a few rounds and a few clients."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((REPO / "jobs").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        name = "job-" + str(path.relative_to(REPO / "jobs")).removesuffix(".yaml").replace("/", "-")
        if "sweep" in raw or name.endswith("sweep_grid"):
            raw.pop("sweep", None)
        shrink(raw)
        out[name] = raw
    return out


def shrink(raw: dict[str, Any]) -> None:
    """A few rounds, a small population, offline data: the same shrink in both recordings."""
    run = raw.setdefault("run", {})
    run["rounds"] = min(int(run.get("rounds", 50)), ROUNDS)
    run["eval_every"] = 2
    data = raw.setdefault("data", {})
    dataset = data.get("dataset", "synthetic")
    if dataset in STAND_INS:
        new_data, model = STAND_INS[dataset]
        raw["data"] = dict(new_data)
        raw["model"] = dict(model)
        part = raw.setdefault("partition", {})
        if part.get("method", "natural") == "natural":
            part["num_clients"] = 12
    elif dataset == "mnist":
        data.update(data_dir=str(SHARED), download=False, source="test_only")
        data.pop("split", None)
        data["max_samples"] = min(int(data.get("max_samples") or 10**9), 3000)
    elif dataset == "synthetic":
        part = raw.setdefault("partition", {})
        part["num_clients"] = min(int(part.get("num_clients") or 100), 60)
        data.pop("lazy", None)
    part = raw.setdefault("partition", {})
    if part.get("num_clients") and part["num_clients"] > 60 and dataset != "ffgg_quadratic":
        part["num_clients"] = 60
    if "big_client_size" in part:
        part["big_client_size"] = 800
    if part.get("client_test_size"):
        part["client_test_size"] = 20
    if "samples_per_client" in part:
        part["samples_per_client"] = 100
    alg = raw.setdefault("algorithm", {})
    if alg.get("clients_per_round") and part.get("num_clients") and alg["clients_per_round"] > part["num_clients"]:
        alg["clients_per_round"] = part["num_clients"]
    lower = alg.get("lower")
    if isinstance(lower, dict):
        lower.update(rounds0=2, rounds_max=2)
    engine = raw.get("engine") or {}
    raw["engine"] = {"num_hosts": 2, **{k: v for k, v in engine.items() if k in ("preaggregate", "vectorize", "balance")}}
    raw.pop("callbacks", None)
    out = raw.setdefault("output", {})
    out.pop("dir", None)
    out["checkpoint_every"] = 0


def small(alg: dict[str, Any], *, data: dict[str, Any] | None = None, model: str = "linear", clients: int = 20,
          system: dict[str, Any] | None = None, partition: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    """A small synthetic (or given) job around one algorithm section."""
    job: dict[str, Any] = {
        "run": {"rounds": ROUNDS, "eval_every": 2, "seed": 3},
        "data": dict(data or SYNTH),
        "partition": {"method": "natural", "num_clients": clients, **(partition or {})},
        "model": {"name": model},
        "algorithm": alg,
        "engine": {"num_hosts": 2},
        "output": {"checkpoint_every": 0},
    }
    if system:
        job["system"] = system
    job.update(sections)
    return job


SLOW = {"speed": {"dist": "inverse_pareto", "value": 2.0e6, "shape": 1.2}, "latency": {"dist": "lognormal", "value": 0.2, "sigma": 0.5}}
PERSONAL = {"client_test": "proportional"}


def matrix_cases() -> dict[str, dict[str, Any]]:
    """Algorithms, round policies, pipeline sections and asynchrony the jobs do not reach."""
    fedavg = {"name": "fedavg", "clients_per_round": 6, "lr": 0.1, "local_steps": 3, "local_epochs": None}
    c: dict[str, dict[str, Any]] = {
        "fedavg-deadline-drop": small(fedavg, system={**SLOW, "policy": "deadline", "deadline": 2.0}),
        "fedavg-deadline-partial": small(fedavg, system={**SLOW, "policy": "deadline", "deadline": 2.0, "late_policy": "partial"}),
        "fedavg-overselect": small(fedavg, system={**SLOW, "policy": "over_selection", "over_selection": 0.5}),
        "fedavg-dropout": small(fedavg, system={"dropout": 0.3}),
        "fedavg-availability": small(fedavg, system={"availability": {"kind": "periodic", "online_fraction": 0.5, "period": 50.0}}),
        "fedavg-uniform-adam": small({**fedavg, "weighting": "uniform", "server_optimizer": {"name": "adam"}, "server_lr": 0.01}),
        "fedavg-roundlr": small({**fedavg, "round_lr": {"kind": "linear", "warmup_fraction": 0.5}}),
        "fedavg-schedule-harmonic": small({**fedavg, "local_steps": None, "local_schedule": {"kind": "sqrt", "tau": 2},
                                           "lr_schedule": "harmonic"}),
        "fedavg-server-client": small({**fedavg, "server_as_client": True}, data={**SYNTH, "server_fraction": 0.2}),
        "fedavg-preagg-off": small(fedavg, engine={"num_hosts": 2, "preaggregate": "off"}),
        "fedavg-vectorize-off": small(fedavg, engine={"num_hosts": 2, "vectorize": "off"}),
        "fedavg-one-host": small(fedavg, engine={"num_hosts": 1}),
        "fedprox-dropout": small({**fedavg, "name": "fedprox", "mu": 0.1}, system={"dropout": 0.3}),
        "scaffold-dropout": small({**fedavg, "name": "scaffold"}, system={"dropout": 0.3}),
        "scaffold-server-client": small({**fedavg, "name": "scaffold", "server_as_client": True},
                                        data={**SYNTH, "server_fraction": 0.2}),
        "fedavg-dp-central": small({**fedavg, "clients_per_round": 8},
                                   privacy={"mode": "central", "clip": 0.5, "noise_multiplier": 0.8}),
        "fedavg-dp-adaptive": small({**fedavg, "clients_per_round": 8},
                                    privacy={"mode": "central", "clip": 0.5, "noise_multiplier": 0.8, "adaptive": True,
                                             "clip_count_stddev": 1.0}),
        "fedavg-dp-local": small({**fedavg, "clients_per_round": 8},
                                 privacy={"mode": "local", "clip": 0.5, "noise_multiplier": 0.3}),
        "scaffold-dp-fixed": small({**fedavg, "name": "scaffold", "clients_per_round": 8},
                                   privacy={"mode": "central", "clip": 0.5, "noise_multiplier": 0.8, "sampling": "fixed"}),
        "fedavg-topk": small(fedavg, compression={"name": "topk", "ratio": 0.1}),
        "ditto-topk": small({**fedavg, "name": "ditto", "clients_per_round": 6}, partition=PERSONAL,
                            compression={"name": "topk", "ratio": 0.1}),
        "fedavg-robust-median": small({**fedavg, "clients_per_round": 10}, engine={"num_hosts": 2, "preaggregate": "auto"},
                                      robust={"aggregator": {"name": "median"},
                                              "attack": {"name": "sign_flip", "count": 2}}),
        "ffgg-mlp": small({"name": "ffgg", "clients_per_round": 6, "tau": 2, "personal_scheme": "output"},
                          model="mlp", partition=PERSONAL),
        "local-ffgg-mlp-adam": small({"name": "local_ffgg", "clients_per_round": 6, "tau": 1, "local_steps": 2,
                                      "local_epochs": None, "server_optimizer": {"name": "adam"}, "server_lr": 0.01},
                                     model="mlp", partition=PERSONAL),
        "ffgg-dp": small({"name": "ffgg", "clients_per_round": 6, "tau": 2}, model="mlp", partition=PERSONAL,
                         privacy={"mode": "central", "clip": 1.0, "noise_multiplier": 0.5}),
        "ditto": small({"name": "ditto", "clients_per_round": 6}, partition=PERSONAL),
        "fedavg-adapt": small({"name": "fedavg_adapt", "clients_per_round": 6}, partition=PERSONAL),
        "per-fedavg": small({"name": "per_fedavg", "clients_per_round": 6, "local_steps": 2, "batch_size": 8,
                             "outer_batch_size": 8}, partition=PERSONAL, model="mlp"),
        "per-fedavg-fo-samples": small({"name": "per_fedavg", "clients_per_round": 6, "local_steps": 2, "batch_size": 8,
                                        "outer_batch_size": 8, "second_order": False, "weighting": "samples"},
                                       partition=PERSONAL),
        "tr-maml": small({"name": "tr_maml", "clients_per_round": 6, "local_steps": 2, "batch_size": 8,
                          "outer_batch_size": 8}, partition=PERSONAL),
        "comfedl-loss": small({"name": "comfedl", "clients_per_round": 6, "local_steps": 2}, partition=PERSONAL),
        "comfedl-maml": small({"name": "comfedl", "clients_per_round": 6, "local_steps": 2, "objective": "maml",
                               "batch_size": 8, "outer_batch_size": 8}, partition=PERSONAL),
        "comfedl-identity-samples": small({"name": "comfedl", "clients_per_round": 6, "local_steps": 2, "outer": "identity",
                                           "average": "samples", "client_eval": False}),
        "comfedl-literal-dropout": small({"name": "comfedl", "clients_per_round": 6, "local_steps": 2, "weighting": "literal",
                                          "gamma": 5.0}, system={"dropout": 0.3}),
        "drfa-weighted": small({"name": "drfa", "clients_per_round": 6, "local_steps": 3}, partition=PERSONAL),
        "drfa-sampling": small({"name": "drfa", "clients_per_round": 6, "local_steps": 3, "variant": "sampling",
                                "client_eval": False}),
        "drfa-dropout": small({"name": "drfa", "clients_per_round": 6, "local_steps": 3, "client_eval": False},
                              system={"dropout": 0.3}),
        "qfedavg": small({"name": "qfedavg", "clients_per_round": 10}, partition=PERSONAL),
        "qfedavg-q0": small({"name": "qfedavg", "clients_per_round": 10, "q": 0.0, "client_eval": False}),
        "fedrzo-nn": small({"name": "fedrzo_nn", "local_steps": 2, "eta": 0.01, "lr": 1e-3}, model="relu1", clients=6),
        "fedrzo-nn-ball-central": small({"name": "fedrzo_nn", "local_steps": 2, "eta": 0.01, "lr": 1e-3, "estimator": "central",
                                         "constraint": {"kind": "ball", "radius": 1.0}}, model="relu1", clients=6),
        "fedmspp": small({"name": "fedmspp", "local_steps": 3}, model="relu1", clients=6),
        "scaffnew": small({"name": "scaffnew", "local_steps": 3}, model="relu1", clients=6),
        "zo-hfl": small({"name": "zo_hfl", "clients_per_round": 6, "local_schedule": {"kind": "sqrt", "tau": 2}},
                        data={**SYNTH, "server_fraction": 0.3}),
        "zo-hfl-scalars-seed-all": small({"name": "zo_hfl", "clients_per_round": 4, "local_schedule": {"kind": "sqrt", "tau": 2},
                                          "upload": "scalars", "send_direction": "seed", "aggregation": "all_clients",
                                          "directions": "shared"}, data={**SYNTH, "server_fraction": 0.3}),
        "zo-hfl-unbiased-dropout": small({"name": "zo_hfl", "clients_per_round": 6, "local_schedule": {"kind": "sqrt", "tau": 2},
                                          "aggregation": "unbiased", "randomness": "independent", "client_init": "input"},
                                         data={**SYNTH, "server_fraction": 0.3}, system={"dropout": 0.3}),
        "ffgg-quadratic": small({"name": "ffgg", "participation": 1.0, "clients_per_round": None, "solver": "cg", "tau": 3},
                                data=QUAD, clients=8),
        "local-ffgg-quadratic": small({"name": "local_ffgg", "participation": 1.0, "clients_per_round": None, "tau": 2,
                                       "local_steps": 3, "local_epochs": None}, data=QUAD, clients=8),
        "br-ffgg-quadratic": small({"name": "br_ffgg", "solver": "exact"}, data=QUAD, clients=8,
                                   engine={"num_hosts": 2, "preaggregate": "auto"},
                                   robust={"attack": {"name": "ipm", "count": 2}}),
        "local-gd": small({"name": "local_gd", "tau": 3}, data=QUAD, clients=8),
        "scaffold-quadratic-II": small({"name": "scaffold_quadratic", "tau": 3, "option": "II"}, data=QUAD, clients=8),
        "l2gd": small({"name": "l2gd", "tau": 3}, data=QUAD, clients=8),
        "local-finetune": small({"name": "local_finetune", "local_epochs": 1, "personal_scheme": "output"}, model="mlp",
                                partition=PERSONAL),
        "fedasync": small({"name": "fedasync", "concurrency": 4, "lr": 0.1}, system=SLOW),
        "fedasync-hinge-bounded": small({"name": "fedasync", "concurrency": 5, "staleness": "hinge", "staleness_b": 1,
                                         "max_staleness": 3}, system={**SLOW, "dropout": 0.2}),
        "fedbuff": small({"name": "fedbuff", "concurrency": 6, "buffer_size": 3}, system=SLOW),
        "fedbuff-constant-dropout": small({"name": "fedbuff", "concurrency": 6, "buffer_size": 2, "staleness": "constant",
                                           "server_lr": 0.5}, system={**SLOW, "dropout": 0.2}),
        "fedbuff-topk": small({"name": "fedbuff", "concurrency": 6, "buffer_size": 3}, system=SLOW,
                              compression={"name": "topk", "ratio": 0.2}),
        "async-ffgg-worker-old": small({"name": "async_ffgg", "participation": 1.0, "clients_per_round": None, "solver": "exact",
                                        "concurrency": 3, "dispatch": "worker", "dispatch_model": "old", "server_lr": 0.01},
                                       data=QUAD, clients=8, system=SLOW),
        "async-ffgg-theory": small({"name": "async_ffgg", "participation": 1.0, "clients_per_round": None, "solver": "gd",
                                    "tau": 2, "concurrency": 3, "step_rule": "delay_adaptive", "server_lr": 0.01,
                                    "max_staleness": 4}, data=QUAD, clients=8, system=SLOW),
    }
    for case in c.values():
        case["run"]["rounds"] = 8 if case["algorithm"]["name"] in ("fedasync", "fedbuff", "async_ffgg") else ROUNDS
    return c


def all_cases() -> dict[str, dict[str, Any]]:
    return {**job_cases(), **matrix_cases()}


def record(out: Path, only: list[str]) -> int:
    """Run every case (or those matching `only`) into `out`, one directory each."""
    import ray

    import rayfl

    out.mkdir(parents=True, exist_ok=True)
    failures: dict[str, str] = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cases = {k: v for k, v in all_cases().items() if not only or any(fnmatch.fnmatch(k, p) for p in only)}
    for i, (name, job) in enumerate(cases.items(), 1):
        job = json.loads(json.dumps(job))
        job["run"].update(run_id=name, experiment="migration")
        job["output"].update(dir=str(out), overwrite=True)
        t0 = time.perf_counter()
        try:
            rayfl.run(job)
            print(f"[{i}/{len(cases)}] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        except BaseException as e:  # a case that fails is recorded as such, in both recordings
            if isinstance(e, KeyboardInterrupt):
                raise
            failures[name] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            print(f"[{i}/{len(cases)}] {name}: FAILED {failures[name]}", flush=True)
            traceback.print_exc(limit=3)
    known = out / "failures.json"  # a partial recording keeps the other cases' failures
    earlier = json.loads(known.read_text()) if known.exists() else {}
    earlier = {k: v for k, v in earlier.items() if k not in cases}
    known.write_text(json.dumps({**earlier, **failures}, indent=1, sort_keys=True))
    ray.shutdown()
    return 0


def tables(run_dir: Path) -> dict[str, Any]:
    import pandas as pd

    out = {}
    for table in ("rounds", "clients", "evals"):
        d = run_dir / table
        if d.exists() and any(d.iterdir()):
            df = pd.read_parquet(d)
            df = df.drop(columns=[c for c in df.columns if c in WALL])
            out[table] = df.reset_index(drop=True)
    return out


@dataclass(frozen=True)
class Difference:
    """One column that differs between two recordings of a case: `largest` is the largest
    relative difference of a float column (inf for any other kind)."""

    table: str
    column: str
    text: str
    largest: float = math.inf
    only_second: bool = False


def differences(table: str, a: Any, b: Any) -> list[Difference]:
    """What differs between two tables, column by column (NaN equals NaN)."""
    import numpy as np

    if len(a) != len(b):
        return [Difference(table, "", f"{len(a)} rows against {len(b)}")]
    found = []
    for col in sorted(set(a.columns) | set(b.columns)):
        if col not in a.columns or col not in b.columns:
            where = "the first" if col in a.columns else "the second"
            found.append(Difference(table, col, f"column {col} only in {where}", only_second=col in b.columns))
            continue
        x, y = a[col].to_numpy(), b[col].to_numpy()
        largest = math.inf
        if x.dtype.kind in "fc" or y.dtype.kind in "fc":
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
            if not same.all() and not (np.isnan(xf) ^ np.isnan(yf)).any():
                d = ~same
                largest = float(np.max(np.abs(xf[d] - yf[d]) / np.maximum(np.maximum(np.abs(xf[d]), np.abs(yf[d])), 1e-30)))
        else:
            same = np.array([u == v or (_nan(u) and _nan(v)) for u, v in zip(x, y, strict=True)], dtype=bool)
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            text = f"column {col}: {int((~same).sum())} rows differ, first at row {i}: {x[i]!r} against {y[i]!r}"
            if math.isfinite(largest):
                text += f" (largest relative difference {largest:.1e})"
            found.append(Difference(table, col, text, largest))
    return found


@dataclass(frozen=True)
class Explained:
    """Differences from the recording of 526da4e that a change meant to make: in the cases
    matching `cases`, only the `columns` listed ("table.column"; None: any float column) may
    differ, floats by at most `rtol` relative, and `new` columns may appear."""

    cases: tuple[str, ...]
    why: str
    columns: frozenset[str] | None = None
    rtol: float = 0.0
    new: frozenset[str] = frozenset()

    def covers(self, name: str, found: list[Difference]) -> bool:
        if not any(fnmatch.fnmatch(name, p) for p in self.cases):
            return False
        for d in found:
            key = f"{d.table}.{d.column}"
            if d.only_second:
                ok = key in self.new
            elif self.columns is not None:
                ok = key in self.columns
            else:
                ok = d.largest <= self.rtol
            if not ok:
                return False
        return True


EXPLAINED = (
    Explained(("fedasync*", "fedbuff*", "job-soak", "job-stragglers_fedasync", "job-stragglers_fedbuff"),
              "an asynchronous task of a stateless client function now runs on the hosts in turn "
              "(engine.balance: auto), batched with the others queued there: `clients.host` names "
              "another host, every other column is equal",
              columns=frozenset({"clients.host"})),
    Explained(("*-dp-*", "ffgg-dp", "job-privacy-*"),
              "the hosts now rescale a clipped update whose float32 cast still exceeds the clip "
              "(by up to 1e-8 relative) and log its norm in the new `clients.clipped_norm`; the "
              "rescaled uploads move later rounds by float32 rounding",
              rtol=1e-5, new=frozenset({"clients.clipped_norm"})),
    Explained(("fedrzo-nn*", "fedmspp", "scaffnew", "job-fedrzo-*"),
              "FedRZO_nn, FedMSPP and Scaffnew now upload x_i - x_r and the server adds their mean "
              "to x_r (a model-shaped sum the pipeline can clip, noise and compress) instead of "
              "averaging x_i: float rounding of the sum differs, and the zeroth-order estimates' "
              "1 / eta magnifies it (a gap's logarithm most)",
              rtol=1e-3),
    Explained(("ditto*", "qfedavg*", "job-comfedl-fig2_qfedavg"),
              "their client functions have no batched twin; under engine.vectorize: auto their "
              "rayfl.local_sgd calls now run batched in lockstep, which sums in another float32 "
              "order",
              rtol=1e-4),
)


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def compare(first: Path, second: Path, only: list[str]) -> int:
    """Every case's tables, bit for bit; prints one line per case, with the reason where a
    difference is one EXPLAINED lists, and returns 1 if any difference is not."""
    fails_a = json.loads((first / "failures.json").read_text()) if (first / "failures.json").exists() else {}
    fails_b = json.loads((second / "failures.json").read_text()) if (second / "failures.json").exists() else {}
    names = sorted({p.name for p in (first / "migration").iterdir()} | set(fails_a) | set(fails_b))
    names = [n for n in names if not only or any(fnmatch.fnmatch(n, p) for p in only)]
    bad = explained = 0
    for name in names:
        if name in fails_a or name in fails_b:
            same = fails_a.get(name) == fails_b.get(name)
            print(f"{'same' if same else 'DIFFERS'} {name}: failed ({fails_a.get(name)!r} / {fails_b.get(name)!r})")
            bad += not same
            continue
        a, b = tables(first / "migration" / name), tables(second / "migration" / name)
        found = [Difference(t, "", f"table {t} only in one") for t in sorted(set(a) ^ set(b))]
        for t in sorted(set(a) & set(b)):
            found += differences(t, a[t], b[t])
        rows = {t: len(df) for t, df in sorted(a.items())}
        why = next((e.why for e in EXPLAINED if found and e.covers(name, found)), None)
        print(f"{'same' if not found else 'explained' if why else 'DIFFERS'} {name} {rows}")
        for d in found:
            print(f"    {d.table}: {d.text}")
        if why:
            print(f"    why: {why}")
            explained += 1
        bad += bool(found) and not why
    print(f"{len(names) - bad - explained} of {len(names)} cases identical, {explained} differ as explained, {bad} unexplained")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run every case into a directory")
    r.add_argument("out", type=Path)
    r.add_argument("--only", nargs="*", default=[], help="case-name patterns (fnmatch)")
    c = sub.add_parser("compare", help="compare two recordings")
    c.add_argument("first", type=Path)
    c.add_argument("second", type=Path)
    c.add_argument("--only", nargs="*", default=[])
    sub.add_parser("list", help="the cases' names")
    args = p.parse_args(argv)
    if args.cmd == "record":
        return record(args.out, args.only)
    if args.cmd == "compare":
        return compare(args.first, args.second, args.only)
    print("\n".join(all_cases()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
