"""ComFedL (Huang & Li, arXiv 2106.11264 v3, Alg. 1): compositional federated learning.

Each client minimises g(f^i(w)) with local SGD on the plug-in compositional gradient

    u = grad g(f_B(w))^T grad f_B(w)           (f_B from a batch B of D_i, |B| = b)

and the server averages the returned models uniformly (line 17; no data-size weights). Both
instantiations have a scalar composed loss q(w) and the shared outer function g = exp(./gamma)
(pluggable: `identity` gives local SGD with a uniform average):

- `objective: loss` (distributionally robust FL, the MNIST experiment): q = f_B(w), the
  minibatch cross-entropy; min_w mean_i exp(f^i(w)/gamma) is the KL-regularised min-max of
  eq. (4) by Lemma 1.
- `objective: maml` (ComFedL-DAMAML, the CIFAR experiment): q = l_B~(w - alpha grad l_B(w)),
  the query loss (batch B~ of D~_i, |B~| = b1) after one inner step on the support batch B,
  differentiated through the inner step (`second_order`; first order is a deviation).

So u = g'(q) grad q. The literal g'(q) = exp(q/gamma)/gamma is 1e11 at the first 10-class CE
loss ln 10 and gamma = 0.1 of the paper's grid (Sec. 5.3), 5e5 at its gamma = 0.2 (Sec. 5.1); the
paper does not discuss this scale. So `weighting: normalized` (default; rayfl's, not the paper's)
first asks every sampled client for L_i = q at w_s, broadcasts c_s = gamma log((1/m) sum_j exp(L_j/gamma))
and steps with exp((q - c_s)/gamma) grad q (exponent clamped at `clamp`): exactly the literal
step with the learning rate rescaled by gamma / Z_s, Z_s = exp(c_s/gamma), for the whole round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rayfl.algorithms.client_eval import evaluate_clients, evaluate_global_and_clients
from rayfl.algorithms.kernels import CrossEntropyGrad
from rayfl.algorithms.personalized_eval import PREFIX as PERSONALIZED
from rayfl.algorithms.server_opt import ModelState
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Phase, Round, Uploads
from rayfl.engine import ClientContext
from rayfl.zo.lower_level import minibatch_indices


@dataclass
class ComFedLConfig(AlgorithmConfig):
    """ComFedL. `local_steps` is tau (line 7), `batch_size` b, `outer_batch_size` b1 (the query
    batch of `objective: maml`), `lr` eta, `gamma` the KL weight / temperature, `inner_lr` the
    MAML inner step alpha. `average: samples` replaces line 17's uniform mean by FedAvg's
    n_i-weighted one: with `outer: identity` that is FedAvg (size-weighted, same minibatches
    as `fedavg`) with per-client evaluation. `client_eval` adds every client's train /
    validation accuracy (average and worst) to each evaluation."""

    name: str = "comfedl"
    local_epochs: int | None = None
    local_steps: int | None = 5
    lr: float = 0.01
    # gamma of the outer function g = exp(q / gamma): the KL weight / temperature (> 0); smaller is
    # more robust.
    gamma: float = 0.2
    # The outer function g: exp (ComFedL) or identity (plain local SGD).
    outer: Literal["exp", "identity"] = "exp"
    # How g'(q) enters the step: normalized (exp((q - c_s) / gamma) with c_s shared in the round:
    # the literal step at a rescaled lr) or literal (exp(q / gamma) / gamma, which overflows at the
    # paper's settings).
    weighting: Literal["normalized", "literal"] = "normalized"
    # The cap on the exponent of the normalized weight (> 0).
    clamp: float = 30.0
    # The composed loss q: loss (the minibatch cross-entropy: distributionally robust FL) or maml
    # (the query loss after one inner step: ComFedL-DAMAML).
    objective: Literal["loss", "maml"] = "loss"
    # objective maml only: b1, the query batch size (> 0).
    outer_batch_size: int = 32
    # objective maml only: alpha, the inner step on the support batch (> 0).
    inner_lr: float = 0.05
    # objective maml only: differentiate through the inner step (first order is a deviation from the
    # paper).
    second_order: bool = True
    # How the server averages the returned models: uniform (the paper's line 17) or samples (by n_i,
    # FedAvg's).
    average: Literal["uniform", "samples"] = "uniform"
    # At each evaluation, also measure every client's train and validation accuracy (average and
    # worst).
    client_eval: bool = True

    def validate(self) -> None:
        super().validate()
        if self.local_steps is None:
            raise ConfigError("algorithm.local_steps", "ComFedL runs tau local steps: set local_steps (local_epochs: null)")
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise ConfigError("algorithm.gamma", f"must be > 0, got {self.gamma}")
        if not self.clamp > 0:
            raise ConfigError("algorithm.clamp", f"must be > 0, got {self.clamp}")
        if self.outer_batch_size <= 0:
            raise ConfigError("algorithm.outer_batch_size", f"must be > 0, got {self.outer_batch_size}")
        if not self.inner_lr > 0:
            raise ConfigError("algorithm.inner_lr", f"must be > 0, got {self.inner_lr}")


# ---------------------------------------------------------------- the composition


def outer_weight(q: float, outer: str, gamma: float, weighting: str, shift: float = 0.0, clamp: float = 30.0) -> float:
    """g'(q) of the outer function at the composed loss q: 1 for the identity,
    exp(q/gamma)/gamma literally (may overflow to inf, as Alg. 1 would), or the normalised
    exp(min((q - shift)/gamma, clamp)) = (gamma / Z) exp(q/gamma)/gamma with Z = exp(shift/gamma)."""
    if outer == "identity":
        return 1.0
    if weighting == "literal":
        try:
            return math.exp(q / gamma) / gamma
        except OverflowError:
            return math.inf
    return math.exp(min((q - shift) / gamma, clamp))


def lse_shift(losses: np.ndarray, gamma: float) -> float:
    """c_s = gamma log((1/m) sum_j exp(L_j/gamma)): Lemma 1's robust objective at w_s over the
    sampled clients, computed stably."""
    z = np.asarray(losses, dtype=np.float64) / gamma
    top = z.max()
    return float(gamma * (top + math.log(np.mean(np.exp(z - top)))))


def robust_weights(losses: np.ndarray, gamma: float) -> np.ndarray:
    """Lemma 1's maximising client weights r* = softmax(L/gamma) (diagnostic only)."""
    z = np.asarray(losses, dtype=np.float64) / gamma
    e = np.exp(z - z.max())
    return e / e.sum()


