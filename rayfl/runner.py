"""One experiment from a validated config to a finished run directory.

Order matters: validate the config and load the data (cheap, and where most mistakes show)
before the run joins Ray (`rayfl run` starts its local one meanwhile: rayfl.engine.local_ray);
open the RunWriter before the first round so a crash mid-run still leaves a manifest and every
flushed Parquet part on disk."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfl.callbacks.base import Callback
from rayfl.config import Config, ConfigError, absolute_local_paths, config_from_manifest
from rayfl.data import FederatedDataset, build_federated_dataset
from rayfl.data.stored import STORED_FILE, dataset_bytes, dataset_from_bytes
from rayfl.driver import drive
from rayfl.engine import Federation
from rayfl.engine.checkpoint import Checkpoint, load_checkpoint, resolver_for
from rayfl.engine.local_ray import (
    discard_head,
    refuses_without_token,
    start_local_ray,
    stop_ray,
    unreachable,
)
from rayfl.engine.placement import Placement
from rayfl.engine.resources import check_cluster, check_local_cluster
from rayfl.progress import mark
from rayfl.registry import Plugins, add_root
from rayfl.results import RunWriter
from rayfl.results.storage import Location, RunDir, is_uri, run_manifest, write_atomically
from rayfl.user_code import found_in, write_log

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class RunOutcome:
    run_dir: RunDir  # a Path for a local output.dir, the run's URI for a remote one
    summary: dict[str, Any]
    wall_seconds: float
    final_params: Any = None  # the server loop's final global model (a flat vector), if it returned one
    config: Config | None = None
    dataset: Any = None


def default_run_id(cfg: Config) -> str:
    """<algorithm>-s<seed>-<time>-<pid>; an import path's attribute names the algorithm."""
    algorithm = cfg.algorithm.name.rpartition(":")[2]
    return f"{algorithm}-s{cfg.run.seed}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


# Set by Ray's job supervisor (ray 2.60: dashboard/modules/job/job_supervisor.py) in the
# environment of every `ray job submit` entrypoint; it holds the job's runtime_env and metadata.
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def relative_output_in_job_warning(output_dir: str) -> str | None:
    """The warning for a relative `output.dir` in a submitted Ray job, or None if it is fine.

    The job's driver runs in Ray's temporary copy of `--working-dir` on the head node, which
    is deleted with the session: results written there are not where the user looks."""
    job = os.environ.get(RAY_JOB_ENV)
    if job is None or is_uri(output_dir) or Path(output_dir).expanduser().is_absolute():
        return None
    try:
        spec = json.loads(job)
        submission = spec.get("metadata", {}).get("job_submission_id")
        copied = bool(spec.get("runtime_env", {}).get("working_dir"))
    except (ValueError, AttributeError):
        submission, copied = None, True
    where = "Ray's temporary copy of --working-dir" if copied else "the job driver's working directory"
    return (
        f"rayfl: output.dir={output_dir!r} is relative inside Ray job {submission or '(unknown)'}: "
        f"results land in {Path(output_dir).absolute()}, {where} on the head node; "
        "use an absolute shared path or an s3:// URI"
    )


