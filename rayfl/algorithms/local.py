"""Local training on a client, shared by the first-order methods.

Parameters are one flat float32 vector; the forward pass runs through `torch.func` on views of
that vector, so a gradient is a flat vector too and corrections (FedProx's proximal pull,
SCAFFOLD's control variates) are plain vector arithmetic. The linear softmax model takes the
closed-form gradient of `kernels.CrossEntropyGrad` instead of autograd (same values, ~4x
faster per step), which is what makes long linear-model runs (ZO-HFL's Table I) affordable."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.algorithms.kernels import CrossEntropyGrad, linear_shape
from rayfl.engine.context import ClientContext
from rayfl.models.params import functional_logits
from rayfl.zo.lower_level import epoch_indices, minibatch_indices
from rayfl.zo.schedules import step_size


@dataclass(frozen=True)
class LocalSchedule:
    """How much local work: `epochs` passes or exactly `steps` minibatches of `batch_size`.
    The step size is lr, or lr / (t + lr_offset) at in-call step t when lr_offset is set (the
    decaying local step of ZO-HFL's experiments, restarting every round)."""

    batch_size: int
    epochs: int | None
    steps: int | None
    lr_offset: float | None = None


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
    for t, (loss, grad) in enumerate(_gradients(ctx, w, schedule)):
        with torch.no_grad():
            if weight_decay:
                grad = grad + weight_decay * w
            if prox_mu:
                grad = grad + prox_mu * (w - prox_center)
            if correction is not None:
                grad = grad + correction
            w -= step_size(lr, t, schedule.lr_offset) * grad
        losses.append(loss.item())
    return w.detach(), float(np.mean(losses)) if losses else float("nan")


def _gradients(ctx: ClientContext, w: torch.Tensor, schedule: LocalSchedule) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(minibatch loss, CE gradient at the current `w`) per step, charging each step. `w` is
    read when the next item is requested, so the caller updates it in place between steps.

    The linear model takes the closed form on pre-flattened inputs and one-hot targets, with
    the same minibatches `ctx.batches` would draw (same stream, same order, same budget
    check); other models go through autograd on `ctx.batches`."""
    if linear_shape(ctx.model) is None:
        for xb, yb in ctx.batches(schedule.batch_size, epochs=schedule.epochs, steps=schedule.steps):
            v = w.detach().requires_grad_(True)
            loss = F.cross_entropy(functional_logits(ctx.model, v, xb), yb)
            (grad,) = torch.autograd.grad(loss, v)
            ctx.work.gradient_step(len(yb))
            yield loss.detach(), grad
        return
    kernel = CrossEntropyGrad(ctx.model)
    xs, ts = kernel.prepare(ctx.x, ctx.y)
    n, rng = ctx.num_samples, ctx.rng("batches")
    if n == 0:
        return
    if schedule.epochs is not None:
        batches: Iterable[torch.Tensor] = epoch_indices(rng, n, schedule.batch_size, schedule.epochs)
    else:
        batches = minibatch_indices(rng, n, schedule.batch_size, schedule.steps or 0)
    for idx in batches:
        if not ctx.work.affords_step(len(idx)):
            return
        idx = idx.to(xs.device)
        loss, grad = kernel(w[None], xs.index_select(0, idx), ts.index_select(0, idx))
        ctx.work.gradient_step(len(idx))
        yield loss[0], grad[0]


def lr_sum(lr: float, schedule: LocalSchedule, steps: int) -> float:
    """sum_{t < steps} of the step sizes: what SCAFFOLD's (x - y) / (K lr) divides by when the
    step size decays (K lr when it is constant)."""
    if schedule.lr_offset is None:
        return steps * lr
    return float(sum(step_size(lr, t, schedule.lr_offset) for t in range(steps)))
