"""`rayfl sweep`: a job times a grid times seeds, one rayfl run per trial.

This module plans and checks a sweep (its trials' configs, validated before Ray starts; their
run ids; the resources each trial's hosts need) and owns what a trial does. The trials run on
warm slots (rayfl.sweep_slots), or, with `scheduler: asha`, as Ray Tune trials, which Tune's
scheduler stops early. Every trial is an ordinary rayfl run written to
`<output.dir>/<sweep name>/<run_id>/`, so `rayfl.results.load(<output.dir>/<sweep name>)` and
`rayfl report` read a sweep like any experiment; `sweep.json` beside the runs lists the trials
(and, for ASHA, Tune's own state lives in `_tune`, which run discovery skips: no manifest.json).

A trial's run id is built from its grid settings and seed (`lr=0.1,alpha=1,s0`), so a rerun of
the same sweep finds each trial's run again: a `completed` run is never run twice, and one
with a checkpoint (stopped, killed, failed) continues from it with `resume_experiment`.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rayfl.config import (
    Config,
    ConfigError,
    absolute_local_paths,
    apply_override,
    config_from_dict,
    read_job_file,
)
from rayfl.registry import Plugins, searching
from rayfl.results.storage import Location, is_uri

SWEEP_KEYS = ("grid", "seeds", "name", "max_concurrent", "max_failures", "scheduler", "metric", "mode")
SCHEDULERS = ("fifo", "asha")
TUNE_DIR = "_tune"  # Tune's experiment state, beside the runs in the sweep directory
SPEC_FILE = "sweep.json"  # the trials of a sweep, to refuse resuming it with another grid
# How long a stopped trial (ASHA) may take to checkpoint and close its run before Tune
# removes the trial's actor (and with it the run's hosts).
STOP_GRACE_S = 120.0


@dataclass
class SweepSpec:
    """What the `sweep:` block of a job and the `rayfl sweep` flags declare."""

    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] | None = None
    name: str | None = None
    max_concurrent: int | None = None
    max_failures: int = 0
    scheduler: str = "fifo"
    metric: str = "test_accuracy"
    mode: str = "max"


@dataclass
class Trial:
    """One trial: its run id, the settings that make it (grid values and seed) and its full
    config, validated, as the raw mapping `config_from_dict` reads."""

    run_id: str
    settings: dict[str, Any]
    seed: int
    raw: dict[str, Any]
    bundles: list[dict[str, float]]


# ---------------------------------------------------------------------------- reading a job


def read_job(path: str | Path | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A job file's sections without its `sweep:` block, and that block (None when absent).
    The config loader knows nothing of sweeps, so the block is split off before it sees the job."""
    if path is None:
        return {}, None
    raw = read_job_file(path)
    block = raw.pop("sweep", None)
    if block is not None and not isinstance(block, Mapping):
        raise ConfigError("sweep", "must be a mapping with keys " + str(list(SWEEP_KEYS)))
    return raw, dict(block) if block is not None else None


def load_base_config(path: str | Path | None, overrides: Sequence[str] = ()) -> tuple[Config, bool]:
    """The job's own config, its `sweep:` block set aside (so `rayfl run` on a sweep job runs
    the base job), and whether there was such a block."""
    raw, block = read_job(path)
    for item in overrides:
        apply_override(raw, item)
    with searching(job_dir(path)):
        return config_from_dict(raw), block is not None


def job_dir(path: str | Path | None) -> Path | None:
    """The job file's directory, searched for the modules its import paths name."""
    return Path(path).absolute().parent if path is not None else None


def parse_values(key: str, text: str) -> list[Any]:
    """`0.01,0.1` (or a YAML list `[0.01, 0.1]`) to a list of YAML-parsed values."""
    try:
        parsed = yaml.safe_load(text)
        values = parsed if isinstance(parsed, list) else [yaml.safe_load(v) for v in text.split(",")]
    except yaml.YAMLError as e:
        raise ConfigError(key, f"cannot parse values {text!r}") from e
    if not values:
        raise ConfigError(key, "needs at least one value")
    return values


