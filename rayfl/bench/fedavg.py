"""`rayfl bench fedavg-mlp` / `fedavg-linear` / `fedprox-mlp`: rayfl against a plain PyTorch loop.

The workload of issue 13: 1,000 clients x 60 training samples, 100 sampled per round, one local
epoch of batch 10 at lr 0.05, an MLP 784-200-10 (`fedavg-mlp`; `fedprox-mlp` with FedProx's
proximal term, mu 0.01) or the linear softmax model (`fedavg-linear`). The data are synthetic
(Synthetic-IID, 784 features, 10 classes: shaped like MNIST, generated offline from the seed),
so the benchmark needs no download.

One invocation runs the reference loop (`rayfl.bench.reference`) and rayfl under each requested
(engine.vectorize, engine.num_hosts), checks that every rayfl run samples the loop's clients and
reaches the loop's model to tolerance (max abs difference of the flat parameters, reported), and
writes a JSON summary and a Parquet row per run: seconds per round (median over rounds 1..R-2:
round 0 holds the hosts' warm-up and the last round rayfl's final evaluation), client updates
per second, peak memory, and the ratio rayfl / loop of seconds per round.

`device="cuda"` runs the loop on the GPU and every rayfl variant's hosts on one shared GPU
(engine.device=cuda, engine.num_gpus_per_host = 1 / hosts), recording which device each host
saw."""

from __future__ import annotations

import itertools
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayfl.bench.common import PeakMemory, load_average, round_seconds, steady, write_result
from rayfl.bench.reference import run_reference_loop
from rayfl.engine.resources import available_cpus

WORKLOADS = {
    "fedavg-mlp": ["model.name=mlp", "model.hidden=[200]"],
    "fedavg-linear": ["model.name=linear"],
    # FedProx's proximal term: the vectorised kernel carries it through its windows of steps
    "fedprox-mlp": ["model.name=mlp", "model.hidden=[200]", "algorithm.name=fedprox", "algorithm.mu=0.01"],
}
COMMON = [
    # 75 samples per client, 15 of them held out: 60 training samples each
    "data.dataset=synthetic", "data.iid=true", "data.features=784", "data.classes=10",
    "data.size_mu=0.0", "data.size_sigma=0.0", "data.min_client_samples=75",
    "data.max_client_samples=75", "data.test_fraction=0.2",
    "partition.method=natural", "partition.num_clients=1000",
    "algorithm.name=fedavg", "algorithm.clients_per_round=100", "algorithm.local_epochs=1",
    "algorithm.batch_size=10", "algorithm.lr=0.05", "output.log_clients=true",
]
TOLERANCE = 1e-4  # max abs parameter difference after the run (float32 reduction order)


def workload_config(workload: str, rounds: int, *extra: str) -> Any:
    from rayfl.config import load_config

    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {sorted(WORKLOADS)}")
    return load_config(None, [*COMMON, *WORKLOADS[workload], f"run.rounds={rounds}", f"run.eval_every={rounds}", *extra])


