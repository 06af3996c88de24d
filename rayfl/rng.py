"""Named, reproducible random streams.

Every random draw in rayfl comes from a generator seeded by `derive_seed(seed, purpose, round,
client)`. Streams for different purposes never share state, so adding a draw in one place (or
running clients on a different number of hosts, in another order) leaves every other stream
unchanged. The hash is blake2b, never Python's `hash()`, which is salted per process.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

_MASK_63 = (1 << 63) - 1


def derive_seed(seed: int, purpose: str, round: int = -1, client: int = -1) -> int:
    """A 63-bit seed for one (seed, purpose, round, client) stream, stable everywhere."""
    # Fields are joined with a separator that cannot appear in the decimal integers, so
    # ("a", 1, 23) and ("a", 12, 3) hash differently.
    key = f"{int(seed)}\x1f{purpose}\x1f{int(round)}\x1f{int(client)}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK_63


def numpy_rng(seed: int, purpose: str, round: int = -1, client: int = -1) -> np.random.Generator:
    """A numpy Generator for one named stream."""
    return np.random.default_rng(derive_seed(seed, purpose, round, client))


def torch_generator(seed: int, purpose: str, round: int = -1, client: int = -1) -> torch.Generator:
    """A CPU torch.Generator for one named stream (torch is imported only when asked for)."""
    import torch

    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, purpose, round, client))
    return gen
