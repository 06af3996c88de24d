"""FedMSPP: federated minibatch stochastic proximal point (Yuan & Li, NeurIPS 2022).

A first-order baseline of FedRZO's App. D.1 (Fig. 3; ref. [55]). Every round each client
draws ONE minibatch B_i of its data and returns an approximate proximal point

    x_i = argmin_x  f_i(x; B_i) + 1 / (2 gamma_p) ||x - x_r||^2,

found by H gradient steps of size `lr` from x_r on that fixed minibatch; the server averages.
With gamma_p = lr (the default: App. D.1 reports no gamma_p) each inner step is x <- x_r - lr
grad f_i(x; B_i), the fixed-point iteration of the implicit step x = x_r - lr grad f_i(x): the
"proximal point" is literal. Unlike FedProx, the local objective is one minibatch, not the whole
local data set. Trained on whatever network the job names (App. D.1: the softplus one,
`model.activation: softplus`, evaluated with the true ReLU through `model.eval_activation:
relu`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.algorithms.fedrzo_nn import FedRZOState, ModelAverage
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Round
from rayfl.engine import ClientContext
from rayfl.models.params import functional_logits

BATCH_PURPOSE = "fedmspp.batch"


@dataclass
class FedMSPPConfig(AlgorithmConfig):
    """FedMSPP: minibatch `batch_size`, H = `local_steps` inner gradient steps of size `lr`,
    proximal parameter `prox_lr` gamma_p (null: = lr, rayfl's default); full participation by
    default, as in FedRZO's comparison."""

    name: str = "fedmspp"
    clients_per_round: int | None = None
    participation: float | None = 1.0
    local_epochs: int | None = None
    local_steps: int | None = 5
    # The size of the one minibatch B_i each client draws per round and solves the proximal problem
    # on.
    batch_size: int = 64
    # gamma_p, the proximal parameter of 1 / (2 gamma_p) ||x - x_r||^2 (> 0); null: lr.
    prox_lr: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.local_epochs is not None:
            raise ConfigError("algorithm.local_epochs", "FedMSPP runs local_steps inner steps on one minibatch; set local_epochs to null")
        if self.prox_lr is not None and not self.prox_lr > 0:
            raise ConfigError("algorithm.prox_lr", f"must be > 0 (or null for lr), got {self.prox_lr}")


def minibatch_gradient(ctx: ClientContext, w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, weight_decay: float) -> tuple[float, torch.Tensor]:
    """(mean CE + weight_decay/2 ||w||^2, its gradient) at the flat vector w, charged as one
    gradient step on the minibatch; the network runs in train mode (softplus if configured)."""
    ctx.model.train()
    v = w.detach().requires_grad_(True)
    loss = F.cross_entropy(functional_logits(ctx.model, v, xb), yb)
    (g,) = torch.autograd.grad(loss, v)
    ctx.work.gradient_step(len(yb))
    value = float(loss.detach())
    if weight_decay:
        g = g + weight_decay * w
        value += 0.5 * weight_decay * float(w @ w)
    return value, g


def fedmspp_client(
    ctx: ClientContext, params: np.ndarray, steps: int, lr: float, prox_lr: float, batch_size: int, weight_decay: float = 0.0
) -> dict[str, Any]:
    """H gradient steps on f_i(.; B_i) + ||x - x_r||^2 / (2 gamma_p) from x_r, one minibatch;
    uploads the change x_i - x_r."""
    anchor = torch.tensor(params, dtype=torch.float32, device=ctx.device)
    if ctx.num_samples == 0:
        return {"delta": np.zeros_like(params), "loss": float("nan")}
    b = min(batch_size, ctx.num_samples)
    idx = torch.from_numpy(ctx.rng(BATCH_PURPOSE).choice(ctx.num_samples, size=b, replace=False))
    xb, yb = ctx.x[idx], ctx.y[idx]
    x = anchor.clone()
    first = float("nan")
    for t in range(steps):
        loss, g = minibatch_gradient(ctx, x, xb, yb, weight_decay)
        first = loss if t == 0 else first
        x = x - lr * (g + (x - anchor) / prox_lr)
    return {"delta": (x - anchor).cpu().numpy(), "loss": first}


class FedMSPP(ModelAverage):
    """Every round each client's approximate proximal point on one minibatch; the average."""

    config = FedMSPPConfig
    client = staticmethod(fedmspp_client)

    def payload(self, state: FedRZOState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x, "steps": int(cfg.local_steps or 0), "lr": cfg.lr,
                "prox_lr": cfg.prox_lr if cfg.prox_lr is not None else cfg.lr, "batch_size": cfg.batch_size,
                "weight_decay": cfg.weight_decay}