def build_spec(
    block: Mapping[str, Any] | None,
    grid_args: Sequence[str] = (),
    seeds: str | None = None,
    **flags: Any,
) -> SweepSpec:
    """The sweep the job's `sweep:` block declares, with the command line's flags on top
    (`--grid KEY=...` replaces that key's values; other flags replace the block's)."""
    block = dict(block or {})
    unknown = sorted(set(block) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"sweep.{unknown[0]}", f"unknown key; allowed keys are {list(SWEEP_KEYS)}")
    grid_raw = block.get("grid") or {}
    if not isinstance(grid_raw, Mapping):
        raise ConfigError("sweep.grid", "must map section.key to a list of values")
    grid: dict[str, list[Any]] = {}
    for key, values in grid_raw.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ConfigError(f"sweep.grid.{key}", "needs at least one value")
        grid[str(key)] = values
    for item in grid_args:
        key, sep, text = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(item, "a grid must look like section.key=v1,v2")
        grid[key.strip()] = parse_values(key.strip(), text)
    spec = SweepSpec(grid=grid)
    for name in ("name", "max_concurrent", "max_failures", "scheduler", "metric", "mode"):
        value = flags.get(name)
        value = block.get(name) if value is None else value
        if value is not None:
            setattr(spec, name, value)
    seed_values: Any = parse_values("sweep.seeds", seeds) if seeds is not None else block.get("seeds")
    if seed_values is not None:
        if not isinstance(seed_values, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seed_values
        ):
            raise ConfigError("sweep.seeds", f"must be a list of integers >= 0, got {seed_values!r}")
        if len(set(seed_values)) != len(seed_values):
            raise ConfigError("sweep.seeds", f"has a repeated seed: {seed_values}")
        spec.seeds = list(seed_values)
    _check_spec(spec)
    return spec


def _check_spec(spec: SweepSpec) -> None:
    if spec.scheduler not in SCHEDULERS:
        raise ConfigError("sweep.scheduler", f"got {spec.scheduler!r}; allowed values are {list(SCHEDULERS)}")
    if spec.mode not in ("max", "min"):
        raise ConfigError("sweep.mode", f"got {spec.mode!r}; allowed values are ['max', 'min']")
    if spec.max_concurrent is not None and (not isinstance(spec.max_concurrent, int) or spec.max_concurrent < 1):
        raise ConfigError("sweep.max_concurrent", f"must be an integer >= 1, got {spec.max_concurrent!r}")
    if not isinstance(spec.max_failures, int) or spec.max_failures < -1:
        raise ConfigError("sweep.max_failures", f"must be an integer >= -1 (-1: retry forever), got {spec.max_failures!r}")
    if spec.name is not None and (not isinstance(spec.name, str) or not spec.name or "/" in spec.name
                                  or spec.name.startswith(("_", "."))):
        raise ConfigError("sweep.name", f"must be a name without '/' not starting with '_' or '.', got {spec.name!r}")
    for key in spec.grid:
        if key in ("run.seed", "run.run_id", "run.experiment", "output.dir"):
            raise ConfigError(f"sweep.grid.{key}", "is set by the sweep itself (use --seeds for seeds)")


# ---------------------------------------------------------------------------- the trials


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """`algorithm.lr` -> `lr`, unless two grid keys end alike (then the dotted key stays)."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def run_id_for(settings: Mapping[str, Any], seed: int) -> str:
    """A deterministic run id from a trial's settings and seed, e.g. `lr=0.1,alpha=1,s0`."""
    names = _short_names(list(settings))
    text = ",".join([f"{names[k]}={_fmt(v)}" for k, v in settings.items()] + [f"s{seed}"])
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)


def client_count(cfg: Config) -> int:
    """A trial's number of clients: from its config, or (a dataset's own clients, which only
    the data know) from its dataset, built here once (a trial builds it again, or reads the
    dataset cache)."""
    planned = cfg.planned_clients()
    if planned is not None:
        return planned
    from rayfl.runner import build_dataset

    return build_dataset(cfg).num_clients


