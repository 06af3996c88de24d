"""Adapters: parameters added to a network so that a client can personalize a small part of it
(FFGG, arXiv 2305.18285, Table 1 "Adapter"). The paper says only "a personalized low-rank
adapter" (Sec. 3.3), with no rank, placement or initialisation.

Two kinds, both starting as the identity edit (the adapted network computes exactly what the
base network computes until the adapter is trained), so adapters can be inserted after
non-personalized pretraining without losing it:

- residual adapters (Pillutla et al., ICML 2022): `x + up(act(down(norm(x))))` after a layer;
  the last projection starts at zero. `ResidualAdapter2d` is the 1x1-conv one of ResNets
  (GroupNorm, then one 1x1 conv), `BottleneckAdapter` the d -> h -> d one of transformers.
- LoRA (Hu et al., ICLR 2022): a weight W becomes W + (alpha / r) B A with A (r x fan_in)
  random and B (fan_out x r) zero. `LoRALinear` / `LoRAConv2d` subclass the torch layers, so
  the base parameters keep their names (`...weight`, `...bias`) and a base model's vector maps
  onto the adapted one by name; the factors are `...lora_a` and `...lora_b`.

Every adapter parameter's name contains `adapter` or `lora_`, which is what the `adapter`
personalization scheme selects (rayfl.models.personal). No buffers anywhere."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ADAPTER_MARKERS = ("adapter", "lora_")


def is_adapter_param(name: str) -> bool:
    """Whether a parameter name belongs to an adapter (a module named *adapter* or a LoRA factor)."""
    return any(marker in part for part in name.split(".") for marker in ADAPTER_MARKERS)


class ZeroConv2d(nn.Conv2d):
    """A conv whose initialisation is zero (an adapter's last projection)."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @torch.no_grad()
    def redraw_(self, generator: torch.Generator) -> None:
        self.reset_parameters()


class ZeroLinear(nn.Linear):
    """A Linear whose initialisation is zero (an adapter's up-projection)."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @torch.no_grad()
    def redraw_(self, generator: torch.Generator) -> None:
        self.reset_parameters()


class ResidualAdapter2d(nn.Module):
    """x + conv1x1(GroupNorm(x)), the conv starting at zero (an exact identity at init)."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(group_count(groups, channels), channels)
        self.conv = ZeroConv2d(channels, channels, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(self.norm(x))


class BottleneckAdapter(nn.Module):
    """x + up(relu(down(x))) with a `hidden`-wide bottleneck; `up` starts at zero."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.down = nn.Linear(dim, hidden)
        self.up = ZeroLinear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(torch.relu(self.down(x)))


class LoRALinear(nn.Linear):
    """A Linear whose weight is W + (alpha / rank) B A; B starts at zero."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True, alpha: float | None = None):
        super().__init__(in_features, out_features, bias=bias)
        self.rank = rank
        self.scale = (alpha if alpha is not None else rank) / rank
        self.lora_a = nn.Parameter(torch.empty(rank, in_features))
        self.lora_b = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight + self.scale * (self.lora_b @ self.lora_a), self.bias)

    @torch.no_grad()
    def redraw_(self, generator: torch.Generator) -> None:
        redraw_lora(self, generator)


class LoRAConv2d(nn.Conv2d):
    """A Conv2d whose kernel is W + (alpha / rank) reshape(B A), A: rank x (C_in k k / groups),
    B: C_out x rank; B starts at zero."""

    def __init__(self, conv: nn.Conv2d, rank: int, alpha: float | None = None):
        super().__init__(
            conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
            dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None, padding_mode=conv.padding_mode,
        )
        self.rank = rank
        self.scale = (alpha if alpha is not None else rank) / rank
        fan_in = self.weight[0].numel()
        self.lora_a = nn.Parameter(torch.empty(rank, fan_in))
        self.lora_b = nn.Parameter(torch.zeros(self.out_channels, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        delta = (self.lora_b @ self.lora_a).reshape(self.weight.shape)
        return self._conv_forward(x, self.weight + self.scale * delta, self.bias)

    @torch.no_grad()
    def redraw_(self, generator: torch.Generator) -> None:
        redraw_lora(self, generator)


@torch.no_grad()
def redraw_lora(layer: LoRALinear | LoRAConv2d, generator: torch.Generator) -> None:
    """PyTorch's default init of the base layer and of A (both U(+-1/sqrt(fan_in))), B = 0,
    drawn on CPU from `generator` (for rayfl.models.networks.init_params)."""
    bound = 1.0 / math.sqrt(layer.weight[0].numel())
    for p, b in ((layer.weight, bound), (layer.bias, bound), (layer.lora_a, 1.0 / math.sqrt(layer.lora_a.shape[1]))):
        if p is not None:
            p.copy_(torch.empty(p.shape).uniform_(-b, b, generator=generator))
    layer.lora_b.zero_()


def add_lora(model: nn.Module, rank: int, skip: tuple[str, ...] = ()) -> nn.Module:
    """Replace every Linear / Conv2d (except the modules named in `skip`) with its LoRA version,
    keeping the base weights; returns the model (changed in place)."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if full in skip or isinstance(child, (LoRALinear, LoRAConv2d)):
                continue
            if isinstance(child, nn.Linear):
                new: nn.Module = LoRALinear(child.in_features, child.out_features, rank, bias=child.bias is not None)
            elif isinstance(child, nn.Conv2d):
                new = LoRAConv2d(child, rank)
            else:
                continue
            with torch.no_grad():
                new.weight.copy_(child.weight)
                if child.bias is not None:
                    new.bias.copy_(child.bias)
            setattr(module, child_name, new)
    return model


def group_count(groups: int, channels: int) -> int:
    """The largest divisor of `channels` not above `groups` (GroupNorm needs a divisor)."""
    g = max(1, min(groups, channels))
    while channels % g:
        g -= 1
    return g
