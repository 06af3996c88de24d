"""The asynchronous driver: any algorithm built from parts, with clients training continuously.

`concurrency` clients train at any time, each from the server state current when it was
dispatched (its model version). The Federation's AsyncPool hands back arrivals in simulated
order while tasks whose inputs are known run in parallel across hosts. Every `buffer_size`
arrivals the server applies the algorithm's own `server_update` to the buffer, its uploads
combined with weights s(staleness_k) * w_k / sum w (rayfl.driver.rounds.normalized), through
the round pipeline when one is on, then the `server:` section's optimizer on the step's model
change, and counts one more model version. An arrival's staleness
is the number of server steps applied since its download.

A checkpoint holds the algorithm's state, the model versions clients in flight downloaded,
how many dispatch draws were made and (in the pool) the tasks in flight, so a resumed or
replayed run gives the uninterrupted run's tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.driver.parts import Algorithm, Round
from rayfl.driver.rounds import check_finite, eval_due
from rayfl.driver.server_optimizer import ServerOptimizer
from rayfl.driver.settings import AsynchronyConfig, staleness_weight
from rayfl.driver.sync import combined

if TYPE_CHECKING:
    from rayfl.engine import AsyncPool, ClientResult, Federation

@dataclass
class AsyncServerState:
    """What the asynchronous driver checkpoints: the algorithm's own state, the models that
    clients still in flight downloaded (by version), and how many dispatch draws were made."""

    state: Any
    models: dict[int, Any] = field(default_factory=dict)
    picks: int = 0


class Dispatcher:
    """Who runs the next asynchronous task, and when: `fill` keeps `concurrency` tasks in
    flight before each arrival is taken; `failed`, `arrived` and `stepped` may dispatch more
    (a failed task replaced, a new job before or after the server step)."""

    def __init__(self, alg: Algorithm, settings: AsynchronyConfig, run_state: AsyncServerState):
        self.alg, self.settings, self.run_state = alg, settings, run_state
        self.fed = alg.fed
        self.pool: AsyncPool = self.fed.async_pool()
        # Central DP's sensitivity bound: a client is in a step's buffer at most once, so the
        # clients already in it are not dispatched again until the step
        pipeline = self.fed.pipeline
        self.once_per_step = pipeline is not None and pipeline.privacy is not None and pipeline.privacy.mode == "central"
        self.buffered: set[int] = set()
        self._payload: tuple[Any, Round, dict[str, Any]] | None = None

    def payload_of(self, state: Any, rnd: Round) -> dict[str, Any]:
        """The algorithm's payload for `state` in `rnd`, made once per server step: the same
        objects for every task of the step, so the pool puts them into the object store once."""
        cached = self._payload
        if cached is None or cached[0] is not state or cached[1] is not rnd:
            cached = self._payload = (state, rnd, self.alg.payload(state, rnd))
        return cached[2]

    def submit(self, client: int, state: Any, rnd: Round, payload: dict[str, Any] | None = None) -> None:
        """Dispatch the algorithm's client function on `client` from `state`."""
        alg = self.alg
        payload = self.payload_of(state, rnd) if payload is None else payload
        mine = alg.per_client(state, rnd, [client])
        if mine:
            payload = {**payload, **mine[client]}
        forward, backward = alg.promised_work(client, payload)
        self.pool.submit(client, alg.client, min_forward_samples=forward, min_backward_samples=backward,
                         keep=alg.uploads, **payload)

    def draw(self) -> int | None:
        """An idle client (online, trainable, not in flight), uniformly, from the stream
        (seed, 'async.sample', draw number)."""
        busy = self.pool.busy_clients | self.buffered if self.once_per_step else self.pool.busy_clients
        client = self.fed.population.sample_idle(busy, key=self.run_state.picks)
        self.run_state.picks += 1
        return client

    def fill(self, state: Any, rnd: Round) -> None:
        """Keep `concurrency` tasks in flight, from the current state."""
        self.run_state.models[self.fed.model_version] = self.alg.model_of(state)
        while len(self.pool) < self.settings.concurrency:
            client = self.draw()
            if client is None:
                break
            self.submit(client, state, rnd)

    def failed(self, res: ClientResult, state: Any, rnd: Round) -> None:
        """A task that will not be applied (dropped, offline, stale, non-finite)."""

    def arrived(self, res: ClientResult, state: Any, rnd: Round) -> None:
        """An arrival taken into the buffer, before the server step."""

    def stepped(self, buffer: list[ClientResult], state: Any, rnd: Round) -> None:
        """After the server step (`state` is the new one)."""

    def forget_old_versions(self) -> None:
        live = {plan.version for plan in self.pool.in_flight()} | {self.fed.model_version}
        self.run_state.models = {v: m for v, m in self.run_state.models.items() if v in live}


class IdleClients(Dispatcher):
    """FedAsync's and FedBuff's dispatch: a finished client is replaced by an idle one."""


def run_async(fed: Federation, alg: Algorithm, settings: AsynchronyConfig) -> dict[str, Any]:
    """Run `alg` for `run.rounds` asynchronous server steps."""
    if alg.phases() != [alg]:
        raise ValueError(f"{type(alg).__name__} calls its clients more than once a step; the asynchronous driver "
                         "applies one call's arrivals")
    run_state = fed.track(AsyncServerState(state=alg.init()))
    fed.model_of = lambda tracked: alg.model_of(tracked.state)
    state = run_state.state
    alg.start(state)
    disp = alg.dispatcher(settings, run_state) or IdleClients(alg, settings, run_state)
    optimizer = ServerOptimizer.of(alg)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(alg.rounds()):
        rnd = Round(r, [], alg.run.rounds, asynchronous=True)
        buffer: list[ClientResult] = []
        while len(buffer) < settings.buffer_size:
            disp.fill(state, rnd)
            res = disp.pool.next(max_staleness=settings.max_staleness)
            if not res.ok:
                disp.failed(res, state, rnd)
                continue
            buffer.append(res)
            disp.buffered.add(res.client)
            disp.arrived(res, state, rnd)
        disp.buffered.clear()
        if fed.pipeline is not None:  # the buffer is this step's upload call
            fed.pipeline.keys = alg.uploads
            fed.pipeline.after_call(buffer)
        rnd.cohort = [res.client for res in buffer]  # the step's clients: those whose arrivals it applies
        staleness = np.array([res.staleness for res in buffer], dtype=np.int64)
        factors = np.array([staleness_weight(settings, int(t)) for t in staleness], dtype=np.float64)
        downloaded = [run_state.models.get(res.version) for res in buffer]
        uploads = combined(fed, alg, state, buffer, rnd, staleness, factors, downloaded)
        start = optimizer.start(state) if optimizer is not None else None
        state = alg.server_update(state, uploads, rnd)
        if optimizer is not None:
            state = optimizer(start, state)
        run_state.state = state
        check_finite(alg.model_of(state), r, *alg.diverged)
        fed.advance_version()
        disp.stepped(buffer, state, rnd)
        disp.forget_old_versions()
        metrics = alg.metrics(state, uploads, rnd)
        if not any(key.startswith("staleness") for key in metrics):  # every asynchronous row says how stale
            metrics.update(staleness_mean=float(np.mean(staleness)), staleness_max=int(staleness.max()))
        if eval_due(r, alg.run):
            metrics.update(alg.evaluate(state, rnd))
        fed.log_round(r, **metrics)
    disp.pool.drain()
    return alg.summary(state, metrics)