class ComposedLoss:
    """q(w) and grad q(w) on one client: the minibatch CE (`loss`) or the post-adaptation query
    loss (`maml`, through `rayfl.algorithms.maml.maml_objective`)."""

    def __init__(self, ctx: ClientContext, objective: str, inner_lr: float, second_order: bool):
        self.ctx, self.objective, self.inner_lr, self.second_order = ctx, objective, inner_lr, second_order
        self.kernel = CrossEntropyGrad(ctx.model)
        self.xs, self.ts = self.kernel.prepare(ctx.x, ctx.y)

    def __call__(self, w: torch.Tensor, inner: torch.Tensor, outer: torch.Tensor | None) -> tuple[float, torch.Tensor]:
        ctx = self.ctx
        inner = inner.to(self.xs.device)
        if self.objective == "loss":
            loss, grad = self.kernel(w[None], self.xs.index_select(0, inner), self.ts.index_select(0, inner))
            ctx.work.gradient_step(len(inner))
            return float(loss[0]), grad[0]
        from rayfl.algorithms.maml import maml_objective  # ComFedL-B's module, loaded when used

        assert outer is not None
        outer = outer.to(self.xs.device)
        v = w.detach().clone().requires_grad_(True)
        q = maml_objective(ctx.model, v, (ctx.x[inner], ctx.y[inner]), (ctx.x[outer], ctx.y[outer]),
                           self.inner_lr, self.second_order)
        (grad,) = torch.autograd.grad(q, v)
        ctx.work.gradient_step(len(inner) + len(outer))
        return float(q.detach()), grad.detach()


