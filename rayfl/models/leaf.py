"""The networks of LEAF's benchmarks (Caldas et al., 2018), the FL literature's most reused
workloads: the FEMNIST CNN and the Shakespeare character LSTM."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from rayfl.config import ConfigError, ModelConfig


@dataclass
class FemnistCNNConfig(ModelConfig):
    """LEAF's FEMNIST CNN: two 5x5 'same' convolutions of `channels` (32, 64), each followed
    by ReLU and a 2x2 max-pool, a dense layer of `dense` (2048) units and the class logits."""

    name: str = "femnist_cnn"
    # The two 5x5 convolutions' channels (two counts > 0).
    channels: list[int] = field(default_factory=lambda: [32, 64])
    # Units of the dense layer before the logits (> 0).
    dense: int = 2048

    def validate(self) -> None:
        super().validate()
        if len(self.channels) != 2 or min(self.channels) <= 0:
            raise ConfigError("model.channels", f"must be two positive channel counts, got {list(self.channels)}")
        if self.dense <= 0:
            raise ConfigError("model.dense", f"must be > 0, got {self.dense}")


class FemnistCNN(nn.Module):
    """conv5x5(c1) -> ReLU -> pool2 -> conv5x5(c2) -> ReLU -> pool2 -> dense -> ReLU -> logits."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: tuple[int, int], dense: int):
        super().__init__()
        if len(input_shape) == 1:  # flat 784-pixel rows: square grayscale images
            side = math.isqrt(input_shape[0])
            if side * side != input_shape[0]:
                raise ValueError(f"flat inputs of {input_shape[0]} values are not a square image")
            input_shape = (1, side, side)
        if len(input_shape) != 3:
            raise ValueError(f"the FEMNIST CNN takes images [C, H, W], got inputs {input_shape}")
        self.image_shape = tuple(input_shape)
        c, h, w = input_shape
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.dense = nn.Linear(c2 * (h // 4) * (w // 4), dense)
        self.out = nn.Linear(dense, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x.reshape(x.shape[0], *self.image_shape))
        return self.out(torch.relu(self.dense(torch.flatten(x, 1))))


def build_femnist_cnn(input_shape: tuple[int, ...], num_classes: int, channels: Sequence[int] = (32, 64),
                      dense: int = 2048) -> nn.Module:
    return FemnistCNN(input_shape, num_classes, tuple(channels), dense)


@dataclass
class CharLSTMConfig(ModelConfig):
    """LEAF's Shakespeare model: characters embedded in `embedding` (8) dimensions, a
    `layers`-layer (2) LSTM of `hidden` (256) units, the next character's logits from the
    last position. The vocabulary is the dataset's class count."""

    name: str = "char_lstm"
    # Dimensions of each character's embedding (> 0).
    embedding: int = 8
    # Units of each LSTM layer (> 0).
    hidden: int = 256
    # Stacked LSTM layers (> 0).
    layers: int = 2

    def validate(self) -> None:
        super().validate()
        for key in ("embedding", "hidden", "layers"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model.{key}", f"must be > 0, got {getattr(self, key)}")


class CharLSTM(nn.Module):
    """Embedding -> LSTM -> Linear on the last position: next-character prediction."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, embedding: int, hidden: int, layers: int):
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(f"the character LSTM takes token sequences [T], got inputs {input_shape}")
        self.embed = nn.Embedding(num_classes, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x.long()))
        return self.out(h[:, -1])


def build_char_lstm(input_shape: tuple[int, ...], num_classes: int, embedding: int = 8, hidden: int = 256,
                    layers: int = 2) -> nn.Module:
    return CharLSTM(input_shape, num_classes, embedding, hidden, layers)
