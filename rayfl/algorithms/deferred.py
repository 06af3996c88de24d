"""Large dense layers whose SGD steps are kept as low-rank factors until they must be applied.

A plain SGD step moves a dense layer's weight by a matrix of rank at most the minibatch's rows:
W_{t+1} = W_t - E_t^T A_t, with A_t the layer's input rows at step t and E_t = step_t * dL/dZ_t
the scaled error at its output. Materialising that gradient, then adding it, streams the whole
weight through memory twice a step; for LEAF's FEMNIST CNN (a 3136 x 2048 dense layer, 97% of
the network's parameters) at batch 20 that traffic, not arithmetic, is what a CPU step waits for.
Keeping the rows instead, with W the weight at the last fold and A, E the rows since,

    Z_t = X_t W_t^T = X_t W^T - (X_t A^T) E        dX_t = dZ_t W_t = dZ_t W - (dZ_t E^T) A

are the layer's forward and backward at W_t exactly (in real arithmetic; float32 rounding
differs from the loop's in the last places), and W_t = W - E^T A is one large matmul when the
window of rows is full or the client is done. The corrections cost rows * (in + out) per input
row against in * out for the layer itself, so a window holds at most in * out / (4 (in + out))
rows (WINDOW_ROWS at most): never more than a quarter of the layer's own arithmetic.

Only where the step is plain SGD (no weight decay, proximal pull or correction: FedAvg's client
and any other that trains with nothing but the CE gradient), and only for layers large enough
that their traffic matters (DEFER_MIN_PARAMS): a client takes this path by its model and batch
size alone, on any host layout, so 1 and 2 hosts give the same bits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

# A weight of 2**20 parameters (4 MB in float32) no longer fits a core's L2 cache.
DEFER_MIN_PARAMS = 1 << 20
# Rows a window holds at most; a fold then is one matmul of this many rows, near a core's peak.
WINDOW_ROWS = 256
# A window must hold at least this many minibatches to save anything.
MIN_STEPS_PER_WINDOW = 4


def window_rows(layer: nn.Linear) -> int:
    """Rows of a window for `layer`: the corrections stay within a quarter of its arithmetic."""
    n_in, n_out = layer.in_features, layer.out_features
    return min(WINDOW_ROWS, n_in * n_out // (4 * (n_in + n_out)))


def deferrable(model: nn.Module, batch_size: int) -> list[nn.Linear]:
    """The Linear layers of `model` whose steps `deferred_steps` keeps as factors at this batch
    size: DEFER_MIN_PARAMS parameters or more, and room for MIN_STEPS_PER_WINDOW minibatches
    of `batch_size` rows (one input row per sample: an input with more rows per sample, a
    sequence, fills a window in fewer steps and still folds correctly)."""
    return [m for m in model.modules() if type(m) is nn.Linear
            and m.in_features * m.out_features >= DEFER_MIN_PARAMS
            and window_rows(m) >= MIN_STEPS_PER_WINDOW * batch_size]


class _Window:
    """One layer's rows since its last fold, and the rows of the step in progress."""

    def __init__(self, layer: nn.Linear, shared: torch.Tensor | None = None):
        weight = layer.weight.detach()  # a view of the client's flat vector under bound_to
        self.weight = weight
        # what the window's products read: until the first fold, `shared` (the same values in
        # the round's broadcast, which every host on the machine maps), then the weight itself
        self.base = weight if shared is None else shared
        self.capacity = window_rows(layer)
        self.acts = torch.empty(self.capacity, layer.in_features, dtype=weight.dtype, device=weight.device)
        self.errs = torch.empty(self.capacity, layer.out_features, dtype=weight.dtype, device=weight.device)
        self.rows = 0
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.step_size = 0.0

    def factors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return (self.acts[: self.rows], self.errs[: self.rows]) if self.rows else None

    def fold(self, acts: torch.Tensor | None = None, errs: torch.Tensor | None = None) -> None:
        """W <- W - E^T A for the window's rows (or for the given rows), emptying the window."""
        if acts is None:
            if self.rows:
                self.weight.addmm_(self.errs[: self.rows].t(), self.acts[: self.rows], alpha=-1.0)
                self.base = self.weight
            self.rows = 0
        else:
            self.weight.addmm_(errs.t(), acts, alpha=-1.0)
            self.base = self.weight

    def end_step(self) -> None:
        """Commit the finished step's rows: into the window, folding it first when full."""
        for acts, errs in self.pending:
            n = acts.shape[0]
            if n > self.capacity:
                self.fold()
                self.fold(acts, errs)
                continue
            if self.rows + n > self.capacity:
                self.fold()
            self.acts[self.rows : self.rows + n].copy_(acts)
            self.errs[self.rows : self.rows + n].copy_(errs)
            self.rows += n
        self.pending.clear()


