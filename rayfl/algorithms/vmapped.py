"""The generic batched client step: any network's per-client gradients through
`torch.func.vmap` over `functional_call`, with the minibatch mask threaded to the layers that
need it, and the rule `engine.vectorize: auto` uses to decide whether batching pays.

vmap turns K clients' convolutions into one grouped convolution, their matmuls into batched
ones and their norms into per-client norms, so Python and dispatch overhead is paid once per
step instead of K times. A step's arithmetic is unchanged, so where a step is compute-bound
(convnets, LSTMs on a CPU) that overhead is all there is to win, and grouped convolutions are
slower per FLOP than plain ones. Measured on this project's 2-core AMD EPYC, one thread, per
client-step, loop / vmap over 5-10 clients: LEAF's FEMNIST CNN (batch 20) 26.0 / 46.6 ms,
ResNet-18-GN width 8 (batch 32) 29.4 / 26.7, width 16 45.9 / 65.0, Conv-4 (batch 20)
7.1 / 8.7, the character LSTM (batch 10) 32.8 / 143.9 (vmap has no batching rule for LSTMs
and loops over clients). `rayfl bench femnist-cnn | cifar-resnet | shakespeare-lstm` measures
the whole round."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from rayfl.models.params import unflatten

GradFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                  tuple[list[tuple[int, torch.Tensor]], torch.Tensor]]
RECURRENT = (nn.RNNBase,)


def batching_pays(model: nn.Module, device: torch.device, fused: bool) -> bool:
    """Whether `engine.vectorize: auto` runs a host's clients of `model` as one batch:
    always with rayfl's fused MLP / linear kernel (`fused`; 2-3x a client-step on a CPU);
    the generic vmap step only on a GPU, where a step of a small network costs its kernel
    launches more than its arithmetic (a rule, not yet measured on these networks: `rayfl
    bench femnist-cnn --device cuda` measures it), and never for recurrent layers, which
    vmap runs one client at a time. By model and device alone: a client takes the same path
    whichever clients share its host, so 1 and 2 hosts give the same bits."""
    if fused:
        return True
    if any(isinstance(m, RECURRENT) for m in model.modules()):
        return False
    return device.type == "cuda"


class _MaskCell:
    """The current step's row mask [B] (inside vmap: one client's), read by masked norms."""

    mask: torch.Tensor | None = None


class MaskedBatchNorm(nn.Module):
    """BatchNorm with batch statistics over the real rows only: padded rows (mask 0) neither
    shift the mean nor the variance, so each client normalises exactly its own minibatch, as
    `F.batch_norm` over its unpadded rows does in the loop. Same parameter names as the
    BatchNorm it stands for, so `functional_call` binds the same flat vector."""

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm, cell: _MaskCell):
        super().__init__()
        if norm.track_running_stats:
            raise ValueError("rayfl's models keep no running statistics (track_running_stats=False)")
        self.eps, self.cell = norm.eps, cell
        self.weight = None if norm.weight is None else nn.Parameter(norm.weight.detach().clone())
        self.bias = None if norm.bias is None else nn.Parameter(norm.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (-1,) + (1,) * (x.dim() - 1)
        m = self.cell.mask
        m = torch.ones(x.shape[0], dtype=x.dtype, device=x.device) if m is None else m.to(x.dtype)
        dims = [0, *range(2, x.dim())]
        count = (m.sum() * x[0, 0].numel()).clamp_min(1.0)
        rows = m.view(shape)
        mean = (x * rows).sum(dims, keepdim=True) / count
        centred = x - mean
        var = (centred * centred * rows).sum(dims, keepdim=True) / count
        y = centred * torch.rsqrt(var + self.eps)
        channel = (1, -1) + (1,) * (x.dim() - 2)
        if self.weight is not None:
            y = y * self.weight.view(channel)
        if self.bias is not None:
            y = y + self.bias.view(channel)
        return y


def masked_twin(model: nn.Module) -> tuple[nn.Module, _MaskCell]:
    """A copy of `model` whose BatchNorm layers are MaskedBatchNorm reading one mask cell
    (the model itself when it has none), made once per model."""
    cached = getattr(model, "_rayfl_masked_twin", None)
    if cached is not None:
        return cached
    cell = _MaskCell()
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        twin = model
    else:
        twin = copy.deepcopy(model)
        for parent in list(twin.modules()):
            for name, child in parent.named_children():
                if isinstance(child, nn.modules.batchnorm._BatchNorm):
                    setattr(parent, name, MaskedBatchNorm(child, cell))
    object.__setattr__(model, "_rayfl_masked_twin", (twin, cell))  # not a submodule
    return twin, cell


def masked_grad(model: nn.Module) -> GradFn:
    """vmap over clients of (grad, loss) of the masked mean CE: padded rows weigh 0 in the
    loss and in batch statistics, and the mean is over the client's real rows, as
    `F.cross_entropy` over its unpadded batch."""
    twin, cell = masked_twin(model)

    def loss_fn(vec: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        cell.mask = m
        try:
            logits = functional_call(twin, unflatten(model, vec), (x,))
        finally:
            cell.mask = None
        ce = F.cross_entropy(logits, y, reduction="none")
        return (ce * m).sum() / m.sum().clamp_min(1.0)

    batched = vmap(grad_and_value(loss_fn))

    def whole(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor]:
        grad, loss = batched(w, x, y, m)
        return [(0, grad)], loss

    return whole
