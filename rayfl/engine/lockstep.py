"""Batched local SGD for client functions that have no batched twin.

A client function that trains with `rayfl.local_sgd` (its proximal term, correction and weight
decay included) gets the batched kernels without a hand-written twin: the host runs a call's
client functions as threads that take turns, one at a time, in client order; each runs until
it calls `local_sgd` (it parks there) or returns. Once every one has parked or returned, the
parked requests run as one `local_sgd_batched` call (or, where the batched kernels decline,
one `local_sgd` after the other) and each thread resumes with its own answer. A client calling
local SGD twice (Ditto's global and personal models) parks twice.

Only one client's code runs at a time, so code that shares the host's model between clients
is as safe as in the loop; each client's numbers come from its own context and do not depend
on which clients share the batch (rayfl.engine.vectorized), so 1 and 2 hosts agree."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rayfl.engine.context import ClientContext


@dataclass
class Request:
    """One parked `local_sgd(ctx, start, lr, schedule, **options)` call."""

    ctx: ClientContext
    start: torch.Tensor
    lr: float
    schedule: Any
    weight_decay: float
    prox_mu: float
    prox_center: torch.Tensor | None
    correction: torch.Tensor | None
    answer: tuple[torch.Tensor, float] | None = None


@dataclass
class _Turn:
    """A client thread's turn: `go` lets it run, `parked` says it stopped (parked or returned)."""

    go: threading.Event = field(default_factory=threading.Event)
    parked: threading.Event = field(default_factory=threading.Event)
    request: Request | None = None
    done: bool = False
    output: Any = None
    error: BaseException | None = None


class Lockstep:
    """The turns of one host call's client threads (see the module docstring)."""

    def __init__(self) -> None:
        self._turns: dict[int, _Turn] = {}

    def local_sgd(self, ctx: ClientContext, start: torch.Tensor, lr: float, schedule: Any, *, weight_decay: float,
                  prox_mu: float, prox_center: torch.Tensor | None,
                  correction: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        """Park this client's local SGD until the host has run every parked request."""
        turn = self._turns[threading.get_ident()]
        turn.request = Request(ctx, start, lr, schedule, weight_decay, prox_mu, prox_center, correction)
        turn.go.clear()
        turn.parked.set()
        turn.go.wait()
        request, turn.request = turn.request, None
        assert request is not None and request.answer is not None
        return request.answer

    def run(self, fn: Callable[..., Any], jobs: Sequence[tuple[ClientContext, dict[str, Any]]],
            solve: Callable[[list[Request]], None]) -> list[Any]:
        """`fn(ctx, **kwargs)` for every job, their local SGD solved `solve`d together;
        the outputs in job order (the first client error is raised, after every thread ends)."""
        turns = [_Turn() for _ in jobs]
        threads = []
        torch_threads = torch.get_num_threads()
        for (ctx, kwargs), turn in zip(jobs, turns, strict=True):
            thread = threading.Thread(target=self._client, args=(fn, ctx, kwargs, turn, torch_threads), daemon=True)
            threads.append(thread)
            thread.start()
        try:
            while True:
                for turn in turns:  # one client at a time, in order, up to its next park or its end
                    if not turn.done:
                        turn.parked.clear()
                        turn.go.set()
                        turn.parked.wait()
                parked = [t.request for t in turns if not t.done and t.request is not None]
                if not parked:
                    break
                solve(parked)
        finally:
            for thread in threads:
                thread.join()
        for turn in turns:
            if turn.error is not None:
                raise turn.error
        return [turn.output for turn in turns]

    def _client(self, fn: Callable[..., Any], ctx: ClientContext, kwargs: dict[str, Any], turn: _Turn,
                torch_threads: int) -> None:
        self._turns[threading.get_ident()] = turn
        # torch sets up its intra-op threading per OS thread, lazily; in a host process that lazy
        # set-up left every later op of the thread slow (FFGG's CG clients: 3x a round's wall
        # time), while setting the host's engine.torch_threads first costs nothing (same bits)
        torch.set_num_threads(torch_threads)
        turn.go.wait()
        ctx.lockstep = self
        try:
            turn.output = fn(ctx, **kwargs)
        except BaseException as e:  # raised by the host once every client has ended
            turn.error = e
        finally:
            ctx.lockstep = None
            turn.done = True
            turn.parked.set()


def solve_together(requests: list[Request]) -> None:
    """Answer parked requests: one `local_sgd_batched` call when their starts share a dtype
    and device and the kernels take the batch, else `local_sgd` one after the other."""
    from rayfl.algorithms.local import local_sgd_batched, local_sgd_now

    first = requests[0].start
    same = all(r.start.dtype == first.dtype and r.start.device == first.device and r.start.shape == first.shape
               for r in requests)
    out = None
    if same:
        starts = torch.stack([r.start.detach() for r in requests])
        at_start = all(r.prox_center is None or r.prox_center is r.start for r in requests)
        centers = starts if at_start else torch.stack([r.start if r.prox_center is None else r.prox_center
                                                       for r in requests])
        corrections = None
        if any(r.correction is not None for r in requests):
            corrections = torch.stack([torch.zeros_like(r.start) if r.correction is None else r.correction
                                       for r in requests])
        out = local_sgd_batched([r.ctx for r in requests], starts, [r.lr for r in requests],
                                [r.schedule for r in requests], weight_decay=[r.weight_decay for r in requests],
                                prox_mu=[r.prox_mu for r in requests], prox_centers=centers, corrections=corrections)
    if out is not None:
        finals, losses = out
        for r, w, loss in zip(requests, finals, losses, strict=True):
            r.answer = (w, loss)
        return
    for r in requests:
        r.answer = local_sgd_now(r.ctx, r.start, r.lr, r.schedule, weight_decay=r.weight_decay, prox_mu=r.prox_mu,
                             prox_center=r.prox_center, correction=r.correction)
