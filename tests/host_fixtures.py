"""In-process hosts over tiny random data: what the loop-versus-batched client tests build
(no Ray; a ClientHostImpl runs the client functions directly)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rayfl.config import ModelConfig
from rayfl.engine.host import ClientHostImpl


def sized_host(sizes: Mapping[int, int], features: int, classes: int, model: ModelConfig, seed: int,
               flops_per_sample: float, vectorize: str, device: str = "auto") -> ClientHostImpl:
    """A host of clients with `sizes[c]` rows each (0 allowed), Gaussian features and uniform
    labels from one fixed stream, so two hosts built alike hold the same data."""
    rng = np.random.default_rng(0)
    n = sum(sizes.values())
    arrays = {"train_x": rng.normal(size=(n, features)).astype(np.float32),
              "train_y": rng.integers(0, classes, size=n).astype(np.int64)}
    bounds = np.cumsum([0, *sizes.values()])
    clients = {c: np.arange(bounds[i], bounds[i + 1]) for i, c in enumerate(sizes)}
    return ClientHostImpl(0, arrays, clients, None, model, (features,), classes, seed,
                          flops_per_sample=flops_per_sample, vectorize=vectorize, device=device)