def init_ray(cfg: Config) -> bool:
    """Connect to `engine.address` / RAY_ADDRESS, or start a local Ray. Returns True when this
    call started Ray (and so should shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if (joined := check_address(cfg)) is not None:
        field, address = joined
        discard_head()  # started early for a local run; the config names a Ray to join instead
        hint = ("a head with token auth needs RAY_AUTH_MODE=token and its token: `ray get-auth-token` on the "
                "head's machine prints it, give it here as RAY_AUTH_TOKEN or in ~/.ray/auth_token")
        if refuses_without_token(address):
            raise ConfigError(field, f"cannot join the Ray at {address!r}: it requires a token; {hint}")
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as e:  # its token auth refused us, or it went away meanwhile
            raise ConfigError(field, f"cannot join the Ray at {address!r}; {hint}: {' '.join(str(e).split())}") from None
    else:
        start_local_ray(**kwargs)
    return True


def check_before_ray(cfg: Config, num_clients: int | None, run_id: str | None = None) -> None:
    """The mistakes a run can be told about before it joins Ray: a run id already taken (for a
    new run), and, for a local Ray the run will start, hosts that cannot fit this machine or
    GPUs it does not have. Both are checked again later; these only say it sooner. `rayfl run`
    checks before it builds the data (`num_clients` from the config, None if only the data
    know), the runner again once they are built."""
    import ray

    if run_id is not None:
        RunWriter.check_free(cfg.output.dir, cfg.run.experiment, run_id, cfg.output.overwrite)
    if not ray.is_initialized() and check_address(cfg) is None:
        check_local_cluster(cfg.engine, num_clients)


def check_address(cfg: Config) -> tuple[str, str] | None:
    """The Ray to join, as (the setting that named it, address), or None for a local Ray;
    raises a one-line ConfigError at once when nothing answers there (`ray.init` would wait
    a minute and more first)."""
    if cfg.engine.address:
        field, address = "engine.address", cfg.engine.address
    elif os.environ.get("RAY_ADDRESS"):
        field, address = "RAY_ADDRESS", os.environ["RAY_ADDRESS"]
    else:
        return None
    if (why := unreachable(address)) is not None:
        raise ConfigError(field, why)
    return field, address


def build_dataset(cfg: Config) -> FederatedDataset:
    """The run's dataset, built with BLAS on one thread. The generators make many small matrix
    products (a synthetic client's labels are argmax(x W^T + b): 75 x 784 by 784 x 10), for
    which OpenBLAS's thread pool costs more than it brings, and far more on a busy machine,
    where its threads spin waiting for each other: 1,000 synthetic clients took 9 s on 2 busy
    cores, 2 s on one thread. The data are the same: OpenBLAS splits a product by blocks of
    the output, each computed alike whatever the number of threads."""
    from threadpoolctl import threadpool_limits

    from rayfl.data.cache import cached_build

    with threadpool_limits(1, user_api="blas"):
        # A rerun of the same config loads the built dataset from disk (rayfl.data.cache).
        dataset = cached_build(
            cfg.data, cfg.partition, cfg.run.seed,
            lambda: build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed),
        )
    dataset.from_config = True  # a resumed run builds it again
    return dataset


def check_model(cfg: Config, dataset: FederatedDataset) -> None:
    """Build the model once for the dataset's inputs and run it on a zero batch, before Ray
    starts: a factory that fails, returns something else than an nn.Module or keeps buffers,
    and a network that does not take the data's inputs or does not output one score per
    class, is a one-line ConfigError now, naming the model and the data's shape, not a
    failure of every host."""
    import torch

    from rayfl.models import build_model

    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    shape, classes = tuple(dataset.input_shape), dataset.num_classes
    data = f"dataset {dataset.name!r}: inputs of shape {shape}, {classes} classes"
    try:
        with torch.no_grad():
            out = model.eval()(torch.zeros((2, *shape)))
    except Exception as e:  # the user's network: any error its forward raises is the mismatch
        raise ConfigError("model.name", f"{cfg.model.name} does not take the data's inputs ({data}): "
                                        f"{type(e).__name__}: {' '.join(str(e).split())}") from None
    if not isinstance(out, torch.Tensor) or out.ndim < 2 or out.shape[0] != 2 or out.shape[-1] != classes:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError("model.name", f"{cfg.model.name} gives outputs of shape {got} for a batch of 2, not one "
                                        f"score per class ({data})")


def check_privacy_budget(cfg: Config, dataset: FederatedDataset) -> None:
    """The noise a private run will use, and whether its planned epsilon stays under
    `privacy.max_epsilon`: a one-line error before Ray starts and before a run directory exists."""
    if cfg.privacy.on:
        from rayfl.pipeline.server import resolve_noise

        resolve_noise(cfg, int(dataset.num_trainable))


def train_samples(dataset: Any) -> int | None:
    """The dataset's training rows; a lazy population counts its own (None where counting
    would cost seconds before the first round)."""
    return dataset.train_samples if hasattr(dataset, "train_samples") else int(len(dataset.train_y))


def check_dataset_object(dataset: Any) -> None:
    """A dataset handed in from Python (not built from the config) is stored with the run so
    `rayfl resume` can continue it: it must be a FederatedDataset with row arrays."""
    if not getattr(dataset, "from_config", False) and not isinstance(dataset, FederatedDataset):
        raise ConfigError("dataset", f"a dataset handed in from Python must be a rayfl.data.FederatedDataset (it is stored "
                          f"with the run, for resume), not a {type(dataset).__name__}")


def run_experiment(
    cfg: Config,
    progress: ProgressFn | None = None,
    dataset: FederatedDataset | None = None,
    on_start: Callable[[RunDir, Federation], None] | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunOutcome:
    """Run `cfg` to completion and return where its results are. `callbacks`: objects run
    after the job's own `callbacks:` (rayfl.callbacks)."""
    import ray

    if (warning := relative_output_in_job_warning(cfg.output.dir)) is not None:
        logging.getLogger(__name__).warning(warning)
    if dataset is None:
        dataset = build_dataset(cfg)
    handed_in = not getattr(dataset, "from_config", False)  # stored with the run, for resume
    check_dataset_object(dataset)
    check_model(cfg, dataset)
    check_privacy_budget(cfg, dataset)
    run_id = cfg.run.run_id or default_run_id(cfg)
    check_before_ray(cfg, dataset.num_clients, run_id)
    started_ray = init_ray(cfg)
    mark("ray_init")
    try:
        manifest = {
            "config": cfg.to_dict(),
            "seed": cfg.run.seed,
            "dataset": {
                "name": dataset.name,
                "num_clients": dataset.num_clients,
                "train_samples": train_samples(dataset),
                "test_samples": int(len(dataset.test_y)),
                "server_samples": 0 if dataset.server_train is None else int(len(dataset.server_train)),
                "empty_clients": [int(c) for c in dataset.empty_clients()],
                **({"stored": STORED_FILE} if handed_in else {}),
            },
            "plugins": Plugins.of(cfg).to_manifest(),
            "cwd": os.getcwd(),  # where relative paths in the config were meant (for resume)
            "ray": {"address": ray.get_runtime_context().gcs_address, "resources": ray.cluster_resources()},
        }
        placement = check_cluster(cfg.engine, dataset.num_clients)  # before a run directory exists
        writer = RunWriter(
            cfg.output.dir, cfg.run.experiment, run_id, manifest, overwrite=cfg.output.overwrite, **cfg.output.writer_options()
        )
        if handed_in:
            write_atomically(Location.parse(writer.run_dir).child(STORED_FILE), dataset_bytes(dataset))
        return _execute(cfg, dataset, placement, writer, None, progress, on_start, callbacks)
    finally:
        if started_ray:
            stop_ray()
            mark("ray_shutdown")


