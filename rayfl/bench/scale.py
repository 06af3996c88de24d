"""`rayfl bench scale`: seconds per round and peak memory against the registered population.

Each population size runs in a fresh Python process (so one size's driver memory and Ray
processes never count towards the next) on a lazily generated Synthetic(1, 1) population
(`data.lazy`, rayfl.data.lazy): with the clients' rows made on demand, memory and
seconds per round should follow the clients of a round, not the population. `--eager` runs the
old in-memory dataset instead, for the before/after comparison.

Per size it reports wall seconds per round (median over rounds after the first), the peak
resident memory of the driver plus every process it started (Ray's GCS, raylet, object store
and the ClientHost actors) and the load average around the run (timings from a busy machine
are not comparable)."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from rayfl.bench.common import (
    PeakMemory,
    measure_each_in_process,
    round_seconds,
    steady,
    write_result,
)

JOB = Path(__file__).resolve().parents[2] / "jobs" / "scale_10k.yaml"


def run_scale_bench(
    clients: int | Sequence[int],
    per_round: int,
    rounds: int,
    out: Path,
    job: str | None = None,
    eager: bool = False,
) -> dict[str, Any]:
    """Measure every population size in `clients`, each in its own process; write `out` (JSON
    summary) and `out`.parquet (one row per size)."""
    counts = [clients] if isinstance(clients, int) else list(clients)
    rows = measure_each_in_process("rayfl.bench.scale", "--clients", counts, out, "--per-round", str(per_round),
                                   "--rounds", str(rounds), *(["--job", str(job)] if job else []),
                                   *(["--eager"] if eager else []))
    base = rows[0]["seconds_per_round_median"]
    for row in rows:
        row["seconds_per_round_vs_first"] = round(row["seconds_per_round_median"] / base, 3) if base else None
    summary = {
        "workload": "scale",
        "mode": "eager" if eager else "lazy",
        "clients_per_round": per_round,
        "rounds": rounds,
        "runs": rows,
        "curve": [
            {k: r[k] for k in ("clients", "seconds_per_round_median", "peak_rss_mb", "load_before", "load_after")}
            for r in rows
        ],
        "seconds_per_round_ratio_last_vs_first": rows[-1]["seconds_per_round_vs_first"],
        "peak_rss_mb_max": max(r["peak_rss_mb"] for r in rows),
    }
    write_result(out, summary, rows)
    return summary


def measure_one(clients: int, per_round: int, rounds: int, out: Path, job: str | None = None, eager: bool = False) -> dict[str, Any]:
    """One population size in this process: build the dataset and run `rounds` FedAvg rounds
    of `per_round` clients under the memory sampler."""
    from rayfl.config import load_config
    from rayfl.data import build_federated_dataset
    from rayfl.results.load import read_manifest
    from rayfl.runner import run_experiment, train_samples

    cfg = load_config(
        job or (JOB if JOB.is_file() else None),
        [
            f"partition.num_clients={clients}",
            f"algorithm.clients_per_round={per_round}",
            f"run.rounds={rounds}",
            f"run.eval_every={rounds}",
            f"output.dir={out.parent / 'results'}",
            "run.experiment=bench_scale",
            f"data.lazy={'false' if eager else 'true'}",
        ],
    )
    load_before = os.getloadavg()
    first_done: list[float] = []  # when round 0's row was logged (time.time())

    def progress(row: dict[str, Any]) -> None:
        if not first_done:
            first_done.append(time.time())

    with PeakMemory() as mem:
        t0 = time.perf_counter()
        dataset = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
        t_data = time.perf_counter() - t0
        outcome = run_experiment(cfg, progress=progress, dataset=dataset)
    load_after = os.getloadavg()
    per_round_s = round_seconds(outcome.run_dir)
    timed = steady(per_round_s)
    manifest = read_manifest(outcome.run_dir)
    result = {
        "clients": clients,
        "mode": "eager" if eager else "lazy",
        "clients_per_round": per_round,
        "rounds": rounds,
        "train_samples": train_samples(dataset),
        "num_hosts": manifest["placement"]["num_hosts"],
        "data_seconds": round(t_data, 3),
        "first_round_seconds": round(float(per_round_s[0]), 3),
        # from this process's start (the command, Python's imports included) to the end of round 0:
        # an upper bound on when the first round started
        "first_round_done_after_start_seconds": round(first_done[0] - psutil.Process().create_time(), 3),
        "seconds_per_round_median": round(float(np.median(timed)), 3),
        "seconds_per_round_mean": round(float(np.mean(timed)), 3),
        "total_seconds": round(outcome.wall_seconds + t_data, 3),
        "peak_rss_mb": mem.peak_mb,
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in load_after],
        "final_test_accuracy": outcome.summary.get("test_accuracy"),
        "run_dir": str(outcome.run_dir),
    }
    write_result(out, result)
    return result


def main(argv: list[str] | None = None) -> None:
    """One population size (what `run_scale_bench` starts per size)."""
    p = argparse.ArgumentParser(prog="python -m rayfl.bench.scale")
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--per-round", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--job", default=None)
    p.add_argument("--eager", action="store_true")
    a = p.parse_args(argv)
    measure_one(a.clients, a.per_round, a.rounds, a.out, a.job, a.eager)


if __name__ == "__main__":
    main()
