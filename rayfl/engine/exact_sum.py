"""Exact, order-independent weighted sums of model-sized vectors, for host pre-aggregation.

With `engine.preaggregate` a host keeps its clients' large outputs (FedAvg's deltas) and, once
the driver has settled the round, returns one partial sum instead of one vector per client: the
driver gathers O(hosts) vectors, not O(clients). Floating-point addition is not associative, so
partial sums grouped by host would make the result depend on how many hosts there are. Here
every term is rounded once onto a common grid, rint(w * v * 2**E), an integer held in a float64,
and every partial sum stays below 2**53: float64 adds such integers exactly, so the total is the
same bits whatever the grouping or order.

E is chosen by the driver from every term's bound (sum over terms of |w| * max|v|) so that the
total stays below 2**52; the grid is then 2**-52 of that bound, float64's own resolution for a sum
of that size. The driver and the hosts run the same arithmetic, so pre-aggregation on and off
give identical sums."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

PRESUM = "presum"  # the host record key carrying a call's partial sums computed in advance
HEADROOM_BITS = 52  # |total| < 2**52 (+ half a unit per term): every partial sum exact in float64
EXPONENT_LIMIT = 1000  # keep 2**E a normal float64
FUSED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # what add_rounded is compiled for
# Terms from this many entries up take the compiled pass. Below it numpy's four passes run in
# the cache (50 terms of 159,010 entries: 4.6 ms against 1.8) and a run of small models does
# not pay Numba's import (0.4 s a process, on a host's first sum).
FUSED_MIN_ENTRIES = 1 << 20


@dataclass(frozen=True)
class KeptValue:
    """Stands in a client's answer for an array its host kept (pre-aggregation): what the
    driver needs to settle the task (finite or not) and to size the fixed-point grid."""

    shape: tuple[int, ...]
    max_abs: float
    finite: bool

    @classmethod
    def of(cls, value: np.ndarray) -> KeptValue:
        """NaN or Inf exactly when some entry is (`max_abs` propagates them)."""
        peak = max_abs(value)
        finite = math.isfinite(peak)
        return cls(tuple(value.shape), peak if finite else 0.0, finite)


def max_abs(value: np.ndarray | KeptValue) -> float:
    """max |v| as max(max v, -min v): two passes without a temporary (np.abs made a
    model-sized one per client)."""
    if isinstance(value, KeptValue):
        return value.max_abs
    return max(float(value.max()), -float(value.min())) if value.size else 0.0


def common_exponent(weights: Sequence[float], max_abs_values: Sequence[float]) -> int:
    """The grid exponent E for these terms: sum |w| * max|v| * 2**E < 2**HEADROOM_BITS."""
    bound = math.fsum(abs(float(w)) * float(m) for w, m in zip(weights, max_abs_values, strict=True))
    if not math.isfinite(bound):
        raise FloatingPointError("weighted sum of non-finite or overflowing values")
    if bound == 0.0:
        return 0
    _, e = math.frexp(bound)  # bound < 2**e
    return max(-EXPONENT_LIMIT, min(EXPONENT_LIMIT, HEADROOM_BITS - e))


def fixed_point_sum(terms: Iterable[tuple[np.ndarray, float]], exponent: int, shape: tuple[int, ...]) -> np.ndarray:
    """sum of rint(float64(v) * w * 2**E) over (v, w): integers below 2**53 in a float64 array,
    added exactly, so any grouping of the terms into partial sums gives the same total."""
    total = FixedPointSum(exponent, shape)
    for value, weight in terms:
        total.add(value, weight)
    return total.total


class FixedPointSum:
    """`fixed_point_sum` a term at a time: a host adds each kept output as it keeps it, while
    the array is still in the cache.

    A large contiguous float32 or float64 term goes through `add_rounded`
    (rayfl.engine.rounded_sum): one pass that reads v once, where numpy's widen, scale, round
    and add take four over model-sized temporaries (10 terms of 6.6M entries, 2-core EPYC: 82 ms
    in four passes, 22 in one). Any other term (small, float16, strided, the overflowing-scale
    branch) takes numpy's passes; both give the same bits."""

    def __init__(self, exponent: int, shape: tuple[int, ...]):
        self.exponent, self.shape = exponent, tuple(shape)
        self.total = np.zeros(self.shape, dtype=np.float64)
        self._term: np.ndarray | None = None  # numpy's temporary, made on first need

    def add(self, value: np.ndarray, weight: float) -> None:
        """total += rint(float64(value) * weight * 2**E)."""
        try:
            scale = math.ldexp(float(weight), self.exponent)  # exact: a power-of-two scaling
        except OverflowError:
            scale = math.inf
        flat = fused_operand(value, self.shape) if math.isfinite(scale) else None
        kernel = fused_kernel() if flat is not None else None
        if kernel is not None:
            kernel(self.total.reshape(-1), flat, scale)
            return
        if self._term is None:
            self._term = np.empty(self.shape, dtype=np.float64)
        term = self._term
        if math.isfinite(scale):  # the ufunc's own cast, unbuffered: exact for float32
            np.copyto(term, value)
            np.multiply(term, scale, out=term)
        else:  # w * 2**E overflows (a tiny bound): scale the product instead
            np.multiply(value, float(weight), out=term, dtype=np.float64)
            np.ldexp(term, self.exponent, out=term)
        np.rint(term, out=term)
        self.total += term


@functools.cache
def fused_kernel() -> Callable[[np.ndarray, np.ndarray, float], None] | None:
    """`add_rounded`, imported on first use (Numba takes 0.4 s to import); None, with a
    warning, where Numba cannot load or compile it here: numpy's passes give the same bits."""
    try:
        from rayfl.engine.rounded_sum import add_rounded
    except Exception as err:  # e.g. no writable cache directory, an unsupported platform
        warnings.warn(f"exact sums take numpy's slower passes: Numba's kernel did not load ({err})", stacklevel=2)
        return None
    return add_rounded


def fused_operand(value: object, shape: tuple[int, ...]) -> np.ndarray | None:
    """`value` as the flat, contiguous float32 / float64 vector `add_rounded` takes, or None
    where numpy's passes take it (small, another dtype or shape, a strided view)."""
    if (not isinstance(value, np.ndarray) or value.shape != shape or value.dtype not in FUSED_DTYPES
            or value.size < FUSED_MIN_ENTRIES):
        return None
    return value.reshape(-1) if value.flags.c_contiguous else None


def to_float(total: np.ndarray, exponent: int) -> np.ndarray:
    """The value of a grid total."""
    return np.ldexp(total, -exponent)
