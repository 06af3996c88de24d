"""Callbacks that decide when a run has done enough: early stopping on a metric, a budget of
simulated or wall-clock time, and a checkpoint of the best global model seen."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rayfl.callbacks.base import Callback, RunInfo
from rayfl.config import CallbackConfig
from rayfl.errors import ConfigError


@dataclass
class MetricWatch(CallbackConfig):
    """A metric of the `rounds` table to watch."""

    # a `rounds` column: test_accuracy, test_loss, train_loss, ... (evaluation columns exist
    # only on rounds that evaluate: run.eval_every)
    metric: str = "test_accuracy"
    # max: higher is better (accuracy); min: lower is better (loss)
    mode: Literal["max", "min"] = "max"
    # an improvement must beat the best so far by more than this
    min_delta: float = 0.0

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.metric, str) or not self.metric:
            raise ConfigError("callbacks.metric", "must name a rounds column, e.g. test_accuracy")
        if self.mode not in ("max", "min"):
            raise ConfigError("callbacks.mode", f"unknown {self.mode!r}; allowed: max, min")
        if not (isinstance(self.min_delta, (int, float)) and self.min_delta >= 0):
            raise ConfigError("callbacks.min_delta", f"must be >= 0, got {self.min_delta!r}")


@dataclass
class EarlyStoppingConfig(MetricWatch):
    """Stop when `metric` has not improved for `patience` evaluations in a row."""

    name: str = "early_stopping"
    # how many rows carrying the metric may pass without an improvement
    patience: int = 5

    def validate(self) -> None:
        super().validate()
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ConfigError("callbacks.patience", f"must be an integer >= 1, got {self.patience!r}")


@dataclass
class BestCheckpointConfig(MetricWatch):
    """Keep the global model of the best `metric` so far as `best_model.npz` in the run."""

    name: str = "best_checkpoint"


@dataclass
class BudgetConfig(CallbackConfig):
    """Stop once the run has used a budget of simulated or wall-clock seconds."""

    name: str = "budget"
    # simulated seconds (the `rounds` column sim_time); null: no limit
    sim_time: float | None = None
    # wall-clock seconds since the run (or its resumption) started; null: no limit
    wall_time: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.sim_time is None and self.wall_time is None:
            raise ConfigError("callbacks.sim_time", "set sim_time or wall_time (seconds)")
        for key in ("sim_time", "wall_time"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"callbacks.{key}", f"must be > 0, got {value!r}")


class _Best:
    """The best value of a metric so far, and whether a new one beats it."""

    def __init__(self, cfg: MetricWatch):
        self.cfg = cfg
        self.best: float | None = None
        self.best_round: int | None = None
        self.seen = False

    def read(self, row: Mapping[str, Any]) -> float | None:
        """The row's finite value of the metric; a typo'd metric fails at the first evaluation."""
        value = row.get(self.cfg.metric)
        if value is None:
            if not self.seen and any(str(k).startswith("test_") for k in row):
                columns = ", ".join(sorted(k for k in row if isinstance(row[k], (int, float))))
                raise ConfigError("callbacks.metric", f"{self.cfg.metric!r} is not a rounds column; numeric ones: {columns}")
            return None
        self.seen = True
        value = float(value)
        return value if math.isfinite(value) else None

    def improves(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.cfg.mode == "max":
            return value > self.best + self.cfg.min_delta
        return value < self.best - self.cfg.min_delta

    def take(self, value: float, round: int) -> None:
        self.best, self.best_round = value, round

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "best_round": self.best_round, "seen": self.seen}

    def load(self, state: Mapping[str, Any]) -> None:
        self.best, self.best_round, self.seen = state.get("best"), state.get("best_round"), state.get("seen", False)


class EarlyStopping(Callback):
    """Stops after `patience` rows with the metric and no improvement on the best."""

    def __init__(self, cfg: EarlyStoppingConfig):
        self.cfg = cfg
        self.watch = _Best(cfg)
        self.waited = 0

    def on_round(self, row: Mapping[str, Any], run: RunInfo) -> str | None:
        value = self.watch.read(row)
        if value is None:
            return None
        if self.watch.improves(value):
            self.watch.take(value, int(row["round"]))
            self.waited = 0
            return None
        self.waited += 1
        if self.waited >= self.cfg.patience:
            return (f"early stopping: {self.cfg.metric} did not improve for {self.waited} evaluations "
                    f"(best {self.watch.best:.6g} at round {self.watch.best_round})")
        return None

    def state_dict(self) -> dict[str, Any]:
        return {**self.watch.state(), "waited": self.waited}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.watch.load(state)
        self.waited = int(state.get("waited", 0))


class BestCheckpoint(Callback):
    """Writes `best_model.npz` (params, round, metric, value) whenever the metric improves."""

    FILE = "best_model.npz"

    def __init__(self, cfg: BestCheckpointConfig):
        self.cfg = cfg
        self.watch = _Best(cfg)

    def on_round(self, row: Mapping[str, Any], run: RunInfo) -> str | None:
        value = self.watch.read(row)
        if value is None or not self.watch.improves(value):
            return None
        params = run.global_params()
        if params is None:
            raise ConfigError("callbacks.name", "best_checkpoint needs a global model: this algorithm's server state has no `x`")
        self.watch.take(value, int(row["round"]))
        if run.save is not None:
            buf = io.BytesIO()
            np.savez(buf, params=np.asarray(params), round=int(row["round"]), value=value, metric=self.cfg.metric)
            run.save(self.FILE, buf.getvalue())
        return None

    def state_dict(self) -> dict[str, Any]:
        return self.watch.state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.watch.load(state)


class Budget(Callback):
    """Stops at the first round that ends past the simulated or wall-clock budget."""

    def __init__(self, cfg: BudgetConfig):
        self.cfg = cfg

    def on_round(self, row: Mapping[str, Any], run: RunInfo) -> str | None:
        if self.cfg.sim_time is not None and float(row.get("sim_time", 0.0)) >= self.cfg.sim_time:
            return f"budget: simulated time {row['sim_time']:.6g} s reached the limit {self.cfg.sim_time:g} s"
        if self.cfg.wall_time is not None and float(row.get("wall_time", 0.0)) >= self.cfg.wall_time:
            return f"budget: wall time {row['wall_time']:.1f} s reached the limit {self.cfg.wall_time:g} s"
        return None


def early_stopping(cfg: EarlyStoppingConfig) -> EarlyStopping:
    return EarlyStopping(cfg)


def best_checkpoint(cfg: BestCheckpointConfig) -> BestCheckpoint:
    return BestCheckpoint(cfg)


def budget(cfg: BudgetConfig) -> Budget:
    return Budget(cfg)
