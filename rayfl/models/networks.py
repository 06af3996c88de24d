"""The networks clients train: `build_model` builds the one a `ModelConfig` names through the
model registry (rayfl.registry.MODELS), built-ins and users' alike, and the small built-in
networks with their config classes.

Every model returns logits and keeps its whole state in `parameters()` (no buffers), so a model
is fully described by one flat float32 vector (see `rayfl.models.params`). That is what lets a
host share one module between many clients and what makes `torch.func.functional_call` over a
flat vector exact; `build_model` refuses a model with buffers.

Initialisation: `build_model` uses the model's own (PyTorch's default) initialisation, which
draws from the global torch RNG, so `torch.manual_seed(s)` before `build_model` makes it
reproducible (this is what the engine does). `init_params(model, generator)` redraws the same
distributions from an explicit `torch.Generator` instead, for callers that must not touch global
RNG state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from rayfl.config import ConfigError, ModelConfig


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The network `cfg.name` names: its factory called with `cfg.factory_kwargs()`, then
    LoRA adapters around it when `cfg.adapter` asks for them and the factory does not build
    them itself.

    Args:
        cfg: the job's `model` section.
        input_shape: one sample's shape, without the batch dimension.
        num_classes: the number of scores the network gives (at least 2).

    Returns:
        A fresh network (its parameters from the factory's own initialisation).

    Raises:
        ConfigError: at `model.name`, when the factory fails or returns something other than
            a buffer-free `nn.Module`.
        ValueError: fewer than 2 classes, or an empty or non-positive `input_shape`."""
    from rayfl.registry import MODELS

    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"input_shape must be non-empty with positive sizes, got {input_shape}")
    factory = MODELS.get(cfg.name).load()
    try:
        model = factory(shape, num_classes, **cfg.factory_kwargs())
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError("model.name", f"building {cfg.name!r} for inputs {shape} and {num_classes} classes failed: "
                          f"{type(e).__name__}: {' '.join(str(e).split())}") from e
    if not isinstance(model, nn.Module):
        raise ConfigError("model.name", f"{cfg.name!r} returned a {type(model).__name__}, not a torch.nn.Module")
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise ConfigError(
            "model.name",
            f"{cfg.name!r} has buffers {buffers[:3]}: rayfl keeps a model's whole state in its parameters "
            "(one flat vector per client); use parameters, or norms without running statistics "
            "(BatchNorm(track_running_stats=False), GroupNorm, LayerNorm)",
        )
    if cfg.adapter == "lora" and not cfg.builds_adapters:
        model = lora_around(model, cfg.adapter_rank)
    return model


def lora_around(base: nn.Module, rank: int) -> nn.Module:
    """LoRA on a network's hidden Linear / Conv2d layers; the first and last stay plain (they
    are the `input` and `output` personalization schemes' layers) unless there is nothing else."""
    from rayfl.models.adapters import add_lora

    layers = [n for n, m in base.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    skip = (layers[0], layers[-1]) if len(layers) > 2 else ()
    return add_lora(base, rank, skip=skip)


# --------------------------------------------------------------------------- built-in networks


@dataclass
class LinearConfig(ModelConfig):
    """Multinomial logistic regression: one Linear layer on the flattened input. `bias: false`
    is ZO-HFL's linear model (d = 784 * 10 for MNIST)."""

    name: str = "linear"
    # Give the layer a bias; false is ZO-HFL's linear model (d = features x classes).
    bias: bool = True


def build_linear(input_shape: tuple[int, ...], num_classes: int, bias: bool = True) -> nn.Module:
    """Flatten, then one Linear layer to the logits."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes, bias=bias))


@dataclass
class MLPConfig(ModelConfig):
    """A fully connected network: Linear + activation for each width in `hidden`, then a
    Linear to the logits. `activation: softplus` is (1/beta) ln(1 + e^{beta t}) with beta =
    `softplus_beta` (FedRZO App. D.1's smoothed network for first-order baselines);
    `eval_activation: relu` evaluates it with the true ReLU (in eval mode) while clients train
    the softplus."""

    name: str = "mlp"
    # The hidden layers' widths, in order (each > 0); relu1 uses the first only.
    hidden: list[int] = field(default_factory=lambda: [200, 200])
    # Give every Linear layer a bias.
    bias: bool = True
    # The hidden activation: relu, or softplus ((1/beta) ln(1 + e^(beta t)): FedRZO's smoothed
    # network for first-order baselines).
    activation: Literal["relu", "softplus"] = "relu"
    # beta of the softplus activation (> 0); larger is closer to ReLU.
    softplus_beta: float = 10.0
    # The activation at evaluation: same as training, or relu (train the softplus, evaluate the true
    # ReLU).
    eval_activation: Literal["same", "relu"] = "same"

    def validate(self) -> None:
        super().validate()
        if len(self.hidden) < 1:
            raise ConfigError("model.hidden", f"{self.name} needs a hidden width, e.g. [200, 200]")
        for i, h in enumerate(self.hidden):
            if h <= 0:
                raise ConfigError(f"model.hidden[{i}]", f"must be > 0, got {h}")
        if not self.softplus_beta > 0:
            raise ConfigError("model.softplus_beta", f"must be > 0, got {self.softplus_beta}")


def build_mlp(
    input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (200, 200), bias: bool = True,
    activation: str = "relu", softplus_beta: float = 10.0, eval_activation: str = "same",
) -> nn.Module:
    """`mlp` on the flattened input with the configured hidden activation."""
    act = hidden_activation(activation, softplus_beta, eval_activation)
    return mlp(math.prod(input_shape), list(hidden), num_classes, bias, activation=act)


@dataclass
class ReLU1Config(MLPConfig):
    """FedRZO's one-hidden-layer ReLU network: an `mlp` with the first width of `hidden` only."""

    name: str = "relu1"


def build_relu1(input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (200,), **kwargs) -> nn.Module:
    """`build_mlp` with one hidden layer of width hidden[0]."""
    return build_mlp(input_shape, num_classes, list(hidden)[:1], **kwargs)


@dataclass
class Conv4Config(ModelConfig):
    """MAML's Conv-4 (Finn et al., ICML 2017): four 3x3 conv / BatchNorm / ReLU / max-pool
    blocks of `conv_channels` channels, then a Linear (see `Conv4`)."""

    name: str = "conv4"
    # Channels of each of the four 3x3 conv blocks (> 0).
    conv_channels: int = 32
    # Give the conv and output layers a bias.
    bias: bool = True

    def validate(self) -> None:
        super().validate()
        if self.conv_channels <= 0:
            raise ConfigError("model.conv_channels", f"must be > 0, got {self.conv_channels}")


def build_conv4(input_shape: tuple[int, ...], num_classes: int, conv_channels: int = 32, bias: bool = True) -> nn.Module:
    return Conv4(input_shape, num_classes, conv_channels, bias)


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


def hidden_activation(activation: str, softplus_beta: float, eval_activation: str) -> Callable[[], nn.Module]:
    """The factory of mlp / relu1's hidden nonlinearity."""
    if activation == "softplus":
        return lambda: SmoothedReLU(softplus_beta, eval_activation == "relu")
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
        elif isinstance(module, nn.LSTM):  # every weight and bias ~ U(-1/sqrt(hidden), 1/sqrt(hidden))
            for param in module.parameters():
                _uniform_(param, 1.0 / math.sqrt(module.hidden_size), generator)
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
