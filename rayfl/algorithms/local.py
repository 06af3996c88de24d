"""Local training on a client, shared by the first-order methods.

Parameters are one flat float32 vector; the host's module runs with its parameters bound as
views of that vector (`rayfl.models.params.bound_to`; `torch.func` on views where binding is
not possible), so a gradient is a flat vector too and corrections (FedProx's proximal pull,
SCAFFOLD's control variates) are plain vector arithmetic. The linear softmax model takes the
closed-form gradient of `kernels.CrossEntropyGrad` instead of autograd (same values, ~4x
faster per step), which is what makes long linear-model runs (ZO-HFL's Table I) affordable.
Plain SGD keeps a large dense layer's steps as low-rank factors (`rayfl.algorithms.deferred`:
LEAF's FEMNIST CNN, 1.13x a client-step on a CPU), and where the host says so
(`ctx.channels_last`) convolutions train with channels-last weights
(`rayfl.models.channels_last`: 1.1-1.2x a convnet's client round on a CPU)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.algorithms.deferred import deferred_steps
from rayfl.algorithms.kernels import CrossEntropyGrad, linear_shape
from rayfl.algorithms.vmapped import batching_pays, masked_grad
from rayfl.engine.context import ClientContext
from rayfl.engine.vectorized import current_mode, planned_batches, stack_batches
from rayfl.models.channels_last import channels_last_weights
from rayfl.models.params import bound_to, can_bind, functional_logits
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


def promised_samples(schedule: LocalSchedule, n: int) -> int:
    """Gradient samples local SGD on `n` samples is certain to process: what lets the
    asynchronous driver run tasks in parallel (rayfl.engine.asyncpool)."""
    if n == 0:
        return 0
    if schedule.epochs is not None:
        return schedule.epochs * n
    return (schedule.steps or 0) * min(schedule.batch_size, n)


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
    """Plain minibatch SGD from `start` on the client's data: the local training of FedAvg,
    FedProx, SCAFFOLD and FedDyn, with the clock and the batching done for the caller.

    Each step's direction is grad CE + weight_decay * w + prox_mu * (w - prox_center) +
    correction, and each step is charged to the client's work meter (`ctx.work`), so the
    simulated clock sees it and a deadline with partial work can stop it early. Where the
    host runs its clients in lockstep (rayfl.engine.lockstep), the call waits for the other
    clients' and all run as one batched computation, to float32 rounding the same.

    Args:
        ctx: the client's context (its model, minibatches and work meter).
        start: the flat float32 parameter vector to start from (never written).
        lr: the step size (or its numerator under `schedule.lr_offset`).
        schedule: how many minibatches of which size (`epochs` or `steps`).
        weight_decay: the L2 coefficient: adds weight_decay * w to each gradient.
        prox_mu: FedProx's proximal weight: adds prox_mu * (w - prox_center).
        prox_center: the proximal term's centre (needed when prox_mu > 0), usually `start`.
        correction: a vector added to every step's gradient (SCAFFOLD's c - c_i, FedDyn's -g).

    Returns:
        (the final flat vector, the float64 mean of the minibatch losses; NaN after no step)."""
    if ctx.lockstep is not None:
        return ctx.lockstep.local_sgd(ctx, start, lr, schedule, weight_decay=weight_decay, prox_mu=prox_mu,
                                      prox_center=prox_center, correction=correction)
    return local_sgd_now(ctx, start, lr, schedule, weight_decay=weight_decay, prox_mu=prox_mu, prox_center=prox_center,
                         correction=correction)


def local_sgd_now(
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
    """`local_sgd` on this client alone, now."""
    w = start.detach().clone()
    if not (weight_decay or prox_mu or correction is not None) and linear_shape(ctx.model) is None \
            and can_bind(ctx.model, w):
        return _plain_sgd(ctx, w, lr, schedule, start.detach())
    losses = []
    for t, (loss, grad) in enumerate(_gradients(ctx, w, schedule)):
        with torch.no_grad():
            if weight_decay:
                grad = grad + weight_decay * w
            if prox_mu:
                grad = grad + prox_mu * (w - prox_center)
            if correction is not None:
                grad = grad + correction
            # w - step * grad in one pass, as torch.optim.SGD's step: `w -= step * grad` made a
            # model-sized temporary each step (10% of a host's time on fedavg-mlp, unvectorised)
            w.add_(grad, alpha=-step_size(lr, t, schedule.lr_offset))
        losses.append(loss)
    return w.detach(), mean_loss(losses)


def mean_loss(losses: list[torch.Tensor]) -> float:
    """The float64 mean of a client's minibatch losses, read with one host-device
    synchronisation per client, not per step."""
    return float(np.mean(torch.stack(losses).cpu().numpy().astype(np.float64))) if losses else float("nan")


def _plain_sgd(ctx: ClientContext, w: torch.Tensor, lr: float, schedule: LocalSchedule,
               start: torch.Tensor) -> tuple[torch.Tensor, float]:
    """`local_sgd` with nothing but the CE gradient (FedAvg's client), on a module bound to
    `w`: each step takes the parameters' gradients from `autograd.grad` and adds them into the
    views of `w`, as torch.optim.SGD does. Through a flat `.grad` (`_gradients`) each step also
    zeroed the buffer and had backward add into it: ~20% more per step (MLP 784-200-10, batch
    10; measured on an AMD EPYC and an Intel Xeon). The same values: a gradient added into
    zeros is itself. `start` is what `w` was copied from (never written)."""
    losses = []
    with bound_to(ctx.model, w) as model, deferred_steps(model, schedule.batch_size, start) as deferred, \
            channels_last_weights(model, ctx.channels_last):
        # a large dense layer's steps wait as low-rank factors (rayfl.algorithms.deferred)
        params = [p for p in model.parameters() if not deferred.holds(p)]
        # slices of w, or a convolution's channels-last buffer, written back into w on exit
        views = [p.data for p in params]
        for t, (xb, yb) in enumerate(ctx.batches(schedule.batch_size, epochs=schedule.epochs, steps=schedule.steps)):
            step = step_size(lr, t, schedule.lr_offset)
            deferred.set_step_size(step)
            loss = F.cross_entropy(model(xb), yb)
            grads = torch.autograd.grad(loss, deferred.inputs(params))
            ctx.work.gradient_step(len(yb))
            for view, g in zip(views, grads, strict=False):  # not the anchor's
                view.add_(g, alpha=-step)
            deferred.end_step()
            losses.append(loss.detach())
    return w, mean_loss(losses)


def _gradients(ctx: ClientContext, w: torch.Tensor, schedule: LocalSchedule) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(minibatch loss, CE gradient at the current `w`) per step, charging each step. `w` is
    read when the next item is requested, so the caller updates it in place between steps.

    The linear model takes the closed form on pre-flattened inputs and one-hot targets, with
    the same minibatches `ctx.batches` would draw (same stream, same order, same budget
    check); other models go through autograd on `ctx.batches`."""
    if linear_shape(ctx.model) is None and can_bind(ctx.model, w):
        grad = torch.zeros_like(w)
        with bound_to(ctx.model, w, grad) as model, \
                channels_last_weights(model, ctx.channels_last, write_back=False) as convs:
            for xb, yb in ctx.batches(schedule.batch_size, epochs=schedule.epochs, steps=schedule.steps):
                convs.refresh()  # the caller moved w since the last step
                grad.zero_()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                convs.collect_gradients()
                ctx.work.gradient_step(len(yb))
                yield loss.detach(), grad
        return
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


def local_sgd_batched(
    ctxs: Sequence[ClientContext],
    starts: torch.Tensor,
    lrs: Sequence[float],
    schedules: Sequence[LocalSchedule],
    *,
    weight_decay: Sequence[float] | None = None,
    prox_mu: Sequence[float] | None = None,
    prox_centers: torch.Tensor | None = None,
    corrections: torch.Tensor | None = None,
    minus_start: bool = False,
    planned: list[list[torch.Tensor]] | None = None,
) -> tuple[list[torch.Tensor], list[float]] | None:
    """`local_sgd` for K clients at once, for a batched twin (`rayfl.batched`): row k of
    `starts` follows exactly client k's loop, on its own minibatches and step count, with its
    own lr, weight decay, proximal pull towards `prox_centers[k]` and `corrections[k]`.

    Args:
        ctxs: the K clients' contexts (one module for all).
        starts: [K, d] start vectors, row k client k's (never written).
        lrs: each client's step size.
        schedules: each client's `LocalSchedule`.
        weight_decay: each client's L2 coefficient (None: 0).
        prox_mu: each client's proximal weight (None: 0).
        prox_centers: [K, d] proximal centres (`starts` itself for FedProx).
        corrections: [K, d] vectors added to each client's gradients.
        minus_start: return the updates final - start instead of the final vectors (FedAvg's
            deltas, written in the same pass).
        planned: each client's minibatches drawn beforehand; None draws them (callers leave it).

    Returns:
        (K final vectors, each client's mean minibatch loss), the vectors rows of buffers the
        caller may change in place; or None where batching would not pay under
        `engine.vectorize: auto` (`rayfl.algorithms.vmapped.batching_pays`) or the clients
        hold different modules: the caller then runs its loop function instead."""
    model = ctxs[0].model
    if any(c.model is not model for c in ctxs):
        return None
    fused = BatchedMLPGrad.of(model)
    if current_mode() == "auto" and not batching_pays(model, starts.device, fused is not None):
        return None
    if prox_centers is _PROX_AT_START:
        prox_centers = starts
    plans = planned if planned is not None else [
        planned_batches(c, s.batch_size, s.epochs, s.steps) for c, s in zip(ctxs, schedules, strict=True)]
    k = len(ctxs)
    if k > 1 and planned is None and fixed_chunk(starts.shape[1] * starts.element_size(), starts.device) == 0:
        order = sorted(range(k), key=lambda j: -len(plans[j]))  # the longest first: see step_tiers
        if order != list(range(k)):
            out = local_sgd_batched(
                [ctxs[j] for j in order], _rows(starts, order), [lrs[j] for j in order], [schedules[j] for j in order],
                weight_decay=None if weight_decay is None else [weight_decay[j] for j in order],
                prox_mu=None if prox_mu is None else [prox_mu[j] for j in order],
                prox_centers=None if prox_centers is None else _rows(prox_centers, order) if prox_centers is not starts
                else _PROX_AT_START, corrections=None if corrections is None else _rows(corrections, order),
                minus_start=minus_start, planned=[plans[j] for j in order])
            if out is None:
                return None
            back = np.argsort(order)
            return [out[0][j] for j in back], [out[1][j] for j in back]
    # FedProx pulls towards the start itself: the kernel folds that pull into its scale
    to_start = prox_centers is starts
    starts = starts.detach()
    row_bytes = starts.shape[1] * starts.element_size()
    fixed = fixed_chunk(row_bytes, starts.device)
    # vmap runs a batch of one client as plain convolutions, not grouped ones, with other bits:
    # the generic step never runs a client alone (an idle client keeps it company)
    least = 1 if fused is not None else 2
    pad = -k % fixed if fixed else max(0, least - k)
    if pad:  # on a GPU every chunk has the same K: idle clients fill the last
        ctxs, lrs, schedules = ([*v, *[v[0]] * pad] for v in (ctxs, lrs, schedules))
        plans = [*plans, *([] for _ in range(pad))]  # no minibatches: an idle client never moves
        weight_decay, prox_mu = (None if v is None else [*v, *[0.0] * pad] for v in (weight_decay, prox_mu))
        starts = _pad_rows(starts, pad)
        prox_centers = starts if to_start else None if prox_centers is None else _pad_rows(prox_centers, pad)
        corrections = None if corrections is None else _pad_rows(corrections, pad)
    grad_fn = fused or masked_grad(model)
    width = max(s.batch_size for s in schedules)
    loss_sum = torch.zeros(len(ctxs), dtype=torch.float64, device=starts.device)
    rows: list[torch.Tensor] = []
    scratch = None  # one chunk's per-layer working copies, reused by the next chunk
    parts = chunk_slices(len(ctxs), row_bytes, fixed, least) if fixed else step_tiers(plans, row_bytes, least)
    for part in parts:
        # one output buffer per chunk, not one [K, d]: a chunk's few MB come back from the
        # allocator's free lists round after round, where K rows (tens of MB) would be a fresh
        # mapping each call and page-fault on every first write
        w = torch.empty((part.stop - part.start, starts.shape[1]), dtype=starts.dtype, device=starts.device)
        if any(plans[part]):
            centers = "start" if to_start else None if prox_centers is None else prox_centers[part]
            scratch = _sgd_chunk(grad_fn, ctxs[part], plans[part], starts[part], w, loss_sum[part], lrs[part],
                                 schedules[part], width, _column(weight_decay, part, w),
                                 _column(prox_mu, part, w), centers,
                                 None if corrections is None else corrections[part], scratch, minus_start,
                                 whole_windows=fixed > 0)
        elif minus_start:
            w.zero_()
        else:
            w.copy_(starts[part])
        rows.extend(w.unbind(0))
    counts = [len(p) for p in plans]
    losses = [float(loss_sum[j]) / counts[j] if counts[j] else float("nan") for j in range(k)]
    return rows[:k], losses


# Parameter bytes per batched step. A client's MLP 784-200-10 is 0.6 MB of parameters; 12 of
# them (7.6 MB) stay in the CPU cache across a chunk's steps, where 100 (64 MB) would stream
# from memory at every step and lose most of what batching gains. Two hosts share a node's
# cache: per client-step, 12 MLPs a chunk took 136 us with two hosts stepping at once, 16 took
# 152 us (2-core EPYC, 32 MB L3). A linear model's chunk holds hundreds of clients. Each
# client's numbers do not depend on which clients share its chunk.
CHUNK_BYTES = 8 << 20
# On a GPU a chunk is as wide as memory allows (a step's kernels cost the same launches at 13
# clients as at 100: one host's round of 100 MLPs took 50 ms in 8 MB chunks, 26 ms in one, on
# an H200), and every chunk has the same client count: cuBLAS picks its kernel by the batch
# count, so a client's row came out 1e-4 different with 2 clients beside it than alone, and
# host counts that group the clients differently gave different bits. The last chunk is
# filled with idle clients, whose steps are zero.
GPU_CHUNK_BYTES = 64 << 20


def fixed_chunk(row_bytes: int, device: torch.device) -> int:
    """The client count of every chunk on a GPU (0 on the CPU: chunks are sized to the cache
    and need not be equal, as CPU kernels give a row the same bits in any batch)."""
    if device.type == "cpu":
        return 0
    return max(1, GPU_CHUNK_BYTES // max(1, row_bytes))


def _pad_rows(t: torch.Tensor, pad: int) -> torch.Tensor:
    """`t` [K, d] with `pad` more rows repeating row 0 (a broadcast stays a stride-0 view)."""
    if t.shape[0] and t.stride(0) == 0:
        return t[:1].expand(t.shape[0] + pad, -1)
    return torch.cat([t, t[:1].expand(pad, -1)])


# A chunk's steps are its longest client's: the others' rows are masked, computed for nothing.
# Clients sorted by their step count are cut into chunks of similar counts, the shortest at
# least this fraction of the longest, so a chunk pads at most 1 / TIER_RATIO of its steps.
# (Synthetic clients of lognormal sizes, 3 epochs of 32: one chunk of 10 took 0.078 s a round
# where the loop took 0.065.) Each client's numbers do not depend on which clients share its
# chunk, on the CPU.
TIER_RATIO = 0.7
_PROX_AT_START = "start"  # prox_centers of a reordered call: the reordered starts themselves


def _rows(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    """`t` [K, d] in `order` (a broadcast, stride 0, stays one)."""
    if t.shape[0] and t.stride(0) == 0:
        return t
    return t[torch.as_tensor(order, device=t.device)]


def step_tiers(plans: Sequence[Sequence[Any]], row_bytes: int, least: int = 1) -> list[slice]:
    """Chunks of clients sorted by descending step count (`plans`): a new one where a client's
    steps fall below TIER_RATIO of its chunk's first, each then cut by chunk_slices' size."""
    out: list[slice] = []
    start = 0
    k = len(plans)
    for j in range(1, k + 1):
        if j == k or (len(plans[j]) < TIER_RATIO * len(plans[start]) and j - start >= least and k - j >= least):
            out.extend(slice(start + p.start, start + p.stop) for p in chunk_slices(j - start, row_bytes, 0, least))
            start = j
    return out


def chunk_slices(k: int, row_bytes: int, fixed: int = 0, least: int = 1) -> list[slice]:
    """K clients in near-equal chunks of at most CHUNK_BYTES of parameters each (50 MLPs: 13,
    13, 12, 12, not 16, 16, 16, 2: a chunk of two costs a step's fixed overhead for little),
    and at least `least` each (K >= least); with `fixed` (a GPU: K is then a multiple of it),
    chunks of exactly `fixed` clients."""
    if fixed:
        return [slice(a, a + fixed) for a in range(0, k, fixed)]
    most = max(least, CHUNK_BYTES // max(1, row_bytes))
    n = min(-(-k // most), k // least)
    if n == 0:
        return []
    size, extra = divmod(k, n)
    bounds = np.cumsum([0] + [size + (j < extra) for j in range(n)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _sgd_chunk(
    grad_fn: Any, ctxs: Sequence[ClientContext], plans: Sequence[list[torch.Tensor]], start: torch.Tensor,
    w: torch.Tensor, loss_sum: torch.Tensor, lrs: Sequence[float], schedules: Sequence[LocalSchedule], width: int,
    wd: torch.Tensor | None, mu: torch.Tensor | None, centers: torch.Tensor | str | None,
    corrections: torch.Tensor | None, scratch: Any = None, minus_start: bool = False, whole_windows: bool = False,
) -> Any:
    """`local_sgd_batched`'s steps for one chunk of clients from `start`, writing the final
    vectors (with `minus_start`, final - start) into `w` and adding to `loss_sum` (views of
    the caller's rows), one parameter segment (layer) at a time: no [K, d] temporaries beyond
    the gradient itself (or, on the fused path, the affine terms' drift). `centers` "start":
    the proximal pull is towards `start`. `whole_windows` (a GPU) pads the chunk's steps with
    idle ones to whole windows, so that every window has the same shape whichever clients
    share the chunk. Returns the working copies for the next chunk to reuse (`scratch`)."""
    sb = stack_batches(ctxs, plans, width)
    fused = isinstance(grad_fn, BatchedMLPGrad)
    if fused and whole_windows:
        sb = sb.padded_steps(window_shape(sb.width, grad_fn.shapes[0][1])[0])
    if fused:
        reuse, reuse_drift = scratch if scratch is not None else (None, None)
        layers = grad_fn.split(start, reuse)
        affine = Affine.of(grad_fn, wd, mu, centers, corrections, start, reuse_drift)

        def unanchored(a: Affine | None) -> Affine | None:
            """After the first window the layers no longer start at `start`: a pull towards it
            is an explicit drift from then on (FedProx's fold holds in the first window only)."""
            if a is None or a.anchor is None:
                return a
            return Affine.of(grad_fn, wd, mu, start, corrections, start, reuse_drift)
    else:
        if isinstance(centers, str):
            centers = start
        w.copy_(start)
    steps = torch.tensor([[step_size(lr, t, s.lr_offset) for lr, s in zip(lrs, schedules, strict=True)]
                          for t in range(sb.steps)], dtype=w.dtype, device=w.device).view(sb.steps, -1) * sb.active
    if fused:  # the kernel moves the layers in place (no gradient materialised), a window of steps at a time
        size, rows = window_shape(sb.width, grad_fn.shapes[0][1])
        if size == 1:  # windows would not pay (a linear model, wide minibatches): plain steps, unpadded
            for t in range(sb.steps):
                affine = unanchored(affine) if t else affine
                loss = grad_fn.step(layers, sb.x_at(t), sb.y_at(t), sb.mask[t], steps[t], affine)
                loss_sum += torch.where(sb.active[t] > 0, loss.double(), 0.0)
        else:
            for t0 in range(0, sb.steps, size):
                affine = unanchored(affine) if t0 else affine
                window = range(t0, min(t0 + size, sb.steps))
                part = slice(window.start, window.stop)
                ys = [sb.y_at(t) for t in window]
                losses = grad_fn.window(layers, sb.x_steps(part, rows), ys, sb.mask[part], steps[part], affine)
                for t, loss in zip(window, losses, strict=True):
                    loss_sum += torch.where(sb.active[t] > 0, loss.double(), 0.0)
        grad_fn.join(layers, w, start if minus_start else None)
        return layers, affine.drift if affine is not None and affine.drift is not None else reuse_drift
    for t in range(sb.steps):
        step = steps[t]
        segments, loss = grad_fn(w, sb.x_at(t), sb.y_at(t), sb.mask[t])
        with torch.no_grad():
            for offset, grad in segments:
                cols = slice(offset, offset + grad.shape[1])
                seg = w[:, cols]
                if wd is not None:
                    grad = grad + wd * seg
                if mu is not None:
                    grad = grad + mu * (seg - centers[:, cols])
                if corrections is not None:
                    grad = grad + corrections[:, cols]
                seg -= step[:, None] * grad
            loss_sum += torch.where(sb.active[t] > 0, loss.detach().double(), 0.0)
    if minus_start:
        w -= start
    return scratch


def affine_terms(
    wd: torch.Tensor | None, mu: torch.Tensor | None, centers: torch.Tensor | str | None, corrections: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The part of the local gradient that is affine in the parameters w: weight decay wd * w,
    FedProx's mu * (w - center), SCAFFOLD's constant correction. With it an SGD step is
        w <- (1 - step * decay) w - step * grad + step * (anchor * w_start + drift),
    returned as (decay = wd + mu [K], anchor [K], drift [K, d]): with `centers` "start" (FedProx's
    pull towards the start itself) anchor = mu and drift = -correction, else anchor is None and
    drift = mu * center - correction. The fused kernel carries them through a window of steps
    in closed form. Each is None where it is 0."""
    decay = None
    for coef in (wd, mu):
        if coef is not None:
            decay = coef[:, 0] if decay is None else decay + coef[:, 0]
    anchor = drift = None
    if mu is not None and isinstance(centers, str):
        anchor = mu[:, 0]
    elif mu is not None:
        drift = mu * centers
    if corrections is not None:
        drift = -corrections if drift is None else drift - corrections
    return decay, anchor, drift


@dataclass
class Affine:
    """`affine_terms` in the kernel's layout: `drift` as `split`'s layers, `start` the start's
    layers (views), which an `anchor` pulls towards."""

    decay: torch.Tensor | None
    anchor: torch.Tensor | None
    drift: list[tuple[torch.Tensor, torch.Tensor | None]] | None
    start: list[tuple[torch.Tensor, torch.Tensor | None]] | None

    @classmethod
    def of(cls, grad_fn: BatchedMLPGrad, wd: torch.Tensor | None, mu: torch.Tensor | None,
           centers: torch.Tensor | str | None, corrections: torch.Tensor | None, start: torch.Tensor,
           reuse: list[tuple[torch.Tensor, torch.Tensor | None]] | None) -> Affine | None:
        """`affine_terms` of a chunk starting at `start` (the drift split into `reuse`), or None
        for plain SGD."""
        decay, anchor, drift = affine_terms(wd, mu, centers, corrections)
        if decay is None and drift is None:
            return None
        return cls(decay, anchor, None if drift is None else grad_fn.split(drift, reuse),
                   None if anchor is None else grad_fn._layers(start))

    def move(self, i: int, part: int, p: torch.Tensor, moved: torch.Tensor, keep: torch.Tensor | None,
             step: torch.Tensor) -> None:
        """One step of layer i's weight (part 0) or bias (part 1) in place:
        p <- keep * p - moved + step * (anchor * p_start + drift), `moved` scaled by the step."""
        shape = (-1,) + (1,) * (p.dim() - 1)
        if keep is not None:
            p.mul_(keep.view(shape))
        p.sub_(moved)
        if self.drift is not None:
            p.add_(self.drift[i][part] * step.view(shape))
        if self.anchor is not None:
            p.add_(self.start[i][part] * (self.anchor * step).view(shape))


def _column(values: Sequence[float] | None, rows: slice, like: torch.Tensor) -> torch.Tensor | None:
    """[K, 1] per-client coefficients of `rows` in the parameters' dtype and device (`like`;
    float32 coefficients would round a float64 model's decay and mu), or None when all are 0
    (the term is skipped, as the loop skips it)."""
    if values is None or not any(values[rows]):
        return None
    return torch.tensor([float(v) for v in values[rows]], dtype=like.dtype, device=like.device)[:, None]


class BatchedMLPGrad:
    """([(offset, grad segment [K, n])], masked mean CE [K]) of K ReLU MLPs (rayfl's `mlp` and `linear`: Flatten,
    then Linear (+ ReLU) layers) on K minibatches, by hand-written batched matmuls: forward
    with baddbmm, backward with bmm. vmap over autograd reaches the same numbers but its
    backward of a batched linear layer is far slower on a CPU than these few bmm calls."""

    def __init__(self, shapes: list[tuple[int, int, bool]]):
        self.shapes = shapes  # (in, out, bias) per Linear, in parameter order
        self.offsets = list(np.cumsum([0] + [i * o + (o if b else 0) for i, o, b in shapes])[:-1])

    @classmethod
    def of(cls, model: torch.nn.Module) -> BatchedMLPGrad | None:
        mods = list(model.children()) if isinstance(model, torch.nn.Sequential) else []
        if not mods or not isinstance(mods[0], torch.nn.Flatten):
            return None
        shapes, expect_linear = [], True
        for m in mods[1:]:
            if expect_linear and isinstance(m, torch.nn.Linear):
                shapes.append((m.in_features, m.out_features, m.bias is not None))
            elif not expect_linear and type(m) is torch.nn.ReLU:
                pass
            else:
                return None
            expect_linear = not expect_linear
        return cls(shapes) if shapes and not expect_linear else None

    def _layers(self, w: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        out, offset, k = [], 0, w.shape[0]
        for n_in, n_out, bias in self.shapes:
            weight = w[:, offset : offset + n_in * n_out].view(k, n_out, n_in)
            offset += n_in * n_out
            b = None
            if bias:
                b = w[:, offset : offset + n_out]
                offset += n_out
            out.append((weight, b))
        return out

    def split(self, w: torch.Tensor, reuse: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None,
              ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Per-layer copies ([K, out, in], [K, out]) of K flat vectors, each client's block
        contiguous and 64-byte aligned (`aligned_batch`): batched matmuls on them run as one
        call each, where views into [K, d] rows would not. Copies into `reuse` (an earlier
        `split` of as many vectors) instead of allocating."""
        views = self._layers(w)
        if reuse is None or reuse[0][0].shape != views[0][0].shape:
            reuse = [(aligned_batch(weight), None if b is None else aligned_batch(b)) for weight, b in views]
        for (dst_w, dst_b), (weight, b) in zip(reuse, views, strict=True):
            dst_w.copy_(weight)
            if b is not None:
                dst_b.copy_(b)
        return reuse

    def join(self, layers: list[tuple[torch.Tensor, torch.Tensor | None]], w: torch.Tensor,
             minus: torch.Tensor | None = None) -> None:
        """Write `split`'s (updated) layers back into the flat vectors `w`, less the flat
        vectors `minus` if given (in the same pass)."""
        subtract = self._layers(minus) if minus is not None else [(None, None)] * len(layers)
        for (weight, b), (dst_w, dst_b), (sub_w, sub_b) in zip(layers, self._layers(w), subtract, strict=True):
            _write(dst_w, weight, sub_w)
            if b is not None:
                _write(dst_b, b, sub_b)

    def step(self, layers: list[tuple[torch.Tensor, torch.Tensor | None]], x: torch.Tensor, y: torch.Tensor,
             m: torch.Tensor, step: torch.Tensor, affine: Affine | None = None) -> torch.Tensor:
        """One SGD step applied in place to `split`'s layers, without materialising the
        gradient (plain SGD, or with the gradient's affine terms). Returns the masked mean CE [K]."""
        return self.window(layers, x, [y], m[None], step[None], affine)[0]

    def window(self, layers: list[tuple[torch.Tensor, torch.Tensor | None]], x: torch.Tensor,
               ys: Sequence[torch.Tensor], ms: torch.Tensor, steps: torch.Tensor, affine: Affine | None = None,
               ) -> list[torch.Tensor]:
        """S consecutive SGD steps (S = len(steps), `steps` [S, K] the step sizes, 0 where a
        client skips the step) in place on `split`'s layers, reading the first layer's weights
        twice for all S steps instead of three times per step: the host is bound by that
        traffic (784x200 weights per client), not by arithmetic.

        Plain SGD moves the first layer by W_{s+1} = W_s - D_s^T X_s (D_s: step s's scaled,
        masked error at its output), so step s's pre-activation is exactly
            X_s W_s^T = X_s W_0^T - sum_{j<s} (X_s X_j^T) D_j:
        one batched matmul gives every step's X_s W_0^T, the Gram matrix X X^T (S*B rows) the
        corrections, and W_S = W_0 - D^T X is one matmul at the end.

        With the gradient's affine terms (`affine_terms`: decay, drift Q, anchor mu) a step is
        W_{s+1} = a_s W_s - D_s^T X_s + step_s (mu W_0 + Q), a_s = 1 - step_s * decay, so
            W_s = (A_s + mu r_s) W_0 - sum_{j<s} c_{s,j} D_j^T X_j + r_s Q,
        A_s = prod_{i<s} a_i, c_{s,j} = prod_{j<i<s} a_i, r_s = sum_{j<s} c_{s,j} step_j: the
        same matmuls, scaled, and one more for every step's X_s Q^T where there is a drift
        (FedProx's pull towards the start folds into the scale). Layers above the first take
        the step directly.

        Same values as S single steps, up to float32 summation order. `x` [K, R, ...] holds
        each client's S minibatches one after another, then zero rows up to the window's padded
        length R (`window_shape`, `StackedBatches.x_steps`); `ys` the S label tensors [K, B],
        `ms` [S, K, B] the masks. Returns the masked mean CE [K] of each step."""
        (w0, b0), n_steps, width = layers[0], len(steps), ms.shape[2]
        k = x.shape[0]
        flat = x.reshape(k, x.shape[1], -1)
        base = torch.bmm(flat, w0.transpose(1, 2))  # every step's X_s W_0^T
        gram = torch.bmm(flat, flat.transpose(1, 2)) if n_steps > 1 else None
        drift = None if affine is None else affine.drift
        anchor = None if affine is None else affine.anchor
        pull = torch.bmm(flat, drift[0][0].transpose(1, 2)) if drift is not None and n_steps > 1 else None  # X_s Q^T
        keeps = None if affine is None or affine.decay is None else 1.0 - steps * affine.decay  # a_s [S, K]
        scale = torch.ones(k, dtype=base.dtype, device=base.device)  # A_s
        coef = torch.ones(k, 0, dtype=base.dtype, device=base.device)  # c_{s,j}, j < s
        reach = torch.zeros(k, dtype=base.dtype, device=base.device)  # r_s
        moves = torch.zeros_like(base)  # D_s, filled step by step; 0 on the padding rows
        losses = []
        for s in range(n_steps):
            rows = slice(s * width, (s + 1) * width)
            z = base[:, rows]
            if s:
                z = aligned_batch(z, copy=True)
                if keeps is not None:
                    z.mul_((scale if anchor is None else scale + anchor * reach)[:, None, None])
                    gram_s = aligned_batch(gram[:, rows, : s * width], copy=True)
                    gram_s.mul_(coef.repeat_interleave(width, dim=1)[:, None, :])
                else:
                    gram_s = gram[:, rows, : s * width]
                z.baddbmm_(gram_s, moves[:, : s * width], alpha=-1.0)
                if pull is not None:
                    z.add_(pull[:, rows] * reach[:, None, None])
            if b0 is not None:
                z = z + b0[:, None, :]
            keep = None if keeps is None else keeps[s]
            _, loss, error = self._above_first(layers, z, ys[s], ms[s], steps[s], keep, affine)
            moves[:, rows] = error
            if b0 is not None:
                if affine is None:
                    b0.sub_(error.sum(dim=1))
                else:
                    affine.move(0, 1, b0, error.sum(dim=1), keep, steps[s])
            losses.append(loss)
            if keep is not None:  # A, c and r of step s + 1
                scale = scale * keep
                coef = torch.cat([coef * keep[:, None], torch.ones_like(keep)[:, None]], dim=1)
                reach = reach * keep + steps[s]
            else:
                reach = reach + steps[s]
        if keeps is not None:
            w0.mul_((scale if anchor is None else scale + anchor * reach)[:, None, None])
            scaled = aligned_batch(moves, copy=True)
            scaled[:, : n_steps * width].mul_(coef.repeat_interleave(width, dim=1)[:, :, None])
            moves = scaled
        w0.baddbmm_(moves.transpose(1, 2), flat, alpha=-1.0)
        if drift is not None:
            w0.add_(drift[0][0] * reach[:, None, None])
        return losses

    def __call__(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
        layers = self._layers(w)
        k, b = x.shape[0], x.shape[1]
        h = x.reshape(k, b, -1)
        weight, bias = layers[0]
        z = torch.bmm(h, weight.transpose(1, 2))
        if bias is not None:
            z = z + bias[:, None, :]
        grads, loss, error = self._above_first(layers, z, y, m, None)
        grads.append((0, torch.bmm(error.transpose(1, 2), h).reshape(k, -1)))
        if bias is not None:
            grads.append((weight.shape[1] * weight.shape[2], error.sum(dim=1)))
        return grads, loss

    def _above_first(
        self, layers: list[tuple[torch.Tensor, torch.Tensor | None]], z0: torch.Tensor, y: torch.Tensor,
        m: torch.Tensor, step: torch.Tensor | None, keep: torch.Tensor | None = None, affine: Affine | None = None,
    ) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor, torch.Tensor]:
        """From the first layer's pre-activation `z0`: the forward pass, the masked mean CE [K]
        and the backward pass down to the first layer, which the caller moves. Layers above it
        move in place (with `step`; `affine`'s terms with `keep`, see `window`) or give their
        gradient segments (without).
        Returns (segments, loss, error at the first layer's output, scaled by `step` if given)."""
        inputs, pre, h = [], [z0], z0
        for weight, bias in layers[1:]:
            h = torch.relu(h)
            inputs.append(h)
            h = torch.bmm(h, weight.transpose(1, 2))
            if bias is not None:
                h = h + bias[:, None, :]
            pre.append(h)
        count = m.sum(dim=1).clamp_min(1.0)  # [K]
        logp = torch.log_softmax(h, dim=-1)
        ce = -logp.gather(2, y[:, :, None]).squeeze(2)  # [K, B]
        loss = (ce * m).sum(dim=1) / count
        dz = logp.exp()
        dz.scatter_add_(2, y[:, :, None], torch.full_like(dz[:, :, :1], -1.0))
        dz.mul_((m / count[:, None])[:, :, None])
        if step is not None:
            dz.mul_(step[:, None, None])
        grads: list[tuple[int, torch.Tensor]] = []
        for i in range(len(layers) - 1, 0, -1):
            (weight, bias), offset, h_in = layers[i], self.offsets[i], inputs[i - 1]
            back = torch.bmm(dz, weight) * (pre[i - 1] > 0)  # before the weight moves
            if step is not None:
                if affine is None:
                    weight.baddbmm_(dz.transpose(1, 2), h_in, alpha=-1.0)
                else:
                    affine.move(i, 0, weight, torch.bmm(dz.transpose(1, 2), h_in), keep, step)
                if bias is not None and affine is None:
                    bias.sub_(dz.sum(dim=1))
                elif bias is not None:
                    affine.move(i, 1, bias, dz.sum(dim=1), keep, step)
            else:
                grads.append((offset, torch.bmm(dz.transpose(1, 2), h_in).reshape(dz.shape[0], -1)))
                if bias is not None:
                    grads.append((offset + weight.shape[1] * weight.shape[2], dz.sum(dim=1)))
            dz = back
        return grads, loss, dz


# Minibatch rows per window of steps (BatchedMLPGrad.window): a window reads the first layer's
# weights twice whatever its length, and its Gram corrections cost about rows / (2 * outputs)
# of the steps' arithmetic: 15% for 60 rows before 200 hidden units, but 300% before a linear
# model's 10 outputs, whose small weights stay in cache anyway. So a window holds at most
# outputs / 2 rows (and WINDOW_ROWS), one step where that is less than a minibatch.
WINDOW_ROWS = 64
# MKL's batched matmuls choose their code path, and with it the order of a sum, by where each
# client's matrix starts: a client's bits would depend on its position in the chunk unless
# every client's block starts on a 64-byte boundary.
ALIGN_FLOATS = 16


def window_shape(width: int, outputs: int) -> tuple[int, int]:
    """(steps, rows) of every window for minibatches of `width` rows before a first layer of
    `outputs` units: at most min(WINDOW_ROWS, outputs / 2) rows of steps, at least one step,
    padded with zero rows to a multiple of ALIGN_FLOATS. Both depend on the batch size and the
    model alone and every window is padded to them (a chunk's last window too), so a client's
    matmuls have the same shapes whichever clients share its chunk and 1, 2 or 3 hosts give
    the same bits."""
    steps = max(1, min(WINDOW_ROWS, outputs // 2) // max(1, width))
    return steps, -(-steps * width // ALIGN_FLOATS) * ALIGN_FLOATS


def aligned_batch(t: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """An uninitialised tensor shaped like `t` ([K, ...]; with `copy`, holding its values)
    whose K blocks are each contiguous and start 64-byte aligned (see ALIGN_FLOATS)."""
    n = t[0].numel() if len(t) else 0
    out = torch.empty((t.shape[0], -(-n // ALIGN_FLOATS) * ALIGN_FLOATS), dtype=t.dtype, device=t.device)
    out = out[:, :n].view(t.shape)
    if copy:
        out.copy_(t)
    return out


def _write(dst: torch.Tensor, src: torch.Tensor, minus: torch.Tensor | None) -> None:
    """dst = src, or src - minus in the same pass."""
    if minus is None:
        dst.copy_(src)
    else:
        torch.sub(src, minus, out=dst)