def trial_bundles(cfg: Config, cluster: Mapping[str, float], concurrency: int) -> tuple[int, list[dict[str, float]]]:
    """The host count a trial's Federation will start and the placement-group bundles that
    reserve them: an empty head bundle for the trial's driver (it mostly waits on its hosts)
    and one (num_cpus_per_host, num_gpus_per_host) bundle per host. An `auto` host count is
    planned, with rayfl's own placement logic, on a `concurrency`-th of the cluster so that
    that many trials fit side by side."""
    from rayfl.engine.placement import plan_placement

    share = {k: v / concurrency for k, v in cluster.items()}
    placement = plan_placement(cfg.engine, client_count(cfg), share)
    host: dict[str, float] = {}
    if placement.num_cpus > 0:
        host["CPU"] = placement.num_cpus
    if placement.num_gpus > 0:
        host["GPU"] = placement.num_gpus
    bundles: list[dict[str, float]] = [{"CPU": 0}]
    bundles += [dict(host) for _ in range(placement.num_hosts)] if host else [{"CPU": 0.01}]
    return placement.num_hosts, bundles


def plan_trials(
    base: Mapping[str, Any],
    overrides: Sequence[str],
    spec: SweepSpec,
    output_dir: str,
    name: str,
) -> list[Trial]:
    """Every trial's config, built and validated before any trial starts: a bad grid value
    fails here, naming its key."""
    keys = list(spec.grid)
    combos = list(itertools.product(*(spec.grid[k] for k in keys))) or [()]
    trials: list[Trial] = []
    seen: dict[str, dict[str, Any]] = {}
    for combo in combos:
        settings = dict(zip(keys, combo, strict=True))
        base_raw = json.loads(json.dumps(base))  # a deep copy of plain YAML data
        for item in overrides:
            apply_override(base_raw, item)
        seeds = spec.seeds if spec.seeds is not None else [int((base_raw.get("run") or {}).get("seed", 0))]
        for seed in seeds:
            raw = json.loads(json.dumps(base_raw))
            for key, value in settings.items():
                apply_override(raw, f"{key}={json.dumps(value)}")
            absolute_local_paths(raw)
            run_id = run_id_for(settings, seed)
            for key, value in {"run.seed": seed, "run.run_id": run_id, "run.experiment": name,
                               "output.dir": output_dir}.items():
                apply_override(raw, f"{key}={json.dumps(value)}")
            try:
                cfg = config_from_dict(raw)
            except ConfigError as e:
                where = ", ".join(f"{k}={_fmt(v)}" for k, v in settings.items()) or "the base job"
                raise ConfigError(e.key, f"{str(e).split(': ', 1)[-1]} (trial {where}, seed {seed})") from e
            if run_id in seen:
                raise ConfigError("sweep.grid", f"two trials get run id {run_id!r}: {seen[run_id]} and {settings}")
            seen[run_id] = settings
            trials.append(Trial(run_id, settings, seed, cfg.to_dict(), []))
    return trials


def reserve(trials: Sequence[Trial], cluster: Mapping[str, float], concurrency: int) -> None:
    """Give each trial its placement-group bundles; an `auto` host count is pinned into the
    trial's config (`engine.num_hosts`) so its Federation starts exactly the hosts reserved."""
    for t in trials:
        cfg = config_from_dict(t.raw)
        hosts, t.bundles = trial_bundles(cfg, cluster, concurrency)
        if cfg.engine.num_hosts is None and cfg.engine.clients_per_host == "auto":
            t.raw["engine"]["num_hosts"] = hosts


def check_fits(trials: Sequence[Trial]) -> None:
    """Fail now, not after Tune waits for ever, when a trial's hosts cannot fit the cluster."""
    from rayfl.engine.resources import check_cluster

    for t in trials:
        cfg = config_from_dict(t.raw)
        try:
            check_cluster(cfg.engine, client_count(cfg))
        except ConfigError as e:
            raise ConfigError(e.key, f"{str(e).split(': ', 1)[-1]} (trial {t.run_id})") from e


# ---------------------------------------------------------------------------- inside a trial


def _finite_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in row.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[k] = float(v) if isinstance(v, float) else v
    return out


_done = threading.Event()  # cleared while this worker's trial runs; set once it closed its run
_done.set()


