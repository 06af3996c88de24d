"""Local training on a client, shared by the first-order methods.

Parameters are one flat float32 vector; the host's module runs with its parameters bound as
views of that vector (`rayfl.models.params.bound_to`; `torch.func` on views where binding is
not possible), so a gradient is a flat vector too and corrections (FedProx's proximal pull,
SCAFFOLD's control variates) are plain vector arithmetic. The linear softmax model takes the
closed-form gradient of `kernels.CrossEntropyGrad` instead of autograd (same values, ~4x
faster per step), which is what makes long linear-model runs (ZO-HFL's Table I) affordable."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

from rayfl.algorithms.kernels import CrossEntropyGrad, linear_shape
from rayfl.engine.context import ClientContext
from rayfl.engine.vectorized import maskable, planned_batches, stack_batches
from rayfl.models.params import bound_to, can_bind, functional_logits, unflatten
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
        losses.append(loss)
    # one host-device synchronisation per client, not per step (the same float64 mean)
    return w.detach(), float(np.mean(torch.stack(losses).cpu().numpy().astype(np.float64))) if losses else float("nan")


def _gradients(ctx: ClientContext, w: torch.Tensor, schedule: LocalSchedule) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(minibatch loss, CE gradient at the current `w`) per step, charging each step. `w` is
    read when the next item is requested, so the caller updates it in place between steps.

    The linear model takes the closed form on pre-flattened inputs and one-hot targets, with
    the same minibatches `ctx.batches` would draw (same stream, same order, same budget
    check); other models go through autograd on `ctx.batches`."""
    if linear_shape(ctx.model) is None and can_bind(ctx.model, w):
        grad = torch.zeros_like(w)
        with bound_to(ctx.model, w, grad) as model:
            for xb, yb in ctx.batches(schedule.batch_size, epochs=schedule.epochs, steps=schedule.steps):
                grad.zero_()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
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
) -> tuple[list[torch.Tensor], list[float]] | None:
    """`local_sgd` for K clients at once (rayfl.engine.vectorized): row k of `starts` [K, d]
    follows exactly client k's loop, on its own minibatches and step count, with its own lr,
    weight decay, proximal pull towards `prox_centers[k]` and `corrections[k]`. Returns
    (K final vectors, mean minibatch loss per client), or None where the model does not
    allow padding (batch statistics); the caller then runs the loop. The K final vectors are
    rows of per-chunk buffers, the caller's to change in place; with `minus_start` they are
    the updates final - start instead (FedAvg's deltas, written in the same pass)."""
    model = ctxs[0].model
    if not maskable(model) or any(c.model is not model for c in ctxs):
        return None
    plans = [planned_batches(c, s.batch_size, s.epochs, s.steps) for c, s in zip(ctxs, schedules, strict=True)]
    k = len(ctxs)
    starts = starts.detach()
    grad_fn = BatchedMLPGrad.of(model) or _masked_grad(model)
    width = max(s.batch_size for s in schedules)
    loss_sum = torch.zeros(k, dtype=torch.float64, device=starts.device)
    rows: list[torch.Tensor] = []
    scratch = None  # one chunk's per-layer working copies, reused by the next chunk
    for part in chunk_slices(k, starts.shape[1] * starts.element_size()):
        # one output buffer per chunk, not one [K, d]: a chunk's few MB come back from the
        # allocator's free lists round after round, where K rows (tens of MB) would be a fresh
        # mapping each call and page-fault on every first write
        w = torch.empty((part.stop - part.start, starts.shape[1]), dtype=starts.dtype, device=starts.device)
        if any(plans[part]):
            scratch = _sgd_chunk(grad_fn, ctxs[part], plans[part], starts[part], w, loss_sum[part], lrs[part],
                                 schedules[part], width, _column(weight_decay, part, w.device),
                                 _column(prox_mu, part, w.device), None if prox_centers is None else prox_centers[part],
                                 None if corrections is None else corrections[part], scratch, minus_start)
        elif minus_start:
            w.zero_()
        else:
            w.copy_(starts[part])
        rows.extend(w.unbind(0))
    counts = [len(p) for p in plans]
    losses = [float(loss_sum[j]) / counts[j] if counts[j] else float("nan") for j in range(k)]
    return rows, losses


# Parameter bytes per batched step. A client's MLP 784-200-10 is 0.6 MB of parameters; 12 of
# them (7.6 MB) stay in the CPU cache across a chunk's steps, where 100 (64 MB) would stream
# from memory at every step and lose most of what batching gains. Two hosts share a node's
# cache: per client-step, 12 MLPs a chunk took 136 us with two hosts stepping at once, 16 took
# 152 us (2-core EPYC, 32 MB L3). A linear model's chunk holds hundreds of clients. Each
# client's numbers do not depend on which clients share its chunk.
CHUNK_BYTES = 8 << 20


