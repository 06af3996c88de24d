"""Server optimizers: how the server turns a round's mean client update into its step.

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021): the mean model delta is a
pseudo-gradient g = -mean(delta) for any optimizer on the server. `sgd` with server_lr 1 is
FedAvg's plain average; `momentum` is FedAvgM (Hsu et al., "Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification", 2019); `yogi` is FedYogi
(Reddi et al., Alg. 2: no bias correction, v starting at tau^2); `adam` is FedAdam, used by the FFGG paper's Table 2 for StackOverflow
and GLDv2 with unreported constants, for which rayfl takes torch's Adam: beta1 0.9, beta2 0.999, eps 1e-8, bias-corrected moments. The moments live in the
algorithm's tracked server state, so checkpoints carry them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rayfl.config import ConfigError


@dataclass
class ServerOptimizerConfig:
    """name: sgd, momentum (FedAvgM), adam (FedAdam) or yogi (FedYogi); beta1, beta2, eps."""

    # The server optimizer on the pseudo-gradient g = -mean delta: sgd (x + server_lr * mean delta),
    # momentum (FedAvgM: v = beta1 v + mean delta, x + server_lr v), adam (FedAdam, bias-corrected)
    # or yogi (FedYogi); their moments are kept in checkpoints.
    name: Literal["sgd", "momentum", "adam", "yogi"] = "sgd"
    # momentum: the server momentum; adam, yogi: the first moment's decay. In [0, 1).
    beta1: float = 0.9
    # adam, yogi: the second moment's decay, in [0, 1).
    beta2: float = 0.999
    # adam: added to the root of the second moment; yogi: tau, also v's start (tau^2). > 0.
    eps: float = 1e-8

    def validate_as(self, key: str) -> None:
        if self.name not in ("sgd", "momentum", "adam", "yogi"):
            raise ConfigError(f"{key}.name", f"unknown {self.name!r}; allowed: sgd, momentum, adam, yogi")
        for field_name in ("beta1", "beta2"):
            value = getattr(self, field_name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{key}.{field_name}", f"must be in [0, 1), got {value}")
        if not self.eps > 0:
            raise ConfigError(f"{key}.eps", f"must be > 0, got {self.eps}")


@dataclass
class AdamMoments:
    """A server optimizer's moments (float64) and its step count: FedAvgM's velocity in `m`,
    FedAdam's and FedYogi's first and second moments of the pseudo-gradient."""

    m: np.ndarray | None = None
    v: np.ndarray | None = None
    steps: int = 0


@dataclass
class ModelState:
    """A server that carries one global model between rounds (and FedAdam's moments)."""

    x: np.ndarray
    moments: AdamMoments = field(default_factory=AdamMoments)


def server_step(
    x: np.ndarray, delta: np.ndarray, lr: float, cfg: ServerOptimizerConfig, moments: AdamMoments | None
) -> np.ndarray:
    """x after one server step on the round's mean delta, in float64 (the caller casts).

    sgd:      x + lr * delta
    momentum: m = b1 m + delta (m = delta at the first step); x + lr * m
    adam:     g = -delta; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
              x - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    yogi:     g = -delta; m = b1 m + (1 - b1) g; v = v - (1 - b2) g^2 sign(v - g^2), v from eps^2;
              x - lr * m / (sqrt(v) + eps)
    The moments are updated in place."""
    if cfg.name == "sgd":
        return x + lr * delta
    if moments is None:
        raise ValueError(f"the {cfg.name} server optimizer needs the server state's AdamMoments")
    moments.steps += 1
    x64 = np.asarray(x, dtype=np.float64)
    if cfg.name == "momentum":
        d = np.asarray(delta, dtype=np.float64)
        moments.m = d if moments.m is None else cfg.beta1 * moments.m + d
        return x64 + lr * moments.m
    g = -np.asarray(delta, dtype=np.float64)
    if moments.m is None or moments.v is None:
        moments.m = np.zeros_like(g)
        moments.v = np.zeros_like(g) if cfg.name == "adam" else np.full_like(g, cfg.eps**2)
    moments.m = cfg.beta1 * moments.m + (1.0 - cfg.beta1) * g
    g2 = g * g
    if cfg.name == "yogi":
        moments.v = moments.v - (1.0 - cfg.beta2) * g2 * np.sign(moments.v - g2)
        return x64 - lr * moments.m / (np.sqrt(moments.v) + cfg.eps)
    moments.v = cfg.beta2 * moments.v + (1.0 - cfg.beta2) * g2
    m_hat = moments.m / (1.0 - cfg.beta1**moments.steps)
    v_hat = moments.v / (1.0 - cfg.beta2**moments.steps)
    return x64 - lr * m_hat / (np.sqrt(v_hat) + cfg.eps)
