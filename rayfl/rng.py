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


# SplitMix64's increment and finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom
# number generators"): output i of the stream keyed k is mix(k + (i + 1) * GAMMA).
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _MIX_1
    x = (x ^ (x >> np.uint64(27))) * _MIX_2
    return x ^ (x >> np.uint64(31))


def client_uniforms(seed: int, purpose: str, clients: np.ndarray | int) -> np.ndarray:
    """One uniform in (0, 1) per client id, from the counter-based stream (seed, purpose):
    client k's value is a function of (seed, purpose, k) alone, so a client's profile or size
    costs O(1) to make, for any subset of a population of any size, on any host. (A Generator
    per client costs ~40 us to seed; this is about 0.1 us a client, vectorised.)"""
    ids = np.atleast_1d(np.asarray(clients)).astype(np.uint64)
    with np.errstate(over="ignore"):
        bits = _mix64(np.uint64(derive_seed(seed, purpose)) + (ids + np.uint64(1)) * _GAMMA)
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def client_normals(seed: int, purpose: str, clients: np.ndarray | int) -> np.ndarray:
    """One standard normal per client id (Box-Muller on two counter-based uniforms)."""
    u1 = client_uniforms(seed, f"{purpose}.radius", clients)
    u2 = client_uniforms(seed, f"{purpose}.angle", clients)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
