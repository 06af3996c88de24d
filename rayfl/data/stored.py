"""A FederatedDataset as one `.npz` file: the row arrays, each client's index set (flattened,
with offsets) and a JSON header. The dataset cache (rayfl.data.cache) stores built datasets
this way, and a run that was handed a dataset object keeps a copy beside its results
(`dataset.npz`), so `rayfl resume` can continue it without the code that made it."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rayfl.data.federated import FederatedDataset

STORED_FILE = "dataset.npz"


def dataset_arrays(fd: FederatedDataset, **header: Any) -> dict[str, np.ndarray]:
    """The arrays of the file for `fd`, `header` (JSON-able) added to its own header."""
    meta = {**header, "name": fd.name, "num_classes": int(fd.num_classes), "input_shape": [int(d) for d in fd.input_shape],
            "excluded_targets": [int(t) for t in fd.excluded_targets]}
    arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
              "train_x": fd.train_x, "train_y": fd.train_y, "test_x": fd.test_x, "test_y": fd.test_y}
    arrays["client_train"], arrays["client_train_offsets"] = _flatten(fd.client_train)
    if fd.client_test is not None:
        arrays["client_test"], arrays["client_test_offsets"] = _flatten(fd.client_test)
    if fd.server_train is not None:
        arrays["server_train"] = fd.server_train
    return arrays


def dataset_from_arrays(arrays: Mapping[str, np.ndarray], mapped: Any = None) -> tuple[FederatedDataset, dict[str, Any]]:
    """(the dataset, its header) from a file's arrays; raises on anything missing or
    inconsistent. Row arrays stay as given (views of a mapped file, for the cache)."""
    meta = json.loads(np.asarray(arrays["meta"]).tobytes())
    fd = FederatedDataset(
        name=meta["name"],
        num_classes=int(meta["num_classes"]),
        input_shape=tuple(int(d) for d in meta["input_shape"]),
        train_x=arrays["train_x"],
        train_y=arrays["train_y"],
        test_x=arrays["test_x"],
        test_y=arrays["test_y"],
        client_train=_unflatten(arrays["client_train"], arrays["client_train_offsets"]),
        client_test=_unflatten(arrays["client_test"], arrays["client_test_offsets"]) if "client_test" in arrays else None,
        server_train=np.array(arrays["server_train"]) if "server_train" in arrays else None,
        mapped=mapped,
        excluded_targets=tuple(meta.get("excluded_targets", ())),
    )
    fd.check()
    return fd, meta


def dataset_bytes(fd: FederatedDataset) -> bytes:
    """The whole file, in memory (for a run directory that may be an object-store URI)."""
    buf = io.BytesIO()
    np.savez(buf, **dataset_arrays(fd))
    return buf.getvalue()


def dataset_from_bytes(data: bytes) -> FederatedDataset:
    with np.load(io.BytesIO(data), allow_pickle=False) as f:
        return dataset_from_arrays({k: f[k] for k in f.files})[0]


def _flatten(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in parts])
    flat = np.concatenate(parts).astype(np.int64, copy=False) if parts else np.empty(0, dtype=np.int64)
    return flat, offsets


def _unflatten(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(flat) or np.any(np.diff(offsets) < 0):
        raise ValueError("index offsets do not match the flattened indices")
    # Copies, so each client's index array owns its memory, like a built one.
    return [flat[a:b].copy() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]
