"""Experiment trackers as callbacks: TensorBoard and MLflow mirror a run's `rounds` and
global-model `evals` rows, so a dashboard shows exactly what the Parquet results hold.

Both import their tracker lazily (`import rayfl.callbacks.trackers` works without them) and
say a missing package as one `ConfigError` at `on_run_start`, before the first round. Only
finite numbers are logged: None, NaN, infinities and strings are skipped (MLflow would clamp an
infinity to the largest float, which reads as a real value). A resumed run restores its state
(`load_state_dict`) before `on_run_start`, and carries on in the same log directory or MLflow
run."""

from __future__ import annotations

import json
import math
import numbers
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfl.callbacks.base import Callback, RunInfo
from rayfl.config import CallbackConfig, ConfigError

INSTALL_HINT = "pip install 'rayfl[trackers]'"

# Columns never logged as metrics: `round` is the step; an `evals` row's identity columns and
# clocks repeat what its round already says under `rounds/`.
ROUND_SKIP = frozenset({"round"})
EVAL_SKIP = frozenset({"round", "client", "split", "sim_time", "wall_time"})


def scalars(row: Mapping[str, Any], skip: frozenset[str]) -> Iterator[tuple[str, float]]:
    """The row's finite numeric columns, as floats (bools count as 0/1)."""
    for key, value in row.items():
        if key in skip or isinstance(value, str) or not isinstance(value, numbers.Real):
            continue
        value = float(value)
        if math.isfinite(value):
            yield str(key), value


def is_global_eval(row: Mapping[str, Any]) -> bool:
    """Whether an `evals` row scores the global model (client -1). Per-client (personalized)
    rows are not tracked: with thousands of clients they would flood the tracker with one
    series per client; they stay in the `evals` table for analysis."""
    client = row.get("client", -1)
    return client is None or int(client) == -1


def config_text(config: Mapping[str, Any]) -> str:
    """The job as YAML (the form job files are written in), via JSON so that tuples, paths and
    other non-YAML values print as plain lists and strings."""
    import yaml

    plain = json.loads(json.dumps(config, default=str))
    return yaml.safe_dump(plain, sort_keys=False)


# ------------------------------------------------------------------------------ TensorBoard


@dataclass
class TensorBoardConfig(CallbackConfig):
    """Settings of the `tensorboard` callback."""

    name: str = "tensorboard"
    # Where event files go; null: `<run dir>/tensorboard` (then a run whose results go to an
    # object store must set it). A resumed run appends new event files to the same directory.
    log_dir: str | None = None
    # Write buffered events to disk at least this often (wall seconds): what a killed run loses.
    flush_secs: float = 30.0

    def validate(self) -> None:
        super().validate()
        if self.log_dir is not None and (not isinstance(self.log_dir, str) or not self.log_dir):
            raise ConfigError("callbacks.log_dir", "must be a directory path (or null: <run dir>/tensorboard)")
        if not self.flush_secs > 0:
            raise ConfigError("callbacks.flush_secs", f"must be > 0, got {self.flush_secs}")


class TensorBoard(Callback):
    """Scalars `rounds/<column>` per round and `evals/<split>/<column>` per global evaluation,
    step = round, plus the job as text."""

    def __init__(self, cfg: TensorBoardConfig):
        self.cfg = cfg
        self.writer: Any = None
        self.log_dir: Path | None = None
        # First round not yet logged; from a checkpoint, where a resumed run starts again.
        self.next_round: int | None = None

    def on_run_start(self, run: RunInfo) -> None:
        if self.cfg.log_dir is None and run.run_dir is None:
            raise ConfigError(
                "callbacks.log_dir",
                "the run has no local directory (results go to an object store); set a log_dir",
            )
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("callbacks.name", f"tensorboard is not installed; {INSTALL_HINT}") from None
        self.log_dir = Path(self.cfg.log_dir).expanduser() if self.cfg.log_dir else Path(run.run_dir) / "tensorboard"
        # On resume, a SessionLog START at the checkpoint's round makes TensorBoard's reader
        # drop what the crashed run logged after it, so re-run rounds are not shown twice.
        purge = self.next_round if run.resumed else None
        self.writer = SummaryWriter(str(self.log_dir), flush_secs=int(max(1, self.cfg.flush_secs)), purge_step=purge)
        self.writer.add_text("config", "```\n" + config_text(run.config) + "```", global_step=purge or 0)

    def on_round(self, row: Mapping[str, Any], run: RunInfo) -> str | None:
        step = int(row["round"])
        for key, value in scalars(row, ROUND_SKIP):
            self.writer.add_scalar(f"rounds/{key}", value, global_step=step)
        self.next_round = step + 1
        return None

    def on_eval(self, row: Mapping[str, Any], run: RunInfo) -> None:
        if not is_global_eval(row):
            return
        split = row.get("split") or "eval"
        for key, value in scalars(row, EVAL_SKIP):
            self.writer.add_scalar(f"evals/{split}/{key}", value, global_step=int(row["round"]))

    def on_run_end(self, status: str, run: RunInfo) -> None:
        if self.writer is not None:
            self.writer.close()  # flushes
            self.writer = None

    def state_dict(self) -> dict[str, Any]:
        if self.writer is not None:
            self.writer.flush()  # a checkpoint's rounds are on disk
        return {"next_round": self.next_round}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.next_round = state.get("next_round")