def _streams(ctx: ClientContext, steps: int, b: int, b1: int, maml: bool, purpose: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(B_t from D_i, B~_t from D~_i) index batches: two independent streams over the
    client's training data (the paper does not say what D_i and D~_i are), sizes clipped to the
    client's size. B_t comes from the
    `batches` stream in training, the one `local_sgd` draws, so `outer: identity` walks the
    very minibatches of FedAvg."""
    n = ctx.num_samples
    inner = minibatch_indices(ctx.rng(purpose), n, b, steps)
    outer: list[torch.Tensor | None] = [None] * steps
    if maml:
        outer = list(minibatch_indices(ctx.rng(f"{purpose}.tilde"), n, b1, steps))
    return list(zip(inner, outer, strict=True))


# ---------------------------------------------------------------- client functions


def comfedl_probe(
    ctx: ClientContext, params: np.ndarray, objective: str, inner_lr: float, second_order: bool,
    batch_size: int, outer_batch_size: int,
) -> dict[str, Any]:
    """L_i at w_s for the normalised step (rayfl's, not the paper's): the full local training loss for
    `loss`, the post-adaptation query loss on one support / query batch for `maml`."""
    if ctx.num_samples == 0:
        return {"probe": float("nan")}
    w = torch.tensor(params, device=ctx.device)
    q = ComposedLoss(ctx, objective, inner_lr, second_order)
    if objective == "loss":
        with torch.no_grad():
            loss, _ = q.kernel(w[None], q.xs, q.ts)
        ctx.work.forward(ctx.num_samples)
        return {"probe": float(loss[0])}
    ((inner, outer),) = _streams(ctx, 1, batch_size, outer_batch_size, True, "comfedl.probe")
    value, _ = q(w, inner, outer)
    return {"probe": value}


def comfedl_client(
    ctx: ClientContext,
    params: np.ndarray,
    lr: float,
    steps: int,
    batch_size: int,
    outer_batch_size: int,
    gamma: float,
    outer: str,
    weighting: str,
    shift: float,
    clamp: float,
    objective: str,
    inner_lr: float,
    second_order: bool,
) -> dict[str, Any]:
    """Lines 6-15 of Alg. 1: tau steps w <- w - lr g'(q_B(w)) grad q_B(w); uploads w_tau - w_s,
    the mean composed loss and the mean outer weight g'."""
    w0 = torch.tensor(params, device=ctx.device)
    w = w0.clone()
    q = ComposedLoss(ctx, objective, inner_lr, second_order)
    losses, weights = [], []
    if ctx.num_samples:
        for inner, outer_idx in _streams(ctx, steps, batch_size, outer_batch_size, objective == "maml", "batches"):
            value, grad = q(w, inner, outer_idx)
            g = outer_weight(value, outer, gamma, weighting, shift, clamp)
            w.add_(grad, alpha=-(lr * g))  # as local_sgd steps: FedAvg bit for bit when g = 1
            losses.append(value)
            weights.append(g)
    mean = float(np.mean(losses)) if losses else float("nan")
    return {"delta": w - w0, "loss": mean, "outer_weight": float(np.mean(weights)) if weights else 0.0}


# ---------------------------------------------------------------- server


class Probe(Phase):
    """The normalised weighting's first call: every sampled client's L_i at w_s, from which
    the server broadcasts c_s = gamma log((1/m) sum_j exp(L_j / gamma))."""

    name = "probe"
    client = staticmethod(comfedl_probe)

    def __init__(self, alg: ComFedL):
        self.alg, self.fed, self.cfg = alg, alg.fed, alg.cfg

    def payload(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        return {"params": state.x, **self.alg.common}

    def server_update(self, state: ModelState, uploads: Uploads, rnd: Round) -> ModelState:
        rnd.notes["shift"] = lse_shift(uploads.values("probe"), self.cfg.gamma)
        return state

    def metrics(self, state: ModelState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        if not uploads:
            return {}
        return {"robust_objective": rnd.notes["shift"],
                "max_client_weight": float(robust_weights(uploads.values("probe"), self.cfg.gamma).max())}


class ComFedL(Algorithm[ModelState]):
    """Alg. 1 with uniform client sampling and a uniform average (line 17); the normalised
    weighting adds the probe call (L_i at w_s) before local training, and only the clients
    that answered it train."""

    config = ComFedLConfig
    client = staticmethod(comfedl_client)
    uploads = ("delta",)
    exact_sums = False

    def setup(self) -> None:
        cfg = self.cfg
        self.common = dict(objective=cfg.objective, inner_lr=cfg.inner_lr, second_order=cfg.second_order,
                           batch_size=cfg.batch_size, outer_batch_size=cfg.outer_batch_size)

    def init(self) -> ModelState:
        return ModelState(x=self.fed.initial_params())

    @staticmethod
    def probes(cfg: ComFedLConfig) -> bool:
        """Whether a round starts with the probe call (the normalised exp weighting)."""
        return cfg.outer == "exp" and cfg.weighting == "normalized"

    @classmethod
    def refuses_asynchrony(cls, cfg: ComFedLConfig) -> str | None:
        if cls.probes(cfg):
            return ("the normalised step asks every sampled client's loss before training (two client calls a round); "
                    "set algorithm.weighting: literal or algorithm.outer: identity")
        return None

    def phases(self) -> list[Phase]:
        return [Probe(self), self] if self.probes(self.cfg) else [self]

    def clients(self, state: ModelState, rnd: Round) -> list[int]:
        probed = rnd.accepted.get(Probe.name)
        return rnd.cohort if probed is None else [p.client for p in probed]

    def weighting_of(self, key: str) -> str:
        return self.cfg.average

    def payload(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x, "lr": cfg.lr, "steps": cfg.local_steps, "gamma": cfg.gamma, "outer": cfg.outer,
                "weighting": cfg.weighting, "shift": rnd.notes.get("shift", 0.0), "clamp": cfg.clamp, **self.common}

    def server_update(self, state: ModelState, uploads: Uploads, rnd: Round) -> ModelState:
        """Line 17: the mean of the returned models."""
        return ModelState(x=(state.x + uploads["delta"]).astype(np.float32), moments=state.moments)

    def metrics(self, state: ModelState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        if not uploads:
            return {"num_updates": 0}
        return {"num_updates": len(uploads), "train_loss": float(np.mean(uploads.values("loss"))),
                "outer_weight": float(np.mean(uploads.values("outer_weight")))}

    def evaluate(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        m = evaluate_global_and_clients(self.fed, state.x, rnd.index, self.cfg.client_eval)
        if self.cfg.client_eval and self.cfg.objective == "maml":  # judged like every MAML method: after one step
            m.update(evaluate_clients(self.fed, state.x, rnd.index, adapt_steps=1, adapt_lr=self.cfg.inner_lr,
                                      adapt_batch_size=self.cfg.batch_size, prefix=PERSONALIZED))
        return m