def resume_experiment(
    run_dir: str | Path,
    progress: ProgressFn | None = None,
    on_start: Callable[[RunDir, Federation], None] | None = None,
    callbacks: Sequence[Callback] = (),
    trust_pickle: bool = False,
) -> RunOutcome:
    """Continue a stopped, killed or failed run from its last checkpoint, in its own directory:
    rows written after the checkpoint are dropped and produced again, so the finished tables
    equal an uninterrupted run's. Without a checkpoint the run starts over from round 0.
    `trust_pickle`: read an older rayfl's pickle checkpoint (pickle runs the code it holds)."""
    location, manifest = run_manifest(run_dir)
    if manifest.get("status") == "completed":
        raise ConfigError("run_dir", f"{location} is already completed; nothing to resume")
    for root in manifest.get("plugins", {}).get("roots", []):  # where the run's own code was found
        if Path(root).is_dir():
            add_root(root)
    recorded = json.loads(json.dumps(manifest["config"]))
    if manifest.get("cwd"):
        absolute_local_paths(recorded, manifest["cwd"])
    cfg = config_from_manifest(recorded)
    ckpt = load_checkpoint(location, resolver_for(cfg), trust_pickle)
    stored = manifest.get("dataset", {}).get("stored")
    dataset = dataset_from_bytes(location.child(stored).read_bytes()) if stored else build_dataset(cfg)
    check_before_ray(cfg, dataset.num_clients)
    started_ray = init_ray(cfg)
    try:
        placement = check_cluster(cfg.engine, dataset.num_clients)
        writer = RunWriter.reopen(location.name, ckpt.parts if ckpt is not None else {}, **cfg.output.writer_options())
        return _execute(cfg, dataset, placement, writer, ckpt, progress, on_start, callbacks)
    finally:
        if started_ray:
            stop_ray()


