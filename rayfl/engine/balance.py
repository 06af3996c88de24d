"""Spreading a call's clients over the hosts by their work, not by where they live.

Each client lives on one host (its data indices, its state). A round of a few clients of
unequal sizes then loads the hosts unequally: on LEAF-like data (lognormal sizes) the busiest
of 2 hosts carried 1.1-1.5x the mean work per round, and a round lasts as long as its busiest
host. A client that keeps no state between rounds can run on any host, since every host holds
the whole dataset (through the object store) and a client's arithmetic does not depend on
where it runs (its own seeded streams; batched kernels whose per-client bits do not depend on
the batch). So for such a client function (`@stateless`) the driver assigns the call's
clients to hosts by longest-processing-time first, ordered by expected work and then client
id: deterministic, so replays and re-runs put every client where the first run did."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_ATTR = "__rayfl_stateless__"


def stateless(fn: F) -> F:
    """Mark a client function that never writes `ctx.state`: the driver may run its clients on
    any host to balance the hosts' work (`engine.balance`). A host that sees such a function
    change a visiting client's state raises, which fails the run: the promise is checked, not
    trusted."""
    setattr(fn, _ATTR, True)
    return fn


def is_stateless(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, _ATTR, False))


def expected_rows(num_samples: int, kwargs: Mapping[str, Any]) -> float:
    """The rows a client will push through its network: epochs x samples, or steps x batch
    for a `schedule` (rayfl.LocalSchedule) of fixed steps; the sample count without one."""
    schedule = kwargs.get("schedule")
    epochs, steps, batch = (getattr(schedule, k, None) for k in ("epochs", "steps", "batch_size"))
    if epochs is not None:
        return float(epochs * num_samples)
    if steps is not None and batch is not None:
        return float(steps * min(batch, max(1, num_samples)))
    return float(num_samples)


def balanced_assignment(clients: Sequence[int], work: Sequence[float], num_hosts: int) -> dict[int, list[int]]:
    """Longest processing time first: clients by decreasing work (then id), each to the host
    with the least work so far (then the lowest index). Returns host -> its clients in id
    order, hosts without clients left out."""
    load = [0.0] * num_hosts
    out: dict[int, list[int]] = {}
    for w, c in sorted(zip(work, clients, strict=True), key=lambda p: (-p[0], p[1])):
        h = min(range(num_hosts), key=lambda i: (load[i], i))
        load[h] += w
        out.setdefault(h, []).append(int(c))
    return {h: sorted(ids) for h, ids in sorted(out.items())}
