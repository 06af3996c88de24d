"""FedRZO_nn: randomized zeroth-order locally-projected federated averaging (Algorithm 1).

Qiu, Shanbhag, Yousefian, "Zeroth-Order Methods for Nondifferentiable, Nonconvex, and
Hierarchical Federated Optimization", NeurIPS 2023 (arXiv 2309.13024), Sec. 3. The text rayfl
was built from lost the algorithm box; the steps below are rayfl's reading of the (Meta-ZO)
scheme of Sec. 1.1(ii), Sec. 3 and Remark 5's compact form (6). The problem is min_x (1/m) sum_i
f_i(x) + indicator of X_i, with f_i nonsmooth (a ReLU network) and X_i a client's own closed
convex set; each client descends on its spherical smoothing f_i^eta plus the Moreau envelope
(1/2eta) dist^2(x, X_i):

    2: every client starts the round at x_i := x_r
    4: draw a minibatch xi_{i,k} and v_{i,k} uniform on the sphere of radius eta (fresh per
       client and per local step: "local" smoothing)
    5: g_{i,k} = (n / eta^2) (f_i(x_{i,k} + v_{i,k}, xi) - f_i(x_{i,k}, xi)) v_{i,k}
    6: x_{i,k+1} = x_{i,k} - gamma (g_{i,k} + (1/eta)(x_{i,k} - P_{X_i}(x_{i,k})))
    8: x_{r+1} = (1/m) sum_i x_{i,H}

H = 1 is parallel zeroth-order SGD (communication every step). Function values and the update
are formed in float64: n / eta^2 is 3e9 for n = 3,190 at eta = 0.001, so float32 rounding of
f would swamp the difference. The server model travels as float32 (n floats each way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
from rayfl.driver.rounds import evaluate_global
from rayfl.engine import ClientContext, Federation
from rayfl.engine.evaluation import evaluate_arrays
from rayfl.models.params import functional_logits
from rayfl.zo.estimator import forward_difference_estimate, two_point_estimate
from rayfl.zo.projection import ConstraintConfig, moreau_gradient, project
from rayfl.zo.schedules import StepsSchedule, check_budget_fields, local_steps
from rayfl.zo.sphere import sphere_from_seed, step_direction_seed

DIRECTION_PURPOSE = "fedrzo_nn.direction"
BATCH_PURPOSE = "fedrzo_nn.batches"


@dataclass
class FedRZONNConfig(AlgorithmConfig):
    """FedRZO_nn (Alg. 1, Sec. 3; the Sec. 5.1 settings the extracted text lost are rayfl's).

    `lr` is gamma, `eta` the smoothing radius, `local_steps` H (or `local_schedule`, H_{i,r}
    from `rayfl.zo.schedules`); full participation (`participation: 1.0`) as in the paper.
    `estimator: forward` is the paper's one-sided (n/eta^2)(f(x+v) - f(x)) v; `central` the
    ZO-HFL form (n/2eta)(f(x+eta u) - f(x-eta u)) u (an option). `weight_decay` is the
    lambda of the objective's lambda/2 ||x||^2, inside the function the clients evaluate.
    `constraint` is every client's X_i, `client_constraints[i]` client i's own (personalized
    sets); the ball is {||x|| <= radius} around the origin. With a set other than R^n,
    gamma <= eta is required (rayfl's rule, not the paper's): a larger gamma / eta overshoots
    past P_X(x)."""

    name: str = "fedrzo_nn"
    clients_per_round: int | None = None
    participation: float | None = 1.0
    local_epochs: int | None = None
    # H, zeroth-order local steps per round (H = 1: parallel ZO SGD, communicating every step).
    local_steps: int | None = 5
    # Per-client, per-round H_{i,r} (rayfl.zo.schedules) instead of local_steps; null: local_steps.
    # Sub-keys below.
    local_schedule: StepsSchedule | None = None
    batch_size: int = 64
    # gamma, the zeroth-order local step size (with a constraint, gamma <= eta).
    lr: float = 1e-3
    # The smoothing radius: each step's direction v is uniform on the sphere of radius eta (> 0).
    eta: float = 0.01
    # The gradient estimate: forward ((n / eta^2)(f(x + v) - f(x)) v, the paper's) or central ((n /
    # 2eta)(f(x + eta u) - f(x - eta u)) u).
    estimator: Literal["forward", "central"] = "forward"
    # Every client's set X_i, entering through the Moreau envelope (sub-keys below); kind none: R^n.
    constraint: ConstraintConfig = field(default_factory=ConstraintConfig)
    # Per-client sets: client i's X_i is item i (personalized constraints); empty: constraint for
    # all.
    client_constraints: list[ConstraintConfig] = field(default_factory=list)

    def validate(self) -> None:
        check_budget_fields(self, self.local_schedule, "algorithm.local_schedule")
        if not self.eta > 0:
            raise ConfigError("algorithm.eta", f"must be > 0, got {self.eta}")
        self.constraint.validate_as("algorithm.constraint")
        for i, c in enumerate(self.client_constraints):
            c.validate_as(f"algorithm.client_constraints[{i}]")
        constrained = any(c.kind != "none" for c in [self.constraint, *self.client_constraints])
        if constrained and self.lr > self.eta:
            raise ConfigError("algorithm.lr", f"with a constraint set gamma must be <= eta (a larger step overshoots the projection), got {self.lr} > {self.eta}")


def constraint_of(cfg: FedRZONNConfig, client: int) -> ConstraintConfig:
    """X_i: client i's own set when `client_constraints` names one, else the common one."""
    return cfg.client_constraints[client] if client < len(cfg.client_constraints) else cfg.constraint


# ---------------------------------------------------------------- client (steps 2-7)


def loss_at(ctx: ClientContext, w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, weight_decay: float) -> float:
    """f~_i(w, xi) = mean CE of the network at the flat float64 vector w on the minibatch, plus
    weight_decay / 2 ||w||^2 (one forward pass, no autograd)."""
    logits = functional_logits(ctx.model, w, xb.to(w.dtype))
    value = F.cross_entropy(logits, yb).item()
    if weight_decay:
        value += 0.5 * weight_decay * float(w @ w)
    return value


def fedrzo_nn_client(
    ctx: ClientContext,
    params: np.ndarray,
    steps: int,
    lr: float,
    eta: float,
    batch_size: int,
    constraint: ConstraintConfig,
    weight_decay: float = 0.0,
    estimator: str = "forward",
) -> dict[str, Any]:
    """H local zeroth-order steps of client i from x_r; returns x_{i,H} - x_r (float32) and the
    mean minibatch loss f~(x_{i,k}, xi_{i,k}) over the steps. v_{i,k} is a pure function of (run
    seed, round, client, step), so no two clients or steps share a direction."""
    x0 = torch.tensor(params, dtype=torch.float64, device=ctx.device)
    x = x0
    n = x.numel()
    origin = torch.zeros_like(x)
    losses: list[float] = []
    for k, (xb, yb) in enumerate(ctx.batches(batch_size, steps=steps, purpose=BATCH_PURPOSE)):
        u = sphere_from_seed(step_direction_seed(ctx.seed, ctx.round, ctx.id, k, DIRECTION_PURPOSE), n)
        with torch.no_grad():
            f_here = loss_at(ctx, x, xb, yb, weight_decay)
            if estimator == "central":
                u_t = torch.from_numpy(u).to(x.device)
                f_plus = loss_at(ctx, x + eta * u_t, xb, yb, weight_decay)
                f_minus = loss_at(ctx, x - eta * u_t, xb, yb, weight_decay)
                g = two_point_estimate(f_plus, f_minus, u, eta)
                ctx.work.forward(3 * len(yb))
            else:
                v = eta * u
                f_shift = loss_at(ctx, x + torch.from_numpy(v).to(x.device), xb, yb, weight_decay)
                g = forward_difference_estimate(f_shift, f_here, v, eta)
                ctx.work.forward(2 * len(yb))
            d = torch.from_numpy(g).to(x.device) + moreau_gradient(x, origin, constraint, eta, ctx.id)
            x = x - lr * d
        ctx.work.steps += 1
        losses.append(f_here)
    return {"delta": (x - x0).to(torch.float32).cpu().numpy(), "loss": float(np.mean(losses)) if losses else float("nan")}


# ---------------------------------------------------------------- server (steps 1, 2, 8)


@dataclass
class FedRZOState:
    """What FedRZO_nn's server carries between rounds: x_r."""

    x: np.ndarray


class ModelAverage(Algorithm[FedRZOState]):
    """What FedRZO_nn and its first-order baselines share: step 8's x_{r+1} = (1/m) sum_i
    x_{i,H}, taken as x_r + the uniform mean of the clients' changes x_{i,H} - x_r (what the
    round pipeline clips), and the paper's "average loss" at each evaluation."""

    uploads = ("delta",)
    weighting = "uniform"

    def init(self) -> FedRZOState:
        return FedRZOState(x=self.fed.initial_params())

    def server_update(self, state: FedRZOState, uploads: Uploads, rnd: Round) -> FedRZOState:
        return FedRZOState(x=(state.x + uploads["delta"]).astype(np.float32))

    def metrics(self, state: FedRZOState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        out: dict[str, Any] = {"num_updates": len(uploads)}
        if uploads:
            out["train_loss"] = float(np.nanmean(uploads.values("loss")))
        return out

    def evaluate(self, state: FedRZOState, rnd: Round) -> dict[str, Any]:
        return {**objective_metrics(self.fed, state.x, self.cfg.weight_decay), **super().evaluate(state, rnd)}


class FedRZONN(ModelAverage):
    """Alg. 1: H_{i,r} zeroth-order projected steps per client, then the average."""

    config = FedRZONNConfig
    client = staticmethod(fedrzo_nn_client)

    def payload(self, state: FedRZOState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x, "lr": cfg.lr, "eta": cfg.eta, "batch_size": cfg.batch_size,
                "weight_decay": cfg.weight_decay, "estimator": cfg.estimator}

    def per_client(self, state: FedRZOState, rnd: Round, ids: list[int]) -> dict[int, dict[str, Any]]:
        return {c: {"steps": steps_of(self.fed, self.cfg, c, rnd.index), "constraint": constraint_of(self.cfg, c)} for c in ids}

    def metrics(self, state: FedRZOState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        out = super().metrics(state, uploads, rnd)
        if uploads:
            out["local_steps_mean"] = float(np.mean([res.local_steps for res in uploads.results]))
        return out

    def evaluate(self, state: FedRZOState, rnd: Round) -> dict[str, Any]:
        out = objective_metrics(self.fed, state.x, self.cfg.weight_decay)
        out.update(feasibility(self.fed, self.cfg, state.x))
        out.update(evaluate_global(self.fed, state.x, rnd.index))
        return out


def steps_of(fed: Federation, cfg: FedRZONNConfig, client: int, round: int) -> int:
    """H_{i,r}: the constant `local_steps`, or the `local_schedule`'s value."""
    if cfg.local_schedule is not None:
        return local_steps(cfg.local_schedule, client, round, fed.seed)
    return int(cfg.local_steps or 0)


def objective_metrics(fed: Federation, x: np.ndarray, weight_decay: float) -> dict[str, float]:
    """The paper's "average loss" at x_r (Fig. 1's y-axis; which average is not stated): mean CE
    over every client's training rows, evaluated on the true ReLU network (eval mode), plus
    weight_decay/2 ||x||^2; off the communication budget, on the driver."""
    idx = np.concatenate(fed.dataset.client_train) if fed.dataset.client_train else np.zeros(0, np.int64)
    m = evaluate_arrays(fed.model, x, fed.dataset.train_x[idx], fed.dataset.train_y[idx], prefix="train_")
    x64 = x.astype(np.float64)
    objective = m["train_loss"] + 0.5 * weight_decay * float(x64 @ x64)
    return {"objective": objective, "log_objective": float(np.log(objective)), "train_accuracy": m["train_accuracy"]}


def feasibility(fed: Federation, cfg: FedRZONNConfig, x: np.ndarray) -> dict[str, float]:
    """max_i dist(x_r, X_i): Prop. 2(ii) bounds this "infeasibility" at a stationary point of
    the smoothed problem (by eta L_0 in rayfl's reading of the bound the extracted text lost)."""
    sets = {constraint_of(cfg, c).kind for c in range(fed.num_clients)}
    if sets == {"none"}:
        return {}
    xt = torch.from_numpy(x.astype(np.float64))
    origin = torch.zeros_like(xt)
    dist = max(float(torch.linalg.vector_norm(xt - project(xt, origin, constraint_of(cfg, c), c)))
               for c in range(fed.num_clients))
    return {"infeasibility": dist}
