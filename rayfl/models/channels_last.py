"""Convolution weights kept channels-last while a client trains (`engine.channels_last`).

PyTorch's CPU convolutions (oneDNN) write their output in the layout of their weight or input,
and the element-wise layers, max-pooling and GroupNorm after them keep it. In the default NCHW
layout max-pooling alone took 2.8 ms of a FEMNIST CNN step on one thread, 0.4 ms channels-last
with its backward; a ResNet-18-GN step (width 16, batch 32) took 61 ms against 44
(`scripts/profile_step.py`, AMD EPYC, 2026-11-28). Whole rounds ran 1.1-1.2x faster
(docs/explanation/engine-speed.md).

The parameters stay one flat vector in NCHW order, which is what the driver, aggregation and
checkpoints read. Each convolution weight trains in a channels-last buffer of its own: it is
refreshed from the vector before a step where the caller moves the vector, or it takes the
steps itself and is written back when the client is done. Either way the parameters hold the
same values, only in another memory order. The convolutions sum in another order too, so the
bits differ from NCHW's by float32 rounding. A run picks its layout by model and device alone,
so every host layout gives the same bits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rayfl.errors import ConfigError


class ConvWeights:
    """The channels-last buffers standing in for a model's 2-D convolution weights, and for
    their `.grad` where backward accumulates into a flat gradient (`bound_to`'s `grad`): a
    gradient whose layout differs from its parameter's costs autograd a warning and a slower
    accumulation. Without a model: none (a client that trains in NCHW)."""

    def __init__(self, model: nn.Module | None):
        def channels_last(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else torch.empty_like(t, memory_format=torch.channels_last)

        modules = model.modules() if model is not None else ()
        weights = {id(m.weight): m.weight for m in modules  # a weight two modules share: once
                   if isinstance(m, nn.Conv2d) and isinstance(m.weight, nn.Parameter) and m.weight.dim() == 4}
        self.held = [(p, p.data, channels_last(p.data), p.grad, channels_last(p.grad)) for p in weights.values()]

    def bind(self) -> None:
        for p, view, buf, _, grad_buf in self.held:
            buf.copy_(view)
            p.data = buf
            if grad_buf is not None:
                p.grad = grad_buf.zero_()

    def refresh(self) -> None:
        """Copy the vector's current values in (the caller moved it since the last step) and
        zero the gradient buffers."""
        for _, view, buf, _, grad_buf in self.held:
            buf.copy_(view)
            if grad_buf is not None:
                grad_buf.zero_()

    def collect_gradients(self) -> None:
        """Copy the gradients backward accumulated into the flat gradient's views."""
        for _, _, _, grad_view, grad_buf in self.held:
            if grad_buf is not None:
                grad_view.copy_(grad_buf)

    def write_back(self) -> None:
        """Copy the steps the buffers took back into the vector."""
        for _, view, buf, _, _ in self.held:
            view.copy_(buf)

    def unbind(self) -> None:
        for p, view, _, grad_view, _ in self.held:
            p.data = view
            p.grad = grad_view


@contextmanager
def channels_last_weights(model: nn.Module, enabled: bool, write_back: bool = True) -> Iterator[ConvWeights]:
    """`model`'s 2-D convolutions with channels-last weights while inside, when `enabled`;
    with `write_back`, the buffers' values go back into the weights the module had on entry
    (views of the client's vector under `bound_to`) on a normal exit."""
    weights = ConvWeights(model if enabled else None)
    weights.bind()
    try:
        yield weights
        if write_back:
            weights.write_back()
    finally:
        weights.unbind()


def has_convolutions(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def runs_channels_last(model: nn.Module, input_shape: tuple[int, ...], device: torch.device,
                       dtype: torch.dtype = torch.float32) -> str | None:
    """None when `model` runs a forward pass on a zero batch with channels-last convolution
    weights; else the error it raised. A model that flattens with `x.view(n, -1)` after a
    convolution fails here, because `.view` cannot reorder memory, where `.flatten` and
    `.reshape` work. Global RNG state is left as it was, so a dropout layer draws the same."""
    x = torch.zeros((2, *input_shape), dtype=dtype, device=device)
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices), channels_last_weights(model, True, write_back=False):
            model(x)
    except RuntimeError as e:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def channels_last_rule(mode: str, model: nn.Module, input_shape: tuple[int, ...], device: torch.device,
                       dtype: torch.dtype = torch.float32) -> bool:
    """Whether a host trains `model`'s convolutions channels-last under `engine.channels_last`
    `mode`: `auto` on a CPU for models with 2-D convolutions that run that way (oneDNN's
    channels-last kernels; on a GPU cuDNN's choice is left alone), `on` wherever the model has
    them (an error when the model cannot run channels-last), `off` never."""
    if mode == "off" or not has_convolutions(model):
        return False
    if mode == "auto" and device.type != "cpu":
        return False
    problem = runs_channels_last(model, input_shape, device, dtype)
    if problem is not None and mode == "on":
        raise ConfigError("engine.channels_last", f"the model does not run with channels-last convolution weights ({problem}); "
                                                  "set engine.channels_last=off or flatten with .flatten / .reshape")
    return problem is None
