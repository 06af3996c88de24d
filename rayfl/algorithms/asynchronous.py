"""FedAsync and FedBuff: asynchronous FL on the simulated clock.

Clients train from whatever model version they downloaded; the server applies their updates in
the simulated order they arrive (the AsyncPool guarantees that order while running tasks in
parallel), weighting each by its staleness: the number of model versions applied between the
client's download and the moment its update is used."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from rayfl.algorithms.fedavg import FedAvgConfig, fedavg_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.algorithms.rounds import check_finite, evaluate_if_due
from rayfl.config import ConfigError, RunConfig
from rayfl.engine import AsyncPool, ClientResult, Federation


@dataclass
class AsyncConfig(FedAvgConfig):
    """Shared by the asynchronous algorithms. `concurrency` clients train at any time;
    staleness weight s(t): `constant` 1, `polynomial` (1 + t)^-a, `hinge` 1 for t <= b else
    1 / (a (t - b) + 1) (Xie et al. 2019, section 5.2). Updates staler than `max_staleness`
    are discarded (bounded staleness; null keeps all). `run.rounds` counts server updates."""

    uploads: ClassVar[tuple[str, ...]] = ()  # each arrival is applied alone: nothing to aggregate
    asynchronous: ClassVar[bool] = True  # no sampling a privacy accountant could assume

    # Clients training at any time (>= 1): a finished one is replaced by a new idle client at once.
    concurrency: int = 10
    # The weight s(t) of an update t server steps stale: constant 1, polynomial (1 + t)^-a, hinge (1
    # for t <= b, else 1 / (a (t - b) + 1)).
    staleness: Literal["constant", "polynomial", "hinge"] = "polynomial"
    # a of the polynomial and hinge staleness weights (>= 0).
    staleness_a: float = 0.5
    # b of the hinge staleness weight (>= 0): the staleness kept at full weight.
    staleness_b: float = 4.0
    # Discard updates staler than this many server steps; null: keep all.
    max_staleness: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.local_schedule is not None or self.server_as_client:
            bad = "local_schedule" if self.local_schedule is not None else "server_as_client"
            raise ConfigError(f"algorithm.{bad}", "is not supported by the asynchronous algorithms")
        if self.concurrency < 1:
            raise ConfigError("algorithm.concurrency", f"must be >= 1, got {self.concurrency}")
        if self.staleness_a < 0 or self.staleness_b < 0:
            raise ConfigError("algorithm.staleness_a", "staleness_a and staleness_b must be >= 0")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError("algorithm.max_staleness", "must be >= 0 or null")


@dataclass
class FedAsyncConfig(AsyncConfig):
    """FedAsync (Xie, Koyejo, Gupta 2019, Alg. 1): on each arrival
    x <- (1 - a_t) x + a_t x_client with a_t = mixing * s(staleness). The paper uses mixing in
    [0.5, 0.9] and polynomial a = 0.5."""

    name: str = "fedasync"
    # The mixing weight of an arrival, in (0, 1]: x <- (1 - a_t) x + a_t x_client with a_t = mixing
    # * s(staleness); the paper uses 0.5-0.9.
    mixing: float = 0.6

    def validate(self) -> None:
        super().validate()
        if not 0 < self.mixing <= 1:
            raise ConfigError("algorithm.mixing", f"must be in (0, 1], got {self.mixing}")


@dataclass
class FedBuffConfig(AsyncConfig):
    """FedBuff (Nguyen et al., AISTATS 2022, Alg. 1): the server buffers `buffer_size` client
    deltas, each scaled by s(staleness) (the paper: 1 / sqrt(1 + t), i.e. polynomial a = 0.5),
    and then steps x <- x + server_lr * (sum of scaled deltas) / buffer_size. The paper uses
    K = 10 with concurrency 100-1000."""

    uploads: ClassVar[tuple[str, ...]] = ("delta",)  # the buffer is a weighted sum of them

    name: str = "fedbuff"
    # K, client deltas buffered per server step (>= 1): x <- x + server_lr * (sum of
    # staleness-scaled deltas) / K.
    buffer_size: int = 10

    def validate(self) -> None:
        super().validate()
        if self.buffer_size < 1:
            raise ConfigError("algorithm.buffer_size", f"must be >= 1, got {self.buffer_size}")


def staleness_weight(cfg: AsyncConfig, staleness: int) -> float:
    t = float(staleness)
    if cfg.staleness == "constant":
        return 1.0
    if cfg.staleness == "polynomial":
        return (1.0 + t) ** (-cfg.staleness_a)
    if t <= cfg.staleness_b:
        return 1.0
    return 1.0 / (cfg.staleness_a * (t - cfg.staleness_b) + 1.0)


def promised_samples(schedule: LocalSchedule, n: int) -> int:
    """Gradient samples local SGD is certain to process: lets the pool run tasks in parallel."""
    if n == 0:
        return 0
    if schedule.epochs is not None:
        return schedule.epochs * n
    return (schedule.steps or 0) * min(schedule.batch_size, n)


@dataclass
class AsyncState:
    """What an asynchronous server carries between steps: the global model, the versions
    clients in flight downloaded (until their updates arrive), and how many picks were drawn.
    The tasks in flight themselves are the Federation's pool, checkpointed with it."""

    x: np.ndarray
    models: dict[int, np.ndarray] = field(default_factory=dict)
    picks: int = 0


