"""Vectorised client execution: a host runs a batch of clients of one model at once.

Clients of a round run the same arithmetic on different data, so K small minibatch steps can be
one batched step over stacked parameters [K, d]: hand-written batched matmuls for rayfl's MLP and
linear models (`rayfl.algorithms.local.BatchedMLPGrad`), torch.func.vmap over `functional_call`
for any other model. Python and op-dispatch overhead is then paid once per step, not K times.

An algorithm opts in by registering a batched twin of its client function:

    @batched(fedavg_client)
    def fedavg_clients(ctxs, kwargs) -> list[dict] | None: ...

The twin receives every client's `ClientContext` (data, state, RNG streams, work meter) and its
full keyword arguments (broadcast merged with the per-client payload) and returns one output per
client, exactly what the loop function would have returned, to float32 reduction-order
tolerance. It returns None when this batch does not allow it or would not gain from it; the
host then runs the plain loop. `engine.vectorize` switches it: `off` always loops, `auto`
(the default) calls the twin and its kernels decline where batching is known to lose
(`current_mode`; rayfl's own: `rayfl.algorithms.vmapped.batching_pays`, by model and device
alone, so a client takes the same path whichever clients share its host), `on` batches
wherever the twin can.

Equal-length minibatch streams: each client's minibatches are drawn from its own seeded stream
(the same indices, in the same order, as the loop) and charged to its own work meter before any
compute (a deadline's work budget truncates them exactly as in the loop). Batches are padded to
the schedule's batch size and steps to the longest client; padded rows carry mask 0 and a
client's steps past its own count are skipped (its parameters do not move), so every client
takes exactly its steps on exactly its minibatches. Padding to the configured batch size, not
to the batch's largest client, keeps each client's arithmetic independent of which clients
share its host, so 1 and 2 hosts agree."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfl.engine.context import ClientContext
from rayfl.zo.lower_level import epoch_indices, minibatch_indices

VECTORIZE_MODES = ("auto", "on", "off")

BatchedFn = Callable[[list[ClientContext], list[dict[str, Any]]], list[dict[str, Any]] | None]
_ATTR = "__rayfl_batched__"


def batched(loop_fn: Callable[..., dict]) -> Callable[[BatchedFn], BatchedFn]:
    """Register the decorated function as `loop_fn`'s batched twin: `twin(ctxs, kwargs)`
    runs a host's clients of one call at once and returns one answer dict per client, or None
    to let the host run `loop_fn` per client instead. The link is an attribute of the
    module-level loop function, so it travels with it to Ray hosts by reference.

    Args:
        loop_fn: the client function `fn(ctx, **payload) -> dict` the twin stands for.

    Returns:
        A decorator that records its function as the twin and returns it unchanged."""

    def register(batch_fn: BatchedFn) -> BatchedFn:
        setattr(loop_fn, _ATTR, batch_fn)
        return batch_fn

    return register


def batched_version(fn: Callable[..., Any]) -> BatchedFn | None:
    """The batched twin registered for `fn`, if any."""
    return getattr(fn, _ATTR, None)


def use_batched(mode: str, fn: Callable[..., Any], num_clients: int) -> BatchedFn | None:
    """The twin to run for `num_clients` clients of one host call under `engine.vectorize`:
    under `auto` as under `on`, however few the clients, so that which path a client takes
    never depends on how many clients share its host (batched and loop bits differ in the
    last place); under `auto` the twin's kernels then decline where batching would lose."""
    if mode == "off" or num_clients < 1:
        return None
    return batched_version(fn)


_mode = threading.local()


@contextlib.contextmanager
def vectorize_mode(mode: str) -> Iterator[None]:
    """Run a batched twin under `engine.vectorize` `mode`, which `current_mode` tells the
    kernels it calls (`local_sgd_batched` declines under `auto` where it would lose)."""
    previous = getattr(_mode, "value", "on")
    _mode.value = mode
    try:
        yield
    finally:
        _mode.value = previous


def current_mode() -> str:
    """The `engine.vectorize` mode the running twin was chosen under ("on" outside a host)."""
    return getattr(_mode, "value", "on")


def planned_batches(ctx: ClientContext, batch_size: int, epochs: int | None, steps: int | None) -> list[torch.Tensor]:
    """The index minibatches the loop's `ctx.batches(...)` would yield for this client (same
    stream, same order), each charged to the work meter; stops where the loop would stop
    (a deadline's work budget)."""
    n = ctx.num_samples
    if n == 0:
        return []
    rng = ctx.rng("batches")
    if epochs is not None:
        candidates: Sequence[torch.Tensor] = epoch_indices(rng, n, batch_size, epochs)
    else:
        candidates = minibatch_indices(rng, n, batch_size, steps or 0)
    out = []
    for idx in candidates:
        if not ctx.work.affords_step(len(idx)):
            break
        ctx.work.gradient_step(len(idx))
        out.append(idx)
    return out


