"""Asynchronous client tasks, committed in simulated-time order and executed in parallel.

`next()` returns the task whose event (finish or failure) is earliest on the simulated clock,
but only once no task still unfinished could have an earlier event: each task has a lower bound
on its event time, known at dispatch (latency + download + the work it is guaranteed to do).
So the commit order is the exact simulated order whatever order Ray finishes in, while tasks
whose inputs are fixed run concurrently across hosts. Ties break by submission order.

A task whose client function is stateless (rayfl.engine.balance) waits in a queue until
`next()` must wait for a result; the queue then goes out as one call per host
(`ClientHostImpl.run_tasks`), which runs its tasks as one batch where the function has a
batched twin. Under `engine.balance: auto` such tasks go to the hosts in turn, not
necessarily to their client's own: a result does not depend on the host. Any other task is
sent at once to its client's host, so it runs before the host sees any later settlement and
starts from the state it was submitted against.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rayfl.engine.balance import is_stateless
from rayfl.engine.host import HostTask
from rayfl.engine.payload import payload_nbytes
from rayfl.engine.tasks import (
    OK,
    STALE,
    ClientResult,
    TaskPlan,
    lower_bound_finish,
    plan_task,
    settle,
)


def host_lost() -> tuple[type[BaseException], ...]:
    """The Ray errors that mean a host is gone (not that a client function raised)."""
    from ray.exceptions import NodeDiedError, OutOfMemoryError, RayActorError, WorkerCrashedError

    return (RayActorError, OutOfMemoryError, NodeDiedError, WorkerCrashedError)


@dataclass
class TaskInput:
    """What a client task was given. Kept until the server decides on the task and, when it
    was accepted and changed the client's state, until the next checkpoint: a replacement host
    replays these to rebuild its clients' states exactly."""

    client: int
    fn: Any
    key: int
    payload_ref: Any
    extra: Any
    budget: float | None
    task: int = -1
    uploads: Any = None  # the call's rayfl.pipeline.uploads.UploadSpec, for an exact replay


@dataclass
class TaskSpec:
    """Everything needed to (re-)launch one asynchronous task exactly: a checkpoint stores the
    specs of the tasks in flight, and a resumed run launches them again with the same plan
    and task id, so they return what they would have returned."""

    plan: TaskPlan
    fn: Any
    payload: dict[str, Any]
    key: int
    phase: str
    min_forward: int
    min_backward: int
    task: int
    uploads: Any = None  # the round pipeline's UploadSpec (rayfl.pipeline.uploads), if any


@dataclass
class _Task:
    """A task not yet finished: its spec, the lower bound on its event time, its payload's
    object reference, the host it runs on and whether it may wait in the queue."""

    spec: TaskSpec
    bound: float
    payload_ref: Any
    host: int
    deferred: bool
    rerun: bool = False

    @property
    def order(self) -> tuple[float, int]:
        """Where its event may fall at the earliest, ties broken by submission order."""
        return self.bound, self.spec.plan.seq


@dataclass
class _Call:
    """One remote call: host `host` running `tasks`, launched at `launched` (wall clock, for
    engine.task_timeout)."""

    host: int
    tasks: list[_Task]
    launched: float


