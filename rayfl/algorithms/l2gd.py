"""FFGG's baselines on its synthetic quadratic (Fig. 1b-d, Sec. 3.2): Local GD and
SCAFFOLD (non-personalized: the joint x = (theta, w) is shared) and L2GD (Hanzely & Richtarik
2020, fully personalized: every client keeps its own x_m). All three train on the same client
rows as FFGG (`data.dataset: ffgg_quadratic`) and are measured the same way: ||F(theta)|| at
the theta-part of the (averaged) model, with exact w* (the paper does not say how; this is the
authors' public code's measure).

    Local GD:  x_m <- x; tau times x_m <- x_m - eta grad f_m(x_m); x <- mean x_m;  eta = 1/(L_f tau)
    SCAFFOLD:  y <- x; tau times y <- y - eta (grad f_m(y) - c_m + c); c_m+ = grad f_m(x) (option I)
               or c_m - c + (x - y)/(tau eta) (option II); x <- x + eta_g mean(y - x);
               c <- c + mean(c_m+ - c_m);  eta_g = 0.5, eta = 1/(L_f tau)   (full participation)
    L2GD:      xi ~ Bernoulli(p), p = 1/tau: xi = 0: x_m <- x_m - alpha/(M(1-p)) grad f_m(x_m);
               xi = 1: x_m <- x_m - (alpha lam/(M p))(x_m - mean x);  lam = 0.1,
               alpha = M / (2 max{L_f/(1-p), lam/p}) (the L2GD theory's largest step; Sec. 3.2's
               printed (2M)^-1 max{L(1-p)^-1, lam p^-1} grows with L)

L2GD's rounds are its communications: the server draws how many local steps (xi = 0) come
before the next averaging step from (seed, 'l2gd.xi', round), sends that count and the last
mean; each client first applies the pending averaging step, then its local steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rayfl.algorithms.finetune import QuadraticObjective, to_tensor
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
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
            raise ConfigError("algorithm.participation", "the quadratic baselines use every client: set 1.0")


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
    """`p` null: 1/tau; `alpha` null: alpha_scale * M / (2 max{L_f/(1-p), lam/p})."""

    name: str = "l2gd"
    # lambda, the strength of the pull of each personal model towards the mean (> 0).
    lam: float = 0.1
    # The probability of an averaging step at each step, in (0, 1); null: 1/tau.
    p: float | None = None
    # The step size (> 0); null: alpha_scale * M / (2 max{L_f/(1-p), lam/p}).
    alpha: float | None = None
    # Multiplies the theory's step when alpha is null (> 0): 1/M (0.03125 for 32 clients) drops
    # the factor M, the reading of Sec. 3.2 that the replication checks beside the theory's step.
    alpha_scale: float = 1.0

    def validate(self) -> None:
        super().validate()
        if not self.lam > 0:
            raise ConfigError("algorithm.lam", f"must be > 0, got {self.lam}")
        if self.p is not None and not 0 < self.p < 1:
            raise ConfigError("algorithm.p", f"must be in (0, 1), got {self.p}")
        if self.alpha is not None and not self.alpha > 0:
            raise ConfigError("algorithm.alpha", f"must be > 0 or null, got {self.alpha}")
        if not self.alpha_scale > 0:
            raise ConfigError("algorithm.alpha_scale", f"must be > 0, got {self.alpha_scale}")


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


def l2gd_steps(cfg: L2GDConfig, num_clients: int, l_f: float) -> tuple[float, float, float]:
    """(p, local step alpha/(M(1-p)), averaging weight alpha lam/(M p))."""
    p = cfg.p or 1.0 / cfg.tau
    alpha = cfg.alpha or cfg.alpha_scale * num_clients / (2.0 * max(l_f / (1.0 - p), cfg.lam / p))
    return p, alpha / (num_clients * (1.0 - p)), alpha * cfg.lam / (num_clients * p)


class QuadraticBaseline(Algorithm[JointState]):
    """What the three baselines share: every client every round, uploads averaged in float64
    in client order, and FFGG's measure ||F(theta)|| each round instead of a test set."""

    weighting = "sum"  # plain sums, divided by the number of answers: the mean of Fig. 1's code
    exact_sums = False

    def setup(self) -> None:
        self.oracle, self.d_theta = quadratic_setup(self.fed)
        self.dim = self.d_theta + self.oracle.d_w

    def cohort(self, state: JointState, rnd: Round) -> list[int]:
        return list(self.fed.trainable_clients)

    def mean(self, uploads: Uploads, key: str) -> np.ndarray:
        return uploads[key] / len(uploads)

    def metrics(self, state: JointState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        return metrics_of(self.oracle, state.x, self.d_theta, uploads.results)

    def evaluate(self, state: JointState, rnd: Round) -> dict[str, Any]:
        return {}


class LocalGD(QuadraticBaseline):
    """Local GD: x <- x + mean_m (x_m - x) after tau local steps, eta = 1/(L_f tau)."""

    config = QuadraticBaselineConfig
    client = staticmethod(local_gd_client)
    uploads = ("delta",)

    def setup(self) -> None:
        super().setup()
        self.lr = self.cfg.fixed_lr or 1.0 / (self.oracle.L_f * self.cfg.tau)

    def init(self) -> JointState:
        return JointState(x=np.zeros(self.dim))

    def payload(self, state: JointState, rnd: Round) -> dict[str, Any]:
        return {"x": state.x, "d_theta": self.d_theta, "steps": self.cfg.tau, "lr": self.lr}

    def server_update(self, state: JointState, uploads: Uploads, rnd: Round) -> JointState:
        return JointState(x=state.x + self.mean(uploads, "delta"), control=state.control)


class ScaffoldQuadratic(LocalGD):
    """SCAFFOLD with full participation: x <- x + eta_g mean(y - x), c <- c + mean(c_m+ - c_m)."""

    config = QuadraticScaffoldConfig
    client = staticmethod(scaffold_client)
    uploads = ("delta", "delta_control")

    def init(self) -> JointState:
        return JointState(x=np.zeros(self.dim), control=np.zeros(self.dim))

    def payload(self, state: JointState, rnd: Round) -> dict[str, Any]:
        return {"x": state.x, "control": state.control, "d_theta": self.d_theta, "steps": self.cfg.tau, "lr": self.lr,
                "option": self.cfg.option}

    def server_update(self, state: JointState, uploads: Uploads, rnd: Round) -> JointState:
        x = state.x + self.cfg.server_lr * self.mean(uploads, "delta")
        control = state.control + len(uploads) / self.fed.num_clients * self.mean(uploads, "delta_control")
        return JointState(x=x, control=control)


class L2GD(QuadraticBaseline):
    """L2GD: a Geometric number of local steps between averaging steps, each client's x_m kept
    in its state; the server keeps the last mean of the x_m."""

    config = L2GDConfig
    client = staticmethod(l2gd_client)
    uploads = ("x",)
    pipeline_refusal = ("L2GD's clients upload their personal models x_m, not updates: a clip would bound the model, "
                        "not a client's share of a step")
    asynchrony_refusal = "L2GD's averaging step needs every client's personal model at once"

    def setup(self) -> None:
        super().setup()
        self.p, self.local_lr, self.mix = l2gd_steps(self.cfg, self.fed.num_clients, self.oracle.L_f)
        if not 0 < self.mix <= 1:
            raise ConfigError("algorithm.alpha", f"the averaging weight alpha lam / (M p) = {self.mix:g} must lie in (0, 1]")

    def init(self) -> JointState:
        return JointState(x=np.zeros(self.dim))  # x: the last mean of the x_m

    def local_steps(self, round: int) -> int:
        """xi = 0 draws before the next xi = 1, from (seed, 'l2gd.xi', round)."""
        return int(numpy_rng(self.fed.seed, "l2gd.xi", round).geometric(self.p)) - 1

    def payload(self, state: JointState, rnd: Round) -> dict[str, Any]:
        return {"mean": state.x if rnd.index > 0 else None, "d_theta": self.d_theta, "steps": self.local_steps(rnd.index),
                "local_lr": self.local_lr, "mix": self.mix}

    def server_update(self, state: JointState, uploads: Uploads, rnd: Round) -> JointState:
        return JointState(x=self.mean(uploads, "x"), control=state.control)

    def metrics(self, state: JointState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        return {**super().metrics(state, uploads, rnd), "local_steps": self.local_steps(rnd.index)}
