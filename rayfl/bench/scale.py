"""`rayfl bench scale`: many registered clients, a hundred per round, on this machine.

Reports wall seconds per round (median over rounds after the first) and the peak resident
memory of the driver plus every process it started (Ray's GCS, raylet, object store and the
ClientHost actors), sampled every 100 ms."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.bench.common import PeakMemory, round_seconds, steady, write_result


def run_scale_bench(clients: int, per_round: int, rounds: int, out: Path, job: str | None = None) -> dict[str, Any]:
    from rayfl.config import load_config
    from rayfl.data import build_federated_dataset
    from rayfl.results.load import read_manifest
    from rayfl.runner import run_experiment

    repo_job = Path(__file__).resolve().parents[2] / "jobs" / "scale_10k.yaml"
    cfg = load_config(
        job or (repo_job if repo_job.is_file() else None),
        [
            f"partition.num_clients={clients}",
            f"algorithm.clients_per_round={per_round}",
            f"run.rounds={rounds}",
            f"run.eval_every={rounds}",
            f"output.dir={out.parent / 'results'}",
            "run.experiment=bench_scale",
        ],
    )
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        dataset = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
        t_data = time.perf_counter() - t0
        outcome = run_experiment(cfg, dataset=dataset)
    per_round_s = round_seconds(outcome.run_dir)
    timed = steady(per_round_s)
    manifest = read_manifest(outcome.run_dir)
    result = {
        "clients": clients,
        "clients_per_round": per_round,
        "rounds": rounds,
        "train_samples": int(len(dataset.train_y)),
        "num_hosts": manifest["placement"]["num_hosts"],
        "data_seconds": round(t_data, 3),
        "first_round_seconds": round(float(per_round_s[0]), 3),
        "seconds_per_round_median": round(float(np.median(timed)), 3),
        "seconds_per_round_mean": round(float(np.mean(timed)), 3),
        "total_seconds": round(outcome.wall_seconds + t_data, 3),
        "peak_rss_mb": round(mem.peak / 2**20, 1),
        "final_test_accuracy": outcome.summary.get("test_accuracy"),
        "run_dir": str(outcome.run_dir),
    }
    write_result(out, result)
    return result