@dataclass
class StackedBatches:
    """K clients' minibatch streams as padded index tensors over their stacked data.

    `data_x` [K, N, ...] and `data_y` [K, N] hold each client's rows (zero-padded to the
    largest client), `index` [T, K, B] the rows of each step's minibatch, `mask` [T, K, B] 1 for
    real rows, `active` [T, K] 1 where client k takes step t; T is the longest client's step
    count and B the padded width. Step t's minibatches are gathered when the step asks for
    them (`x_at`, `y_at`), into one buffer reused by every step: gathering all T steps at once
    held T*K*B rows (1.4 GB for 16 clients x 450 steps of 64 MNIST images) and took most of
    the host's time."""

    data_x: torch.Tensor
    data_y: torch.Tensor
    index: torch.Tensor
    mask: torch.Tensor
    active: torch.Tensor
    _rows: torch.Tensor | None = None  # [T, K * B] flat row numbers into data_x viewed [K * N, ...]
    _x: torch.Tensor | None = None
    _xs: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return int(self.index.shape[0])

    def padded_steps(self, multiple: int) -> StackedBatches:
        """The same streams with idle steps (no rows, inactive) appended up to a multiple of
        `multiple` steps."""
        pad = -self.steps % multiple
        if not pad:
            return self

        def more(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t.new_zeros((pad, *t.shape[1:]))])

        return StackedBatches(self.data_x, self.data_y, more(self.index), more(self.mask), more(self.active))

    def _flat_rows(self) -> torch.Tensor:
        if self._rows is None:
            k, n = self.data_y.shape
            offsets = torch.arange(k, device=self.index.device)[None, :, None] * n
            self._rows = (self.index + offsets).reshape(self.steps, -1)
        return self._rows

    def x_at(self, t: int) -> torch.Tensor:
        """[K, B, ...] step t's inputs (valid until the next call)."""
        k, n = self.data_y.shape
        feat = self.data_x.shape[2:]
        if self._x is None:
            self._x = torch.empty((k, self.index.shape[2], *feat), dtype=self.data_x.dtype, device=self.data_x.device)
        torch.index_select(self.data_x.view(k * n, *feat), 0, self._flat_rows()[t], out=self._x.view(-1, *feat))
        return self._x

    @property
    def width(self) -> int:
        """B: the padded rows of every minibatch."""
        return int(self.index.shape[2])

    def x_steps(self, steps: slice, rows: int) -> torch.Tensor:
        """[K, rows, ...] the inputs of consecutive steps, each client's minibatches one after
        another (row s * B + i: row i of the window's step s), then zero rows; in one buffer
        reused by every window (valid until the next call)."""
        k, n = self.data_y.shape
        feat = self.data_x.shape[2:]
        index = self._flat_rows()[steps]
        real = index.shape[0] * self.width
        if self._xs is None or self._xs.shape[1] != rows:
            self._xs = torch.zeros((k, rows, *feat), dtype=self.data_x.dtype, device=self.data_x.device)
        gathered = self.data_x.view(k * n, *feat).index_select(0, index.view(-1, k, self.width).transpose(0, 1).reshape(-1))
        self._xs[:, :real] = gathered.view(k, real, *feat)
        self._xs[:, real:] = 0
        return self._xs

    def y_at(self, t: int) -> torch.Tensor:
        """[K, B] step t's labels."""
        k, n = self.data_y.shape
        return self.data_y.view(k * n).index_select(0, self._flat_rows()[t]).view(k, -1)


def stack_batches(ctxs: Sequence[ClientContext], plans: Sequence[list[torch.Tensor]], width: int) -> StackedBatches:
    """Every client's planned minibatches as padded [T, K, width] indices over its data."""
    k = len(ctxs)
    t_max = max((len(p) for p in plans), default=0)
    width = max([width, *(len(i) for p in plans for i in p)])
    ref = ctxs[0]
    idx = torch.zeros((t_max, k, width), dtype=torch.int64)
    # the mask weighs losses: the inputs' float type, float32 for token ids
    mask = torch.zeros((t_max, k, width), dtype=ref.x.dtype if ref.x.is_floating_point() else torch.float32)
    n_max = max(1, max(c.num_samples for c in ctxs))
    data_x = torch.zeros((k, n_max, *ref.x.shape[1:]), dtype=ref.x.dtype, device=ref.x.device)
    data_y = torch.zeros((k, n_max), dtype=ref.y.dtype, device=ref.y.device)
    full = all(len(rows) == width for plan in plans for rows in plan)
    for j, (ctx, plan) in enumerate(zip(ctxs, plans, strict=True)):
        n = ctx.num_samples
        if n and plan:  # a client without minibatches (no budget, a GPU chunk's idle filler) is never read
            data_x[j, :n] = ctx.x
            data_y[j, :n] = ctx.y
        if full and plan:  # every minibatch full: one copy per client
            idx[: len(plan), j] = torch.stack(plan)
            mask[: len(plan), j] = 1
            continue
        for t, rows in enumerate(plan):
            idx[t, j, : len(rows)] = rows
            mask[t, j, : len(rows)] = 1
    active = (mask.sum(dim=2) > 0).to(mask.dtype)
    idx, mask, active = idx.to(ref.x.device), mask.to(ref.x.device), active.to(ref.x.device)
    return StackedBatches(data_x, data_y, idx, mask, active)


def per_client(kwargs: Sequence[Mapping[str, Any]], key: str, default: Any = None) -> list[Any]:
    """One keyword's value for every client of the batch."""
    return [kw.get(key, default) for kw in kwargs]


def stack_vectors(values: Sequence[Any], device: torch.device) -> torch.Tensor:
    """[K, d] float32 from K flat vectors (numpy or tensors), read-only: one shared array
    (the broadcast model) becomes a stride-0 view of one copy, not K copies."""
    first = values[0]
    if all(v is first for v in values):
        return _vector(first, device).expand(len(values), -1)
    return torch.stack([_vector(v, device) for v in values])


def _vector(v: Any, device: torch.device) -> torch.Tensor:
    """A float32 tensor of a flat vector; numpy arrays are copied (the broadcast arrives as a
    read-only view of Ray's object store)."""
    if isinstance(v, torch.Tensor):
        return v.to(device=device, dtype=torch.float32)
    return torch.tensor(np.asarray(v), dtype=torch.float32, device=device)
