"""ResNet-18 with GroupNorm, the network of FFGG's EMNIST and GLDv2 experiments (arXiv
2305.18285, App. E; Pillutla et al. 2022's `resnet_gn`).

GroupNorm instead of BatchNorm keeps the model's whole state in its parameters (no running
statistics: the no-buffers rule of rayfl.models.networks) and does not mix samples of a batch.
Small images (EMNIST's 28x28, under 64 pixels a side) get the paper's variant: a 3x3 first
conv with stride 1 and no first max-pool; larger ones (GLDv2's 224x224) the ImageNet stem (7x7
stride 2, then a 3x3 max-pool). `width` scales every stage (64 is ResNet-18; smaller widths
keep the same topology for CPU runs).

Inputs may be uint8 images (GLDv2 is kept as bytes to fit in memory: scaled to [0, 1] here),
floats, or flattened / channel-less arrays reshaped to the image shape given at construction.

`adapter`: `residual` puts a `ResidualAdapter2d` after each conv of every residual block
(Pillutla et al.); `lora` turns every conv inside the residual blocks into a `LoRAConv2d` (the
stem conv and the classifier stay plain: they are the `input` and `output` schemes' layers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from rayfl.config import ConfigError, ModelConfig
from rayfl.models.adapters import ResidualAdapter2d, add_lora, group_count

SMALL_IMAGE = 64


class BasicBlock(nn.Module):
    """conv3x3 -> [adapter] -> GN -> ReLU -> conv3x3 -> [adapter] -> GN, plus the shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int, adapter: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.adapter1 = ResidualAdapter2d(cout, groups) if adapter else nn.Identity()
        self.norm1 = nn.GroupNorm(group_count(groups, cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.adapter2 = ResidualAdapter2d(cout, groups) if adapter else nn.Identity()
        self.norm2 = nn.GroupNorm(group_count(groups, cout), cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(group_count(groups, cout), cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.adapter1(self.conv1(x))))
        out = self.norm2(self.adapter2(self.conv2(out)))
        return torch.relu(out + self.shortcut(x))


class ResNet18GN(nn.Module):
    """ResNet-18 (He et al. 2016) with GroupNorm; see the module docstring."""

    # The stem and the classifier: FFGG's input and prediction layers (App. E.2 names no parameters).
    personal_groups = {"input": ("conv1.", "norm1."), "output": ("fc.",)}

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        width: int = 64,
        groups: int = 2,
        adapter: str = "none",
        rank: int = 16,
    ):
        super().__init__()
        if len(input_shape) == 2:
            input_shape = (1, *input_shape)
        if len(input_shape) != 3:
            raise ValueError(f"resnet18 needs an image input shape (C, H, W) or (H, W), got {input_shape}")
        self.image_shape = tuple(int(s) for s in input_shape)
        c, h, _ = self.image_shape
        small = h < SMALL_IMAGE
        if small:
            self.conv1 = nn.Conv2d(c, width, 3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(c, width, 7, stride=2, padding=3, bias=False)
        self.norm1 = nn.GroupNorm(group_count(groups, width), width)
        self.pool: nn.Module = nn.Identity() if small else nn.MaxPool2d(3, stride=2, padding=1)
        residual = adapter == "residual"
        stages, cin = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride, groups, residual), BasicBlock(cout, cout, 1, groups, residual)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, num_classes)
        if adapter == "lora":
            for stage in stages:
                add_lora(stage, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = x.float() / 255.0
        x = x.reshape(x.shape[0], *self.image_shape)
        x = self.pool(torch.relu(self.norm1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(x.mean(dim=(2, 3)), 1))


@dataclass
class ResNet18Config(ModelConfig):
    """ResNet-18 with GroupNorm (FFGG App. E): `width` is the first stage's channels (64 is
    ResNet-18; smaller widths keep the topology for CPU runs), `norm_groups` GroupNorm's groups.
    Builds its own adapters (`adapter: residual` or `lora` inside the residual blocks)."""

    name: str = "resnet18"
    # The first stage's channels, doubled at each of the four stages (> 0; 64 is ResNet-18, smaller
    # keeps the topology for CPU runs).
    width: int = 64
    # GroupNorm's groups in every normalisation layer (> 0).
    norm_groups: int = 2
    builds_adapters: ClassVar[bool] = True

    def validate(self) -> None:
        super().validate()
        for key in ("width", "norm_groups"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model.{key}", f"must be > 0, got {getattr(self, key)}")


def build_resnet18(
    input_shape: tuple[int, ...], num_classes: int, width: int = 64, norm_groups: int = 2,
    adapter: str = "none", adapter_rank: int = 16,
) -> nn.Module:
    return ResNet18GN(input_shape, num_classes, width, norm_groups, adapter, adapter_rank)
