"""FedRZO_bl: zeroth-order FedAvg for bilevel FL with delayed inexact lower-level solutions,
and FedRZO_minimax (its Corollary 1 instance with a federated ascent oracle).

Qiu, Shanbhag, Yousefian, "Zeroth-Order Methods for Nondifferentiable, Nonconvex, and
Hierarchical Federated Optimization", NeurIPS 2023, Alg. 2 (spec zo-nondiff.md 4, with the
addendum's correction C1: clients evaluate at their own x_{i,k}; only y is delayed):

    3: the server draws ONE v_r uniform on the sphere of radius eta (global smoothing)
    4: two calls of the lower-level FL oracle (Alg. 3, `rayfl.zo.fl_oracle`) on the same
       clients: y+_r = LL(x_r + v_r, r), y0_r = LL(x_r, r)
    5: broadcast x_r, v_r, y+_r, y0_r; every client sets x_{i,T_r} = x_r
    8: g_{i,k} = (n / eta^2) [f~_i(x_{i,k} + v_r, y+_r; xi) - f~_i(x_{i,k}, y0_r; xi)] v_r
    9: x_{i,k+1} = x_{i,k} - gamma (g_{i,k} + (x_{i,k} - P_X(x_{i,k})) / eta),  H local steps
   11: x_{r+1} = (1/m) sum_i x_{i,T_{r+1}}

The delay is what saves communication: the lower level is solved twice per *round*, not at
every local step, so its cost is 2 sum_r R~_r lower rounds for K = R H local steps. The
`rounds` table counts both levels (upper_rounds, lower_rounds, total_rounds, bytes per level,
simulated seconds per level) so the saving of a larger H is measurable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from rayfl.algorithms.base import eval_due
from rayfl.algorithms.rounds import check_finite
from rayfl.config import AlgorithmConfig, ConfigError, RunConfig
from rayfl.engine import ClientContext, ClientResult, Federation
from rayfl.papers.fedrzo.problems import (
    PROBLEMS,
    Problem,
    ProblemSpec,
    client_problems,
    dimensions,
    initial_point,
    mean_squared_loss,
    reference_lower,
    upper_objective,
)
from rayfl.rng import numpy_rng
from rayfl.zo.estimator import forward_difference_estimate
from rayfl.zo.fl_oracle import LowerLevelConfig, run_fl_oracle
from rayfl.zo.lower_level import minibatch_indices
from rayfl.zo.projection import ConstraintConfig, project
from rayfl.zo.sphere import direction_seed, sphere_from_seed

SHARED_DIRECTION = -1  # the `client` of the direction stream: one v_r for every client
DIRECTION_PURPOSE = "fedrzo_bl.direction"


@dataclass
class FedRZOBLConfig(AlgorithmConfig):
    """FedRZO_bl (NeurIPS 2023, Alg. 2; spec 4, 5, 7.4).

    Upper level: `local_steps` H per round (local_epochs must be null), step `lr` gamma,
    smoothing radius `eta`, upper minibatch `batch_size`, constraint set X (`constraint`,
    e.g. box low: 0.1 for hyperparam's x >= mu, spec 7.4) entering through the Moreau term.
    Full participation (the paper has no client sampling). `lower` is Alg. 3 (FedAvg, budget
    growing with r). `problem` picks Sec. 5.2 (`hyperparam`) or 5.3 (`fair`, use
    `fedrzo_minimax`); `reg_floor`, `lam`, `hidden`, `groups` are its constants.
    `send_direction: seed` sends v_r as its 8-byte seed instead of n floats (spec D-18)."""

    name: str = "fedrzo_bl"
    local_epochs: int | None = None
    local_steps: int | None = 10
    batch_size: int = 64
    lr: float = 1e-3
    eta: float = 0.05
    clients_per_round: int | None = None
    participation: float | None = 1.0
    constraint: ConstraintConfig = field(default_factory=ConstraintConfig)
    lower: LowerLevelConfig = field(default_factory=LowerLevelConfig)
    problem: Literal["hyperparam", "fair"] = "hyperparam"
    reg_floor: float = 1e-4
    lam: float = 1.0
    hidden: int = 4
    groups: Literal["class", "binary"] = "class"
    send_direction: Literal["vector", "seed"] = "vector"

    def validate(self) -> None:
        super().validate()
        if self.local_steps is None:
            raise ConfigError("algorithm.local_steps", "FedRZO_bl runs H = local_steps steps per round; set it (local_epochs: null)")
        if self.participation != 1.0 or self.clients_per_round is not None:
            raise ConfigError("algorithm.participation", "FedRZO_bl uses every client every round: participation 1.0, clients_per_round null")
        if not self.eta > 0:
            raise ConfigError("algorithm.eta", f"must be > 0, got {self.eta}")
        if self.problem not in PROBLEMS:
            raise ConfigError("algorithm.problem", f"must be one of {', '.join(PROBLEMS)}, got {self.problem!r}")
        if not self.reg_floor > 0:
            raise ConfigError("algorithm.reg_floor", f"must be > 0, got {self.reg_floor}")
        if not self.lam > 0:
            raise ConfigError("algorithm.lam", f"must be > 0 (strong concavity of the inner max), got {self.lam}")
        if self.hidden < 1:
            raise ConfigError("algorithm.hidden", f"must be >= 1, got {self.hidden}")
        if self.weight_decay:
            raise ConfigError("algorithm.weight_decay", "FedRZO_bl has no weight decay; regularise inside the problem")
        if self.constraint.kind == "ball":
            raise ConfigError("algorithm.constraint.kind", "FedRZO_bl supports none or box sets here")
        if self.constraint.kind != "none" and self.lr > self.eta:
            raise ConfigError("algorithm.lr", f"with a constraint need lr <= eta (the Moreau step overshoots otherwise, spec D-9), got {self.lr} > {self.eta}")
        self.constraint.validate_as("algorithm.constraint")
        self.lower.validate_as("algorithm.lower")

    def spec(self, num_classes: int) -> ProblemSpec:
        return ProblemSpec(self.problem, num_classes, self.reg_floor, self.lam, self.hidden, self.groups)


@dataclass
class FedRZOMinimaxConfig(FedRZOBLConfig):
    """FedRZO for minimax (Corollary 1, spec 4.3, 7.5): Alg. 2 unchanged on min_x max_y
    (1/m) sum_i f_i(x, y) with h_i = -f_i, i.e. the lower-level oracle is federated gradient
    ascent on y. Defaults: Sec. 5.3's fair classification (lam = 1, spec 7.6)."""

    name: str = "fedrzo_minimax"
    problem: Literal["hyperparam", "fair"] = "fair"

    def validate(self) -> None:
        super().validate()
        if self.problem != "fair":
            raise ConfigError("algorithm.problem", "fedrzo_minimax solves the fair-classification minimax; use fedrzo_bl for hyperparam")


# ---------------------------------------------------------------- client (Alg. 2 lines 6-10)


def fedrzo_bl_client(
    ctx: ClientContext,
    params: np.ndarray,
    y_plus: np.ndarray,
    y_zero: np.ndarray,
    steps: int,
    lr: float,
    eta: float,
    batch_size: int,
    problem: ProblemSpec,
    constraint: ConstraintConfig,
    direction: np.ndarray | None = None,
    direction_seed: int | None = None,
) -> dict[str, Any]:
    """H local steps from x_r with the round's delayed y+_r, y0_r and shared v_r; fresh
    upper-level minibatch xi_{i,k} per step, the same one for both evaluations."""
    prob = problem.for_client(ctx)
    x = np.asarray(params, dtype=np.float64).copy()
    v = direction if direction is not None else eta * sphere_from_seed(int(direction_seed), x.size)
    v = np.asarray(v, dtype=np.float64)
    idx = minibatch_indices(ctx.rng("fedrzo_bl.upper"), len(prob.upper["v"]), batch_size, steps)
    losses = []
    for k in range(len(idx)):
        batch = {key: t.index_select(0, idx[k]) for key, t in prob.upper.items()}
        x, f_zero = local_step(prob, x, v, y_plus, y_zero, batch, lr, eta, constraint)
        losses.append(f_zero)
        ctx.work.forward(2 * len(idx[k]))
        ctx.work.steps += 1
    return {"x": x, "loss": float(np.mean(losses)) if losses else float("nan")}


def local_step(
    prob: Problem, x: np.ndarray, v: np.ndarray, y_plus: np.ndarray, y_zero: np.ndarray,
    batch: dict[str, torch.Tensor], lr: float, eta: float, constraint: ConstraintConfig,
) -> tuple[np.ndarray, float]:
    """Lines 8-9 at the client's own x_{i,k}: returns (x_{i,k+1}, f~_i(x_{i,k}, y0_r; xi))."""
    f_plus = prob.upper_value(x + v, y_plus, batch)
    f_zero = prob.upper_value(x, y_zero, batch)
    g = forward_difference_estimate(f_plus, f_zero, v, eta)
    moreau = (x - project_x(x, constraint)) / eta
    return x - lr * (g + moreau), f_zero


def project_x(x: np.ndarray, constraint: ConstraintConfig) -> np.ndarray:
    """P_X(x) (R^n or a box; the ZO-HFL projection API, centred at the origin)."""
    xt = torch.as_tensor(x, dtype=torch.float64)
    return project(xt, torch.zeros_like(xt), constraint).numpy()


# ---------------------------------------------------------------- server (Alg. 2)


@dataclass
class Ledger:
    """Communication per level, cumulative (kept in the server state so a resumed run goes on
    counting): upper rounds, lower rounds (both calls, as the paper counts them), bytes and
    simulated seconds of each level."""

    upper_rounds: int = 0
    lower_rounds: int = 0
    upper_bytes: int = 0
    lower_bytes: int = 0
    upper_seconds: float = 0.0
    lower_seconds: float = 0.0


@dataclass
class FedRZOBLState:
    """What FedRZO_bl's server carries between rounds: x_r (float64), the last y0 (for the
    `warm` lower-level start) and the communication ledger."""

    x: np.ndarray
    y_last: np.ndarray
    ledger: Ledger = field(default_factory=Ledger)


def shared_direction(seed: int, r: int, n: int, eta: float) -> tuple[int, np.ndarray]:
    """Line 3: v_r = eta z / ||z||, one per round for all clients; returns (its seed, v_r)."""
    s = direction_seed(seed, r, SHARED_DIRECTION, purpose=DIRECTION_PURPOSE)
    return s, eta * sphere_from_seed(s, n)


def average(results: list[ClientResult], key: str) -> np.ndarray:
    """(1/m) sum_i, in client-id order, float64."""
    acc = np.zeros_like(np.asarray(results[0][key], dtype=np.float64))
    for r in results:
        acc += np.asarray(r[key], dtype=np.float64)
    return acc / len(results)


def run_fedrzo_bl(fed: Federation, cfg: FedRZOBLConfig, run: RunConfig) -> dict[str, Any]:
    ds = fed.dataset
    spec = cfg.spec(ds.num_classes)
    features = int(np.prod(ds.input_shape))
    n, n_lower = dimensions(spec, ds.num_clients, features)
    x0 = initial_point(spec, ds.num_clients, features, numpy_rng(fed.seed, "fedrzo_bl.init"))
    s = fed.track(FedRZOBLState(x=x0, y_last=np.zeros(n_lower)))
    clients = [int(c) for c in fed.trainable_clients]
    evaluation = client_problems(ds, spec)  # driver-side, outside the communication budget
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        led = s.ledger
        seed_v, v = shared_direction(fed.seed, r, n, cfg.eta)
        y_start = s.y_last if cfg.lower.init == "warm" else np.zeros(n_lower)
        plus = run_fl_oracle(fed, s.x + v, r, "plus", cfg.lower, y_start, spec, clients)
        zero = run_fl_oracle(fed, s.x, r, "zero", cfg.lower, y_start, spec, clients)
        start = fed.clock.now
        sent = {"direction": v} if cfg.send_direction == "vector" else {"direction_seed": seed_v}
        results = fed.call(
            clients, fedrzo_bl_client, round=r, phase="upper", params=s.x, y_plus=plus.y, y_zero=zero.y,
            steps=cfg.local_steps, lr=cfg.lr, eta=cfg.eta, batch_size=cfg.batch_size, problem=spec,
            constraint=cfg.constraint, **sent,
        )
        x_r = s.x
        if results:
            s.x = average(results, "x")
            check_finite(s.x, r)
        s.y_last = zero.y
        led.upper_rounds += 1
        led.lower_rounds += plus.rounds + zero.rounds
        led.upper_bytes += sum(res.bytes_up + res.bytes_down for res in results)
        led.lower_bytes += plus.bytes + zero.bytes
        led.upper_seconds += fed.clock.now - start
        led.lower_seconds += plus.sim_seconds + zero.sim_seconds
        metrics = {
            "level": "upper",
            "num_updates": len(results),
            "train_loss": float(np.mean([res["loss"] for res in results])) if results else float("nan"),
            "lower_rounds": plus.rounds + zero.rounds,
            "upper_rounds_cum": led.upper_rounds,
            "lower_rounds_cum": led.lower_rounds,
            "total_rounds": led.upper_rounds + led.lower_rounds,
            "upper_bytes_cum": led.upper_bytes,
            "lower_bytes_cum": led.lower_bytes,
            "upper_sim_seconds_cum": led.upper_seconds,
            "lower_sim_seconds_cum": led.lower_seconds,
            "lower_loss": zero.loss,
            "lower_clamped": plus.clamped + zero.clamped,
            "local_steps": cfg.local_steps,
            "eta": cfg.eta,
            "gamma": cfg.lr,
            "x_mean": float(np.mean(s.x)),
        }
        # the loss at y0_r, the lower-level answer the round used, at the round's x_r (spec 7.4 [D])
        metrics["upper_loss"] = upper_objective(evaluation, x_r, zero.y)
        metrics["log_upper_loss"] = float(np.log(metrics["upper_loss"])) if metrics["upper_loss"] > 0 else float("nan")
        if eval_due(r, run):
            metrics.update(evaluate(evaluation, s.x, x_r, zero.y, spec, cfg))
            fed.log_eval(r, {k: metrics[k] for k in ("implicit_obj", "log_implicit_obj", "ll_err", "feas_violation")})
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}


def evaluate(
    problems: list[Problem], x: np.ndarray, x_r: np.ndarray, y_zero: np.ndarray, spec: ProblemSpec, cfg: FedRZOBLConfig
) -> dict[str, float]:
    """The implicit objective f(x_{r+1}) = (1/m) sum_i f_i(x, y(x)) with a reference y(x)
    (closed form or L-BFGS, outside the communication budget), its log, the lower-level error
    ||y0_r - y(x_r)||^2 of the round's oracle answer, and dist(x_{r+1}, X)."""
    implicit = upper_objective(problems, x, reference_lower(problems, x, spec))
    out = {
        "implicit_obj": implicit,
        "log_implicit_obj": float(np.log(implicit)) if implicit > 0 else float("nan"),
        "ll_err": float(np.sum((y_zero - reference_lower(problems, x_r, spec)) ** 2)),
        "feas_violation": float(np.linalg.norm(x - project_x(x, cfg.constraint))),
    }
    if spec.name == "fair":
        out["mse"] = mean_squared_loss(problems, x, spec)
    return out
