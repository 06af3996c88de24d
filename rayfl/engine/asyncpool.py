"""Asynchronous client tasks, committed in simulated-time order and executed in parallel.

Every submitted task starts running on its host at once. `next()` returns the task whose event
(finish or failure) is earliest on the simulated clock, but only once no task still running
could have an earlier event: each running task has a lower bound on its event time, known at
dispatch (latency + download + the work it is guaranteed to do). So the commit order is the
exact simulated order whatever order Ray finishes in, while tasks whose inputs are fixed run
concurrently across hosts. Ties break by submission order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from rayfl.engine.federation import Federation


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
class _Running:
    spec: TaskSpec
    future: Any
    bound: float
    rerun: bool = False
    launched: float = 0.0  # wall clock, for engine.task_timeout

    @property
    def plan(self) -> TaskPlan:
        return self.spec.plan


class AsyncPool:
    """In-flight client tasks of an asynchronous algorithm (FedAsync, FedBuff, async FFGG)."""

    def __init__(self, fed: Federation):
        self.fed = fed
        self._running: dict[Any, _Running] = {}  # ObjectRef -> task
        self._done: list[tuple[float, int, ClientResult]] = []
        self._specs: dict[int, TaskSpec] = {}  # seq -> spec, until committed
        self._seq = 0
        self._payload_cache: tuple[dict[str, Any], Any] | None = None

    def __len__(self) -> int:
        return len(self._running) + len(self._done)

    @property
    def busy_clients(self) -> set[int]:
        return {t.plan.client for t in self._running.values()} | {r.client for _, _, r in self._done}

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
        spec = TaskSpec(plan, fn, payload, key, phase, min_forward_samples, min_backward_samples, task, uploads)
        self._launch(spec)
        return seq

    def _launch(self, spec: TaskSpec, rerun: bool = False) -> None:
        fed = self.fed
        client = spec.plan.client
        h = int(fed.host_of(client))
        ref = self._payload_ref(spec.payload)
        uploads = getattr(spec, "uploads", None)  # a checkpoint from before the pipeline has none
        fed.remember_input(spec.task, TaskInput(client, spec.fn, spec.key, ref, None, None, spec.task, uploads))
        future = fed.hosts[h].run.remote(spec.fn, [client], spec.key, ref, None, None, {client: spec.task}, fed.take_decisions(h),
                                         uploads=uploads)
        min_flops = fed.system.flops(spec.min_forward, spec.min_backward)
        bound = lower_bound_finish(spec.plan, fed.system, payload_nbytes(spec.payload), min_flops)
        self._specs[spec.plan.seq] = spec
        self._running[future] = _Running(spec, future, bound, rerun, time.monotonic())
        fed.count_dispatch(1)

    def _relaunch_host(self, h: int) -> None:
        """Host `h` died or hung: replace it and launch its unfinished tasks again (same plans,
        task ids and seeds, so they return what they would have)."""
        self.fed.replace_host(h)
        lost = [ref for ref, t in self._running.items() if int(self.fed.host_of(t.plan.client)) == h]
        for ref in lost:
            self._launch(self._running.pop(ref).spec, rerun=True)
        # finished but not yet committed: their staged state died with the host, so run again
        again = [entry for entry in self._done if entry[2].host == h]
        for entry in again:
            self._done.remove(entry)
            self._launch(self._specs[entry[2].seq], rerun=True)

    def snapshot(self) -> dict[str, Any]:
        """The pool as data, for a checkpoint: the next sequence number and the specs of every
        task not yet committed, in submission order."""
        return {"seq": self._seq, "tasks": [self._specs[q] for q in sorted(self._specs)]}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Launch a checkpoint's in-flight tasks again (the client states they started from
        are the committed ones restored with them: a busy client commits nothing)."""
        self._seq = snapshot["seq"]
        for spec in snapshot["tasks"]:
            self._launch(spec)

    def _payload_ref(self, payload: dict[str, Any]) -> Any:
        """Put a payload into the object store once, reusing it while the same objects are sent
        (FedBuff sends one model version to many clients). The cache holds the objects, so
        identity comparison is safe."""
        import ray

        cached = self._payload_cache
        if cached is not None and cached[0].keys() == payload.keys() and all(cached[0][k] is payload[k] for k in payload):
            return cached[1]
        ref = ray.put(payload)
        self._payload_cache = (dict(payload), ref)
        return ref

    def in_flight(self) -> list[TaskPlan]:
        """Plans of the tasks not yet handed out by next()."""
        return [spec.plan for spec in self._specs.values()]

    def next(self, max_staleness: int | None = None) -> ClientResult:
        """The next event in simulated time; advances the clock to it and logs the task. Its
        outcome is ok, dropped, offline, or stale (an ok update older than `max_staleness`
        versions, which must not be applied). Raises if nothing is in flight."""
        import ray

        if not self._running and not self._done:
            raise RuntimeError("no client task in flight")
        while True:
            ready, _ = ray.wait(list(self._running), num_returns=len(self._running), timeout=0) if self._running else ([], [])
            for ref in ready:
                if ref in self._running:  # not re-launched by an earlier failure in this batch
                    self._settle(ref)
            if self._done:
                head = min(self._done, key=lambda e: (e[0], e[1]))
                if all((head[0], head[1]) <= (t.bound, t.plan.seq) for t in self._running.values()):
                    self._done.remove(head)
                    return self._commit(head[2], max_staleness)
            # an unfinished task may still come first: wait for any to finish
            timeout = self.fed.cfg.engine.task_timeout
            ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout)
            if not ready and timeout is not None:
                oldest = min(self._running.values(), key=lambda t: t.launched)
                if time.monotonic() - oldest.launched >= timeout:  # hung: treat as dead
                    self._relaunch_host(int(self.fed.host_of(oldest.plan.client)))

    def _settle(self, ref: Any) -> None:
        import ray

        try:
            (rec,) = ray.get(ref)
        except host_lost():
            self._relaunch_host(int(self.fed.host_of(self._running[ref].plan.client)))
            return
        running = self._running.pop(ref)
        spec = running.spec
        if rec["forward_samples"] < spec.min_forward or rec["backward_samples"] < spec.min_backward:
            raise RuntimeError(
                f"client {spec.plan.client} did less work than its submit() promised "
                f"({rec['forward_samples']}/{rec['backward_samples']} < {spec.min_forward}/{spec.min_backward} samples)"
            )
        result = settle(spec.plan, rec, self.fed.system, spec.key)
        result.task = spec.task
        result.extra["phase"] = spec.phase
        if running.rerun:
            result.extra["rerun"] = True
        self._done.append((result.finish_time, spec.plan.seq, result))

    def _commit(self, result: ClientResult, max_staleness: int | None) -> ClientResult:
        fed = self.fed
        self._specs.pop(result.seq, None)
        fed.clock.advance_to(result.finish_time)
        result.staleness = fed.model_version - result.version
        if result.outcome == OK and max_staleness is not None and result.staleness > max_staleness:
            result.outcome = STALE
        fed.record_tasks([result], result.round, result.extra.get("phase", "train"))
        fed.decide([result])
        return result

    def drain(self) -> None:
        """Let what is still running at the end of a run finish, and discard it unlogged (its
        events lie after the run's last committed event), its staged client state with it."""
        import ray

        if self._running:
            ray.wait(list(self._running), num_returns=len(self._running))
        for spec in self._specs.values():
            self.fed.discard(int(self.fed.host_of(spec.plan.client)), spec.task)
        self._running.clear()
        self._done.clear()
        self._specs.clear()
