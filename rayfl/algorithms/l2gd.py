"""FFGG's baselines on its synthetic quadratic (Fig. 1b-d, spec Sec. 3.6): Local GD and
SCAFFOLD (non-personalized: the joint x = (theta, w) is shared) and L2GD (Hanzely & Richtarik
2020, fully personalized: every client keeps its own x_m). All three train on the same client
rows as FFGG (`data.dataset: ffgg_quadratic`) and are measured the same way: ||F(theta)|| at
the theta-part of the (averaged) model, with exact w* (the authors' code, spec 6.13).

    Local GD:  x_m <- x; tau times x_m <- x_m - eta grad f_m(x_m); x <- mean x_m;  eta = 1/(L_f tau)
    SCAFFOLD:  y <- x; tau times y <- y - eta (grad f_m(y) - c_m + c); c_m+ = grad f_m(x) (option I)
               or c_m - c + (x - y)/(tau eta) (option II); x <- x + eta_g mean(y - x);
               c <- c + mean(c_m+ - c_m);  eta_g = 0.5, eta = 1/(L_f tau)   (full participation)
    L2GD:      xi ~ Bernoulli(p), p = 1/tau: xi = 0: x_m <- x_m - alpha/(M(1-p)) grad f_m(x_m);
               xi = 1: x_m <- x_m - (alpha lam/(M p))(x_m - mean x);  lam = 0.1,
               alpha = M / (2 max{L_f/(1-p), lam/p}) (spec 6.11: the paper text's formula grows with L)

L2GD's rounds are its communications: the server draws how many local steps (xi = 0) come
before the next averaging step from (seed, 'l2gd.xi', round), sends that count and the last
mean; each client first applies the pending averaging step, then its local steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rayfl.algorithms.finetune import QuadraticObjective, to_tensor
from rayfl.config import AlgorithmConfig, ConfigError, RunConfig
from rayfl.engine import ClientContext, Federation
from rayfl.rng import numpy_rng


@dataclass
class QuadraticBaselineConfig(AlgorithmConfig):
    """`tau` local steps per round; `lr` null means the paper's 1/(L_f tau) (its default 0.05
    of the base config is ignored unless `fixed_lr` is set)."""

    name: str = "local_gd"
    clients_per_round: int | None = None
    participation: float | None = 1.0
    # Local gradient steps per round (>= 1; L2GD: the expected steps between averagings, p = 1/tau).
    tau: int = 100
    # A fixed local step size eta; null: the paper's 1/(L_f tau) (algorithm.lr is ignored).
    fixed_lr: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.tau < 1:
            raise ConfigError("algorithm.tau", f"must be >= 1, got {self.tau}")
        if self.fixed_lr is not None and not self.fixed_lr > 0:
            raise ConfigError("algorithm.fixed_lr", f"must be > 0 or null, got {self.fixed_lr}")
        if self.participation != 1.0:
            raise ConfigError("algorithm.participation", "the quadratic baselines use every client (spec 6.8): set 1.0")


@dataclass
class QuadraticScaffoldConfig(QuadraticBaselineConfig):
    name: str = "scaffold_quadratic"
    # eta_g, the server's step on the mean (y - x).
    server_lr: float = 0.5
    # SCAFFOLD's control-variate update: I (c_m = grad f_m(x)) or II (c_m - c + (x - y)/(tau eta)).
    option: Literal["I", "II"] = "I"

    def validate(self) -> None:
        super().validate()
        if not self.server_lr > 0:
            raise ConfigError("algorithm.server_lr", f"must be > 0, got {self.server_lr}")


@dataclass
class L2GDConfig(QuadraticBaselineConfig):
    """`p` null: 1/tau; `alpha` null: M / (2 max{L_f/(1-p), lam/p})."""

    name: str = "l2gd"
    # lambda, the strength of the pull of each personal model towards the mean (> 0).
    lam: float = 0.1
    # The probability of an averaging step at each step, in (0, 1); null: 1/tau.
    p: float | None = None
    # The step size (> 0); null: M / (2 max{L_f/(1-p), lam/p}).
    alpha: float | None = None

    def validate(self) -> None:
        super().validate()
        if not self.lam > 0:
            raise ConfigError("algorithm.lam", f"must be > 0, got {self.lam}")
        if self.p is not None and not 0 < self.p < 1:
            raise ConfigError("algorithm.p", f"must be in (0, 1), got {self.p}")
        if self.alpha is not None and not self.alpha > 0:
            raise ConfigError("algorithm.alpha", f"must be > 0 or null, got {self.alpha}")


@dataclass
class JointState:
    x: np.ndarray
    control: np.ndarray | None = None


# ---------------------------------------------------------------- client functions


def joint_grad(obj: QuadraticObjective, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    g_theta, g_w, loss = obj.grads(x[: obj.d_theta], x[obj.d_theta :])
    return torch.cat([g_theta, g_w]), loss


def local_gd_client(ctx: ClientContext, x: np.ndarray, d_theta: int, steps: int, lr: float) -> dict[str, Any]:
    obj = QuadraticObjective(ctx, d_theta)
    x0 = to_tensor(x, ctx, torch.float64)
    y, loss = x0.clone(), float("nan")
    for _ in range(steps):
        g, loss = joint_grad(obj, y)
        y = y - lr * g
    return {"delta": y - x0, "loss": loss}


def scaffold_client(
    ctx: ClientContext, x: np.ndarray, control: np.ndarray, d_theta: int, steps: int, lr: float, option: str
) -> dict[str, Any]:
    obj = QuadraticObjective(ctx, d_theta)
    x0, c = to_tensor(x, ctx, torch.float64), to_tensor(control, ctx, torch.float64)
    c_m = ctx.state.get("control")
    c_m = torch.zeros_like(x0) if c_m is None else torch.as_tensor(c_m, dtype=torch.float64)
    y, loss = x0.clone(), float("nan")
    for _ in range(steps):
        g, loss = joint_grad(obj, y)
        y = y - lr * (g - c_m + c)
    c_new = joint_grad(obj, x0)[0] if option == "I" else c_m - c + (x0 - y) / (steps * lr)
    ctx.state["control"] = c_new
    return {"delta": y - x0, "delta_control": c_new - c_m, "loss": loss}


def l2gd_client(
    ctx: ClientContext, mean: np.ndarray | None, d_theta: int, steps: int, local_lr: float, mix: float
) -> dict[str, Any]:
    """The pending averaging step toward `mean` (none at the start), then `steps` local steps."""
    obj = QuadraticObjective(ctx, d_theta)
    x = ctx.state.get("x")
    x = torch.zeros(obj.d_theta + obj.d_w, dtype=torch.float64) if x is None else torch.as_tensor(x, dtype=torch.float64)
    if mean is not None:
        m = to_tensor(mean, ctx, torch.float64)
        x = x - mix * (x - m)
    loss = float("nan")
    for _ in range(steps):
        g, loss = joint_grad(obj, x)
        x = x - local_lr * g
    ctx.state["x"] = x
    return {"x": x, "loss": loss}


# ---------------------------------------------------------------- server loops


def quadratic_setup(fed: Federation) -> tuple[Any, int]:
    from rayfl.papers.ffgg.quadratic import is_quadratic, oracle_from_dataset

    if not is_quadratic(fed.dataset):
        raise ConfigError("data.dataset", "the FFGG baselines (local_gd, scaffold_quadratic, l2gd) run on ffgg_quadratic")
    d_theta = fed.cfg.data.d_theta
    return oracle_from_dataset(fed.dataset, d_theta), d_theta


def metrics_of(oracle: Any, x: np.ndarray, d_theta: int, results: list[Any]) -> dict[str, Any]:
    losses = [float(r["loss"]) for r in results]
    return {"num_updates": len(results), "train_loss": float(np.mean(losses)) if losses else float("nan"),
            **oracle.metrics(x[:d_theta])}


def mean_of(results: list[Any], key: str) -> np.ndarray:
    return np.mean(np.stack([np.asarray(r[key], dtype=np.float64) for r in results]), axis=0)


def run_local_gd(fed: Federation, cfg: QuadraticBaselineConfig, run: RunConfig) -> dict[str, Any]:
    oracle, d_theta = quadratic_setup(fed)
    lr = cfg.fixed_lr or 1.0 / (oracle.L_f * cfg.tau)
    s = fed.track(JointState(x=np.zeros(d_theta + oracle.d_w)))
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        results = fed.call(list(fed.trainable_clients), local_gd_client, round=r, x=s.x, d_theta=d_theta, steps=cfg.tau, lr=lr)
        if results:
            s.x = s.x + mean_of(results, "delta")
        metrics = metrics_of(oracle, s.x, d_theta, results)
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}


def run_scaffold_quadratic(fed: Federation, cfg: QuadraticScaffoldConfig, run: RunConfig) -> dict[str, Any]:
    oracle, d_theta = quadratic_setup(fed)
    lr = cfg.fixed_lr or 1.0 / (oracle.L_f * cfg.tau)
    dim = d_theta + oracle.d_w
    s = fed.track(JointState(x=np.zeros(dim), control=np.zeros(dim)))
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        results = fed.call(list(fed.trainable_clients), scaffold_client, round=r, x=s.x, control=s.control,
                           d_theta=d_theta, steps=cfg.tau, lr=lr, option=cfg.option)
        if results:
            s.x = s.x + cfg.server_lr * mean_of(results, "delta")
            s.control = s.control + len(results) / fed.num_clients * mean_of(results, "delta_control")
        metrics = metrics_of(oracle, s.x, d_theta, results)
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}


def l2gd_steps(cfg: L2GDConfig, num_clients: int, l_f: float) -> tuple[float, float, float]:
    """(p, local step alpha/(M(1-p)), averaging weight alpha lam/(M p))."""
    p = cfg.p or 1.0 / cfg.tau
    alpha = cfg.alpha or num_clients / (2.0 * max(l_f / (1.0 - p), cfg.lam / p))
    return p, alpha / (num_clients * (1.0 - p)), alpha * cfg.lam / (num_clients * p)


def run_l2gd(fed: Federation, cfg: L2GDConfig, run: RunConfig) -> dict[str, Any]:
    oracle, d_theta = quadratic_setup(fed)
    p, local_lr, mix = l2gd_steps(cfg, fed.num_clients, oracle.L_f)
    if not 0 < mix <= 1:
        raise ConfigError("algorithm.alpha", f"the averaging weight alpha lam / (M p) = {mix:g} must lie in (0, 1]")
    s = fed.track(JointState(x=np.zeros(d_theta + oracle.d_w)))  # x: the last mean of the x_m
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        steps = int(numpy_rng(fed.seed, "l2gd.xi", r).geometric(p)) - 1  # xi = 0 draws before the next xi = 1
        results = fed.call(list(fed.trainable_clients), l2gd_client, round=r, mean=s.x if r > 0 else None,
                           d_theta=d_theta, steps=steps, local_lr=local_lr, mix=mix)
        if results:
            s.x = mean_of(results, "x")
        metrics = {**metrics_of(oracle, s.x, d_theta, results), "local_steps": steps}
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}
