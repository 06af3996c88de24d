"""The one kernel of the exact sums (rayfl.engine.exact_sum): total += rint(float64(v) * s),
compiled by Numba into a single pass over v.

Why compiled: numpy spells it as four passes (widen, scale, round, add), each over a
model-sized float64 temporary that a large model's terms push out of the cache; one pass reads
v once. A host's pre-aggregated sum of a large model runs it every round (LEAF's FEMNIST CNN,
6.6M parameters: 82 ms a round in numpy's passes, 22 ms here, on a 2-core EPYC).

The arithmetic is IEEE's, as numpy's: the product rounded once to float64, rint rounding half
to even, then the add; no fast-math, so nothing is contracted or reordered and the bits equal
numpy's passes (tests/test_preaggregate.py compares them bit for bit, NaN signs included).
Compiled at import for its four signatures, cached on disk (`cache=True`: later processes load
it), single-threaded (a host has one core). Imported only when a sum first needs it."""

from __future__ import annotations

import numba
import numpy as np
from numba import types

# the terms: float32 or float64, writable or read-only (an object-store array)
SIGNATURES = [types.void(types.float64[::1], types.Array(dtype, 1, "C", readonly=readonly), types.float64)
              for dtype in (types.float32, types.float64) for readonly in (False, True)]


@numba.njit(SIGNATURES, cache=True, nogil=True, boundscheck=False)
def add_rounded(total: np.ndarray, value: np.ndarray, scale: float) -> None:  # pragma: no cover (compiled)
    """total[i] += rint(float64(value[i]) * scale) for every i (both flat and contiguous).
    A NaN already in the total stays as it is, as x86's add keeps its first operand's NaN:
    LLVM may swap an add's operands, which would change which NaN's sign survives."""
    for i in range(total.shape[0]):
        before = total[i]
        term = np.rint(np.float64(value[i]) * scale)
        total[i] = before if before != before else before + term
