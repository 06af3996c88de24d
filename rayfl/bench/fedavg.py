"""`rayfl bench WORKLOAD` for the workloads of `rayfl.bench.workloads`: rayfl against a plain
PyTorch loop doing the same client work (`fedavg-mlp`, `fedavg-linear`, `fedprox-mlp`,
`femnist-cnn`, `cifar-resnet`, `shakespeare-lstm`).

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

from rayfl.bench.common import (
    PeakMemory,
    load_average,
    processor_name,
    round_seconds,
    steady,
    write_result,
)
from rayfl.bench.reference import run_reference_loop
from rayfl.bench.workloads import workload, workload_config
from rayfl.engine.resources import available_cpus

__all__ = ["run_fedavg_bench", "workload_config"]

TOLERANCE = 1e-4  # max abs parameter difference after the run (float32 reduction order)
# A deep network amplifies float32 rounding: the float32 loop itself ends this far from its
# float64 twin. rayfl agrees with the loop when it is within TOLERANCE or within this many
# times the loop's own float32 error.
ROUNDING_FACTOR = 4.0


def run_fedavg_bench(
    name: str, rounds: int | None, out: Path, hosts: list[int] | None = None, vectorize: list[str] | None = None,
    loop_threads: int | None = 1, preaggregate: list[str] | None = None, device: str = "cpu", repeat: int = 1,
    overrides: list[str] | None = None, algorithms: list[str] | None = None,
) -> dict[str, Any]:
    """Time the loop and every (vectorize, hosts) variant of rayfl; see the module doc.
    `overrides` (`--set KEY=VALUE`) apply to every rayfl run, e.g. an engine setting to time
    against its default. `algorithms` ("NAME[,KEY=VALUE...]") are timed too, each under every
    variant, beside the workload's own algorithm: a user's extension of FedAvg against the
    built-in, in one invocation."""
    from rayfl.runner import build_dataset

    rounds = rounds or workload(name).rounds
    if rounds < 3:
        raise ValueError("--rounds must be >= 3 (round 0 and the last round are not timed)")
    if repeat < 1:
        raise ValueError("--repeat must be >= 1")
    if device == "cuda" and not torch.cuda.is_available():
        from rayfl.config import ConfigError

        raise ConfigError("--device", f"cuda asked, but torch {torch.__version__} sees no GPU here; use --device cpu")
    spec = workload(name)
    hosts, vectorize = hosts or list(spec.hosts), vectorize or list(spec.vectorize)
    preaggregate = preaggregate or list(spec.preaggregate)
    results_dir = out.parent / "results"
    overrides = list(overrides or [])
    cfg = workload_config(name, rounds)
    others = {label: keys for label, keys in map(algorithm_variant, algorithms or [])}
    workload_config(name, rounds, *overrides)  # a bad key or value: one line, before any timing
    for keys in others.values():
        workload_config(name, rounds, *overrides, *keys)
    t0 = time.perf_counter()
    # as `rayfl run` builds it: cached on disk, mapped by the hosts, not stored with each run
    dataset = build_dataset(cfg)
    data_seconds = time.perf_counter() - t0
    started = _start_ray(cfg)  # once, before any timing: every variant then finds it running
    try:
        with PeakMemory() as mem:
            loop = run_reference_loop(cfg, dataset, rounds, loop_threads, device)
        # the size of float32 rounding over this run: the same loop in float64
        rounding = float(np.max(np.abs(loop.final - run_reference_loop(cfg, dataset, rounds, loop_threads, device,
                                                                          torch.float64).final)))
        loop_s = float(np.median(steady(loop.round_seconds, 1, 1)))
        per_round = cfg.algorithm.clients_per_round
        rows = [{"workload": name, "runner": "loop", "device": device, "vectorize": None, "preaggregate": None, "num_hosts": None,
                 "seconds_per_round": loop_s, "client_updates_per_second": per_round / loop_s,
                 "peak_rss_mb": mem.peak_mb, "peak_process_mb": mem.peak_process_mb, "ratio_to_loop": 1.0,
                 "max_abs_diff": 0.0, "same_clients": True, "round_seconds": [round(s, 4) for s in loop.round_seconds]}]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for (label, keys), vec, pre, h in itertools.product([("", []), *others.items()], vectorize, preaggregate, hosts):
            variant = variant_name(vec, pre, h) + label
            pairs = []
            for i in range(repeat):
                run_cfg = workload_config(name, rounds, f"engine.vectorize={vec}", f"engine.num_hosts={h}",
                                          f"engine.preaggregate={pre}", f"output.dir={results_dir}",
                                          f"run.experiment=bench_{name}", f"run.run_id={variant}-{stamp}-{i}",
                                          *device_overrides(device, h), *overrides, *keys)
                # the loop again beside each run, before it and after it in turn (ABBA): a ratio of
                # back-to-back timings survives a machine whose speed drifts
                if i % 2 == 0:
                    again = run_reference_loop(cfg, dataset, rounds, loop_threads, device)
                row = _rayfl_row(name, run_cfg, dataset, loop, vec, pre, h, device, label)
                if i % 2 == 1:
                    again = run_reference_loop(cfg, dataset, rounds, loop_threads, device)
                pairs.append((row, float(np.median(steady(again.round_seconds, 1, 1))),
                              float(np.mean(steady(again.round_seconds, 1, 1)))))
            rows.append(paired_row(pairs))
    finally:
        if started:
            from rayfl.engine.local_ray import stop_ray

            stop_ray()
    alg = cfg.algorithm
    agree = max(TOLERANCE, ROUNDING_FACTOR * rounding)
    summary = {
        "workload": name, **workload(name).describe(),
        "algorithm": alg.name, "prox_mu": getattr(alg, "mu", 0.0),
        "clients_per_round": per_round, "local_epochs": alg.local_epochs, "batch_size": alg.batch_size, "lr": alg.lr,
        "rounds": rounds,
        "overrides": overrides,
        "timed_rounds": f"1..{rounds - 2} (median; round 0 is warm-up, round {rounds - 1} evaluates)",
        "repeat": repeat,
        "ratio": "rayfl / loop of the mean seconds over the timed rounds, each pair timed back to back"
                 + ("; the median over the repeats" if repeat > 1 else ""),
        "data_seconds": round(data_seconds, 3),
        "machine": {"cpus": available_cpus(), "platform": platform.platform(), "processor": processor_name(),
                    "torch": torch.__version__, "loop_torch_threads": loop_threads or torch.get_num_threads(),
                    "host_torch_threads": cfg.engine.torch_threads, "load_average": load_average(),
                    "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None},
        "date": time.strftime("%Y-%m-%d"),
        "device": device,
        "tolerance": TOLERANCE,
        "loop_float32_rounding": rounding,
        "agreement_bound": agree,
        "loop": {k: rows[0][k] for k in ("seconds_per_round", "client_updates_per_second", "peak_rss_mb", "peak_process_mb")},
        "runs": {row_variant(r): {k: v for k, v in r.items() if k not in ("workload", "runner", "round_seconds")}
                 for r in rows[1:]},
        "ratios_rayfl_over_loop": {row_variant(r): r["ratio_to_loop"] for r in rows[1:]},
        "speedups_loop_over_rayfl": {row_variant(r): round(1.0 / r["ratio_to_loop"], 3) for r in rows[1:]},
        **({"algorithms": {label.lstrip("-"): keys for label, keys in others.items()},
            "seconds_per_round_over_the_workloads_algorithm": {
                row_variant(r): round(r["seconds_per_round"] / base["seconds_per_round"], 3)
                for r in rows[1:] for base in rows[1:]
                if r["algorithm_label"] and row_variant(base) == row_variant(r).removesuffix(r["algorithm_label"])}}
           if others else {}),
        "all_same_model": all(r["max_abs_diff"] <= agree and r["same_clients"] for r in rows[1:]),
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


def algorithm_variant(spec: str) -> tuple[str, list[str]]:
    """`--algorithm NAME[,KEY=VALUE...]` as (the variants' suffix, its job keys)."""
    name, *keys = [part.strip() for part in spec.split(",")]
    if not name:
        raise ValueError(f"--algorithm {spec!r}: give a name or import path first")
    return f"-{name.rpartition(':')[2].lower()}", [f"algorithm.name={name}", *keys]


def row_variant(row: dict[str, Any]) -> str:
    """A rayfl row's variant: its engine settings, and the algorithm timed beside the workload's."""
    return variant_name(row["vectorize"], row["preaggregate"], row["num_hosts"]) + row.get("algorithm_label", "")


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


def paired_row(pairs: list[tuple[dict[str, Any], float, float]]) -> dict[str, Any]:
    """One variant's row from its (rayfl row, loop median, loop mean seconds per round) pairs:
    medians of the seconds, the median of the pairs' ratios, the worst model difference;
    `ratios` keeps every pair's. A pair's ratio is of the mean seconds over the same timed
    rounds, which run the same clients in both: rounds of unequal work (clients of unequal
    sizes) made a ratio of medians compare different rounds."""
    rows, loops = [p[0] for p in pairs], [p[1] for p in pairs]
    ratios = [r["mean_round_seconds"] / mean for r, _, mean in pairs]
    row = dict(rows[len(rows) // 2])
    seconds = float(np.median([r["seconds_per_round"] for r in rows]))
    row.update(seconds_per_round=seconds, client_updates_per_second=rows[0]["client_updates_per_second"]
               * rows[0]["seconds_per_round"] / seconds, peak_rss_mb=max(r["peak_rss_mb"] for r in rows),
               loop_seconds_per_round=float(np.median(loops)), ratio_to_loop=float(np.median(ratios)),
               peak_process_mb=max(r.get("peak_process_mb", 0.0) for r in rows),
               ratios=[round(x, 4) for x in ratios], max_abs_diff=max(r["max_abs_diff"] for r in rows),
               same_clients=all(r["same_clients"] for r in rows))
    return row


def _rayfl_row(name: str, cfg: Any, dataset: Any, loop: Any, vec: str, pre: str,
               hosts: int, device: str, label: str = "") -> dict[str, Any]:
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
    return {"workload": name, "runner": "rayfl", "algorithm": cfg.algorithm.name, "algorithm_label": label,
            "device": device, "vectorize": vec, "preaggregate": pre, "num_hosts": hosts,
            "seconds_per_round": s, "mean_round_seconds": float(np.mean(steady(seconds, 1, 1))),
            "client_updates_per_second": per_round / s, "peak_rss_mb": mem.peak_mb,
            "peak_process_mb": mem.peak_process_mb,
            "max_abs_diff": float(np.max(np.abs(final - loop.final))),
            "same_clients": sampled == loop.sampled, "round_seconds": [round(float(v), 4) for v in seconds],
            "host_devices": [f"{i['device']} (CUDA_VISIBLE_DEVICES={i['cuda_visible_devices']})" for i in hosts_seen],
            "run_dir": str(outcome.run_dir)}