class AsyncPool:
    """In-flight client tasks of an asynchronous algorithm (FedAsync, FedBuff, async FFGG)."""

    def __init__(self, fed: Any):  # the run's Federation (not imported: it imports this module)
        self.fed = fed
        self._queue: list[_Task] = []  # submitted, not yet sent
        self._calls: dict[Any, _Call] = {}  # ObjectRef -> call
        self._done: list[tuple[float, int, ClientResult]] = []
        self._specs: dict[int, TaskSpec] = {}  # seq -> spec, until committed
        self._seq = 0
        self._payload_cache: tuple[dict[str, Any], Any, int] | None = None
        self._kinds: dict[Any, tuple[bool, bool]] = {}  # client function -> (deferred, anywhere)

    def __len__(self) -> int:
        return len(self._queue) + sum(len(call.tasks) for call in self._calls.values()) + len(self._done)

    def _unfinished(self) -> Iterator[_Task]:
        yield from self._queue
        for call in self._calls.values():
            yield from call.tasks

    @property
    def busy_clients(self) -> set[int]:
        return {t.spec.plan.client for t in self._unfinished()} | {r.client for _, _, r in self._done}

    def submit(
        self,
        client: int,
        fn: Any,
        *,
        round: int | None = None,
        phase: str = "train",
        min_forward_samples: int = 0,
        min_backward_samples: int = 0,
        keep: tuple[str, ...] = (),
        **payload: Any,
    ) -> int:
        """Dispatch `fn` on `client` now (simulated) against model version `fed.model_version`.

        `min_*_samples` promise work the client will certainly do (e.g. local steps x batch);
        the tighter the promise, the more tasks run in parallel. A broken promise raises.
        `round` keys the client's random streams; by default each task gets its own.
        `keep` names the model-shaped outputs the server only sums (`fed.weighted_sum`): the
        round pipeline (privacy, compression, robust) transforms them on the host."""

        fed = self.fed
        seq = self._seq
        self._seq += 1
        key = seq if round is None else round
        plan = plan_task(fed.system, fed.seed, client, seq, key, fed.now, fed.model_version)
        task = fed.new_task_ids([client])[client]
        uploads = fed.pipeline.upload_spec(tuple(keep), [client]) if fed.pipeline is not None and keep else None
        self._add(TaskSpec(plan, fn, payload, key, phase, min_forward_samples, min_backward_samples, task, uploads))
        return seq

    def _host_of(self, spec: TaskSpec) -> int:
        """Where a task runs: its client's host, or for a task that may run anywhere the hosts
        in turn by submission number. That depends on the submissions alone, not on when hosts
        answer, so a resumed or replayed run puts every task where the first run did."""
        if self._placement(spec.fn)[1]:
            return spec.plan.seq % len(self.fed.hosts)
        return self.fed.host_of(spec.plan.client)

    def _add(self, spec: TaskSpec, rerun: bool = False) -> None:
        """Queue a task whose function keeps no client state; send any other at once."""
        fed = self.fed
        min_flops = fed.system.flops(spec.min_forward, spec.min_backward)
        ref, nbytes = self._put(spec.payload)
        bound = lower_bound_finish(spec.plan, fed.system, nbytes, min_flops)
        task = _Task(spec, bound, ref, self._host_of(spec), self._placement(spec.fn)[0], rerun)
        self._specs[spec.plan.seq] = spec
        if task.deferred:
            self._queue.append(task)
        else:
            self._send(task.host, [task])
        killed = fed.hosts.count_dispatch(1)
        if killed is not None:
            self._find_dead(killed)

    def _find_dead(self, h: int) -> None:
        """engine.kill_host_every killed host `h`: wait for its calls (an empty one where it has
        none in flight) to fail, so it is replaced now, not at its next use, which may never
        come before the run ends."""
        import ray

        dead = self.fed.hosts[h]
        while self.fed.hosts[h] is dead:  # a call may still have returned before the kill landed
            if not any(call.host == h for call in self._calls.values()):
                self._send(h, [])
            refs = [ref for ref, call in self._calls.items() if call.host == h]
            ray.wait(refs, num_returns=len(refs))
            self._receive(refs)

    def _placement(self, fn: Any) -> tuple[bool, bool]:
        """Whether `fn`'s tasks may wait in the queue (nothing keeps client state, so no later
        settlement can change what they start from), and whether they may run on any host."""
        if fn not in self._kinds:
            fed = self.fed
            deferred = is_stateless(fn) and not (fed.pipeline is not None and fed.pipeline.keeps_client_state)
            self._kinds[fn] = (deferred, deferred and fed.runs_anywhere(fn))
        return self._kinds[fn]

    def _send(self, h: int, tasks: list[_Task]) -> None:
        """One call to host `h` running `tasks` in order, with the decisions it has not seen."""
        fed = self.fed
        refs: dict[Any, int] = {}  # payload reference -> its argument index
        items = []
        for t in tasks:
            spec, c = t.spec, t.spec.plan.client
            uploads = getattr(spec, "uploads", None)  # a checkpoint from before the pipeline has none
            fed.remember_input(spec.task, TaskInput(c, spec.fn, spec.key, t.payload_ref, None, None, spec.task, uploads))
            index = refs.setdefault(t.payload_ref, len(refs))
            rows = fed.population.rows_of(c) if h != fed.host_of(c) else None
            items.append(HostTask(spec.fn, c, spec.key, index, spec.task, uploads, rows))
        future = fed.hosts[h].run_tasks.remote(items, fed.take_decisions(h), *refs)
        self._calls[future] = _Call(h, tasks, time.monotonic())

    def _flush(self) -> None:
        """Send every queued task, one call per host."""
        batches: dict[int, list[_Task]] = {}
        for t in self._queue:
            batches.setdefault(t.host, []).append(t)
        self._queue = []
        for h, batch in batches.items():
            self._send(h, batch)

    def host_replaced(self, h: int) -> None:
        """Host `h` was replaced (by this pool or by any other call that found it dead): launch
        its unfinished tasks again (same plans, task ids and seeds, so they return what they
        would have), and those finished but not yet committed, whose staged state died with
        it. Its calls still in flight are forgotten, so their failure replaces nothing."""
        calls = [self._calls.pop(ref) for ref in [r for r, call in self._calls.items() if call.host == h]]
        lost = [t.spec for call in calls for t in call.tasks]
        again = [entry for entry in self._done if entry[2].host == h]
        for entry in again:
            self._done.remove(entry)
        for spec in [*lost, *(self._specs[entry[2].seq] for entry in again)]:  # taken out first: a launch
            self._add(spec, rerun=True)  # may kill and replace a host in turn

    def snapshot(self) -> dict[str, Any]:
        """The pool as data, for a checkpoint: the next sequence number and the specs of every
        task not yet committed, in submission order."""
        return {"seq": self._seq, "tasks": [self._specs[q] for q in sorted(self._specs)]}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Launch a checkpoint's in-flight tasks again (the client states they started from
        are the committed ones restored with them: a busy client commits nothing)."""
        self._seq = snapshot["seq"]
        for spec in snapshot["tasks"]:
            self._add(spec)

    def _put(self, payload: dict[str, Any]) -> tuple[Any, int]:
        """A payload's object reference and its size on the wire. It goes into the object store
        once while the same objects are sent (FedBuff sends one model version to many
        clients); the cache holds the objects, so identity comparison is safe."""
        import ray

        cached = self._payload_cache
        if cached is not None and cached[0].keys() == payload.keys() and all(cached[0][k] is payload[k] for k in payload):
            return cached[1], cached[2]
        ref, nbytes = ray.put(payload), payload_nbytes(payload)
        self._payload_cache = (dict(payload), ref, nbytes)
        return ref, nbytes

    def in_flight(self) -> list[TaskPlan]:
        """Plans of the tasks not yet handed out by next()."""
        return [spec.plan for spec in self._specs.values()]

    def next(self, max_staleness: int | None = None) -> ClientResult:
        """The next event in simulated time; advances the clock to it and logs the task. Its
        outcome is ok, dropped, offline, or stale (an ok update older than `max_staleness`
        versions, which must not be applied). Raises if nothing is in flight."""
        if not len(self):
            raise RuntimeError("no client task in flight")
        while True:
            self._collect()
            head = self._committable()
            if head is not None:
                self._done.remove(head)
                return self._commit(head[2], max_staleness)
            # an unfinished task may still come first: send what is queued and wait for a result
            self._flush()
            self._wait()

    def _committable(self) -> tuple[float, int, ClientResult] | None:
        """The earliest finished task, if no unfinished task can still come before it."""
        if not self._done:
            return None
        head = min(self._done, key=lambda e: (e[0], e[1]))
        return head if all((head[0], head[1]) <= t.order for t in self._unfinished()) else None

    def _collect(self) -> None:
        """Take in every call that has returned."""
        import ray

        if self._calls:
            ready, _ = ray.wait(list(self._calls), num_returns=len(self._calls), timeout=0)
            self._receive(ready)

    def _wait(self) -> None:
        """Wait for a call to return; a host whose oldest call outlived engine.task_timeout is
        treated as dead."""
        import ray

        timeout = self.fed.cfg.engine.task_timeout
        ready, _ = ray.wait(list(self._calls), num_returns=1, timeout=timeout)
        self._receive(ready)
        if not ready and timeout is not None:
            oldest = min(self._calls.values(), key=lambda call: call.launched)
            if time.monotonic() - oldest.launched >= timeout:  # hung: treat as dead
                self.fed.replace_host(oldest.host)

    def _receive(self, refs: list[Any]) -> None:
        """Settle the tasks of returned calls; a call whose host died launches its host's tasks
        again."""
        import ray

        for ref in refs:
            call = self._calls.get(ref)
            if call is None:  # re-launched by an earlier failure in this batch
                continue
            try:
                records = ray.get(ref)
            except host_lost():
                self.fed.replace_host(call.host)
                continue
            del self._calls[ref]
            for t, rec in zip(call.tasks, records, strict=True):
                self._finished(t, rec)

    def _finished(self, t: _Task, rec: dict[str, Any]) -> None:
        spec = t.spec
        if rec["forward_samples"] < spec.min_forward or rec["backward_samples"] < spec.min_backward:
            raise RuntimeError(
                f"client {spec.plan.client} did less work than its submit() promised "
                f"({rec['forward_samples']}/{rec['backward_samples']} < {spec.min_forward}/{spec.min_backward} samples)"
            )
        result = settle(spec.plan, rec, self.fed.system, spec.key)
        result.task = spec.task
        result.extra["phase"] = spec.phase
        if t.rerun:
            result.extra["rerun"] = True
        self._done.append((result.finish_time, spec.plan.seq, result))

    def _commit(self, result: ClientResult, max_staleness: int | None) -> ClientResult:
        fed = self.fed
        self._specs.pop(result.seq, None)
        fed.clock.advance_to(result.finish_time)
        result.staleness = fed.model_version - result.version
        if result.outcome == OK and max_staleness is not None and result.staleness > max_staleness:
            result.outcome = STALE
        fed.runlog.record_tasks([result], result.round, result.extra.get("phase", "train"))
        fed.decide([result])
        return result

    def drain(self) -> None:
        """Let what is still running at the end of a run finish, and discard it unlogged (its
        events lie after the run's last committed event), its staged client state with it.
        Queued tasks are dropped unsent."""
        import ray

        if self._calls:
            ray.wait(list(self._calls), num_returns=len(self._calls))
        where = {t.spec.plan.seq: t.host for t in self._unfinished()} | {r.seq: r.host for _, _, r in self._done}
        for seq, spec in self._specs.items():
            self.fed.discard(where[seq], spec.task)
        self._queue.clear()
        self._calls.clear()
        self._done.clear()
        self._specs.clear()
