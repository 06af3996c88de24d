"""Per-FedAvg / FedMAML (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020; ComFedL's baseline [8]):
local SGD on the one-step MAML objective, uniform server average.

Client i, round s, from w = w_s, for t < tau (Per-FedAvg's step; ComFedL Sec. 5.2 gives only its
learning rates):

    S, Q  <- two independent batches of its training data (sizes b, b1; disjoint when it has
             b + b1 samples, else each drawn from all of it, clipped to its size; ComFedL gives no b, b1)
    w     <- w - beta * grad_w l_Q(w - alpha grad l_S(w))         (`maml.maml_gradient`)
           = w - beta * (I - alpha H_S(w)) grad l_Q(w - alpha grad l_S(w))

and the server sets w_{s+1} = mean_i w_i (uniform). One deviation from
Per-FedAvg's Alg. 1, labelled: its Hessian is taken on a third independent batch D''; here it
is the support batch S's (the exact gradient of the MAML batch objective, what ComFedL-DAMAML
differentiates too, so the two methods differ only by ComFedL's exp re-weighting).
`second_order: false` is Per-FedAvg's first-order (FO) variant: the Hessian term dropped.

The client function (`maml_client`) is shared with federated TR-MAML (`tr_maml.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rayfl.algorithms.maml import Batch, maml_gradient
from rayfl.algorithms.personalized_eval import evaluate_personalized, require_client_validation
from rayfl.algorithms.server_opt import ModelState
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
from rayfl.driver.parts import S
from rayfl.engine import ClientContext


@dataclass
class MAMLConfig(AlgorithmConfig):
    """What every MAML-type method shares: tau local steps (`local_steps`) at the outer lr
    `lr` (beta), the inner step `inner_lr` (alpha), support / query batch sizes `batch_size`
    (b) and `outer_batch_size` (b1), second- or first-order, and the personalized evaluation:
    `eval_adapt_steps` SGD steps at `eval_adapt_lr` (null: the method's inner lr) on one batch
    of b training samples before the validation measurement (ComFedL Sec. 5.2: "one step at test
    time")."""

    local_epochs: int | None = None
    # tau, the MAML local steps per round, each on a fresh support and query batch.
    local_steps: int | None = 5
    # alpha, the inner adaptation step on the support batch (> 0).
    inner_lr: float = 0.1
    # b1, the query batch size (batch_size is the support batch's, b).
    outer_batch_size: int = 32
    # Differentiate through the inner step (false: the first-order variant, Hessian term dropped).
    second_order: bool = True
    # How the server averages the clients' models: uniform (the paper's) or samples (by n_i).
    weighting: Literal["uniform", "samples"] = "uniform"
    # SGD steps each client takes on one batch of its training data before its validation
    # measurement (>= 0).
    eval_adapt_steps: int = 1
    # The step size of those evaluation steps; null: inner_lr.
    eval_adapt_lr: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.local_steps is None:
            raise ConfigError("algorithm.local_steps", "MAML methods count tau in local steps; set local_steps and local_epochs=null")
        if not self.inner_lr > 0:
            raise ConfigError("algorithm.inner_lr", f"must be > 0, got {self.inner_lr}")
        if self.outer_batch_size <= 0:
            raise ConfigError("algorithm.outer_batch_size", f"must be > 0, got {self.outer_batch_size}")
        if self.eval_adapt_steps < 0:
            raise ConfigError("algorithm.eval_adapt_steps", f"must be >= 0, got {self.eval_adapt_steps}")
        if self.eval_adapt_lr is not None and not self.eval_adapt_lr > 0:
            raise ConfigError("algorithm.eval_adapt_lr", f"must be > 0 (or null: the inner lr), got {self.eval_adapt_lr}")

    @property
    def adapt_lr(self) -> float:
        return self.inner_lr if self.eval_adapt_lr is None else self.eval_adapt_lr


@dataclass
class PerFedAvgConfig(MAMLConfig):
    """Per-FedAvg / FedMAML at ComFedL's CIFAR setting: alpha = beta = 0.1, tau = 5."""

    name: str = "per_fedavg"
    # beta, the outer (meta) step size.
    lr: float = 0.1


# ---------------------------------------------------------------- client side


def support_query_batches(ctx: ClientContext, batch_size: int, outer_batch_size: int, steps: int) -> Iterator[tuple[Batch, Batch]]:
    """`steps` (support, query) pairs from the client's training data, from the stream
    (seed, 'maml.batches', round, client): disjoint within a step when the client holds
    b + b1 samples, otherwise two independent draws clipped to its size."""
    n = ctx.num_samples
    if n == 0:
        return
    b, b1 = min(batch_size, n), min(outer_batch_size, n)
    rng = ctx.rng("maml.batches")
    for _ in range(steps):
        perm = rng.permutation(n)
        s = perm[:b]
        q = perm[b : b + b1] if b + b1 <= n else rng.permutation(n)[:b1]
        if not ctx.work.affords_step(b + b1):
            return
        s_idx, q_idx = torch.from_numpy(s).to(ctx.device), torch.from_numpy(q).to(ctx.device)
        yield (ctx.x[s_idx], ctx.y[s_idx]), (ctx.x[q_idx], ctx.y[q_idx])


def maml_client(
    ctx: ClientContext,
    params: np.ndarray,
    lr: float,
    inner_lr: float,
    steps: int,
    batch_size: int,
    outer_batch_size: int,
    second_order: bool = True,
) -> dict[str, Any]:
    """tau MAML steps w <- w - lr * grad f(w); uploads the model delta, the mean query loss and
    `adapted_loss`: the first step's query loss l_Q(w_s - alpha grad l_S(w_s)), a one-batch
    estimate of the post-adaptation loss at the broadcast model (TR-MAML's p-gradient)."""
    x = torch.tensor(params, device=ctx.device)
    w = x.clone()
    losses: list[float] = []
    for support, query in support_query_batches(ctx, batch_size, outer_batch_size, steps):
        loss, grad = maml_gradient(ctx.model, w, support, query, inner_lr, second_order)
        w = w - lr * grad
        ctx.work.gradient_step(len(support[1]) + len(query[1]))
        losses.append(loss.item())
    nan = float("nan")
    return {"delta": w - x, "loss": float(np.mean(losses)) if losses else nan, "adapted_loss": losses[0] if losses else nan}


def maml_payload(cfg: MAMLConfig) -> dict[str, Any]:
    return dict(lr=cfg.lr, inner_lr=cfg.inner_lr, steps=cfg.local_steps, batch_size=cfg.batch_size,
                outer_batch_size=cfg.outer_batch_size, second_order=cfg.second_order)


# ---------------------------------------------------------------- server


class MAML(Algorithm[S]):
    """What the MAML-type methods share: MAML local steps, a weighted mean of the deltas
    (float64, in client order), and each client measured after one adaptation step."""

    client = staticmethod(maml_client)
    uploads = ("delta",)
    exact_sums = False

    def setup(self) -> None:
        require_client_validation(self.fed)

    def weighting_of(self, key: str) -> str:
        return self.cfg.weighting

    def payload(self, state: Any, rnd: Round) -> dict[str, Any]:
        return {"params": state.x, **maml_payload(self.cfg)}

    def evaluate(self, state: Any, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return evaluate_personalized(self.fed, state.x, rnd.index, cfg.adapt_lr, cfg.eval_adapt_steps, cfg.batch_size)


class PerFedAvg(MAML[ModelState]):
    """Per-FedAvg: w_{s+1} = w_s + mean_i delta_i."""

    config = PerFedAvgConfig

    def init(self) -> ModelState:
        return ModelState(x=self.fed.initial_params())

    def server_update(self, state: ModelState, uploads: Uploads, rnd: Round) -> ModelState:
        return ModelState(x=(state.x + uploads["delta"]).astype(np.float32), moments=state.moments)