def run_trial(config: dict[str, Any]) -> None:
    """The Tune function trainable (ASHA sweeps): one rayfl run, reporting every round to Tune.

    When Tune stops the trial, `tune.report` raises SystemExit: the run then checkpoints after
    the round, closes as `interrupted` with `sweep_stopped` in its manifest, and can be resumed
    later."""
    from ray import tune

    from rayfl.engine.runlog import RunInterrupted

    _done.clear()
    try:
        raw = config["trial"]
        config["plugins"].install(f"the Tune trial's node {_node_ip()}")
        cfg = config_from_dict(raw)
        last: dict[str, Any] = {}
        fed_ref: list[Any] = []
        stopped = [False]

        def progress(row: dict[str, Any]) -> None:
            last.update(_finite_metrics(row))  # metrics carry over rounds without an evaluation
            try:
                tune.report(dict(last))
            except SystemExit:  # Tune stopped the trial: end the run cleanly after this round
                if int(row.get("round", -1)) + 1 >= cfg.run.rounds:
                    return  # the last round (a scheduler's max_t): the run completes anyway
                stopped[0] = True
                runlog = fed_ref[0].runlog
                if runlog.writer is not None:
                    runlog.writer.update_manifest(sweep_stopped="stopped by the Tune scheduler")
                runlog.stop_requested = True

        def on_start(_: Any, fed: Any) -> None:
            fed_ref.append(fed)
            if fed.runlog.writer is not None:
                fed.runlog.writer.update_manifest(sweep={**config.get("sweep", {}), **placement_groups(fed)})

        try:
            done = run_or_resume(raw, progress=progress, on_start=on_start)
        except RunInterrupted:
            if not stopped[0]:
                raise
            return
        if done is not None:
            tune.report({**_finite_metrics(done.get("summary") or {}), "run_status": "completed", "reused": True})
    finally:
        _done.set()


def trial_dir(raw: Mapping[str, Any]) -> Location:
    """Where a trial's run lives: <output.dir>/<sweep name>/<run_id>."""
    return Location.parse(raw["output"]["dir"]).child(raw["run"]["experiment"], raw["run"]["run_id"] or "")


def run_or_resume(raw: dict[str, Any], progress: Any = None, on_start: Any = None,
                  dataset: Any = None) -> dict[str, Any] | None:
    """A trial's run: a `completed` one is left alone (its manifest is returned), one that holds
    a checkpoint is resumed, any other leftover (a first attempt that failed before its first
    checkpoint) starts over; None once it ran. `dataset`: the trial's data, built already."""
    from rayfl.engine.checkpoint import has_checkpoint
    from rayfl.runner import resume_experiment, run_experiment

    run_dir = trial_dir(raw)
    manifest = _manifest(run_dir)
    status = manifest.get("status") if manifest is not None else None
    if status == "completed":
        return manifest
    if status is not None and has_checkpoint(run_dir):
        resume_experiment(run_dir.name, progress=progress, on_start=on_start)
        return None
    if status is not None:  # a failed first attempt without a checkpoint
        raw = {**raw, "output": {**raw["output"], "overwrite": True}}
    run_experiment(config_from_dict(raw), progress=progress, on_start=on_start, dataset=dataset)
    return None


def _placement_group_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_placement_group_id()


def placement_groups(fed: Any) -> dict[str, Any]:
    """The placement group this trial runs in and the one each of its hosts landed in: the
    record that the trial's hosts live in (are reserved by) the trial's own group."""
    import ray

    hosts = ray.get([h.__ray_call__.remote(lambda _self: _placement_group_id()) for h in fed.hosts])
    return {"placement_group": _placement_group_id(), "host_placement_groups": hosts}


def wait_for_trial(timeout: float) -> bool:
    """Wait until this worker's trial closed its run (a module function, so the trainable class
    Tune pickles refers to it by name instead of carrying the event)."""
    return _done.wait(timeout)


def _trainable_class(configs: Mapping[str, dict[str, Any]]) -> type:
    """`run_trial` as a Tune function trainable. Tune's config holds only the run id (what its
    progress table shows); the trial's full config rides on the class. Its cleanup waits (up to
    STOP_GRACE_S) for the run to close: Tune removes a stopped trial's actor right after `stop`,
    which would otherwise kill the run mid-checkpoint and leave its manifest saying `running`."""
    from ray.tune.trainable.function_trainable import wrap_function

    base = wrap_function(run_trial, name="rayfl_trial")

    class RayflTrial(base):  # type: ignore[misc, valid-type]
        CONFIGS = dict(configs)

        def _trainable_func(self, config: dict[str, Any]) -> Any:
            return super()._trainable_func({**config, **self.CONFIGS[config["run_id"]]})

        def cleanup(self) -> None:
            try:
                super().cleanup()
            finally:
                wait_for_trial(STOP_GRACE_S)

    RayflTrial.__name__ = RayflTrial.__qualname__ = "rayfl_trial"
    return RayflTrial