def tensorboard(cfg: TensorBoardConfig) -> TensorBoard:
    """The registry's factory for `name: tensorboard`."""
    return TensorBoard(cfg)


# ----------------------------------------------------------------------------------- MLflow

# MLflow's limits: a batch holds at most 100 params and 1000 entities in all; keys are at most
# 250 characters; param values at most 6000 (MAX_PARAM_VAL_LENGTH; longer ones are cut).
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
MAX_KEY_LENGTH = 250
MAX_PARAM_LENGTH = 6000

# A rayfl run's end -> the MLflow run status (anything else: FAILED).
END_STATUS = {"completed": "FINISHED", "stopped_early": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


@dataclass
class MLflowConfig(CallbackConfig):
    """Settings of the `mlflow` callback."""

    name: str = "mlflow"
    # Where runs are tracked: `http://host:port` of a tracking server, or any MLflow store URI;
    # null: a SQLite store `sqlite:///<run dir>/mlflow.db` (MLflow 3 refuses a plain `file:`
    # store unless MLFLOW_ALLOW_FILE_STORE=true; `mlflow ui --backend-store-uri` opens it).
    tracking_uri: str | None = None
    # The MLflow experiment (created when missing).
    experiment: str = "rayfl"
    # The MLflow run's name; null: the rayfl run id. A resumed run carries on in the same MLflow
    # run, sending no step a metric already has (rounds run again after the checkpoint).
    run_name: str | None = None
    # Send buffered metrics at least this often (wall seconds; 0: after every row), so a fast
    # run makes one request per batch of rounds rather than one per round.
    flush_secs: float = 5.0

    def validate(self) -> None:
        super().validate()
        for key in ("tracking_uri", "run_name"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"callbacks.{key}", "must be a non-empty string (or null)")
        if not isinstance(self.experiment, str) or not self.experiment:
            raise ConfigError("callbacks.experiment", "must be a non-empty experiment name")
        if not self.flush_secs >= 0:
            raise ConfigError("callbacks.flush_secs", f"must be >= 0, got {self.flush_secs}")


def mlflow_key(key: str) -> str:
    """`key` as a name MLflow accepts: letters, digits, `_-. /` only, no empty, `.` or `..`
    path segments (MLflow may store names as files), at most 250 characters."""
    key = re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)
    parts = [p if p not in (".", "..") else "_" for p in key.split("/") if p]
    return "/".join(parts)[:MAX_KEY_LENGTH] or "_"


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The nested job config as `section.key` -> string (lists and nulls as JSON)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, name + "."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[mlflow_key(name)] = text[:MAX_PARAM_LENGTH]
    return out


