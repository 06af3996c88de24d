"""FedAsync and FedBuff: asynchronous FL on the simulated clock.

Clients train from whatever model version they downloaded; the server applies their updates in
the simulated order they arrive (the AsyncPool guarantees that order while running tasks in
parallel), weighting each by its staleness: the number of model versions applied between the
client's download and the moment its update is used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rayfl.algorithms.fedavg import FedAvg, FedAvgConfig
from rayfl.algorithms.server_opt import ModelState
from rayfl.config import ConfigError
from rayfl.driver import Round, Uploads
from rayfl.driver.settings import AsynchronyConfig, StalenessKeys, staleness_weight


@dataclass
class AsyncConfig(FedAvgConfig, StalenessKeys):
    """Shared by the asynchronous algorithms. `concurrency` clients train at any time;
    staleness weight s(t): `constant` 1, `polynomial` (1 + t)^-a, `hinge` 1 for t <= b else
    1 / (a (t - b) + 1) (Xie et al. 2019, section 5.2). Updates staler than `max_staleness`
    are discarded (bounded staleness; null keeps all). `run.rounds` counts server updates."""

    def validate(self) -> None:
        super().validate()
        if self.local_schedule is not None or self.server_as_client:
            bad = "local_schedule" if self.local_schedule is not None else "server_as_client"
            raise ConfigError(f"algorithm.{bad}", "is not supported by the asynchronous algorithms")
        self.validate_staleness("algorithm")


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

    name: str = "fedbuff"
    # How buffered deltas are weighted before staleness: uniform (1/K each, the paper's) or samples.
    weighting: Literal["samples", "uniform"] = "uniform"
    # K, client deltas buffered per server step (>= 1): x <- x + server_lr * (sum of
    # staleness-scaled deltas) / K.
    buffer_size: int = 10

    def validate(self) -> None:
        super().validate()
        if self.buffer_size < 1:
            raise ConfigError("algorithm.buffer_size", f"must be >= 1, got {self.buffer_size}")


class FedBuff(FedAvg):
    """FedBuff: FedAvg's parts under the asynchronous driver with the algorithm's own
    concurrency, buffer and staleness keys."""

    config = FedBuffConfig
    always_asynchronous = True

    @classmethod
    def asynchrony_of(cls, cfg: Any) -> AsynchronyConfig:
        alg = cfg.algorithm
        return AsynchronyConfig(enabled=True, concurrency=alg.concurrency, buffer_size=getattr(alg, "buffer_size", 1),
                                staleness=alg.staleness, staleness_a=alg.staleness_a, staleness_b=alg.staleness_b,
                                max_staleness=alg.max_staleness)


class FedAsync(FedBuff):
    """FedAsync (Xie et al. 2019, Alg. 1): each arrival alone (a buffer of 1), mixed into the
    model: x <- (1 - a_t) x + a_t x_client, x_client = x_downloaded + delta,
    a_t = mixing * s(staleness)."""

    config = FedAsyncConfig

    @classmethod
    def refuses_pipeline(cls, cfg: Any, sections: list[str]) -> str | None:
        if "robust" in sections or cfg.privacy.mode == "central":
            return ("FedAsync mixes each arrival's model into the server's alone, so there is no sum for central noise "
                    "or a robust rule to act on; use fedbuff (a buffer of K arrivals) or local DP")
        return None

    def server_update(self, state: ModelState, uploads: Uploads, rnd: Round) -> ModelState:
        (res,) = uploads.results
        alpha = self.mixing(uploads)
        x_client = uploads.downloaded[0] + res["delta"]
        x = (1.0 - alpha) * state.x.astype(np.float64) + alpha * x_client.astype(np.float64)
        return ModelState(x=x.astype(np.float32), moments=state.moments)

    def mixing(self, uploads: Uploads) -> float:
        return self.cfg.mixing * staleness_weight(self.cfg, int(uploads.staleness[0]))

    def metrics(self, state: ModelState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        (res,) = uploads.results
        return {"train_loss": float(res["loss"]), "num_updates": 1, "staleness_mean": float(res.staleness),
                "mixing": self.mixing(uploads)}
