"""The job's `asynchrony:` section: any algorithm built from parts, run by the asynchronous
driver (rayfl.driver.asynchronous). Kept free of the driver so the config module loads light."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.checks import choice, non_negative, positive
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
        self.validate_as("asynchrony")

    def validate_as(self, key: str) -> None:
        self.validate_staleness(key)
        positive(f"{key}.buffer_size", self.buffer_size)


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
