"""What a host keeps of a pre-aggregated call (`engine.preaggregate`): the outputs the server only sums.

A call of at most `engine.clients_per_chunk` clients on a host keeps each such output until the
driver asks for its weighted sum (`ClientHostImpl.reduce`), plus, where the driver expects the
round's weights, their partial sum on the last sum's grid, sent with the call's answer. A larger
call keeps no output: each is added, as it is made, to partial sums on the grids the driver is
likely to ask for (the last sum's exponent and its two neighbours; on a first sum, those the
first output suggests) and dropped, so a host's memory grows with the model, not with its
clients; `reduce` answers with the one asked for. A sum on another grid
or with other weights (a client dropped, a grid two steps away) re-runs the call's tasks on the
host: until the driver settles them their inputs, committed states and seeds are unchanged, so
they give the same outputs and the sum the same bits (rayfl.engine.exact_sum)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.engine.exact_sum import EXPONENT_LIMIT, FixedPointSum, KeptValue, common_exponent

NEIGHBOURS = 1  # grids either side of the expected one a large call sums on
Partial = tuple[int, dict[int, float], np.ndarray]  # (grid exponent, task -> weight, grid total)


@dataclass(frozen=True)
class Expected:
    """The driver's expectation for one summed key: the last sum's grid exponent (None before
    the first sum), this host's tasks' weights if every client is accepted, and the sum of
    |weight| over the whole call (every host's tasks), which sizes a first grid."""

    exponent: int | None
    weights: Mapping[int, float]
    total_weight: float


class HostPartials:
    """One call's kept outputs, or their partial sums, as `take` receives its records."""

    def __init__(self, keep: tuple[str, ...], task_ids: Mapping[int, int], expected: Mapping[str, Expected] | None,
                 hold: bool):
        self.keep, self.task_ids, self.hold = keep, task_ids, hold
        self.expected = dict(expected or {})
        self.values: dict[int, dict[str, np.ndarray]] = {}  # task -> key -> output (held calls only)
        self.arrays: dict[str, set[int]] = {}  # key -> the tasks whose output was an array
        self.sums: dict[str, dict[int, FixedPointSum]] = {}  # key -> grid exponent -> partial sum

    def take(self, record: dict[str, Any]) -> None:
        """Move the record's kept arrays here (a `KeptValue` stands in the record: its bytes_up
        still counts them), adding each to the partial sums it belongs to while in the cache."""
        values = record["values"]
        task = self.task_ids[record["client"]]
        for key in self.keep:
            value = values.get(key)
            if not isinstance(value, np.ndarray):
                continue
            stand_in = values[key] = KeptValue.of(value)
            self.arrays.setdefault(key, set()).add(task)
            if self.hold:
                self.values.setdefault(task, {})[key] = value
            expected = self.expected.get(key)
            if expected is not None and task in expected.weights:
                for total in self._sums(key, expected, stand_in, value.shape):
                    total.add(value, expected.weights[task])

    def _sums(self, key: str, expected: Expected, first: KeptValue, shape: tuple[int, ...]) -> list[FixedPointSum]:
        """The key's partial sums, their grids chosen at its first term."""
        if key not in self.sums:
            if expected.exponent is not None:
                centre, spread = expected.exponent, 0 if self.hold else NEIGHBOURS
            elif self.hold:  # the held outputs serve any grid
                centre, spread = 0, -1
            else:  # first sum: the call's bound guessed from this output's peak
                centre, spread = common_exponent([expected.total_weight], [first.max_abs]), NEIGHBOURS
            grids = sorted({max(-EXPONENT_LIMIT, min(EXPONENT_LIMIT, e)) for e in range(centre - spread, centre + spread + 1)})
            self.sums[key] = {e: FixedPointSum(e, shape) for e in grids}
        return list(self.sums[key].values())

    def presums(self) -> dict[str, list[Partial]]:
        """key -> every partial sum made, for the record that carries them to the driver; a key
        some expected task did not answer with an array has none."""
        out = {}
        for key, sums in self.sums.items():
            weights = {t: float(w) for t, w in self.expected[key].weights.items()}
            if sums and set(weights) <= self.arrays.get(key, set()):
                out[key] = [(e, weights, total.total) for e, total in sums.items()]
        return out

    def held(self, key: str, weights: Mapping[int, float]) -> list[tuple[np.ndarray, float]] | None:
        """The held outputs of `key` for these tasks with their weights, in task order, each
        given up (a sum is asked once); None where some is not held."""
        if not all(key in self.values.get(t, {}) for t in weights):
            return None
        return [(self.values[t].pop(key), w) for t, w in sorted(weights.items())]

    def partial(self, key: str, weights: Mapping[int, float], exponent: int | None) -> np.ndarray | None:
        """The partial sum made for exactly these weights on this grid, if one was; the key's
        partial sums are given up with it (the driver asks for a key's sum once)."""
        for e, mine, total in self.presums().get(key, []):
            if e == exponent and mine == {t: float(w) for t, w in weights.items()}:
                del self.sums[key]
                return total
        return None


def total_weight(weights: Mapping[Any, float]) -> float:
    """sum |w|: a first grid's size (rayfl.engine.exact_sum.common_exponent bounds by it)."""
    return math.fsum(abs(float(w)) for w in weights.values())