def run_fedavg_bench(
    workload: str, rounds: int, out: Path, hosts: list[int] | None = None, vectorize: list[str] | None = None,
    loop_threads: int | None = 1, preaggregate: list[str] | None = None, device: str = "cpu", repeat: int = 1,
) -> dict[str, Any]:
    """Time the loop and every (vectorize, hosts) variant of rayfl; see the module doc."""
    from rayfl.data import build_federated_dataset

    if rounds < 3:
        raise ValueError("--rounds must be >= 3 (round 0 and the last round are not timed)")
    if repeat < 1:
        raise ValueError("--repeat must be >= 1")
    if device == "cuda" and not torch.cuda.is_available():
        from rayfl.config import ConfigError

        raise ConfigError("--device", f"cuda asked, but torch {torch.__version__} sees no GPU here; use --device cpu")
    hosts, vectorize, preaggregate = hosts or [1, 2], vectorize or ["on", "off"], preaggregate or ["off"]
    results_dir = out.parent / "results"
    cfg = workload_config(workload, rounds)
    t0 = time.perf_counter()
    dataset = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    data_seconds = time.perf_counter() - t0
    started = _start_ray(cfg)  # once, before any timing: every variant then finds it running
    try:
        with PeakMemory() as mem:
            loop = run_reference_loop(cfg, dataset, rounds, loop_threads, device)
        loop_s = float(np.median(steady(loop.round_seconds, 1, 1)))
        per_round = cfg.algorithm.clients_per_round
        rows = [{"workload": workload, "runner": "loop", "device": device, "vectorize": None, "preaggregate": None, "num_hosts": None,
                 "seconds_per_round": loop_s, "client_updates_per_second": per_round / loop_s,
                 "peak_rss_mb": mem.peak_mb, "ratio_to_loop": 1.0, "max_abs_diff": 0.0, "same_clients": True,
                 "round_seconds": [round(s, 4) for s in loop.round_seconds]}]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for vec, pre, h in itertools.product(vectorize, preaggregate, hosts):
            name = variant_name(vec, pre, h)
            pairs = []
            for i in range(repeat):
                run_cfg = workload_config(workload, rounds, f"engine.vectorize={vec}", f"engine.num_hosts={h}",
                                          f"engine.preaggregate={pre}", f"output.dir={results_dir}",
                                          f"run.experiment=bench_{workload}", f"run.run_id={name}-{stamp}-{i}",
                                          *device_overrides(device, h))
                # the loop again beside each run, before it and after it in turn (ABBA): a ratio of
                # back-to-back timings survives a machine whose speed drifts
                if i % 2 == 0:
                    again = run_reference_loop(cfg, dataset, rounds, loop_threads, device)
                row = _rayfl_row(workload, run_cfg, dataset, loop, vec, pre, h, device)
                if i % 2 == 1:
                    again = run_reference_loop(cfg, dataset, rounds, loop_threads, device)
                pairs.append((row, float(np.median(steady(again.round_seconds, 1, 1)))))
            rows.append(paired_row(pairs))
    finally:
        if started:
            from rayfl.engine.local_ray import stop_ray

            stop_ray()
    summary = {
        "workload": workload,
        "data": "synthetic IID, 784 features, 10 classes (shaped like MNIST, generated offline); "
                "1,000 clients x 60 training samples",
        "model": "MLP 784-200-10" if workload.endswith("-mlp") else "linear 784-10",
        "algorithm": cfg.algorithm.name, "prox_mu": getattr(cfg.algorithm, "mu", 0.0),
        "clients_per_round": per_round, "local_epochs": 1, "batch_size": 10, "lr": 0.05, "rounds": rounds,
        "timed_rounds": f"1..{rounds - 2} (median; round 0 is warm-up, round {rounds - 1} evaluates)",
        "repeat": repeat,
        "ratio": "median over the repeats of rayfl / loop, each pair timed back to back" if repeat > 1 else
                 "rayfl / loop, timed back to back",
        "data_seconds": round(data_seconds, 3),
        "machine": {"cpus": available_cpus(), "platform": platform.platform(), "torch": torch.__version__,
                    "loop_torch_threads": loop_threads or torch.get_num_threads(),
                    "host_torch_threads": cfg.engine.torch_threads, "load_average": load_average(),
                    "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None},
        "device": device,
        "tolerance": TOLERANCE,
        "loop": {k: rows[0][k] for k in ("seconds_per_round", "client_updates_per_second", "peak_rss_mb")},
        "runs": {variant_name(r["vectorize"], r["preaggregate"], r["num_hosts"]): {
            k: v for k, v in r.items() if k not in ("workload", "runner", "round_seconds")} for r in rows[1:]},
        "ratios_rayfl_over_loop": {variant_name(r["vectorize"], r["preaggregate"], r["num_hosts"]): r["ratio_to_loop"]
                                   for r in rows[1:]},
        "all_same_model": all(r["max_abs_diff"] <= TOLERANCE and r["same_clients"] for r in rows[1:]),
    }
    write_result(out, summary, rows)
    return summary


def device_overrides(device: str, hosts: int) -> list[str]:
    """The engine settings that put `hosts` hosts on one shared GPU (none for the CPU)."""
    if device == "cpu":
        return []
    if device != "cuda":
        raise ValueError(f"--device must be cpu or cuda, not {device!r}")
    return ["engine.device=cuda", f"engine.num_gpus_per_host={1 / hosts!r}"]


def variant_name(vectorize: str, preaggregate: str, hosts: int) -> str:
    """e.g. `vectorize-on-2h`, or `vectorize-on-preagg-2h` with host pre-aggregation."""
    return f"vectorize-{vectorize}{'-preagg' if preaggregate == 'on' else ''}-{hosts}h"


def _start_ray(cfg: Any) -> bool:
    """Start (or join) Ray, retrying once: a busy machine may time its first start out."""
    from rayfl.runner import init_ray

    try:
        return init_ray(cfg)
    except Exception:
        import ray

        ray.shutdown()
        return init_ray(cfg)


def paired_row(pairs: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    """One variant's row from its (rayfl row, loop seconds per round) pairs: medians of the
    seconds, the median of the pairs' ratios (each of two back-to-back timings), the worst
    model difference; `ratios` keeps every pair's."""
    rows, loops = [r for r, _ in pairs], [s for _, s in pairs]
    ratios = [r["seconds_per_round"] / s for r, s in pairs]
    row = dict(rows[len(rows) // 2])
    seconds = float(np.median([r["seconds_per_round"] for r in rows]))
    row.update(seconds_per_round=seconds, client_updates_per_second=rows[0]["client_updates_per_second"]
               * rows[0]["seconds_per_round"] / seconds, peak_rss_mb=max(r["peak_rss_mb"] for r in rows),
               loop_seconds_per_round=float(np.median(loops)), ratio_to_loop=float(np.median(ratios)),
               ratios=[round(x, 4) for x in ratios], max_abs_diff=max(r["max_abs_diff"] for r in rows),
               same_clients=all(r["same_clients"] for r in rows))
    return row


def _rayfl_row(workload: str, cfg: Any, dataset: Any, loop: Any, vec: str, pre: str,
               hosts: int, device: str) -> dict[str, Any]:
    """One rayfl run; `loop` gives the reference model and clients."""
    from rayfl.results import load
    from rayfl.results.load import read_manifest
    from rayfl.runner import run_experiment

    feds: list[Any] = []
    with PeakMemory() as mem:
        outcome = run_experiment(cfg, dataset=dataset, on_start=lambda _dir, fed: feds.append(fed))
    final = np.asarray(feds[0].server_state.x)
    clients = load(outcome.run_dir).clients
    sampled = {int(r): sorted(int(c) for c in g["client"]) for r, g in clients.groupby("round")}
    seconds = round_seconds(outcome.run_dir)
    s = float(np.median(steady(seconds, 1, 1)))
    per_round = cfg.algorithm.clients_per_round
    hosts_seen = read_manifest(outcome.run_dir)["placement"]["hosts"]
    return {"workload": workload, "runner": "rayfl", "device": device, "vectorize": vec, "preaggregate": pre, "num_hosts": hosts,
            "seconds_per_round": s, "client_updates_per_second": per_round / s, "peak_rss_mb": mem.peak_mb,
            "max_abs_diff": float(np.max(np.abs(final - loop.final))),
            "same_clients": sampled == loop.sampled, "round_seconds": [round(float(v), 4) for v in seconds],
            "host_devices": [f"{i['device']} (CUDA_VISIBLE_DEVICES={i['cuda_visible_devices']})" for i in hosts_seen],
            "run_dir": str(outcome.run_dir)}