class _LowRankProduct(torch.autograd.Function):
    """x W_t^T from the window (see the module docstring); its backward gives dX and queues
    the step's rows (A, step * dZ) for the window. `anchor` (DeferredSteps.anchor) puts every
    call on a path autograd differentiates, also a first layer on the raw inputs."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, anchor: torch.Tensor,
                window: _Window) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        factors = window.factors()
        z = rows @ window.base.t()
        if factors is not None:
            acts, errs = factors
            z.addmm_(rows @ acts.t(), errs, alpha=-1.0)
        ctx.window, ctx.factors, ctx.shape = window, factors, x.shape
        ctx.save_for_backward(rows)
        return z.view(*x.shape[:-1], z.shape[-1])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, dz: torch.Tensor,
                 ) -> tuple[torch.Tensor | None, torch.Tensor, None]:
        (rows,) = ctx.saved_tensors
        window: _Window = ctx.window
        dz_rows = dz.reshape(-1, dz.shape[-1])
        dx = None
        if ctx.needs_input_grad[0]:
            dx = dz_rows @ window.base
            if ctx.factors is not None:
                acts, errs = ctx.factors
                dx.addmm_(dz_rows @ errs.t(), acts, alpha=-1.0)
            dx = dx.view(ctx.shape)
        window.pending.append((rows.detach(), dz_rows * window.step_size))
        return dx, torch.zeros((), dtype=dz.dtype, device=dz.device), None


class DeferredSteps:
    """The windows of a model's deferred layers during one client's local SGD."""

    def __init__(self, layers: list[nn.Linear], shared: dict[int, torch.Tensor] | None = None):
        shared = shared or {}
        self.windows = {id(layer.weight): _Window(layer, shared.get(id(layer.weight))) for layer in layers}
        weight = layers[0].weight if layers else torch.empty(())
        self.anchor = torch.zeros((), dtype=weight.dtype, device=weight.device, requires_grad=True)

    def holds(self, param: torch.Tensor) -> bool:
        """Whether `param` moves through a window (so autograd need not differentiate it)."""
        return id(param) in self.windows

    def inputs(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """What a step differentiates: `params`, and the anchor that runs the windows' backward."""
        return [*params, self.anchor] if self.windows else params

    def set_step_size(self, step_size: float) -> None:
        for window in self.windows.values():
            window.step_size = step_size

    def end_step(self) -> None:
        for window in self.windows.values():
            window.end_step()

    def fold(self) -> None:
        for window in self.windows.values():
            window.end_step()
            window.fold()


def shared_weights(model: nn.Module, layers: list[nn.Linear], start: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each layer's weight as a view of `start`, the flat vector the client's was copied from:
    the same values at the layer's offset in `model.parameters()` order. A FedAvg client's
    `start` is the round's broadcast in the object store, whose pages every host on a machine
    maps, so until a window first folds the hosts' products read one copy of a large weight
    through the shared cache instead of one each (FEMNIST's dense layer: 25 MB). Only where the
    view has the weight's memory alignment, which a BLAS may branch on: the same bits as reading
    the weight itself."""
    offsets, offset = {}, 0
    for p in model.parameters():
        offsets[id(p)] = offset
        offset += p.numel()
    if start.shape != (offset,) or start.stride() != (1,):
        return {}
    out = {}
    for layer in layers:
        weight = layer.weight
        view = start[offsets[id(weight)] : offsets[id(weight)] + weight.numel()].view(weight.shape)
        if (weight.is_contiguous() and view.dtype == weight.dtype and view.device == weight.device
                and view.data_ptr() % 64 == weight.data_ptr() % 64):
            out[id(weight)] = view
    return out


@contextmanager
def deferred_steps(model: nn.Module, batch_size: int, start: torch.Tensor | None = None,
                   ) -> Iterator[DeferredSteps]:
    """`model` (bound to the client's flat vector) with its deferrable layers computing through
    their windows. The caller sets each step's size before the forward pass, steps every other
    parameter itself and calls `end_step` after each backward; on exit every window is folded,
    so the flat vector holds the trained weights. `start` (the vector the client's was copied
    from, never written) lets the windows read the weights from it until they first fold
    (`shared_weights`)."""
    layers = deferrable(model, batch_size)
    steps = DeferredSteps(layers, shared_weights(model, layers, start) if start is not None and layers else None)
    for layer in layers:
        window = steps.windows[id(layer.weight)]

        def forward(x: torch.Tensor, layer: nn.Linear = layer, window: _Window = window) -> torch.Tensor:
            z = _LowRankProduct.apply(x, steps.anchor, window)
            return z if layer.bias is None else z + layer.bias

        layer.forward = forward  # an instance attribute: nn.Module.__call__ finds it first
    try:
        yield steps
        steps.fold()
    finally:
        for layer in layers:
            del layer.forward
