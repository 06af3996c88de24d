"""Byte accounting for what actually travels: the system model charges bytes measured from the
payload, so an algorithm that uploads two scalars and a seed pays for that, not for a model."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def payload_nbytes(value: Any) -> int:
    """Wire size of a payload: array bytes, 8 bytes per scalar, UTF-8 length of strings."""
    if value is None:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (bool, int, float, np.generic)):
        return 8
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, Mapping):
        return sum(payload_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_nbytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(payload_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    raise TypeError(f"cannot measure a payload of type {type(value).__name__}")


def to_numpy_tree(value: Any) -> Any:
    """Tensors become numpy arrays (on CPU) so results cross Ray cheaply and without torch."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, Mapping):
        return {k: to_numpy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_numpy_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_numpy_tree(v) for v in value)
    return value


def broadcast_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A broadcast array as a tensor the caller only reads: on a CPU the array's own memory (in
    a host, the object store's pages, which every host on the machine maps: a large model is in
    the shared cache once, not once per host), elsewhere a copy on `device`."""
    if device.type != "cpu" or not isinstance(value, np.ndarray):
        return torch.tensor(value, device=device)
    with warnings.catch_warnings():  # read-only, as the object store hands it out: never written
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(value)
