"""One experiment from a validated config to a finished run directory.

Order matters: validate the config and load the data (cheap, and where most mistakes show)
before Ray starts; open the RunWriter before the first round so a crash mid-run still leaves a
manifest and every flushed Parquet part on disk."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfl.algorithms import ALGORITHMS
from rayfl.config import Config
from rayfl.data import FederatedDataset, build_federated_dataset
from rayfl.engine import Federation
from rayfl.results import RunWriter

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class RunOutcome:
    run_dir: Path
    summary: dict[str, Any]
    wall_seconds: float


def default_run_id(cfg: Config) -> str:
    return f"{cfg.algorithm.name}-s{cfg.run.seed}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def init_ray(cfg: Config) -> bool:
    """Connect to `engine.address` / RAY_ADDRESS, or start a local Ray. Returns True when this
    call started Ray (and so should shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    address = cfg.engine.address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local" always starts a fresh instance, never attaching to whatever cluster
        # /tmp/ray/ray_current_cluster last pointed at.
        ray.init(address="local", include_dashboard=False, **kwargs)
    return True


def run_experiment(
    cfg: Config,
    progress: ProgressFn | None = None,
    dataset: FederatedDataset | None = None,
    on_start: Callable[[Path, Federation], None] | None = None,
) -> RunOutcome:
    """Run `cfg` to completion and return where its results are."""
    import ray

    algorithm = ALGORITHMS[cfg.algorithm.name]
    if dataset is None:
        dataset = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    started_ray = init_ray(cfg)
    t0 = time.perf_counter()
    run_id = cfg.run.run_id or default_run_id(cfg)
    manifest = {
        "config": cfg.to_dict(),
        "seed": cfg.run.seed,
        "dataset": {
            "name": dataset.name,
            "num_clients": dataset.num_clients,
            "train_samples": int(len(dataset.train_y)),
            "test_samples": int(len(dataset.test_y)),
            "server_samples": 0 if dataset.server_train is None else int(len(dataset.server_train)),
        },
        "ray": {"address": ray.get_runtime_context().gcs_address, "resources": ray.cluster_resources()},
    }
    fed = None
    try:
        with RunWriter(Path(cfg.output.dir), cfg.run.experiment, run_id, manifest) as writer:
            fed = Federation(cfg, dataset, writer=writer, progress=progress)
            writer.update_manifest(
                placement={"num_hosts": fed.placement.num_hosts, "hosts": fed.host_info},
                num_params=fed.num_params,
            )
            if on_start is not None:
                on_start(writer.run_dir, fed)
            summary = algorithm.run(fed, cfg.algorithm, cfg.run)
            summary = {k: v for k, v in summary.items() if k != "final_params"}
            summary.update(sim_time=fed.now, wall_seconds=time.perf_counter() - t0)
            writer.close("completed", summary=summary)
            return RunOutcome(writer.run_dir, summary, time.perf_counter() - t0)
    finally:
        if fed is not None:
            fed.shutdown()
        if started_ray:
            ray.shutdown()