def resume_target(run_dir: str | Path) -> int:
    """How many rounds the run in `run_dir` has in all (for a progress bar)."""
    location, manifest = run_manifest(run_dir)
    try:
        return int(manifest["config"]["run"]["rounds"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError("run_dir", f"{location}'s manifest names no run.rounds ({e})") from e


def _execute(
    cfg: Config,
    dataset: FederatedDataset,
    placement: Placement,
    writer: RunWriter,
    resume: Checkpoint | None,
    progress: ProgressFn | None,
    on_start: Callable[[RunDir, Federation], None] | None,
    callbacks: Sequence[Callback] = (),
) -> RunOutcome:
    """The run itself, between an open writer and a closed one. SIGTERM and Ctrl-C ask it to
    stop after the current round, with a checkpoint; a second one stops it at once."""
    from rayfl.registry import ALGORITHMS

    run_algorithm = ALGORITHMS.get(cfg.algorithm.name).load()
    t0 = time.perf_counter()
    fed = None
    status = "failed"
    try:
        with writer, StopSignals() as stop:
            mark("writer_open")
            try:
                fed = Federation(cfg, dataset, writer=writer, progress=progress, resume=resume, callbacks=callbacks,
                                 placement=placement)
            except ConfigError:  # bad input the hosts found at their start: the run never began
                if resume is None:
                    writer.discard()
                raise
            mark("hosts_ready")
            stop.federation = fed
            writer.update_manifest(
                placement={"num_hosts": fed.placement.num_hosts, "hosts": fed.hosts.info},
                num_params=fed.num_params,
                **({"pipeline": fed.pipeline.manifest()} if fed.pipeline is not None else {}),
            )
            if on_start is not None:
                on_start(writer.run_dir, fed)
            summary = drive(fed, run_algorithm, cfg.algorithm, cfg.run)
            if not isinstance(summary, dict):
                raise TypeError(f"the server loop of {cfg.algorithm.name!r} returned a {type(summary).__name__}, not a dict")
            final_params = summary.get("final_params")
            summary = {k: v for k, v in summary.items() if k != "final_params"}
            summary.update(
                sim_time=fed.now, wall_seconds=time.perf_counter() - t0, tasks_issued=fed.tasks_issued,
                tasks_discarded=fed.tasks_discarded, host_failures=fed.hosts.failures,
            )
            if fed.runlog.stopped_early is not None:
                summary["stopped_early"] = fed.runlog.stopped_early
            mark("rounds_done")
            writer.close("completed", summary=summary)
            status = "completed" if fed.runlog.stopped_early is None else "stopped_early"
            mark("writer_closed")
            return RunOutcome(writer.run_dir, summary, time.perf_counter() - t0, final_params, cfg, dataset)
    except KeyboardInterrupt:  # a stop asked for (RunInterrupted) or Ctrl-C twice
        status = "interrupted"
        raise
    except Exception as e:  # the whole traceback beside the results; the CLI tells a user's own error short
        if isinstance(writer.run_dir, Path):
            text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            if (users := found_in(e)) is not None and users.full not in text:  # a host's: where it was raised
                text = f"{users.full}\nOn the driver:\n{text}"
            log = write_log(str(writer.run_dir), text)
            with contextlib.suppress(AttributeError):
                e.rayfl_error_log = log
        raise
    finally:
        if fed is not None:
            fed.shutdown()
            mark("hosts_stopped")
            fed.runlog.callbacks.end(status)


class StopSignals:
    """While a run is going, SIGTERM (`kill`, `ray job stop`) and SIGINT (Ctrl-C) ask the
    Federation to checkpoint after the current round and stop; a second signal stops at once.
    Only the main thread can install handlers; elsewhere the defaults stay."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.federation: Federation | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        fed = self.federation
        if fed is None or fed.runlog.stop_requested:
            raise KeyboardInterrupt(f"signal {signum}")
        fed.runlog.stop_requested = True
        print(
            f"rayfl: {signal.Signals(signum).name}: stopping after this round with a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
