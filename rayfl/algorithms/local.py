"""Local training on a client, shared by the first-order methods.

Parameters are one flat float32 vector; the forward pass runs through `torch.func` on views of
that vector, so a gradient is a flat vector too and corrections (FedProx's proximal pull,
SCAFFOLD's control variates) are plain vector arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.engine.context import ClientContext
from rayfl.models.params import functional_logits


@dataclass(frozen=True)
class LocalSchedule:
    batch_size: int
    epochs: int | None
    steps: int | None


def local_sgd(
    ctx: ClientContext,
    start: torch.Tensor,
    lr: float,
    schedule: LocalSchedule,
    *,
    weight_decay: float = 0.0,
    prox_mu: float = 0.0,
    prox_center: torch.Tensor | None = None,
    correction: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Plain minibatch SGD from `start`; returns (final vector, mean minibatch loss).

    Each step's direction is grad CE + weight_decay * w + prox_mu * (w - prox_center) +
    correction, and each step is charged to the client's work meter."""
    w = start.detach().clone()
    losses = []
    for xb, yb in ctx.batches(schedule.batch_size, epochs=schedule.epochs, steps=schedule.steps):
        w.requires_grad_(True)
        loss = F.cross_entropy(functional_logits(ctx.model, w, xb), yb)
        (grad,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w = w.detach()
            if weight_decay:
                grad = grad + weight_decay * w
            if prox_mu:
                grad = grad + prox_mu * (w - prox_center)
            if correction is not None:
                grad = grad + correction
            w = w - lr * grad
        ctx.work.gradient_step(len(yb))
        losses.append(loss.item())
    return w.detach(), float(np.mean(losses)) if losses else float("nan")
