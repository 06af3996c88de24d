"""Constraint sets and the Euclidean projection onto them.

ZO-HFL (arXiv 2504.01839, Alg. 2 line 4) projects every local step onto a closed convex set
Y_i(x) that may depend on the global point x the client received, which in ZO-HFL is the
*perturbed* point x_r +- eta v. The paper's example is the trust region {y : ||y - x|| <= rho_i}
(personalization with a bounded dissimilarity); its appendix toy uses the nonnegative orthant.

FedRZO (Qiu, Shanbhag, Yousefian, NeurIPS 2023, Sec. 1.1(ii) and Sec. 3) uses
fixed local sets X_i (R^n, box, half-space, ball, simplex) through the gradient of the Moreau
envelope of their indicator, (1/eta)(x - P_X(x)) (`moreau_gradient`); there the ball is centred
at the `center` the caller passes (the origin for a fixed ball {||x|| <= radius}).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from rayfl.config import ConfigError


@dataclass
class ConstraintConfig:
    """Y_i(x) (ZO-HFL Sec. II, Assumption 1(iv)).

    `none`: R^d, the paper's experiments. `ball`: {y : ||y - x|| <= radius} around the point x
    the client received (`client_radius[i]` overrides `radius` per client: the paper's rho_i,
    a name Sec. IV reuses for the data weights); radii of the order of
    ||x|| keep the lower level personal but tied to x. `box`: low <= y <= high elementwise
    (low: 0, high: null is the orthant of the appendix toy). `halfspace`: {y : a^T y <= offset}
    with a = `normal` (empty: the all-ones vector). `simplex`: {y >= 0, sum(y) = radius}
    (`client_radius` applies). Half-space and simplex ignore the centre."""

    # The set: none (R^d); ball (||y - x|| <= radius around the received point); box (low <= y <=
    # high); halfspace (a^T y <= offset); simplex (y >= 0, sum(y) = radius).
    kind: Literal["none", "ball", "box", "halfspace", "simplex"] = "none"
    # ball: the radius; simplex: the coordinates' sum (> 0).
    radius: float = 1.0
    # Per-client radius overriding radius for ball and simplex, indexed by client id; empty: radius
    # for all.
    client_radius: list[float] = field(default_factory=list)
    # box: the elementwise lower bound (0 with high null: the nonnegative orthant); null: unbounded
    # below.
    low: float | None = None
    # box: the elementwise upper bound; null: unbounded above.
    high: float | None = None
    # halfspace: the normal a (non-zero); empty: the all-ones vector.
    normal: list[float] = field(default_factory=list)
    # halfspace: the bound of a^T y <= offset.
    offset: float = 0.0

    def validate_as(self, key: str) -> None:
        if self.kind == "ball" and (not self.radius > 0 or any(not r > 0 for r in self.client_radius)):
            raise ConfigError(f"{key}.radius", "ball radii must be > 0")
        if self.kind == "box":
            if self.low is None and self.high is None:
                raise ConfigError(f"{key}.low", "a box needs low, high or both (low: 0 is the nonnegative orthant)")
            if self.low is not None and self.high is not None and self.low > self.high:
                raise ConfigError(f"{key}.low", f"need low <= high, got {self.low} > {self.high}")
        if self.kind == "simplex" and (not self.radius > 0 or any(not r > 0 for r in self.client_radius)):
            raise ConfigError(f"{key}.radius", "simplex radii (the sum of the coordinates) must be > 0")
        if self.kind == "halfspace" and self.normal and not any(a != 0 for a in self.normal):
            raise ConfigError(f"{key}.normal", "the half-space normal must be non-zero (empty: all ones)")

    def radius_of(self, client: int) -> float:
        if self.client_radius:
            if client >= len(self.client_radius):
                raise ConfigError("algorithm.constraint.client_radius", f"has no radius for client {client}")
            return float(self.client_radius[client])
        return float(self.radius)


def project(y: torch.Tensor, center: torch.Tensor, cfg: ConstraintConfig, client: int = 0) -> torch.Tensor:
    """Pi_{Y(center)}[y], row by row for [K, d] batches (or one [d] vector); `y` is not modified.

    Ball: center + (y - center) min(1, radius / ||y - center||); box: clamp to [low, high];
    half-space: y - max(0, a^T y - offset) / ||a||^2 a; simplex: see `project_simplex`."""
    if cfg.kind == "none":
        return y
    if cfg.kind == "box":
        return torch.clamp(y, min=cfg.low, max=cfg.high)
    if cfg.kind == "halfspace":
        return project_halfspace(y, cfg)
    if cfg.kind == "simplex":
        return project_simplex(y, cfg.radius_of(client))
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


def project_halfspace(y: torch.Tensor, cfg: ConstraintConfig) -> torch.Tensor:
    """P onto {y : a^T y <= offset}, row by row: only rows that violate it move, along a."""
    d = y.shape[-1]
    if cfg.normal:
        if len(cfg.normal) != d:
            raise ConfigError("algorithm.constraint.normal", f"has {len(cfg.normal)} entries for a {d}-dimensional point")
        a = torch.tensor(cfg.normal, dtype=y.dtype, device=y.device)
    else:
        a = torch.ones(d, dtype=y.dtype, device=y.device)
    excess = torch.clamp((y * a).sum(dim=-1, keepdim=True) - cfg.offset, min=0.0)
    return y - excess / (a @ a) * a


def project_simplex(y: torch.Tensor, radius: float = 1.0) -> torch.Tensor:
    """P onto {y >= 0, sum(y) = radius}, row by row, by the sort-and-threshold rule (the
    projection is max(y - theta, 0) with the one theta that makes the sum come out right)."""
    u, _ = torch.sort(y, dim=-1, descending=True)
    css = torch.cumsum(u, dim=-1) - radius
    k = torch.arange(1, y.shape[-1] + 1, dtype=y.dtype, device=y.device)
    rho = (u * k > css).sum(dim=-1, keepdim=True)  # the support size, >= 1
    theta = css.gather(-1, rho - 1) / rho.to(y.dtype)
    return torch.clamp(y - theta, min=0.0)



def project_simplex_array(v: np.ndarray) -> np.ndarray:
    """`project_simplex` for a float64 numpy vector: the server-side client weights of DRFA's
    lambda and TR-MAML's p live on the probability simplex."""
    return project_simplex(torch.from_numpy(np.asarray(v, dtype=np.float64).copy())).numpy()


def moreau_gradient(
    x: torch.Tensor, center: torch.Tensor, cfg: ConstraintConfig, eta: float, client: int = 0
) -> torch.Tensor:
    """(1/eta)(x - P_X(x)): the gradient of the Moreau envelope (1/2eta) dist^2(x, X) of X's
    indicator (FedRZO's local-step term, Sec. 1.1(ii) and Sec. 3); zero when X = R^n or x is
    in X."""
    if cfg.kind == "none":
        return torch.zeros_like(x)
    return (x - project(x, center, cfg, client)) / eta
