"""The networks clients train, built from a `ModelConfig`.

Every model returns logits and keeps its whole state in `parameters()` (no buffers), so a model
is fully described by one flat float32 vector (see `rayfl.models.params`). That is what lets a
host share one module between many clients and what makes `torch.func.functional_call` over a
flat vector exact.

Initialisation: `build_model` uses PyTorch's default initialisation, which draws from the
global torch RNG, so `torch.manual_seed(s)` before `build_model` makes it reproducible (this is
what the engine does). `init_params(model, generator)` redraws the same distributions from an
explicit `torch.Generator` instead, for callers that must not touch global RNG state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from rayfl.config import ModelConfig


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The network named by `cfg.name` for inputs of shape `input_shape` (no batch dim).

    `cfg.bias` switches the bias of every Linear and Conv2d layer (ZO-HFL's linear model has
    none: d = 784 * 10 for MNIST). BatchNorm's affine scale and shift are always kept."""
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"input_shape must be non-empty with positive sizes, got {input_shape}")
    in_features = math.prod(shape)
    if cfg.name in ("resnet18", "transformer") or getattr(cfg, "adapter", "none") != "none":
        from rayfl.models.adapted import build_adapted  # FFGG's networks and adapters

        return build_adapted(cfg, shape, num_classes)
    if cfg.name == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes, bias=cfg.bias))
    if cfg.name == "mlp":
        return mlp(in_features, list(cfg.hidden), num_classes, cfg.bias, activation=hidden_activation(cfg))
    if cfg.name == "relu1":
        if not cfg.hidden:
            raise ValueError("relu1 needs one hidden width in model.hidden")
        return mlp(in_features, [cfg.hidden[0]], num_classes, cfg.bias, activation=hidden_activation(cfg))
    if cfg.name == "conv4":
        return Conv4(shape, num_classes, cfg.conv_channels, cfg.bias)
    raise ValueError(f"unknown model {cfg.name!r}; choose one of linear, mlp, relu1, conv4")


def mlp(
    in_features: int, hidden: Sequence[int], num_classes: int, bias: bool = True,
    activation: Callable[[], nn.Module] = nn.ReLU,
) -> nn.Sequential:
    """Flatten, then Linear + activation (ReLU) for each hidden width, then a Linear to the logits."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h, bias=bias), activation()]
        width = h
    layers.append(nn.Linear(width, num_classes, bias=bias))
    return nn.Sequential(*layers)


class SmoothedReLU(nn.Module):
    """Softplus (1/beta) ln(1 + e^{beta t}) while training; in eval mode the true ReLU when
    `relu_in_eval` (FedRZO App. D.1: first-order baselines train the smoothed network and are
    compared on the ReLU loss). No parameters, so the flat vector is the ReLU network's."""

    def __init__(self, beta: float, relu_in_eval: bool):
        super().__init__()
        self.beta = float(beta)
        self.relu_in_eval = relu_in_eval

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.relu_in_eval and not self.training:
            return torch.relu(x)
        return torch.nn.functional.softplus(x, beta=self.beta)


def hidden_activation(cfg: ModelConfig) -> Callable[[], nn.Module]:
    """The factory of mlp / relu1's hidden nonlinearity named by `cfg.activation`."""
    if cfg.activation == "softplus":
        return lambda: SmoothedReLU(cfg.softplus_beta, cfg.eval_activation == "relu")
    return nn.ReLU


class Conv4(nn.Module):
    """The MAML Conv-4 (Finn et al., ICML 2017, Sec. 5.2): four blocks of 3x3 conv (padding 1)
    -> BatchNorm -> ReLU -> 2x2 max-pool, then a Linear to the logits.

    BatchNorm uses batch statistics in train and eval mode alike (`track_running_stats=False`,
    as MAML does), so the module has no buffers and its state is its parameters.

    Small inputs: a block skips its max-pool when pooling would leave the *next* block's conv
    below 2x2, and the last block pools only while its input is at least 2x2. For 28x28 this is
    the usual 28 -> 14 -> 7 -> 3 -> 1; for 32x32, 32 -> 16 -> 8 -> 4 -> 2; for 8x8 (digits)
    8 -> 4 -> 2 -> 2 -> 1. The reason: BatchNorm with batch statistics needs more than one value
    per channel, so keeping every conv at >= 2x2 lets a batch of a single sample through.

    Inputs may arrive as (N, C, H, W), or flattened / without a channel axis: they are reshaped
    to the image shape given at construction. A 2-D `input_shape` (H, W) means one channel.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: int = 32, bias: bool = True):
        super().__init__()
        if len(input_shape) == 2:
            input_shape = (1, *input_shape)
        if len(input_shape) != 3:
            raise ValueError(f"conv4 needs an image input shape (C, H, W) or (H, W), got {input_shape}")
        self.image_shape = tuple(input_shape)
        c, h, w = self.image_shape
        blocks: list[nn.Module] = []
        for i in range(4):
            last = i == 3
            layers: list[nn.Module] = [
                nn.Conv2d(c if i == 0 else channels, channels, kernel_size=3, padding=1, bias=bias),
                nn.BatchNorm2d(channels, track_running_stats=False),
                nn.ReLU(),
            ]
            if _should_pool(h, w, last):
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
            blocks.append(nn.Sequential(*layers))
        self.features = nn.Sequential(*blocks)
        self.feature_shape = (channels, h, w)
        self.classifier = nn.Linear(channels * h * w, num_classes, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.image_shape)
        return self.classifier(self.features(x).flatten(1))


def _should_pool(h: int, w: int, last: bool) -> bool:
    """Pool unless it would shrink the next conv below 2x2 (or, in the last block, below 1x1)."""
    floor = 1 if last else 2
    return min(h, w) // 2 >= floor


@torch.no_grad()
def init_params(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Redraw every parameter of a `build_model` network from `generator`, in place.

    The distributions match PyTorch's defaults for these layers (Linear / Conv2d weight and
    bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)); BatchNorm scale 1, shift 0), so a model built
    under `torch.manual_seed` and one passed through `init_params` are statistically alike;
    only the stream they draw from differs. Draws happen on CPU so the values do not depend on
    the model's device. Returns the model."""
    for module in model.modules():
        if hasattr(module, "redraw_"):  # adapters, LoRA layers (rayfl.models.adapters)
            module.redraw_(generator)
        elif isinstance(module, (nn.GroupNorm, nn.LayerNorm)):  # ResNet-18-GN, the transformer
            if module.weight is not None:
                module.weight.fill_(1.0)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.copy_(torch.empty(module.weight.shape).normal_(generator=generator))
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            fan_in = module.weight[0].numel()
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            _uniform_(module.weight, bound, generator)
            if module.bias is not None:
                _uniform_(module.bias, bound, generator)
        elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            if module.weight is not None:
                module.weight.fill_(1.0)
            if module.bias is not None:
                module.bias.zero_()
        elif not list(module.children()) and list(module.parameters(recurse=False)):
            raise TypeError(f"init_params does not know how to initialise {type(module).__name__}")
    return model


def _uniform_(param: torch.Tensor, bound: float, generator: torch.Generator) -> None:
    values = torch.empty(param.shape, dtype=torch.float32).uniform_(-bound, bound, generator=generator)
    param.copy_(values)
