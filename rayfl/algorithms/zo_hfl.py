"""ZO-HFL: randomized zeroth-order hierarchical (bilevel) federated learning.

Qiu, Kim, Yousefian, "A Randomized Zeroth-Order Hierarchical Framework for Heterogeneous
Federated Learning", arXiv 2504.01839 (revised version: H_{i,r} with the ceiling; v1 has the
same algorithms and Table I).

    min_x  f1(x) + sum_i w_i f2(x, y_i(x)),   y_i(x) = argmin_{y in Y_i(x)} CE_i(y) + mu/2 ||x - y||^2

The server owns data (f1, first-order) and the clients solve the lower level; the implicit
penalty f2(x, y_i(x)) = lam/2 ||x - y_i(x)||^2 is nonsmooth in general, so the server steps on
its spherical smoothing with two-point estimates built from the clients' two solves at
x_r +- eta v_{i,r}. Every round (Alg. 1):

    3: draw v_{i,r} uniform on the unit sphere; send x_r and v_{i,r} (or its seed) to client i
    5: client i runs Alg. 2 twice: y+- = H_{i,r} projected-SGD steps at x_r +- eta v_{i,r}
    7: g = grad f1~(x_r, xi_r) + sum_i w_i (d / 2 eta)(f2(x_r + eta v, y+) - f2(x_r - eta v, y-)) v
    8: x_{r+1} = x_r - gamma_r g,  gamma_r = gamma_0 / (r + 1)^p

Defaults are the paper's Sec. IV values where it gives them and rayfl's choices where it does
not (lam = 1, mu = 0.1, batch 64, x_0 = 0, warm starts, common random numbers, self-normalised
weights over participants); docs/replications/zo-hfl.md says why for each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from rayfl.algorithms.kernels import CrossEntropyGrad, linear_shape
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
from rayfl.driver.rounds import evaluate_global
from rayfl.engine import ClientContext, ClientResult, Federation
from rayfl.engine.evaluation import evaluate_arrays
from rayfl.engine.vectorized import batched
from rayfl.zo.batched_solves import (
    PairedBatches,
    batched_projected_sgd,
    pair_batches,
    project_rows,
    row_radii,
)
from rayfl.zo.estimator import quadratic_penalty, quadratic_penalty_difference, two_point_estimate
from rayfl.zo.lower_level import minibatch_indices, projected_sgd
from rayfl.zo.projection import ConstraintConfig, project
from rayfl.zo.schedules import StepsSchedule, check_budget_fields, local_steps
from rayfl.zo.sphere import direction_seed, sphere_from_seed

SHARED_DIRECTION = -1  # the `client` of the direction stream when one v_r serves every client


@dataclass
class ZOHFLConfig(AlgorithmConfig):
    """ZO-HFL (arXiv 2504.01839, Alg. 1 + 2; Sec. IV for the experimental values).

    Server: `server_lr` gamma_0 = 0.01 and `server_lr_power` p = 0.5 (gamma_r = 0.01/sqrt(r+1),
    Sec. IV; p in (1/2, 1] for Thm 2's a.s. result); one minibatch of `server_batch_size` from
    its own data per round (f1); x_0 = 0 (`init: zeros`) or the model's initialisation, after
    `server_pretrain_steps` SGD steps on f1 (0: the paper's "pre-training" is the f1 term).
    Zeroth order: `eta` = 0.1; penalty f2 = `lam`/2 ||x - y||^2 (lam not reported; 1 keeps
    gamma_0 lam sqrt(d), the ZO noise step per unit gap, below 1: on MNIST lam = 10 or 100
    leaves the global model at chance, the estimate's noise ~ sqrt(d) times its signal;
    lam = 0 is server-only SGD, and the clients are then not called); `directions`
    independent per client (the paper's v_{i,r}) or one shared v_r.
    Clients: H_{i,r} from `local_schedule` (sqrt, tau = 20 in Table I), step `lr`/(t +
    `lr_offset`) = 0.1/(t+1), minibatch `batch_size`, lower level CE + `mu`/2 ||x - y||^2
    (mu = 0.1; larger mu keeps clients near x under extreme heterogeneity, Sec. IV), projected
    on `constraint`. `client_init: warm` starts both solves at Pi[y_bar_i], the client's last
    (y+ + y-)/2 (the global model at its first call); `input` at x_r +- eta v. `randomness:
    common` gives both solves the same minibatches (the d/2eta ~ 4e4 factor would otherwise
    amplify independent SGD noise; the paper does not say). Aggregation: `weights` data_size
    (rho_i = N_i / sum_j N_j, Sec. IV) or uniform (1/m, the theory); `aggregation: participants`
    renormalises them over the round's clients, `unbiased` scales by m/|S_r|, `all_clients`
    calls every client with H = 0 for those not sampled (the paper's straggler reading).
    Communication: `send_direction: seed` sends 8 bytes instead of v; `upload: scalars` sends
    f2(x+, y+) and f2(x-, y-) (and ||x_r - y_bar||^2 for the logged loss) instead of y+-.
    Readings the paper leaves open: `zo_dimension` is the n of n/(2 eta) (null: the number of
    parameters d, Lemma 7; Sec. IV reuses n for the 784 features); `direction_radius: eta`
    draws v on eta S (Sec. II's sentence) instead of the unit sphere S (Alg. 1, Lemma 7), the
    client then solving at x_r +- eta v with ||v|| = eta and g_i carrying that v."""

    name: str = "zo_hfl"
    local_epochs: int | None = None
    local_steps: int | None = None
    # H_{i,r}, each client's projected-SGD steps per solve in round r (sqrt with tau 20: Table I);
    # sub-keys below.
    local_schedule: StepsSchedule = field(default_factory=StepsSchedule)
    # The clients' lower-level minibatch size.
    batch_size: int = 64
    # The clients' base step: step t of a solve uses lr / (t + lr_offset) (0.1 / (t + 1) in the
    # paper).
    lr: float = 0.1
    # The offset of the clients' harmonic step lr / (t + lr_offset) (> 0).
    lr_offset: float = 1.0
    # gamma_0, the server's base step: gamma_r = server_lr / (r + 1)^server_lr_power (> 0).
    server_lr: float = 0.01
    # p of gamma_r = gamma_0 / (r + 1)^p (>= 0); p in (1/2, 1] for Thm 2's almost-sure result.
    server_lr_power: float = 0.5
    # The server's minibatch of its own data per round for f1 (>= 1).
    server_batch_size: int = 64
    # SGD steps on f1 before the first round (>= 0; 0: the paper's f1 term is its only
    # pre-training).
    server_pretrain_steps: int = 0
    # The smoothing radius of the two-point estimate at x_r +- eta v (> 0).
    eta: float = 0.1
    # lambda of the penalty f2 = lam/2 ||x - y||^2 (>= 0; 0 is server-only SGD, the clients not
    # called).
    lam: float = 1.0
    # mu of the clients' lower level CE + mu/2 ||x - y||^2 (>= 0): larger keeps clients near x under
    # extreme heterogeneity.
    mu: float = 0.1
    # The clients' weights w_i: data_size (N_i / sum_j N_j, Sec. IV) or uniform (1/m, the theory).
    weights: Literal["data_size", "uniform"] = "data_size"
    # How the round's clients combine: participants (weights renormalised over them), unbiased
    # (scaled by m / |S_r|), all_clients (every client called, H = 0 for those not sampled).
    aggregation: Literal["participants", "unbiased", "all_clients"] = "participants"
    # common (both solves of a client use the same minibatches, so the d / 2eta factor does not
    # amplify SGD noise) or independent.
    randomness: Literal["common", "independent"] = "common"
    # per_client (an independent v_{i,r} per client: the paper's) or shared (one v_r for all).
    directions: Literal["per_client", "shared"] = "per_client"
    # x_0: zeros (the paper's) or model (the model's initialisation).
    init: Literal["zeros", "model"] = "zeros"
    # Where both solves start: warm (the client's last (y+ + y-)/2, projected) or input (x_r +- eta
    # v).
    client_init: Literal["warm", "input"] = "warm"
    # Y_i(x), the set every lower-level step is projected on (sub-keys below); kind none: R^d.
    constraint: ConstraintConfig = field(default_factory=ConstraintConfig)
    # How v travels: vector (d floats) or seed (8 bytes; needs direction_radius unit).
    send_direction: Literal["vector", "seed"] = "vector"
    # What clients send: models (y+ and y-) or scalars (f2(x+, y+), f2(x-, y-) and the logged loss's
    # term).
    upload: Literal["models", "scalars"] = "models"
    # The n of n / (2 eta) in the estimate (>= 1); null: the number of parameters d (Lemma 7).
    zo_dimension: int | None = None
    # Where v is drawn: unit (the unit sphere: Alg. 1, Lemma 7) or eta (the sphere of radius eta:
    # Sec. II's sentence).
    direction_radius: Literal["unit", "eta"] = "unit"

    def validate(self) -> None:
        check_budget_fields(self, self.local_schedule, "algorithm.local_schedule")
        for key in ("eta", "server_lr", "lr_offset"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"algorithm.{key}", f"must be > 0, got {getattr(self, key)}")
        for key in ("lam", "mu", "server_lr_power", "server_pretrain_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"algorithm.{key}", f"must be >= 0, got {getattr(self, key)}")
        if self.server_batch_size < 1:
            raise ConfigError("algorithm.server_batch_size", f"must be >= 1, got {self.server_batch_size}")
        if self.weight_decay:
            raise ConfigError("algorithm.weight_decay", "ZO-HFL's lower level is CE + mu/2 ||x - y||^2; use algorithm.mu")
        self.constraint.validate_as("algorithm.constraint")
        if self.zo_dimension is not None and (isinstance(self.zo_dimension, bool) or not isinstance(self.zo_dimension, int)
                                              or self.zo_dimension < 1):
            raise ConfigError("algorithm.zo_dimension", f"must be an integer >= 1 or null (the parameter count), got {self.zo_dimension!r}")
        if self.direction_radius not in ("unit", "eta"):
            raise ConfigError("algorithm.direction_radius", f"got {self.direction_radius!r}; allowed values are ['unit', 'eta']")
        if self.direction_radius == "eta" and self.send_direction == "seed":
            raise ConfigError("algorithm.direction_radius", "eta needs send_direction: vector (a seed rebuilds a unit v)")


# ---------------------------------------------------------------- client (Alg. 2, twice)


def zo_hfl_client(
    ctx: ClientContext,
    params: np.ndarray,
    steps: int,
    eta: float,
    lam: float,
    mu: float,
    lr: float,
    lr_offset: float,
    batch_size: int,
    constraint: ConstraintConfig,
    randomness: str = "common",
    client_init: str = "warm",
    upload: str = "models",
    direction: np.ndarray | None = None,
    direction_seed: int | None = None,
) -> dict[str, Any]:
    """Both lower-level solves of client i in round r, as one [2, d] projected-SGD run.

    The direction arrives as a float32 vector or as the seed it was drawn from; either way the
    client perturbs with the same float32 v. Stores y_bar = (y+ + y-)/2 for its next warm start."""
    x = torch.tensor(params, dtype=torch.float32, device=ctx.device)
    d = x.numel()
    v_np = direction if direction is not None else sphere_from_seed(int(direction_seed), d).astype(np.float32)
    v = torch.tensor(v_np, dtype=torch.float32, device=ctx.device)
    centers = torch.stack([x + eta * v, x - eta * v])
    if client_init == "warm":
        y_bar = ctx.state.get("y_bar", x)
        starts = project(y_bar.expand(2, d), centers, constraint, ctx.id)
    else:
        starts = centers
    y, loss, _ = projected_sgd(
        starts, centers, steps=steps, lr=lr, lr_offset=lr_offset, mu=mu, constraint=constraint,
        data_grad=_minibatch_grad(ctx, steps, batch_size, randomness), client=ctx.id,
        affords_step=lambda: ctx.work.affords_step(2 * min(batch_size, ctx.num_samples)),
    )
    y_bar = 0.5 * (y[0] + y[1])
    ctx.state["y_bar"] = y_bar
    if upload == "models":
        return {"y_plus": y[0], "y_minus": y[1], "loss": loss}
    c, yy = centers.cpu().numpy(), y.cpu().numpy()
    return {
        "f_plus": quadratic_penalty(c[0], yy[0], lam),
        "f_minus": quadratic_penalty(c[1], yy[1], lam),
        "gap": squared_distance(params, y_bar.cpu().numpy()),
        "loss": loss,
    }


def _minibatch_grad(ctx: ClientContext, steps: int, batch_size: int, randomness: str):
    """The data term's stochastic gradient for the [2, d] solve, charging both gradient steps:
    common random numbers share one index stream (and one matmul); `independent` gives each
    solve its own stream."""
    n = ctx.num_samples
    if n == 0 or steps == 0:
        return None
    kernel = CrossEntropyGrad(ctx.model)
    xs, ts = kernel.prepare(ctx.x, ctx.y)
    b = min(batch_size, n)
    if randomness == "common":
        idx = minibatch_indices(ctx.rng("zo_hfl.batches"), n, b, steps).to(xs.device)

        def grad(y: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
            ctx.work.gradient_step(b)
            ctx.work.gradient_step(b)
            return kernel(y, xs.index_select(0, idx[t]), ts.index_select(0, idx[t]), shared=True)

        return grad
    pair = torch.stack(
        [minibatch_indices(ctx.rng(f"zo_hfl.batches.{s}"), n, b, steps) for s in ("plus", "minus")], dim=1
    ).to(xs.device)  # [steps, 2, b]

    def grad_independent(y: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.work.gradient_step(b)
        ctx.work.gradient_step(b)
        return kernel(y, xs[pair[t]], ts[pair[t]], shared=False)

    return grad_independent


@batched(zo_hfl_client)
def zo_hfl_clients(ctxs: list[ClientContext], kwargs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`zo_hfl_client` for K clients of one host call as one [2K, d] projected-SGD run (issue
    13's vectorised execution). Each client keeps its own index streams, work meter (and work
    budget's truncation), warm start and constraint radius; None (the host loops) for models
    other than the linear one, whose closed-form gradient the batch stacks, or mixed settings."""
    shape = linear_shape(ctxs[0].model)
    shared = ("params", "eta", "lam", "mu", "lr", "lr_offset", "batch_size", "constraint", "randomness", "client_init", "upload")
    first = kwargs[0]
    if shape is None or any(not _same(kw.get(key), first.get(key)) for kw in kwargs[1:] for key in shared):
        return None
    kw = {**_CLIENT_DEFAULTS, **first}
    eta, lam, mu, constraint = kw["eta"], kw["lam"], kw["mu"], kw["constraint"]
    device = ctxs[0].device
    x = torch.tensor(kw["params"], dtype=torch.float32, device=device)
    d = x.numel()
    v = torch.stack([torch.tensor(_direction(k, d), dtype=torch.float32, device=device) for k in kwargs])
    xs = x.expand(len(ctxs), d)
    centers = torch.stack([xs + eta * v, xs - eta * v], dim=1).reshape(2 * len(ctxs), d)  # rows k+, k-
    radii = row_radii(constraint, [c.id for c in ctxs], centers)
    if kw["client_init"] == "warm":
        y_bar = torch.stack([c.state.get("y_bar", x) for c in ctxs]).repeat_interleave(2, dim=0)
        starts = project_rows(y_bar, centers, constraint, radii)
    else:
        starts = centers
    b = kw["batch_size"]
    steps = [int(k["steps"]) for k in kwargs]
    done = [_charge_steps(c, h, b) for c, h in zip(ctxs, steps, strict=True)]
    has_data = [c.num_samples > 0 and h > 0 for c, h in zip(ctxs, steps, strict=True)]
    batches = _paired_batches(ctxs, steps, b, kw["randomness"]) if any(has_data) else None
    y, losses = batched_projected_sgd(
        starts, centers, done, lr=kw["lr"], lr_offset=kw["lr_offset"], mu=mu, constraint=constraint,
        radii=radii, batches=batches, shape=shape, has_data=has_data,
    )
    outs = []
    for j, ctx in enumerate(ctxs):
        y_plus, y_minus = y[2 * j].clone(), y[2 * j + 1].clone()
        y_bar_j = 0.5 * (y_plus + y_minus)
        ctx.state["y_bar"] = y_bar_j
        if kw["upload"] == "models":
            outs.append({"y_plus": y_plus, "y_minus": y_minus, "loss": losses[j]})
            continue
        c, yy = centers[2 * j : 2 * j + 2].cpu().numpy(), torch.stack([y_plus, y_minus]).cpu().numpy()
        outs.append({
            "f_plus": quadratic_penalty(c[0], yy[0], lam),
            "f_minus": quadratic_penalty(c[1], yy[1], lam),
            "gap": squared_distance(kw["params"], y_bar_j.cpu().numpy()),
            "loss": losses[j],
        })
    return outs


_CLIENT_DEFAULTS = {"randomness": "common", "client_init": "warm", "upload": "models"}


def _same(a: Any, b: Any) -> bool:
    """Whether two clients got the same setting (the broadcast's one object, as a rule)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _direction(kw: dict[str, Any], d: int) -> np.ndarray:
    """The client's float32 v, sent as a vector or rebuilt from its seed (as the loop does)."""
    v = kw.get("direction")
    return v if v is not None else sphere_from_seed(int(kw["direction_seed"]), d).astype(np.float32)


def _charge_steps(ctx: ClientContext, steps: int, batch_size: int) -> int:
    """The loop's work-meter calls for `steps` paired steps (a budget check, then two gradient
    steps of b samples when there is data), in its order; returns the steps the budget allows."""
    n = ctx.num_samples
    b = min(batch_size, n)
    charge = n > 0
    if ctx.work.budget_flops is None:
        if charge:
            ctx.work.backward_samples += 2 * b * steps
            ctx.work.steps += 2 * steps
        return steps
    for t in range(steps):
        if not ctx.work.affords_step(2 * b):
            return t
        if charge:
            ctx.work.gradient_step(b)
            ctx.work.gradient_step(b)
    return steps


def _paired_batches(ctxs: list[ClientContext], steps: list[int], batch_size: int, randomness: str) -> PairedBatches:
    """Every client's minibatch indices from its own streams, drawn exactly as `_minibatch_grad`
    draws them (full `steps` rows even when a budget truncates, like the loop)."""
    kernel = CrossEntropyGrad(ctxs[0].model)
    xs, ts, streams = [], [], []
    for ctx, h in zip(ctxs, steps, strict=True):
        xi, ti = kernel.prepare(ctx.x, ctx.y)
        xs.append(xi)
        ts.append(ti)
        n = ctx.num_samples
        b = min(batch_size, n)
        if n == 0 or h == 0:
            owned = [torch.zeros((0, 0), dtype=torch.int64)] * (1 if randomness == "common" else 2)
        elif randomness == "common":
            owned = [minibatch_indices(ctx.rng("zo_hfl.batches"), n, b, h)]
        else:
            owned = [minibatch_indices(ctx.rng(f"zo_hfl.batches.{s}"), n, b, h) for s in ("plus", "minus")]
        streams.append(owned)
    return pair_batches(xs, ts, streams, max(steps))


# ---------------------------------------------------------------- server (Alg. 1)


@dataclass
class ZOHFLState:
    """What ZO-HFL's server carries between rounds: x_r (float64) and each client's latest
    lower-level answer for the penalty term of the objective it reports."""

    x: np.ndarray
    penalty: PenaltyTracker


class ZOHFL(Algorithm[ZOHFLState]):
    """Alg. 1: the clients' paired lower-level solves at x_r +- eta v_{i,r}, then the server's
    step on its own minibatch gradient of f1 plus the weighted two-point estimates."""

    config = ZOHFLConfig
    client = staticmethod(zo_hfl_client)
    name = "zo_solves"
    update_without_uploads = True  # with no answer (or lam = 0) the server still steps on f1
    pipeline_refusal = ("ZO-HFL's clients upload lower-level solutions y+- whose penalty difference the server "
                        "takes; no model-shaped update is summed")
    asynchrony_refusal = "ZO-HFL forms each client's estimate against the round's x_r and its own direction v_{i,r}"

    def setup(self) -> None:
        fed, cfg = self.fed, self.cfg
        self.server = fed.server_data  # built once: the property copies the server's rows
        self.kernel = CrossEntropyGrad(fed.model)
        self.rho = fed.client_weights(None, "samples" if cfg.weights == "data_size" else "uniform")

    def init(self) -> ZOHFLState:
        x0 = pretrain(initial_point(self.fed, self.cfg), self.server, self.kernel, self.cfg)
        return ZOHFLState(x=x0, penalty=PenaltyTracker(self.cfg.lam, self.rho))

    def clients(self, state: ZOHFLState | None, rnd: Round) -> list[int]:
        """Lines 3-6's clients: the sampled ones (every client with `all_clients`); none with
        lam = 0, where nothing a client returns can move x (server-only SGD)."""
        if self.cfg.lam <= 0:
            return []
        return list(range(self.fed.num_clients)) if self.cfg.aggregation == "all_clients" else rnd.cohort

    def directions(self, rnd: Round) -> dict[int, tuple[int, np.ndarray]]:
        """Each called client's v_{i,r} (drawn once per round)."""
        if "directions" not in rnd.notes:
            called = self.clients(None, rnd)
            rnd.notes["directions"] = client_directions(self.fed.seed, rnd.index, called, self.fed.num_params, self.cfg)
        return rnd.notes["directions"]

    def payload(self, state: ZOHFLState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x.astype(np.float32), "eta": cfg.eta, "lam": cfg.lam, "mu": cfg.mu, "lr": cfg.lr,
                "lr_offset": cfg.lr_offset, "batch_size": cfg.batch_size, "constraint": cfg.constraint,
                "randomness": cfg.randomness, "client_init": cfg.client_init, "upload": cfg.upload}

    def per_client(self, state: ZOHFLState, rnd: Round, ids: list[int]) -> dict[int, dict[str, Any]]:
        """H_{i,r} (0 for a client called but not sampled) and v_{i,r} or its seed."""
        cfg, sampled, directions = self.cfg, set(rnd.cohort), self.directions(rnd)
        out: dict[int, dict[str, Any]] = {}
        for i in ids:
            seed, v32 = directions[i]
            out[i] = {"steps": local_steps(cfg.local_schedule, i, rnd.index, self.fed.seed) if i in sampled else 0}
            out[i].update({"direction": v32} if cfg.send_direction == "vector" else {"direction_seed": seed})
        return out

    def server_update(self, state: ZOHFLState, uploads: Uploads, rnd: Round) -> ZOHFLState:
        """Lines 7-8: g = grad f1~(x_r) + sum_i w_i g_i; x_{r+1} = x_r - gamma_r g."""
        cfg = self.cfg
        x32 = state.x.astype(np.float32)
        directions = self.directions(rnd)
        estimates = [zo_estimate(res, x32, directions[res.client][1].astype(np.float64), cfg) for res in uploads.results]
        f1_loss, g1 = server_gradient(self.server, self.kernel, x32, cfg.server_batch_size, rnd.index)
        w = aggregation_weights(self.rho, uploads.clients, len(rnd.cohort), cfg.aggregation)
        x, g_zo, gamma = server_step(state.x, rnd.index, g1, estimates, w, cfg)
        rnd.notes.update(server_loss=f1_loss, weights=w, zo_grad_norm=float(np.linalg.norm(g_zo)), gamma=gamma)
        return ZOHFLState(x=x, penalty=state.penalty.updated(uploads.results))

    def metrics(self, state: ZOHFLState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        notes, results = rnd.notes, uploads.results
        return {
            "num_updates": len(results),
            "server_loss": notes["server_loss"],
            "train_loss": _mean_local_loss(results, notes["weights"]),
            "zo_grad_norm": notes["zo_grad_norm"],
            "server_lr": notes["gamma"],
            "local_steps_mean": float(np.mean([res.local_steps for res in results])) if results else 0.0,
        }

    def evaluate(self, state: ZOHFLState, rnd: Round) -> dict[str, Any]:
        x_eval = state.x.astype(np.float32)
        out = objective(self.fed, self.server, x_eval, state.penalty)
        out.update(evaluate_global(self.fed, x_eval, rnd.index))
        return out

    def summary(self, state: ZOHFLState, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"final_params": state.x.astype(np.float32), **metrics}


def client_directions(seed: int, round: int, clients: list[int], d: int, cfg: ZOHFLConfig) -> dict[int, tuple[int, np.ndarray]]:
    """Line 3: each client's direction v_{i,r} (one shared v_r with `directions: shared`) as
    (its seed, the float32 vector the client perturbs with), on the unit sphere or eta S."""
    radius = cfg.eta if cfg.direction_radius == "eta" else 1.0
    out = {}
    for i in clients:
        s = direction_seed(seed, round, SHARED_DIRECTION if cfg.directions == "shared" else i)
        out[i] = (s, (radius * sphere_from_seed(s, d)).astype(np.float32))
    return out


def zo_estimate(res: ClientResult, x32: np.ndarray, v: np.ndarray, cfg: ZOHFLConfig) -> np.ndarray:
    """Line 7's g_i = (d / 2 eta)(f2(x_r + eta v, y+) - f2(x_r - eta v, y-)) v from client i's
    answer `res` to x_r (`x32`) and v_{i,r} (`v`, the float32-exact direction as float64).
    d is `zo_dimension` when set (the two-point formula's own d is len(v), hence the rescale)."""
    g = two_point_estimate(penalty_difference(res, x32, v, cfg), 0.0, v, cfg.eta)
    return g if cfg.zo_dimension is None else (cfg.zo_dimension / v.size) * g


def server_step(
    x: np.ndarray, r: int, g1: np.ndarray, estimates: list[np.ndarray], w: np.ndarray, cfg: ZOHFLConfig
) -> tuple[np.ndarray, np.ndarray, float]:
    """Lines 7-8: g_zo = sum_i w_i g_i, gamma_r = gamma_0 / (r + 1)^p and x_{r+1} = x_r -
    gamma_r (grad f1~ + g_zo), a plain SGD step with no projection on x.
    Returns (x_{r+1}, g_zo, gamma_r)."""
    g_zo = sum((wi * est for wi, est in zip(w, estimates, strict=True)), np.zeros_like(x))
    gamma = cfg.server_lr / (r + 1) ** cfg.server_lr_power
    return x - gamma * (g1 + g_zo), g_zo, gamma


def penalty_difference(res: ClientResult, x32: np.ndarray, v: np.ndarray, cfg: ZOHFLConfig) -> float:
    """f2(x + eta v, y+) - f2(x - eta v, y-) in float64, from the models or the client's scalars."""
    if cfg.upload == "scalars":
        return float(res["f_plus"]) - float(res["f_minus"])
    return quadratic_penalty_difference(x32, v, cfg.eta, res["y_plus"], res["y_minus"], cfg.lam)


def aggregation_weights(rho: np.ndarray, clients: list[int], num_sampled: int, how: str) -> np.ndarray:
    """w_i for the clients that answered: rho_i renormalised over them (`participants`,
    `all_clients`), or (m / |S_r|) rho_i (`unbiased`, rho summing to 1 over all m clients)."""
    if not clients:
        return np.zeros(0)
    w = rho[np.asarray(clients)]
    if how == "unbiased":
        return w * (len(rho) / max(num_sampled, 1))
    return w / w.sum()


def server_gradient(server: Any, kernel: CrossEntropyGrad, x32: np.ndarray, batch_size: int, r: int) -> tuple[float, np.ndarray]:
    """Line 7's grad f1~(x_r, xi_r) on one minibatch of the server's data (0 without any)."""
    if server is None:
        return float("nan"), np.zeros(x32.size)
    xb, yb = server.batch(batch_size, r, purpose="zo_hfl.server_batch")
    loss, grad = kernel(torch.from_numpy(x32)[None], *kernel.prepare(xb, yb))
    return float(loss[0]), grad[0].double().numpy()


def initial_point(fed: Federation, cfg: ZOHFLConfig) -> np.ndarray:
    """x_0 in float64: zeros (not stated in the paper; the softmax model is convex in x) or the
    model's init."""
    if cfg.init == "zeros":
        return np.zeros(fed.num_params, dtype=np.float64)
    return fed.initial_params().astype(np.float64)


def pretrain(x: np.ndarray, server: Any, kernel: CrossEntropyGrad, cfg: ZOHFLConfig) -> np.ndarray:
    """Optional SGD on f1 alone before round 0, at step gamma_0 (not in the paper, whose
    "pre-training" is the f1 term of every round)."""
    if server is None:
        return x
    for s in range(cfg.server_pretrain_steps):
        xb, yb = server.batch(cfg.server_batch_size, s, purpose="zo_hfl.pretrain")
        _, grad = kernel(torch.from_numpy(x.astype(np.float32))[None], *kernel.prepare(xb, yb))
        x = x - cfg.server_lr * grad[0].double().numpy()
    return x


@dataclass
class PenaltyTracker:
    """lam/2 sum_i rho_i ||x - y_bar_i||^2 with each client's latest y_bar (rayfl's reading of
    the penalty in Fig. 2's "global loss", which Sec. IV does not define): exact for the
    current x when clients upload models, from their last reported gap otherwise.
    Clients never called yet contribute nothing. A dataclass of arrays and numbers, so the
    server state that holds it is checkpointed as data."""

    lam: float
    rho: np.ndarray
    y_bar: dict[int, np.ndarray] = field(default_factory=dict)
    gap: dict[int, float] = field(default_factory=dict)

    def updated(self, results: list[ClientResult]) -> PenaltyTracker:
        """A tracker with these answers' y_bar_i (or gaps) replacing their clients' last ones."""
        out = PenaltyTracker(self.lam, self.rho, dict(self.y_bar), dict(self.gap))
        for res in results:
            if "y_plus" in res.values:
                out.y_bar[res.client] = 0.5 * (res["y_plus"] + res["y_minus"])
            else:
                out.gap[res.client] = float(res["gap"])
        return out

    def value(self, x: np.ndarray) -> float:
        squared = {i: squared_distance(x, y) for i, y in self.y_bar.items()} | self.gap
        return 0.5 * self.lam * sum(float(self.rho[i]) * s for i, s in squared.items())


def squared_distance(a: np.ndarray, b: np.ndarray) -> float:
    e = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return float(e @ e)


def objective(fed: Federation, server: Any, x32: np.ndarray, penalty: PenaltyTracker) -> dict[str, float]:
    """The upper-level objective f(x) = f1(x) + penalty on all server data (Fig. 2's "global
    loss", which Sec. IV does not define) and the CE of x on the whole training split."""
    out: dict[str, float] = {}
    f1 = 0.0
    if server is not None:
        f1 = evaluate_arrays(fed.model, x32, server.x.numpy(), server.y.numpy(), prefix="f1_")["f1_loss"]
    pen = penalty.value(x32.astype(np.float64))
    ds = fed.dataset
    out.update(f1=f1, penalty=pen, global_loss=f1 + pen)
    out["train_ce"] = evaluate_arrays(fed.model, x32, ds.train_x, ds.train_y, prefix="train_")["train_loss"]
    return out


def _mean_local_loss(results: list[ClientResult], w: np.ndarray) -> float:
    losses = np.array([r["loss"] for r in results], dtype=np.float64)
    ok = np.isfinite(losses)
    if not ok.any():
        return float("nan")
    return float(np.sum(w[ok] * losses[ok]) / np.sum(w[ok]))
