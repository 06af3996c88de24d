"""`rayfl bench scale`: many registered clients, a hundred per round, on this machine.

Reports wall seconds per round (median over rounds after the first) and the peak resident
memory of the driver plus every process it started (Ray's GCS, raylet, object store and the
ClientHost actors), sampled every 100 ms."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


class PeakMemory:
    """Peak summed RSS of this process and all its descendants."""

    def __init__(self, interval: float = 0.1):
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> int:
        import psutil

        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a process may end between listing and reading
                total += p.memory_info().rss
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_scale_bench(clients: int, per_round: int, rounds: int, out: Path, job: str | None = None) -> dict[str, Any]:
    from rayfl.config import load_config
    from rayfl.data import build_federated_dataset
    from rayfl.results import load
    from rayfl.results.load import read_manifest
    from rayfl.runner import run_experiment

    repo_job = Path(__file__).resolve().parents[1] / "jobs" / "scale_10k.yaml"
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
    res = load(outcome.run_dir)
    wall = res.rounds.sort_values("round")["wall_time"].to_numpy()
    per_round_s = np.diff(np.concatenate([[0.0], wall]))
    steady = per_round_s[1:] if len(per_round_s) > 1 else per_round_s
    manifest = read_manifest(outcome.run_dir)
    result = {
        "clients": clients,
        "clients_per_round": per_round,
        "rounds": rounds,
        "train_samples": int(len(dataset.train_y)),
        "num_hosts": manifest["placement"]["num_hosts"],
        "data_seconds": round(t_data, 3),
        "first_round_seconds": round(float(per_round_s[0]), 3),
        "seconds_per_round_median": round(float(np.median(steady)), 3),
        "seconds_per_round_mean": round(float(np.mean(steady)), 3),
        "total_seconds": round(outcome.wall_seconds + t_data, 3),
        "peak_rss_mb": round(mem.peak / 2**20, 1),
        "final_test_accuracy": outcome.summary.get("test_accuracy"),
        "run_dir": str(outcome.run_dir),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result