class TrialResources:
    """Tune's per-trial resources: a placement group of the trial's bundles. A class (not a
    closure) so Tune can pickle it with its experiment state."""

    def __init__(self, bundles: Mapping[str, list[dict[str, float]]]):
        self.bundles = dict(bundles)

    def __call__(self, config: Mapping[str, Any]) -> Any:
        from ray import tune

        return tune.PlacementGroupFactory(self.bundles[config["run_id"]])


# ---------------------------------------------------------------------------- the sweep


@dataclass
class SweepOutcome:
    sweep_dir: str
    trials: list[Trial]
    statuses: dict[str, str | None]  # run id -> manifest status
    errors: list[str]
    restored: bool


def sweep_name(spec: SweepSpec, base: Mapping[str, Any], job: str | Path | None) -> str:
    """`--name`, else the block's `name`, else the job's run.experiment plus `_sweep`."""
    if spec.name:
        return spec.name
    experiment = (base.get("run") or {}).get("experiment") or (Path(job).stem if job else "default")
    return f"{experiment}_sweep"


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def absolute_dir(output_dir: str) -> str:
    """output.dir made absolute: Tune runs each trial in its own working directory."""
    return output_dir if is_uri(output_dir) else str(Path(output_dir).expanduser().resolve())


def run_sweep(
    job: str | Path | None,
    overrides: Sequence[str] = (),
    grid: Sequence[str] = (),
    seeds: str | None = None,
    address: str | None = None,
    verbose: int = 1,
    **flags: Any,
) -> SweepOutcome:
    """Plan, validate and run (or resume) a sweep; return every trial's run status."""
    from rayfl.engine.local_ray import fork_workers_here, stop_ray
    from rayfl.runner import init_ray

    base, block = read_job(job)
    spec = build_spec(block, grid, seeds, **flags)
    probe = json.loads(json.dumps(base))
    for item in overrides:
        apply_override(probe, item)
    if address:
        apply_override(probe, f"engine.address={address}")
    with searching(job_dir(job)):
        base_cfg = config_from_dict(probe)  # the base job itself must be valid
        name = sweep_name(spec, probe, job)
        out_dir = absolute_dir(base_cfg.output.dir)
        all_overrides = [*overrides, *([f"engine.address={address}"] if address else [])]
        trials = plan_trials(base, all_overrides, spec, out_dir, name)  # before Ray starts
    fork_workers_here()  # an early head's workers: forked from this process, before it imports Ray
    import ray

    started = init_ray(base_cfg)
    try:
        cluster = {k: float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        if spec.scheduler != "fifo":
            reserve(trials, cluster, spec.max_concurrent or 1)
        check_fits(trials)
        sweep_dir = Location.parse(out_dir).child(name)
        if spec.scheduler == "fifo":
            with searching(job_dir(job)):
                return _run_fifo(trials, spec, sweep_dir, name, cluster, verbose)
        from ray import tune  # ASHA's trials: Tune's

        _record_spec(sweep_dir, trials)
        tune_path = sweep_dir.child(TUNE_DIR)
        trainable = tune.with_resources(
            _trainable_class({t.run_id: trial_payload(name, t) for t in trials}), TrialResources({t.run_id: t.bundles for t in trials}))
        restored = tune.Tuner.can_restore(str(tune_path.name))
        if restored:
            tuner = tune.Tuner.restore(
                str(tune_path.name), trainable, resume_unfinished=True, resume_errored=True
            )
        else:
            scheduler = None
            if spec.scheduler == "asha":
                from ray.tune.schedulers import ASHAScheduler

                rounds = max(int(t.raw["run"]["rounds"]) for t in trials)
                scheduler = ASHAScheduler(time_attr="training_iteration", max_t=rounds, grace_period=1)
            tuner = tune.Tuner(
                trainable,
                param_space={"run_id": tune.grid_search([t.run_id for t in trials])},
                tune_config=tune.TuneConfig(
                    max_concurrent_trials=spec.max_concurrent,
                    scheduler=scheduler,
                    metric=spec.metric if scheduler is not None else None,
                    mode=spec.mode if scheduler is not None else None,
                    reuse_actors=False,
                    trial_name_creator=_trial_name,
                    trial_dirname_creator=_trial_name,
                ),
                run_config=tune.RunConfig(
                    name=TUNE_DIR,
                    storage_path=str(sweep_dir.name),
                    failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                    verbose=verbose,
                ),
            )
        grid_result = tuner.fit()
        errors = [
            f"{_trial_name_of(r)}: {_last_line(r.error)}" for r in grid_result if r.error is not None
        ]
        statuses = {t.run_id: _status(sweep_dir.child(t.run_id)) for t in trials}
        return SweepOutcome(str(sweep_dir.name), trials, statuses, errors, restored)
    finally:
        if started:
            stop_ray()


def _run_fifo(trials: list[Trial], spec: SweepSpec, sweep_dir: Location, name: str, cluster: dict[str, float],
              verbose: int) -> SweepOutcome:
    """The trials on warm slots (rayfl.sweep_slots); a stop asked for ends the sweep with
    RunInterrupted once every running trial has checkpointed."""
    from rayfl.engine.runlog import RunInterrupted
    from rayfl.sweep_slots import dataset_builder, run_on_slots

    restored = sweep_dir.child(SPEC_FILE).is_file()
    _record_spec(sweep_dir, trials)
    done = run_on_slots(trials, name, cluster, spec.max_concurrent, spec.max_failures, dataset_builder, verbose)
    if done.interrupted:
        raise RunInterrupted(f"the sweep stopped; run the same command again to resume it ({sweep_dir})")
    statuses = {t.run_id: _status(sweep_dir.child(t.run_id)) for t in trials}
    errors = [f"{run_id}: {error}" for run_id, error in done.errors.items()]
    return SweepOutcome(str(sweep_dir.name), trials, statuses, errors, restored)


def trial_payload(name: str, trial: Trial) -> dict[str, Any]:
    """What a trial's function receives beside its run id: its config and, for its manifest,
    the sweep it belongs to and the settings that make it."""
    plugins = Plugins.of(config_from_dict(trial.raw))
    return {"trial": trial.raw, "sweep": {"name": name, "settings": trial.settings, "seed": trial.seed}, "plugins": plugins}


def _trial_name(trial: Any) -> str:
    return str(trial.config["run_id"])


def _trial_name_of(result: Any) -> str:
    try:
        return str(result.config["run_id"])
    except (KeyError, TypeError):
        return "trial"


def _last_line(error: BaseException) -> str:
    """A trial's error in one line: the exception Tune wrapped, not its remote traceback."""
    cause = getattr(error, "cause", None) or error
    return " ".join(f"{type(cause).__name__}: {cause}".split())[:300]


def _manifest(run_dir: Location) -> dict[str, Any] | None:
    """A trial's run manifest, None before its run started."""
    manifest = run_dir.child("manifest.json")
    return json.loads(manifest.read_bytes()) if manifest.is_file() else None


def _status(run_dir: Location) -> str | None:
    manifest = _manifest(run_dir)
    return manifest.get("status") if manifest is not None else None


def _record_spec(sweep_dir: Location, trials: Sequence[Trial]) -> None:
    """Write the sweep's trials to `sweep.json`, or check them against the recorded ones: a
    rerun under the same name must be the same sweep, or Tune would resume the old grid."""
    from rayfl.results.storage import put_bytes

    where = sweep_dir.child(SPEC_FILE)
    recorded = [{"run_id": t.run_id, "seed": t.seed, "settings": t.settings, "config": t.raw} for t in trials]
    if where.is_file():
        old = json.loads(where.read_bytes())
        old_ids = [t["run_id"] for t in old.get("trials", [])]
        new_ids = [t.run_id for t in trials]
        if old_ids != new_ids or [t["config"] for t in old["trials"]] != [t.raw for t in trials]:
            raise ConfigError(
                "sweep.name",
                f"sweep {posixpath_name(sweep_dir)!r} already exists at {sweep_dir} with other trials; "
                "rerun it unchanged to resume it, or give another --name",
            )
        return
    data = json.dumps({"trials": recorded}, indent=1, default=str).encode()
    if isinstance(where.name, Path):
        where.name.parent.mkdir(parents=True, exist_ok=True)
        where.name.write_bytes(data)
    else:
        put_bytes(sweep_dir.fs, where.path, data)


def posixpath_name(where: Location) -> str:
    return where.path.rstrip("/").rsplit("/", 1)[-1]
