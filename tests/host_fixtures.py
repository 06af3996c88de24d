"""In-process hosts over tiny random data: what the loop-versus-batched client tests build
(no Ray; a ClientHostImpl runs the client functions directly), and the check that two paths'
records agree."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rayfl.config import ModelConfig
from rayfl.engine.host import ClientHostImpl


def sized_host(sizes: Mapping[int, int], features: int | tuple[int, ...], classes: int, model: ModelConfig, seed: int,
               flops_per_sample: float, vectorize: str, device: str = "auto", tokens: bool = False,
               channels_last: str = "off", clients_per_chunk: int | str = "auto") -> ClientHostImpl:
    """A host of clients with `sizes[c]` rows each (0 allowed), Gaussian features and uniform
    labels from one fixed stream, so two hosts built alike hold the same data. `features` is
    a row's width or its shape (images: (C, H, W)); with `tokens` the rows are int64 token
    sequences over a vocabulary of `classes` instead of Gaussian floats. `channels_last` is
    `engine.channels_last`, `clients_per_chunk` `engine.clients_per_chunk`."""
    rng = np.random.default_rng(0)
    n = sum(sizes.values())
    shape = (features,) if isinstance(features, int) else tuple(features)
    x = rng.integers(0, classes, size=(n, *shape)).astype(np.int64) if tokens else \
        rng.normal(size=(n, *shape)).astype(np.float32)
    arrays = {"train_x": x, "train_y": rng.integers(0, classes, size=n).astype(np.int64)}
    bounds = np.cumsum([0, *sizes.values()])
    clients = {c: np.arange(bounds[i], bounds[i + 1]) for i, c in enumerate(sizes)}
    return ClientHostImpl(0, arrays, clients, None, model, shape, classes, seed,
                          flops_per_sample=flops_per_sample, vectorize=vectorize, device=device,
                          channels_last=channels_last, clients_per_chunk=clients_per_chunk)


def assert_records_match(loop: list[dict], vec: list[dict], wider: dict[str, dict] | None = None, **tol: float) -> None:
    """Work, steps and bytes identical; every output value equal to `tol` (default: bitwise),
    the values named in `wider` to their own tolerance."""
    assert len(loop) == len(vec)
    for a, b in zip(loop, vec, strict=True):
        for key in ("client", "num_samples", "forward_samples", "backward_samples", "local_steps", "truncated",
                    "bytes_up", "bytes_down", "state_changed"):
            assert a[key] == b[key], (key, a["client"])
        assert a["values"].keys() == b["values"].keys()
        for key, v in a["values"].items():
            key_tol = (wider or {}).get(key, tol)
            if key_tol:
                np.testing.assert_allclose(b["values"][key], v, **key_tol, err_msg=f"{key} of client {a['client']}")
            else:
                np.testing.assert_array_equal(b["values"][key], v, err_msg=f"{key} of client {a['client']}")