def reachable(uri: str, timeout: float = 10.0) -> None:
    """Fail fast on a tracking server that does not answer: MLflow's own client retries a
    refused connection with backoff for minutes. Any HTTP answer (even 401/404) will do."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError("callbacks.tracking_uri", f"no MLflow tracking server answers at {uri}: {reason}") from None


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class MLflow(Callback):
    """Metrics per round (step = round) in one MLflow run per rayfl run, through the
    `MlflowClient` API: no global `mlflow.start_run` state, so two runs in one process (a
    sweep's trials) never write into each other's MLflow run."""

    def __init__(self, cfg: MLflowConfig):
        self.cfg = cfg
        self.client: Any = None
        self.run_id: str | None = None
        self.pending: list[Any] = []
        self.last_flush = 0.0
        # On resume, the last step each metric already has: a run killed after its checkpoint
        # may have sent rounds that its resume runs again (the same values: replay is exact),
        # and MLflow cannot delete a point, so those are not sent twice.
        self.logged_through: dict[str, int] = {}

    def on_run_start(self, run: RunInfo) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError("callbacks.name", f"mlflow is not installed; {INSTALL_HINT}") from None
        uri = self.cfg.tracking_uri
        if uri is None:
            if run.run_dir is None:
                raise ConfigError(
                    "callbacks.tracking_uri",
                    "the run has no local directory (results go to an object store); set a tracking_uri",
                )
            uri = f"sqlite:///{Path(run.run_dir).resolve() / 'mlflow.db'}"
        reachable(uri)
        try:
            self.client = MlflowClient(uri)
            if self.run_id is not None:
                self.client.get_run(self.run_id)  # the checkpoint's MLflow run must exist here
                self.client.update_run(self.run_id, status="RUNNING")
                data = self.client.get_run(self.run_id).data
                logged = set(data.params)
                self.logged_through = {key: max((m.step for m in self.client.get_metric_history(self.run_id, key)),
                                                default=-1) for key in data.metrics}
            else:
                self.run_id = self.create_run(run)
                logged = set()
        except Exception as e:  # MlflowException, connection errors: said in one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError("callbacks.tracking_uri", f"MLflow at {uri}: {first}") from None
        self.log_params(flat_params(run.config), skip=logged)
        self.last_flush = time.monotonic()

    def create_run(self, run: RunInfo) -> str:
        """A new MLflow run in the configured experiment (created when missing)."""
        client, name = self.client, self.cfg.experiment
        exp = client.get_experiment_by_name(name)
        if exp is None:
            try:
                exp_id = client.create_experiment(name)
            except Exception:  # created meanwhile by a parallel run
                exp = client.get_experiment_by_name(name)
                if exp is None:
                    raise
                exp_id = exp.experiment_id
        else:
            exp_id = exp.experiment_id
        tags = {"rayfl.run_id": run.run_id, "rayfl.run_dir": str(run.run_dir) if run.run_dir else ""}
        created = client.create_run(exp_id, tags=tags, run_name=self.cfg.run_name or run.run_id)
        return created.info.run_id

    def log_params(self, params: dict[str, str], skip: set[str]) -> None:
        """The job's params; a resumed run logs only new keys (MLflow refuses to change a
        logged param, e.g. `run.rounds` raised by `rayfl resume --rounds`)."""
        from mlflow.entities import Param

        todo = [Param(k, v) for k, v in params.items() if k not in skip]
        for batch in chunks(todo, PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch)

    def add(self, prefix: str, row: Mapping[str, Any], skip: frozenset[str]) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(row["round"])
        for k, v in scalars(row, skip):
            key = mlflow_key(prefix + k)
            if step > self.logged_through.get(key, -1):
                self.pending.append(Metric(key, v, now, step))
        if time.monotonic() - self.last_flush >= self.cfg.flush_secs or len(self.pending) >= METRICS_PER_BATCH:
            self.flush()

    def flush(self) -> None:
        for batch in chunks(self.pending, METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch)
        self.pending = []
        self.last_flush = time.monotonic()

    def on_round(self, row: Mapping[str, Any], run: RunInfo) -> str | None:
        self.add("", row, ROUND_SKIP)
        return None

    def on_eval(self, row: Mapping[str, Any], run: RunInfo) -> None:
        if is_global_eval(row):
            self.add(f"evals.{row.get('split') or 'eval'}.", row, EVAL_SKIP)

    def on_run_end(self, status: str, run: RunInfo) -> None:
        if self.client is None or self.run_id is None:
            return
        self.flush()
        self.client.set_terminated(self.run_id, END_STATUS.get(status, "FAILED"))

    def state_dict(self) -> dict[str, Any]:
        if self.client is not None and self.run_id is not None:
            self.flush()  # a checkpoint's rounds are in MLflow
        return {"mlflow_run_id": self.run_id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.run_id = state.get("mlflow_run_id")


def mlflow_tracker(cfg: MLflowConfig) -> MLflow:
    """The registry's factory for `name: mlflow`."""
    return MLflow(cfg)
