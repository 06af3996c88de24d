"""The drivers' own sections of a job: `asynchrony:` (any algorithm built from parts, run by the
asynchronous driver, rayfl.driver.asynchronous) and `server:` (a server optimizer on any
algorithm's step, rayfl.driver.server_optimizer). Kept free of the drivers so the config module
loads light."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.checks import choice, non_negative, positive, positive_float
from rayfl.errors import ConfigError


@dataclass
class StalenessKeys:
    """The keys an asynchronous run shares, whether a job's `asynchrony:` section sets them or
    an asynchronous algorithm's own (FedAsync's, FedBuff's)."""

    # Clients training at any time (>= 1); a finished one is replaced at once by an idle client.
    concurrency: int = 10
    # The weight s(t) of an arrival t server steps stale: constant 1, polynomial (1 + t)^-a, hinge
    # (1 for t <= b, else 1 / (a (t - b) + 1)).
    staleness: Literal["constant", "polynomial", "hinge"] = "polynomial"
    # a of the polynomial and hinge weights (>= 0).
    staleness_a: float = 0.5
    # b of the hinge weight (>= 0): the staleness kept at full weight.
    staleness_b: float = 4.0
    # Discard arrivals staler than this many server steps; null: keep all.
    max_staleness: int | None = None

    def validate_staleness(self, key: str) -> None:
        """Each key's range, named under `key` (the section)."""
        choice(f"{key}.staleness", self.staleness, ("constant", "polynomial", "hinge"))
        positive(f"{key}.concurrency", self.concurrency)
        if self.staleness_a < 0 or self.staleness_b < 0:
            raise ConfigError(f"{key}.staleness_a", "staleness_a and staleness_b must be >= 0")
        if self.max_staleness is not None:
            non_negative(f"{key}.max_staleness", self.max_staleness)


@dataclass
class AsynchronyConfig(StalenessKeys):
    """Asynchronous FL on the simulated clock for any algorithm built from parts.

    `concurrency` clients train at any time, each from the server state current when it was
    dispatched; the server steps (the algorithm's own server update) every `buffer_size`
    arrivals (K = 1: each arrival alone, FedAsync's schedule; K > 1: FedBuff's buffer), each
    arrival weighted by s(staleness), the number of server steps since its download:
    `constant` 1, `polynomial` (1 + t)^-a, `hinge` 1 for t <= b else 1 / (a (t - b) + 1)
    (Xie, Koyejo, Gupta 2019, Sec. 5.2). Arrivals staler than `max_staleness` are discarded.
    `run.rounds` counts server steps."""

    # Run the algorithm asynchronously: clients train continuously and the server steps every
    # buffer_size arrivals (false: synchronous rounds).
    enabled: bool = False
    # K, arrivals per server step (>= 1): 1 applies each alone (FedAsync's schedule), more buffer
    # them (FedBuff).
    buffer_size: int = 10

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        self.validate_as("asynchrony")

    def validate_as(self, key: str) -> None:
        """`validate` with the keys named under `key` (an algorithm's own asynchronous section)."""
        self.validate_staleness(key)
        positive(f"{key}.buffer_size", self.buffer_size)


@dataclass
class ServerConfig:
    """A server optimizer on any algorithm's step (Reddi et al., "Adaptive Federated
    Optimization", ICLR 2021): the change the algorithm's own server update makes to the global
    model, delta = x' - x, is read as the pseudo-gradient -delta, and the model becomes x after
    one `optimizer` step at `lr` on it. `sgd` at lr 1 is the algorithm's own step (the default);
    `momentum` gives any method FedAvgM's velocity, `adam` and `yogi` FedAdam's and FedYogi's
    moments, kept in checkpoints."""

    # The optimizer on the pseudo-gradient -(x' - x) of each server step: sgd (x + lr (x' - x)),
    # momentum (v = beta1 v + (x' - x), x + lr v), adam or yogi; sgd at lr 1 leaves the step as is.
    optimizer: Literal["sgd", "momentum", "adam", "yogi"] = "sgd"
    # The server learning rate on the algorithm's step (> 0).
    lr: float = 1.0
    # momentum: the velocity's decay; adam, yogi: the first moment's decay. In [0, 1).
    beta1: float = 0.9
    # adam, yogi: the second moment's decay, in [0, 1).
    beta2: float = 0.999
    # adam: added to the root of the second moment; yogi: tau, also v's start (tau^2). > 0.
    eps: float = 1e-8

    @property
    def name(self) -> str:
        """The optimizer's name, as rayfl.algorithms.server_opt.server_step reads it."""
        return self.optimizer

    @property
    def changes_step(self) -> bool:
        """Whether the algorithm's step is changed at all (not sgd at lr 1)."""
        return self.optimizer != "sgd" or self.lr != 1.0

    def validate(self) -> None:
        choice("server.optimizer", self.optimizer, ("sgd", "momentum", "adam", "yogi"))
        positive_float("server.lr", self.lr)
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"server.{key}", f"must be in [0, 1), got {getattr(self, key)}")
        positive_float("server.eps", self.eps)


def staleness_weight(settings: StalenessKeys, staleness: int) -> float:
    """s(t) of the settings' staleness rule."""
    t = float(staleness)
    if settings.staleness == "constant":
        return 1.0
    if settings.staleness == "polynomial":
        return (1.0 + t) ** (-settings.staleness_a)
    if t <= settings.staleness_b:
        return 1.0
    return 1.0 / (settings.staleness_a * (t - settings.staleness_b) + 1.0)
