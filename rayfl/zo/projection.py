"""Lower-level constraint sets Y_i(x) and the Euclidean projection onto them.

ZO-HFL (arXiv 2504.01839, Alg. 2 line 4) projects every local step onto a closed convex set
Y_i(x) that may depend on the global point x the client received, which in ZO-HFL is the
*perturbed* point x_r +- eta v. The paper's example is the trust region {y : ||y - x|| <= rho_i}
(personalization with a bounded dissimilarity); its appendix toy uses the nonnegative orthant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from rayfl.config import ConfigError


@dataclass
class ConstraintConfig:
    """Y_i(x) (ZO-HFL Sec. II, Assumption 1(iv)).

    `none`: R^d, the paper's experiments. `ball`: {y : ||y - x|| <= radius} around the point x
    the client received (`client_radius[i]` overrides `radius` per client; the spec calls it
    `constraint_radius` because the paper reuses rho_i for data weights); radii of the order of
    ||x|| keep the lower level personal but tied to x. `box`: low <= y <= high elementwise
    (low: 0, high: null is the orthant of the appendix toy)."""

    kind: Literal["none", "ball", "box"] = "none"
    radius: float = 1.0
    client_radius: list[float] = field(default_factory=list)
    low: float | None = None
    high: float | None = None

    def validate_as(self, key: str) -> None:
        if self.kind == "ball" and (not self.radius > 0 or any(not r > 0 for r in self.client_radius)):
            raise ConfigError(f"{key}.radius", "ball radii must be > 0")
        if self.kind == "box":
            if self.low is None and self.high is None:
                raise ConfigError(f"{key}.low", "a box needs low, high or both (low: 0 is the nonnegative orthant)")
            if self.low is not None and self.high is not None and self.low > self.high:
                raise ConfigError(f"{key}.low", f"need low <= high, got {self.low} > {self.high}")

    def radius_of(self, client: int) -> float:
        if self.client_radius:
            if client >= len(self.client_radius):
                raise ConfigError("algorithm.constraint.client_radius", f"has no radius for client {client}")
            return float(self.client_radius[client])
        return float(self.radius)


def project(y: torch.Tensor, center: torch.Tensor, cfg: ConstraintConfig, client: int = 0) -> torch.Tensor:
    """Pi_{Y(center)}[y], row by row for [K, d] batches (or one [d] vector); `y` is not modified.

    Ball: center + (y - center) min(1, radius / ||y - center||); box: clamp to [low, high]."""
    if cfg.kind == "none":
        return y
    if cfg.kind == "box":
        return torch.clamp(y, min=cfg.low, max=cfg.high)
    diff = y - center
    norm = torch.linalg.vector_norm(diff, dim=-1, keepdim=True)
    radius = cfg.radius_of(client)
    scale = torch.clamp(radius / torch.clamp(norm, min=torch.finfo(y.dtype).tiny), max=1.0)
    return center + diff * scale


def project_(y: torch.Tensor, center: torch.Tensor, cfg: ConstraintConfig, client: int = 0) -> None:
    """In-place `project`, for the local-step loop (no allocation when there is no constraint)."""
    if cfg.kind == "none":
        return
    if cfg.kind == "box":
        y.clamp_(min=cfg.low, max=cfg.high)
        return
    y.copy_(project(y, center, cfg, client))
