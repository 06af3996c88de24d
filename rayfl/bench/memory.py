"""`rayfl bench memory`: each host's peak memory against the clients of a round.

A host should hold a few copies of the model, whatever its share of the round: its clients'
outputs the server only sums go into partial sums as they are made (rayfl.engine.partials) and a
batched call runs in chunks (`engine.clients_per_chunk`). This bench runs FedAvg rounds of a
19.2M-parameter MLP (784-4000-4000-10, 77 MB of float32 parameters; 2 local steps of 10 samples)
on 2 hosts, every client of the population in every round, at several cohort sizes, with and without vectorisation
(`engine.vectorize` off and auto), pre-aggregation at its default (on).

Each size runs in a fresh Python process (its own local Ray). Per size it reports the peak
resident memory of each ClientHost process, of the whole process tree (the driver, Ray's
processes and the hosts, summed; sampled every 0.25 s) and the wall seconds per round."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.bench.common import (
    PeakMemory,
    load_average,
    measure_each_in_process,
    round_seconds,
    steady,
    write_result,
)
from rayfl.bench.workloads import MNIST_SHAPED

HIDDEN = "[4000,4000]"  # 784-4000-4000-10: 19.2M parameters
MODEL = "MLP 784-4000-4000-10 (19.2M parameters, 77 MB)"
HOSTS = 2
LOCAL_STEPS = 2  # of 10 samples: memory does not depend on them, the bench's minutes do
VECTORIZE = ("off", "auto")
MB = 2**20


def measure_one(clients: int, rounds: int, vectorize: str, out: Path, hidden: str = HIDDEN) -> dict[str, Any]:
    """`rounds` FedAvg rounds of `clients` clients a round on 2 hosts, in this process, under
    the memory sampler."""
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    cfg = load_config(None, [
        *MNIST_SHAPED, "model.name=mlp", f"model.hidden={hidden}", "algorithm.local_epochs=null",
        f"algorithm.local_steps={LOCAL_STEPS}",
        f"partition.num_clients={clients}", f"algorithm.clients_per_round={clients}",
        f"engine.num_hosts={HOSTS}", "engine.pool=off", f"engine.vectorize={vectorize}",
        f"run.rounds={rounds}", f"run.eval_every={rounds}", "run.experiment=bench_memory",
        f"output.dir={out.parent / 'results'}", "output.overwrite=true", f"run.run_id={vectorize}-{clients}",
    ])
    hosts: list[int] = []
    load_before = load_average()
    with PeakMemory() as mem:
        outcome = run_experiment(cfg, on_start=lambda _dir, fed: hosts.extend(int(i["pid"]) for i in fed.hosts.info))
    per_round = round_seconds(outcome.run_dir)
    host_peaks = [round(mem.per_process.get(pid, 0) / MB, 1) for pid in hosts]
    result = {
        "clients_per_round": clients,
        "vectorize": vectorize,
        "hosts": HOSTS,
        "rounds": rounds,
        "host_peak_rss_mb": host_peaks,
        "host_peak_rss_mb_max": max(host_peaks, default=0.0),
        "tree_peak_rss_mb": mem.peak_mb,
        "seconds_per_round_median": round(float(np.median(steady(per_round))), 3),
        "first_round_seconds": round(float(per_round[0]), 3),
        "load_before": load_before,
        "load_after": load_average(),
        "run_dir": str(outcome.run_dir),
    }
    out.write_text(json.dumps(result, indent=2))
    return result


def run_memory_bench(clients: Sequence[int], rounds: int, out: Path, vectorize: Sequence[str] = VECTORIZE,
                     hidden: str = HIDDEN) -> dict[str, Any]:
    """Every cohort size under every `engine.vectorize` mode, each in its own process; write
    `out` (JSON) and `out`.parquet (one row per run). `hidden` is the MLP's hidden layers
    (tests run a small one)."""
    rows = []
    for mode in vectorize:
        rows += measure_each_in_process("rayfl.bench.memory", "--clients", clients, out.with_name(f"{out.stem}_{mode}"),
                                        "--rounds", str(rounds), "--vectorize", mode, "--hidden", hidden)
    summary = summarize(rows, rounds, hidden)
    write_result(out, summary, rows)
    return summary


def summarize(rows: Sequence[dict[str, Any]], rounds: int, hidden: str = HIDDEN) -> dict[str, Any]:
    """The summary of per-run rows (`measure_one`'s results): one curve per `engine.vectorize`
    mode, in the rows' order, each size's tree peak also against the mode's first size."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        mine = curves.setdefault(r["vectorize"], [])
        base = mine[0]["tree_peak_rss_mb"] if mine else r["tree_peak_rss_mb"]
        mine.append({"clients_per_round": r["clients_per_round"], "host_peak_rss_mb": r["host_peak_rss_mb"],
                     "tree_peak_rss_mb": r["tree_peak_rss_mb"],
                     "tree_above_first_mb": round(r["tree_peak_rss_mb"] - base, 1),
                     "seconds_per_round_median": r["seconds_per_round_median"]})
    model = MODEL if hidden == HIDDEN else f"MLP hidden {hidden}"
    return {
        "workload": "memory",
        "what": f"FedAvg ({LOCAL_STEPS} local steps of 10 samples), {model}, {HOSTS} hosts, every client "
                "in every round, pre-aggregation on; peak RSS of each host process and of the whole process tree",
        "rounds": rounds,
        "curves": curves,
        "target": "at 100 clients a round, the tree's peak at most 1.5 GB above the 10-client run's",
    }


def main(argv: list[str] | None = None) -> None:
    """One cohort size (what `run_memory_bench` starts per size)."""
    p = argparse.ArgumentParser(prog="python -m rayfl.bench.memory")
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--vectorize", choices=("auto", "on", "off"), required=True)
    p.add_argument("--hidden", default=HIDDEN)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    measure_one(a.clients, a.rounds, a.vectorize, a.out, a.hidden)


if __name__ == "__main__":
    main()
