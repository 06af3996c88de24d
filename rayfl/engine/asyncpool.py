"""Asynchronous client tasks, committed in simulated-time order and executed in parallel.

Every submitted task starts running on its host at once. `next()` returns the task whose event
(finish or failure) is earliest on the simulated clock, but only once no task still running
could have an earlier event: each running task has a lower bound on its event time, known at
dispatch (latency + download + the work it is guaranteed to do). So the commit order is the
exact simulated order whatever order Ray finishes in, while tasks whose inputs are fixed run
concurrently across hosts. Ties break by submission order.
"""

from __future__ import annotations

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


@dataclass
class _Running:
    plan: TaskPlan
    future: Any
    bound: float
    min_forward: int
    min_backward: int
    round: int
    phase: str


class AsyncPool:
    """In-flight client tasks of an asynchronous algorithm (FedAsync, FedBuff, async FFGG)."""

    def __init__(self, fed: Federation):
        self.fed = fed
        self._running: dict[Any, _Running] = {}  # ObjectRef -> task
        self._done: list[tuple[float, int, ClientResult]] = []
        self._seq = 0
        self._plans: dict[int, TaskPlan] = {}
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
        **payload: Any,
    ) -> int:
        """Dispatch `fn` on `client` now (simulated) against model version `fed.model_version`.

        `min_*_samples` promise work the client will certainly do (e.g. local steps x batch);
        the tighter the promise, the more tasks run in parallel. A broken promise raises.
        `round` keys the client's random streams; by default each task gets its own."""

        fed = self.fed
        seq = self._seq
        self._seq += 1
        key = seq if round is None else round
        plan = plan_task(fed.system, fed.seed, client, seq, key, fed.now, fed.model_version)
        ref = self._payload_ref(payload)
        host = fed.hosts[int(fed.host_of(client))]
        future = host.run.remote(fn, [client], key, ref, None, None)
        bytes_down = payload_nbytes(payload)
        min_flops = fed.system.flops(min_forward_samples, min_backward_samples)
        bound = lower_bound_finish(plan, fed.system, bytes_down, min_flops)
        self._plans[seq] = plan
        self._running[future] = _Running(plan, future, bound, min_forward_samples, min_backward_samples, key, phase)
        return seq

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
        return [t.plan for t in self._running.values()] + [self._plans[r.seq] for _, _, r in self._done]

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
                self._settle(ref)
            if self._done:
                head = min(self._done, key=lambda e: (e[0], e[1]))
                if all((head[0], head[1]) <= (t.bound, t.plan.seq) for t in self._running.values()):
                    self._done.remove(head)
                    return self._commit(head[2], max_staleness)
            # an unfinished task may still come first: wait for any to finish
            ray.wait(list(self._running), num_returns=1)

    def _settle(self, ref: Any) -> None:
        import ray

        task = self._running.pop(ref)
        (rec,) = ray.get(ref)
        if rec["forward_samples"] < task.min_forward or rec["backward_samples"] < task.min_backward:
            raise RuntimeError(
                f"client {task.plan.client} did less work than its submit() promised "
                f"({rec['forward_samples']}/{rec['backward_samples']} < {task.min_forward}/{task.min_backward} samples)"
            )
        result = settle(task.plan, rec, self.fed.system, task.round)
        result.extra["phase"] = task.phase
        self._done.append((result.finish_time, task.plan.seq, result))

    def _commit(self, result: ClientResult, max_staleness: int | None) -> ClientResult:
        fed = self.fed
        self._plans.pop(result.seq, None)
        fed.clock.advance_to(result.finish_time)
        result.staleness = fed.model_version - result.version
        if result.outcome == OK and max_staleness is not None and result.staleness > max_staleness:
            result.outcome = STALE
        fed.record_tasks([result], result.round, result.extra.get("phase", "train"))
        return result

    def drain(self) -> None:
        """Let what is still running at the end of a run finish, and discard it unlogged (its
        events lie after the run's last committed event)."""
        import ray

        if self._running:
            ray.wait(list(self._running), num_returns=len(self._running))
        self._running.clear()
        self._done.clear()
        self._plans.clear()