def chunk_slices(k: int, row_bytes: int) -> list[slice]:
    """K clients in near-equal chunks of at most CHUNK_BYTES of parameters each (50 MLPs: 13,
    13, 12, 12, not 16, 16, 16, 2: a chunk of two costs a step's fixed overhead for little)."""
    most = max(1, CHUNK_BYTES // max(1, row_bytes))
    n = -(-k // most)
    if n == 0:
        return []
    size, extra = divmod(k, n)
    bounds = np.cumsum([0] + [size + (j < extra) for j in range(n)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _sgd_chunk(
    grad_fn: Any, ctxs: Sequence[ClientContext], plans: Sequence[list[torch.Tensor]], start: torch.Tensor,
    w: torch.Tensor, loss_sum: torch.Tensor, lrs: Sequence[float], schedules: Sequence[LocalSchedule], width: int,
    wd: torch.Tensor | None, mu: torch.Tensor | None, centers: torch.Tensor | None, corrections: torch.Tensor | None,
    scratch: Any = None, minus_start: bool = False,
) -> Any:
    """`local_sgd_batched`'s steps for one chunk of clients from `start`, writing the final
    vectors (with `minus_start`, final - start) into `w` and adding to `loss_sum` (views of
    the caller's rows), one parameter segment (layer) at a time: no [K, d] temporaries beyond
    the gradient itself. Returns the working copies for the next chunk to reuse (`scratch`)."""
    sb = stack_batches(ctxs, plans, width)
    fused = wd is None and mu is None and corrections is None and isinstance(grad_fn, BatchedMLPGrad)
    if fused:
        layers = grad_fn.split(start, scratch)
    else:
        w.copy_(start)
    for t in range(sb.steps):
        step = torch.tensor([step_size(lr, t, s.lr_offset) for lr, s in zip(lrs, schedules, strict=True)],
                            dtype=w.dtype, device=w.device) * sb.active[t]
        if fused:  # plain SGD: the kernel writes w -= step * grad straight into the layers
            loss = grad_fn.step(layers, sb.x_at(t), sb.y_at(t), sb.mask[t], step)
            loss_sum += torch.where(sb.active[t] > 0, loss.double(), 0.0)
            continue
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
    if fused:
        grad_fn.join(layers, w, start if minus_start else None)
        return layers
    if minus_start:
        w -= start
    return scratch


def _column(values: Sequence[float] | None, rows: slice, device: torch.device) -> torch.Tensor | None:
    """[K, 1] per-client coefficients of `rows`, or None when all are 0 (the term is skipped,
    as the loop skips it)."""
    if values is None or not any(values[rows]):
        return None
    return torch.tensor([float(v) for v in values[rows]], dtype=torch.float32, device=device)[:, None]


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
        """Contiguous per-layer copies ([K, out, in], [K, out]) of K flat vectors: batched
        matmuls on them run as one call each, where views into [K, d] rows would not. Copies
        into `reuse` (an earlier `split` of as many vectors) instead of allocating."""
        views = self._layers(w)
        if reuse is None or reuse[0][0].shape != views[0][0].shape:
            # always copies: `w` may view the shared broadcast vector, which `.contiguous()`
            # would hand back as is for a single client (size-1 dims count as contiguous)
            fmt = torch.contiguous_format
            return [(weight.clone(memory_format=fmt), None if b is None else b.clone(memory_format=fmt))
                    for weight, b in views]
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
             m: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """One SGD step w -= step * grad applied in place to `split`'s layers, without
        materialising the gradient: the step [K] scales the output error and each layer's
        update is one baddbmm. Returns the masked mean CE [K]."""
        return self._run(layers, x, y, m, step)[1]

    def __call__(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
        return self._run(self._layers(w), x, y, m, None)

    def _run(
        self, layers: list[tuple[torch.Tensor, torch.Tensor | None]], x: torch.Tensor, y: torch.Tensor, m: torch.Tensor,
        step: torch.Tensor | None,
    ) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
        k, b = x.shape[0], x.shape[1]
        h = x.reshape(k, b, -1)
        inputs, pre = [], []
        for i, (weight, bias) in enumerate(layers):
            inputs.append(h)
            z = torch.bmm(h, weight.transpose(1, 2))
            if bias is not None:
                z = z + bias[:, None, :]
            pre.append(z)
            h = torch.relu(z) if i < len(layers) - 1 else z
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
        for i in range(len(layers) - 1, -1, -1):
            (weight, bias), offset = layers[i], self.offsets[i]
            back = torch.bmm(dz, weight) * (pre[i - 1] > 0) if i else None  # before weight moves
            if step is not None:
                weight.baddbmm_(dz.transpose(1, 2), inputs[i], alpha=-1.0)
                if bias is not None:
                    bias.sub_(dz.sum(dim=1))
            else:
                grads.append((offset, torch.bmm(dz.transpose(1, 2), inputs[i]).reshape(k, -1)))
                if bias is not None:
                    grads.append((offset + weight.shape[1] * weight.shape[2], dz.sum(dim=1)))
            if back is not None:
                dz = back
        return grads, loss


def _write(dst: torch.Tensor, src: torch.Tensor, minus: torch.Tensor | None) -> None:
    """dst = src, or src - minus in the same pass."""
    if minus is None:
        dst.copy_(src)
    else:
        torch.sub(src, minus, out=dst)


def _masked_grad(model: torch.nn.Module):
    """vmap over clients of (grad, loss) of the masked mean CE: padded rows weigh 0 and the
    mean is over the client's real rows, as `F.cross_entropy` over its unpadded batch."""

    def loss_fn(vec: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, unflatten(model, vec), (x,))
        ce = F.cross_entropy(logits, y, reduction="none")
        return (ce * m).sum() / m.sum().clamp_min(1.0)

    batched = vmap(grad_and_value(loss_fn))

    def whole(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
        grad, loss = batched(w, x, y, m)
        return [(0, grad)], loss

    return whole
