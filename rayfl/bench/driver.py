"""`rayfl bench driver`: the driver's CPU time per round as the number of hosts grows.

A cluster of hundreds of GPU hosts must not wait on its driver: every round the driver sends
each host its call, collects the replies, combines them and logs the round. This bench runs
synchronous FedAvg rounds of trivial client work (a linear model, one local step of a small
batch, a few clients per host) on 2 to 32 hosts of this machine, each host a fractional-CPU
Ray actor, so that what grows with the host count is the driver's own work.

Each host count runs in a fresh Python process (its own local Ray, no pooled hosts). Per count
it reports the driver process's CPU seconds per round (all its threads: Python and Ray's core
worker; median over rounds after the first few), the same divided by the hosts ("ms per host
per round"), and the slope of driver CPU against hosts fitted over all counts: the marginal
cost of one more host, the figure that decides how many hosts one driver can keep busy."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.bench.common import load_average, measure_each_in_process, write_result
from rayfl.callbacks.base import Callback

CLIENTS_PER_HOST = 4  # clients of a round on each host: a call per host per round, as on a cluster
WARMUP_ROUNDS = 3  # rounds left out of the medians (host start, first calls, allocations)


class DriverCpuAtRounds(Callback):
    """This process's CPU seconds (every thread) and the wall clock as each round is logged."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.wall: dict[int, float] = {}

    def on_round(self, row: Mapping[str, Any], run: Any) -> None:
        self.cpu[int(row["round"])] = time.process_time()
        self.wall[int(row["round"])] = time.perf_counter()


def per_round(marks: Mapping[int, float]) -> np.ndarray:
    """Seconds between consecutive rounds' marks, warm-up rounds left out."""
    rounds = sorted(marks)
    values = np.diff([marks[r] for r in rounds])
    return values[WARMUP_ROUNDS:] if len(values) > WARMUP_ROUNDS else values


def measure_one(hosts: int, rounds: int, out: Path) -> dict[str, Any]:
    """`rounds` FedAvg rounds on `hosts` fractional-CPU hosts, in this process."""
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    cpus = os.cpu_count() or 1
    clients = CLIENTS_PER_HOST * hosts
    cfg = load_config(None, [
        "data.dataset=digits", "model.name=linear",
        "partition.method=iid", f"partition.num_clients={clients}",
        "algorithm.name=fedavg", f"algorithm.clients_per_round={clients}",
        "algorithm.local_steps=1", "algorithm.local_epochs=null", "algorithm.batch_size=4",
        f"engine.num_hosts={hosts}", f"engine.num_cpus_per_host={cpus / hosts}", "engine.pool=off",
        f"run.rounds={rounds}", f"run.eval_every={rounds}", "run.experiment=bench_driver",
        f"output.dir={out.parent / 'results'}", "output.overwrite=true", f"run.run_id=hosts{hosts}",
    ])
    marks = DriverCpuAtRounds()
    load_before = load_average()
    outcome = run_experiment(cfg, callbacks=[marks])
    cpu, wall = per_round(marks.cpu), per_round(marks.wall)
    cpu_ms = float(np.median(cpu)) * 1e3
    result = {
        "hosts": hosts,
        "clients_per_round": clients,
        "rounds": rounds,
        "num_cpus_per_host": round(cpus / hosts, 4),
        "driver_cpu_ms_per_round": round(cpu_ms, 3),
        "driver_cpu_ms_per_host_per_round": round(cpu_ms / hosts, 3),
        "wall_ms_per_round": round(float(np.median(wall)) * 1e3, 3),
        "load_before": load_before,
        "load_after": load_average(),
        "run_dir": str(outcome.run_dir),
    }
    out.write_text(json.dumps(result, indent=2))
    return result


def run_driver_bench(hosts: Sequence[int], rounds: int, out: Path) -> dict[str, Any]:
    """Every host count in its own process; write `out` (JSON) and `out`.parquet."""
    rows = measure_each_in_process("rayfl.bench.driver", "--hosts", hosts, out, "--rounds", str(rounds))
    x = np.array([r["hosts"] for r in rows], float)
    y = np.array([r["driver_cpu_ms_per_round"] for r in rows], float)
    slope, intercept = np.polyfit(x, y, 1) if len(rows) > 1 else (float("nan"), float("nan"))
    summary = {
        "workload": "driver",
        "what": "driver CPU per round, FedAvg, linear model on digits, one local step, "
                f"{CLIENTS_PER_HOST} clients per host, fractional-CPU hosts",
        "machine_cpus": os.cpu_count(),
        "rounds": rounds,
        "curve": [{k: r[k] for k in ("hosts", "driver_cpu_ms_per_round", "driver_cpu_ms_per_host_per_round",
                                     "wall_ms_per_round")} for r in rows],
        "marginal_driver_cpu_ms_per_host": round(float(slope), 3),
        "fixed_driver_cpu_ms_per_round": round(float(intercept), 3),
        "target_ms_per_host_per_round": 0.5,
    }
    write_result(out, summary, rows)
    return summary


def main(argv: list[str] | None = None) -> None:
    """One host count (what `run_driver_bench` starts per count)."""
    p = argparse.ArgumentParser(prog="python -m rayfl.bench.driver")
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    measure_one(a.hosts, a.rounds, a.out)


if __name__ == "__main__":
    main()
