"""`ClientHost`: one Ray actor that hosts a shard of clients.

A torch process costs seconds to start and hundreds of MB, so a host keeps many clients: their
index partitions, their persistent state and one model instance they share. The dataset arrays
arrive once through the object store (zero-copy numpy views); per-client state never leaves the
host, unlike Flower's context round-trip.

State is transactional. A task runs on a private copy of its client's committed state; the copy
is staged under the task's id and becomes the client's state only when the driver settles the
task as accepted (outcome ok). A late, dropped, stale or non-finite task leaves the state as it
was. Settlements ride on the next call to the host (Ray runs one caller's calls to an actor in
order), so they cost no extra round trip."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfl.config import ConfigError, ModelConfig, section_config
from rayfl.data.lazy import ClientIds
from rayfl.data.rows import host_rows, is_file_rows
from rayfl.engine.context import ClientContext
from rayfl.engine.exact_sum import PRESUM, FixedPointSum, fixed_point_sum
from rayfl.engine.lockstep import Lockstep, solve_together
from rayfl.engine.partials import Expected, HostPartials
from rayfl.engine.payload import payload_nbytes, to_numpy_tree
from rayfl.engine.state_codec import check_savable
from rayfl.engine.vectorized import BatchedFn, use_batched, vectorize_mode
from rayfl.models import build_model
from rayfl.models.channels_last import channels_last_rule
from rayfl.pipeline.uploads import UploadSpec, flip_labels_of, transform_upload
from rayfl.registry import Plugins
from rayfl.user_code import from_exception

ClientFn = Callable[..., dict]
Rows = tuple[np.ndarray, np.ndarray | None]  # a client's train and test row indices


@dataclass(frozen=True)
class HostTask:
    """One task of a `run_tasks` call: its client function and client, the key of its random
    streams (its context's round), which of the call's payloads it gets, its task id, the
    round pipeline's upload spec, and, for a client another host holds, its rows."""

    fn: ClientFn
    client: int
    key: int
    payload: int
    task: int
    uploads: UploadSpec | None = None
    rows: Rows | None = None


@dataclass
class _Job:
    """One client task as the host runs it: `fn(ctx, **broadcast, **extra)` on a context of
    `round`, its work capped by `budget`, its new state staged under `task` (None: committed
    at once)."""

    client: int
    round: int
    broadcast: Mapping[str, Any]
    extra: Mapping[str, Any]
    budget: float | None = None
    task: int | None = None
    uploads: UploadSpec | None = None


@dataclass(frozen=True)
class _KeptJobs:
    """A pre-aggregated call as it ran: enough to run it again for a sum (rayfl.engine.partials)."""

    fn: ClientFn
    jobs: list[_Job]
    foreign: dict[int, Rows]


class ClientHostImpl:
    """The host's logic, kept free of Ray so it can be unit-tested and run in-process."""

    def __init__(
        self,
        host_id: int,
        arrays: Mapping[str, np.ndarray],
        client_train: Mapping[int, np.ndarray],
        client_test: Mapping[int, np.ndarray] | None,
        model_cfg: ModelConfig | Mapping[str, Any],
        input_shape: tuple[int, ...],
        num_classes: int,
        seed: int,
        torch_threads: int = 1,
        device: str = "auto",
        flops_per_sample: float = 0.0,
        backward_cost: float = 3.0,
        vectorize: str = "off",
        plugins: Plugins | None = None,
        channels_last: str = "off",
        clients_per_chunk: int | str = "auto",
    ):
        # The run's user code first: what it names must import here before anything uses it
        # (the model's config may be a user's class, so it comes as a mapping). A host that
        # cannot import it says so in `info()`, which the driver turns into a one-line error.
        self.host_id = host_id
        self.start_error: tuple[str, str] | None = None
        if plugins is not None:
            try:
                plugins.install(f"node {_node_ip()}, host {host_id}")
            except ConfigError as e:
                self.start_error = (e.key, str(e).partition(": ")[2])
                return
        if isinstance(model_cfg, Mapping):
            model_cfg = section_config("model", **model_cfg)
        torch.set_num_threads(torch_threads)
        retain_freed_memory()
        self.vectorize = vectorize  # engine.vectorize: run opted-in algorithms' clients as one batch
        self.host_id = host_id
        # a lazy population (rayfl.data.lazy) arrives as its source plus this host's client ids
        self.source = arrays if hasattr(arrays, "client_arrays") else None
        if self.source is None and is_file_rows(arrays["train_x"]):  # read its clients' rows itself, once
            try:
                arrays, client_train = host_rows(arrays, client_train)
            except ConfigError as e:  # the files cannot be read here: a one-line error on the driver
                self.start_error = (e.key, str(e).partition(": ")[2])
                return
        self.arrays = arrays
        self.client_train = ClientIds(client_train) if self.source is not None else dict(client_train)
        self.client_test = dict(client_test) if client_test is not None else None
        self.seed = seed
        self.flops_per_sample = flops_per_sample
        self.backward_cost = backward_cost
        self.device = resolve_device(device)
        self.model = build_model(model_cfg, tuple(input_shape), num_classes).to(self.device)
        try:  # engine.channels_last, decided by model and device alone: the same on every host
            self.channels_last = channels_last_rule(channels_last, self.model, tuple(input_shape), self.device,
                                                    self._input_dtype())
        except ConfigError as e:
            self.start_error = (e.key, str(e).partition(": ")[2])
            return
        self.states: dict[int, dict[str, Any]] = ClientStates()  # {} until a client first runs
        self.staged: dict[int, tuple[int, dict[str, Any]]] = {}  # task id -> (client, new state)
        self.chunk = chunk_clients(clients_per_chunk, self.model)
        self.partials: HostPartials | None = None  # the last call's kept outputs or their partial sums
        self.kept_call: _KeptJobs | None = None  # and how to run it again (rayfl.engine.partials)
        self.foreign: dict[int, Rows] = {}  # other hosts' clients, this call only

    def _input_dtype(self) -> torch.dtype:
        """The dtype a client's inputs arrive in (float32 for a lazy population)."""
        rows = None if self.source is not None else self.arrays.get("train_x")
        dtype = getattr(rows, "dtype", None)
        return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype if isinstance(dtype, np.dtype) else torch.float32

    def client_ids(self) -> list[int]:
        return sorted(self.client_train)

    def run_call(self, broadcast: Mapping[str, Any], call: tuple[Any, ...]) -> list[dict[str, Any]]:
        """`run(fn, client_ids, round, broadcast, *rest)` with `call = (fn, client_ids, round,
        *rest)`: the driver's round call as one argument beside the shared payload. Ray
        serializes each argument of a call on its own, so one tuple instead of eleven saves the
        driver ~0.1 ms of CPU per host and round (rayfl bench driver)."""
        fn, client_ids, round, *rest = call
        return self.run(fn, client_ids, round, broadcast, *rest)

    def run(
        self,
        fn: ClientFn,
        client_ids: list[int],
        round: int,
        broadcast: Mapping[str, Any],
        per_client: Mapping[int, Mapping[str, Any]] | None = None,
        budgets: Mapping[int, float] | None = None,
        task_ids: Mapping[int, int] | None = None,
        settle: Mapping[int, bool] | None = None,
        keep: tuple[str, ...] = (),
        foreign: Mapping[int, Rows] | None = None,
        uploads: UploadSpec | None = None,
        presum: Mapping[str, Expected] | None = None,
    ) -> list[dict[str, Any]]:
        """Run `fn` for each client in `client_ids` (one after another, in id order, or as one
        batch through its registered twin under `engine.vectorize`) and return
        one record per client: the function's output plus the work it did and bytes it sends.
        `budgets` caps a client's FLOPs (a deadline with partial work).

        `foreign` (client -> train and test row indices) are clients another host holds, run
        here for this call only to balance the hosts (rayfl.engine.balance): `fn` must be
        stateless, and a task that changes such a client's state fails.

        With `task_ids` (client -> task id) each client's new state is staged until the driver
        settles that task; without, it is committed at once (in-process use and unit tests).
        `settle` (task id -> accepted) applies the driver's earlier decisions first.

        `keep` (pre-aggregation; needs `task_ids`): these output arrays stay here, replaced in
        the record by a `KeptValue`, until `reduce` sums them or the host's next `run`; beyond
        `engine.clients_per_chunk` clients only their partial sums do (rayfl.engine.partials).

        `uploads` (rayfl.pipeline.uploads) transforms each answer's model-shaped keys on the
        way out (compression with error feedback, clipping, local noise) before any is kept.

        `presum` (key -> `Expected`: the last grid exponent, task id -> weight, the call's
        total weight): the sums `reduce` would give for those weights, computed at once. A
        call that holds its outputs sends them with its first record under PRESUM, as key ->
        [(exponent, weights, total)], so the driver need not ask again when its sum turns out
        to be that one; a larger call's partial sums, one per likely grid, stay here for
        `reduce` (sending them all would cost more than the second call)."""
        if settle:
            self.settle(settle)
        self.partials = self.kept_call = None
        jobs = [_Job(cid, round, broadcast, per_client.get(cid, {}) if per_client else {},
                     budgets.get(cid) if budgets else None, None if task_ids is None else task_ids[cid], uploads)
                for cid in sorted(client_ids)]
        if keep and task_ids is None:
            raise ValueError("keeping outputs on the host needs task ids")
        partials = HostPartials(keep, task_ids, presum, hold=len(jobs) <= self.chunk) if keep else None
        with self._visiting(foreign):
            records = self._execute(fn, jobs, None if partials is None else partials.take)
        if partials is not None:
            self.partials, self.kept_call = partials, _KeptJobs(fn, jobs, dict(foreign or {}))
            if presum and records and partials.hold:  # else `reduce` answers from the partial sums
                records[0][PRESUM] = partials.presums()
        return records

    def run_tasks(self, tasks: Sequence[HostTask], settle: Mapping[int, bool] | None,
                  *payloads: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run asynchronous tasks and return one record per task, in their order. Each task has
        its own client function, stream key, payload (`payloads[task.payload]`: Ray resolves
        object references only among a call's own arguments) and task id. A function's tasks
        run as one batch through its twin under `engine.vectorize`, as `run`'s clients do.
        Every task starts from its client's committed state after `settle`, so one client may
        have several tasks here, each staging its own new state."""
        if settle:
            self.settle(settle)
        self.partials = self.kept_call = None
        records: list[dict[str, Any]] = [{} for _ in tasks]
        with self._visiting({t.client: t.rows for t in tasks if t.rows is not None}):
            for fn, where in _by_function(tasks).items():
                jobs = [_Job(tasks[i].client, tasks[i].key, payloads[tasks[i].payload], {}, None, tasks[i].task,
                             tasks[i].uploads) for i in where]
                for i, rec in zip(where, self._execute(fn, jobs), strict=True):
                    records[i] = rec
        return records

    @contextlib.contextmanager
    def _visiting(self, foreign: Mapping[int, Rows] | None) -> Iterator[None]:
        """Other hosts' clients (client -> rows) run here for one call and leave nothing behind."""
        self.foreign = dict(foreign or {})
        try:
            yield
        finally:
            for cid in self.foreign:
                if not self.states.get(cid):
                    self.states.pop(cid, None)
            self.foreign = {}

    def _execute(self, fn: ClientFn, jobs: list[_Job],
                 take: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """`_run_jobs`, an exception of the user's own code (a client function or model of a
        package of theirs) told as a UserCodeError naming the clients and round."""
        try:
            return self._run_jobs(fn, jobs, take)
        except Exception as e:
            clients = ", ".join(str(job.client) for job in jobs)
            where = f"client{'s' if len(jobs) > 1 else ''} {clients}, round {jobs[0].round}" if jobs else ""
            err = from_exception(e, where)
            if err is None:
                raise
            raise err from None

    def _run_jobs(self, fn: ClientFn, jobs: list[_Job],
                  take: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """One record per job, in chunks of `engine.clients_per_chunk` jobs: a chunk as one
        batch through `fn`'s twin under `engine.vectorize`, else one after another. `take`
        sees each record as soon as its chunk (or, in the loop, its job) is done, before the
        next runs: it moves the large outputs out, so a host holds one chunk's at a time."""
        for job in jobs:
            if job.client not in self.client_train and job.client not in self.foreign:
                raise KeyError(f"host {self.host_id} does not host client {job.client}")

        def done(rec: dict[str, Any]) -> dict[str, Any]:
            if rec["client"] in self.foreign and rec["state_changed"]:
                raise RuntimeError(f"client function {getattr(fn, '__name__', fn)} is marked stateless "
                                   f"(rayfl.stateless) but changed client {rec['client']}'s state")
            if take is not None:
                take(rec)
            return rec

        records: list[dict[str, Any]] = []
        for start in range(0, len(jobs), self.chunk):
            records.extend(self._run_chunk(fn, jobs[start:start + self.chunk], done))
        return records

    def _run_chunk(self, fn: ClientFn, jobs: list[_Job],
                   done: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
        """One chunk's records, each through `done`: as one batch through `fn`'s twin, in
        lockstep where `fn` has none, or one after another (a client's numbers do not depend
        on its chunk)."""
        twin = use_batched(self.vectorize, fn, len(jobs))
        records = None if twin is None else self._run_batched(twin, jobs)
        if twin is None and self.vectorize != "off":  # no twin: its rayfl.local_sgd calls run batched
            records = self._run_lockstep(fn, jobs)
        if records is None:
            return [done(self._run_one(fn, job)) for job in jobs]
        return [done(rec) for rec in records]

    def _run_one(self, fn: ClientFn, job: _Job) -> dict[str, Any]:
        state, ctx = self._prepare(job)
        out = fn(ctx, **job.broadcast, **job.extra)
        return self._record(fn, job, ctx, state, out)

    def reduce(self, key: str, weights: Mapping[int, float], exponent: int | None) -> np.ndarray:
        """sum over tasks of weight * kept[task][key] on the fixed-point grid 2**-exponent
        (rayfl.engine.exact_sum): this host's exact share of a weighted sum of the last call's
        kept outputs. Without an exponent, the sum of one term: float64(v) * w, rounded once.
        Outputs not held here (a call of more than `engine.clients_per_chunk` clients) come
        from a partial sum made for these weights, else from running the call again."""
        partials = self.partials
        if partials is None:
            raise RuntimeError(f"host {self.host_id} keeps no outputs of {key!r}: no call kept them since its last run")
        terms = partials.held(key, weights)
        if terms is None and exponent is not None:
            part = partials.partial(key, weights, exponent)
            if part is not None:
                return part
        if terms is None:
            return self._replayed_sum(key, weights, exponent)
        if exponent is None:
            ((value, weight),) = terms
            return np.multiply(value, weight, dtype=np.float64)
        return fixed_point_sum(terms, exponent, terms[0][0].shape if terms else (0,))

    def _replayed_sum(self, key: str, weights: Mapping[int, float], exponent: int | None) -> np.ndarray:
        """`reduce`'s sum from the last call run again: its tasks were not settled yet, so they
        start from the same committed states with the same inputs and seeds and give the same
        outputs (all of its jobs, in the same chunks, as the call ran them)."""
        call = self.kept_call
        assert call is not None
        task_of = {job.client: job.task for job in call.jobs}
        total: FixedPointSum | None = None
        single: list[np.ndarray] = []

        def take(rec: dict[str, Any]) -> None:
            nonlocal total
            task = task_of[rec["client"]]
            value = rec["values"].get(key)
            if task not in weights or not isinstance(value, np.ndarray):
                return
            if exponent is None:
                single.append(np.multiply(value, weights[task], dtype=np.float64))
                return
            if total is None:
                total = FixedPointSum(exponent, value.shape)
            total.add(value, weights[task])

        with self._visiting(call.foreign):
            self._execute(call.fn, call.jobs, take)
        if exponent is None:
            (value,) = single
            return value
        if total is None:
            raise KeyError(f"host {self.host_id} ran no task of {sorted(weights)} with an array {key!r}")
        return total.total

    def _prepare(self, job: _Job) -> tuple[dict[str, Any], ClientContext]:
        """A task's private state copy and its context (with its work budget; a Byzantine
        client of a data attack sees its labels flipped)."""
        cid = job.client
        state = copy_state(self.states[cid])
        ctx = self._context(cid, job.round, state)
        ctx.y = flip_labels_of(ctx.y, job.uploads, cid)
        if job.budget is not None:
            ctx.work.budget_flops = job.budget
        return state, ctx

    def _run_batched(self, twin: BatchedFn, jobs: list[_Job]) -> list[dict[str, Any]] | None:
        """All jobs through the algorithm's batched twin (rayfl.engine.vectorized); None when
        the twin declines this batch (the caller then loops, on fresh contexts)."""
        prepared = [self._prepare(job) for job in jobs]
        with vectorize_mode(self.vectorize):
            outs = twin([ctx for _, ctx in prepared], [{**job.broadcast, **job.extra} for job in jobs])
        if outs is None:
            return None
        if len(outs) != len(jobs):
            raise ValueError(f"batched client function {getattr(twin, '__name__', twin)} returned {len(outs)} results "
                             f"for {len(jobs)} clients")
        return [self._record(twin, job, ctx, state, out) for job, (state, ctx), out in zip(jobs, prepared, outs, strict=True)]

    def _run_lockstep(self, fn: ClientFn, jobs: list[_Job]) -> list[dict[str, Any]]:
        """All jobs through `fn` in lockstep (rayfl.engine.lockstep): each client's local SGD
        runs batched with the others'. A single job too, so that which path a client takes
        never depends on how many clients share its host."""
        prepared = [self._prepare(job) for job in jobs]
        with vectorize_mode(self.vectorize):
            outs = Lockstep().run(fn, [(ctx, {**job.broadcast, **job.extra}) for job, (_, ctx) in zip(jobs, prepared,
                                                                                                        strict=True)],
                                  solve_together)
        return [self._record(fn, job, ctx, state, out) for job, (state, ctx), out in zip(jobs, prepared, outs, strict=True)]

    def _record(self, fn: Callable[..., Any], job: _Job, ctx: ClientContext, state: dict[str, Any],
                out: Any) -> dict[str, Any]:
        """Stage (or commit) the task's state and describe what it did and sends."""
        if not isinstance(out, Mapping):
            raise TypeError(f"client function {getattr(fn, '__name__', fn)} must return a dict")
        cid, uploads = job.client, job.uploads
        values = to_numpy_tree(dict(out))
        upload = None
        if uploads is not None:
            values, upload = transform_upload(values, state, uploads, cid, ctx.round, self.seed)
        changed = not same_state(state, self.states[cid])
        if changed:  # what a checkpoint cannot hold fails here, at the first commit, not rounds later
            check_savable(state, "ctx.state", context=f"{getattr(fn, '__name__', fn)} on client {cid}, round {ctx.round}")
        if job.task is None:
            self.states[cid] = state
        elif changed:
            self.staged[job.task] = (cid, state)
        return {
            "client": cid,
            "host": self.host_id,
            "values": values,
            "num_samples": ctx.num_samples,
            "forward_samples": ctx.work.forward_samples,
            "backward_samples": ctx.work.backward_samples,
            "local_steps": ctx.work.steps,
            "truncated": ctx.work.truncated,
            "bytes_up": payload_nbytes(values) if upload is None else upload.bytes_up,
            "bytes_down": payload_nbytes(job.broadcast) + payload_nbytes(job.extra),
            "state_changed": changed,
            "state_bytes": payload_nbytes(state) if changed else None,  # the driver's ledger of client state
            "pipeline": {} if upload is None else upload.row(),
        }

    def settle(self, decisions: Mapping[int, bool]) -> None:
        """Commit (True) or discard (False) the staged state of finished tasks. A task settled
        twice, or never staged (it failed before staging), is ignored."""
        for task, accepted in decisions.items():
            staged = self.staged.pop(task, None)
            if staged is not None and accepted:
                cid, state = staged
                self.states[cid] = state

    def _context(self, cid: int, round: int, state: dict[str, Any]) -> ClientContext:
        if self.source is not None:  # lazy: the client's rows, made now from its own stream
            rows = self.source.client_arrays(cid)
        else:
            idx, tidx = self.foreign[cid] if cid in self.foreign else (
                self.client_train[cid], None if self.client_test is None else self.client_test[cid])
            rows = (self.arrays["train_x"][idx], self.arrays["train_y"][idx], None, None)
            if tidx is not None:
                rows = (*rows[:2], self.arrays["test_x"][tidx], self.arrays["test_y"][tidx])
        x, y, test_x, test_y = (None if a is None else torch.from_numpy(a).to(self.device) for a in rows)
        ctx = ClientContext(
            id=cid,
            round=round,
            seed=self.seed,
            model=self.model,
            device=self.device,
            x=x,
            y=y,
            test_x=test_x,
            test_y=test_y,
            state=state,
            channels_last=self.channels_last,
        )
        ctx.work.flops_per_sample = self.flops_per_sample
        ctx.work.backward_cost = self.backward_cost
        return ctx

    def get_state(self, client_ids: list[int], key: str, settle: Mapping[int, bool] | None = None) -> dict[int, Any]:
        """Read one committed state entry of some clients (personalized models, for evaluation
        or export), after applying the driver's pending decisions."""
        if settle:
            self.settle(settle)
        return {cid: to_numpy_tree(self.states[cid].get(key)) for cid in client_ids}

    def export_states(self, settle: Mapping[int, bool] | None = None) -> dict[int, dict[str, Any]]:
        """Every client's committed, non-empty state (for a checkpoint), after the driver's
        pending decisions. Tasks still staged are not part of it: they are re-run on resume."""
        if settle:
            self.settle(settle)
        return {cid: _map_tensors(state, lambda t: t.detach().cpu()) for cid, state in self.states.items() if state}

    def import_states(self, states: Mapping[int, dict[str, Any]]) -> None:
        """Restore committed states (a resumed run, a replaced host); tensors go to this host's
        device, everything else comes back as it was stored."""
        for cid, state in states.items():
            if cid not in self.client_train:
                raise KeyError(f"host {self.host_id} does not host client {cid}")
            self.states[cid] = _map_tensors(copy_state(state), lambda t: t.to(self.device))
        self.staged.clear()

    def info(self) -> dict[str, Any]:
        if self.start_error is not None:
            return {"host": self.host_id, "start_error": self.start_error}
        return {
            "host": self.host_id,
            "pid": os.getpid(),
            "node_id": _node_id(),
            "clients": len(self.client_train),
            "train_rows": len(self.arrays["train_y"]) if self.source is None else None,  # the rows it holds
            "device": str(self.device),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "torch_threads": torch.get_num_threads(),
        }


def _by_function(tasks: Sequence[HostTask]) -> dict[ClientFn, list[int]]:
    """The tasks' positions grouped by client function, in order of first appearance."""
    groups: dict[ClientFn, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(task.fn, []).append(i)
    return groups


class ClientStates(dict):
    """Committed client states, created on first access: a host of a million clients holds
    no per-client object until a client runs."""

    def __missing__(self, cid: int) -> dict[str, Any]:
        return self.setdefault(cid, {})


def copy_state(state: dict[str, Any]) -> dict[str, Any]:
    """A private copy a task may change freely, in place or by assignment: tensors and arrays
    are cloned, anything else deep-copied. Costs O(state), far below the task's own work."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.clone()
        elif isinstance(value, np.ndarray):
            out[key] = value.copy()
        else:
            out[key] = copy.deepcopy(value)
    return out


def _node_ip() -> str:
    """This machine's address as Ray names its node (the hostname outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        import socket

        return socket.gethostname()


def _node_id() -> str | None:
    """The Ray node this host runs on (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:
        return None


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two client states hold equal values (a task that changed nothing needs neither a
    commit nor a replay after a host failure)."""
    if a.keys() != b.keys():
        return False
    for key, x in a.items():
        y = b[key]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(x, y):
                return False
        else:
            try:
                if bool(x != y):
                    return False
            except (TypeError, ValueError):  # something without a plain equality: assume changed
                return False
    return True


def _map_tensors(state: dict[str, Any], fn: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    """`state` with `fn` applied to its top-level tensors (device moves for export / import)."""
    return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


# What a host's chunk of clients may hold at once under engine.clients_per_chunk: auto, at two
# model copies a client (its output and its working copy). A 19.2M-parameter MLP (77 MB) runs
# 6 clients a chunk; rayfl's small models run any call in one.
CHUNK_MEMORY = 1 << 30


def chunk_clients(setting: int | str, model: torch.nn.Module) -> int:
    """engine.clients_per_chunk on this host: the integer given, or for auto as many clients
    as CHUNK_MEMORY holds at two copies of `model`'s parameters each."""
    if setting != "auto":
        return int(setting)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(1, CHUNK_MEMORY // max(1, 2 * nbytes))


# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def retain_freed_memory(trim: int = 1 << 30, mmap: int = 32 << 20) -> None:
    """Keep freed heap memory in this process instead of handing it back to the kernel.

    A round's batched client outputs are a few chunk buffers of several MB each, freed once
    the driver has summed them; glibc returns that much free memory at the top of the heap to
    the kernel (its trim threshold follows its mmap threshold, 2x the largest freed block), so
    the next round page-faults on every first write: 11% of a vectorised fedavg-mlp host's
    time went to writing its outputs. With these thresholds the same pages come back from the
    free lists. The price is resident memory that stays at the host's peak. glibc only."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_TRIM_THRESHOLD, trim)
        libc.mallopt(M_MMAP_THRESHOLD, mmap)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        pass


def resolve_device(device: str) -> torch.device:
    """engine.device for this host. "auto" is the GPU only where Ray gave this actor a GPU
    share (engine.num_gpus_per_host > 0): on a GPU node Ray leaves CUDA visible to actors that
    reserved none, and hosts that used it anyway would crowd a card Ray hands to others (seen
    on an H200: two "auto" hosts with no share both ran on cuda). Outside a Ray actor (a host
    built in process) "auto" is the GPU whenever torch sees one."""
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("engine.device is 'cuda' but this host sees no GPU (set engine.num_gpus_per_host > 0)")
        return torch.device("cuda")
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda" if _ray_gpu_share() in (None, True) else "cpu")


def _ray_gpu_share() -> bool | None:
    """Whether Ray gave this process GPUs (None outside a Ray worker)."""
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().worker.mode != ray.WORKER_MODE:
        return None
    return bool(ray.get_gpu_ids())


@functools.cache
def remote_host_class():
    """The Ray actor class, created lazily so importing rayfl does not import ray's workers, and
    once: Ray exports an actor class to its cluster at its first use per job, disassembling every
    method (0.07-0.15 s on 2 cores), so a class made per host paid that once per host."""
    import ray

    return ray.remote(ClientHostImpl)