class Dispatcher:
    """Keeps `concurrency` clients training, each from the model version current at dispatch,
    and remembers those versions until their last update has arrived."""

    def __init__(self, fed: Federation, cfg: AsyncConfig, s: AsyncState):
        self.fed, self.cfg, self.s = fed, cfg, s
        self.pool: AsyncPool = fed.async_pool()
        offset = cfg.lr_offset if cfg.lr_schedule == "harmonic" else None
        self.schedule = LocalSchedule(cfg.batch_size, cfg.local_epochs, cfg.local_steps, offset)
        self.sizes = fed.client_sizes

    def refill(self, x: np.ndarray) -> None:
        self.s.models[self.fed.model_version] = x
        while len(self.pool) < self.cfg.concurrency:
            client = self.fed.sample_idle(self.pool.busy_clients, key=self.s.picks)
            self.s.picks += 1
            if client is None:
                break
            self.pool.submit(
                client, fedavg_client, params=x, lr=self.cfg.lr, schedule=self.schedule,
                weight_decay=self.cfg.weight_decay, prox_mu=0.0,
                min_backward_samples=promised_samples(self.schedule, int(self.sizes[client])), keep=type(self.cfg).uploads,
            )

    def next_update(self, x: np.ndarray) -> ClientResult:
        """The next usable arrival (failed and too-stale tasks are logged and skipped)."""
        while True:
            self.refill(x)
            res = self.pool.next(max_staleness=self.cfg.max_staleness)
            if res.ok:
                return res

    def downloaded(self, res: ClientResult) -> np.ndarray:
        return self.s.models[res.version]

    def forget_old_versions(self) -> None:
        live = {r.version for r in self.pool.in_flight()} | {self.fed.model_version}
        self.s.models = {v: m for v, m in self.s.models.items() if v in live}


def run_fedasync(fed: Federation, cfg: FedAsyncConfig, run: RunConfig) -> dict[str, Any]:
    s = fed.track(AsyncState(x=fed.initial_params()))
    disp = Dispatcher(fed, cfg, s)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        res = disp.next_update(s.x)
        x_client = disp.downloaded(res) + res["delta"]
        alpha = cfg.mixing * staleness_weight(cfg, res.staleness)
        s.x = ((1.0 - alpha) * s.x.astype(np.float64) + alpha * x_client.astype(np.float64)).astype(np.float32)
        check_finite(s.x, r)
        fed.advance_version()
        disp.forget_old_versions()
        metrics = {"train_loss": float(res["loss"]), "num_updates": 1, "staleness_mean": float(res.staleness), "mixing": alpha}
        metrics.update(evaluate_if_due(fed, s.x, r, run))
        fed.log_round(r, **metrics)
    disp.pool.drain()
    return {"final_params": s.x, **metrics}


def run_fedbuff(fed: Federation, cfg: FedBuffConfig, run: RunConfig) -> dict[str, Any]:
    s = fed.track(AsyncState(x=fed.initial_params()))
    disp = Dispatcher(fed, cfg, s)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        buffer = [disp.next_update(s.x) for _ in range(cfg.buffer_size)]
        step = fed.weighted_sum(buffer, "delta", [staleness_weight(cfg, res.staleness) / cfg.buffer_size for res in buffer])
        s.x = (s.x + cfg.server_lr * step).astype(np.float32)
        check_finite(s.x, r)
        fed.advance_version()
        disp.forget_old_versions()
        metrics = {
            "train_loss": float(np.mean([res["loss"] for res in buffer])),
            "num_updates": len(buffer),
            "staleness_mean": float(np.mean([res.staleness for res in buffer])),
            "staleness_max": int(max(res.staleness for res in buffer)),
        }
        metrics.update(evaluate_if_due(fed, s.x, r, run))
        fed.log_round(r, **metrics)
    disp.pool.drain()
    return {"final_params": s.x, **metrics}
