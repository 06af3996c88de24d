"""`Federation`: the driver-side handle an algorithm's server loop uses.

The algorithm is plain Python; the Federation hides Ray (hosts, object store, futures), the
simulated clock and the results writer. A synchronous step is

    results = fed.call(client_ids, client_fn, round=r, params=x, lr=0.1)

which ships the broadcast payload once through the object store, makes one remote call per
host, gathers the records, charges each client's task on the simulated clock and logs one
`clients` row per task. Results come back sorted by client id, so any aggregation the algorithm
does in that order is identical whatever the number of hosts or the order futures finish in.

The Federation is the host and call machinery (calls and their settlement, the journal that
replays a dead host's clients, exact sums of outputs kept on hosts, the clock, task ids); its
parts hold the clients and their sampling (`population`), the host actors (`hosts`), the rows,
callbacks and checkpoints (`runlog`) and the model on the driver (rayfl.engine.evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from rayfl.callbacks.base import Callback
from rayfl.config import Config
from rayfl.data import FederatedDataset
from rayfl.data.rows import is_file_rows, server_rows
from rayfl.engine.asyncpool import AsyncPool, TaskInput, host_lost
from rayfl.engine.balance import balanced_assignment, expected_rows, is_stateless
from rayfl.engine.checkpoint import Checkpoint
from rayfl.engine.clock import SimClock
from rayfl.engine.evaluation import ServerData, evaluate_arrays, initial_model_params
from rayfl.engine.exact_sum import (
    PRESUM,
    KeptValue,
    common_exponent,
    fixed_point_sum,
    max_abs,
    to_float,
)
from rayfl.engine.host import ClientFn
from rayfl.engine.hosts import Hosts
from rayfl.engine.partials import Expected, Partial, total_weight
from rayfl.engine.placement import Placement
from rayfl.engine.population import Population
from rayfl.engine.resources import check_cluster
from rayfl.engine.runlog import ProgressFn, RunLog
from rayfl.engine.system import SystemModel, forward_flops_per_sample
from rayfl.engine.tasks import (
    NONFINITE,
    ClientResult,
    NonFiniteUpdateError,
    close_round,
    deadline_budgets,
    nonfinite_keys,
    plan_task,
    settle,
)
from rayfl.models import build_model
from rayfl.pipeline.server import RoundPipeline

T = TypeVar("T")


@dataclass
class KeptCall:
    """The last `call`'s outputs kept on hosts (`keep`): which keys, and what its accepted
    tasks were given, to run them again should a host die before `weighted_sum` reads them."""

    keep: tuple[str, ...]
    inputs: dict[int, TaskInput]  # task id -> its input
    hosts: dict[int, int]  # task id -> the host that ran it (and keeps its outputs)


class Federation:
    """One run's hosts and the calls to them, its simulated clock and task ids. Its parts:
    `population` (the clients and their sampling), `hosts` (the actors, `hosts[h]`) and
    `runlog` (rows, callbacks, checkpoints)."""

    pipeline: RoundPipeline | None = None  # the run's privacy / compression / robust, set in __init__
    model_of: Callable[[Any], Any] | None = None  # the global model of a tracked state (set by the drivers)

    def __init__(
        self,
        cfg: Config,
        dataset: FederatedDataset,
        writer: Any | None = None,
        progress: ProgressFn | None = None,
        resume: Checkpoint | None = None,
        callbacks: Sequence[Callback] = (),
        placement: Placement | None = None,
    ):
        """`placement`: the hosts' layout as `rayfl.engine.resources.check_cluster` planned and
        checked it on the joined cluster (the runner's); None plans and checks it here.
        `resume`: the checkpoint a resumed run continues from."""
        import ray

        self.cfg = cfg
        self.dataset = dataset
        self.seed = cfg.run.seed
        self.runlog = RunLog(self, writer, progress, callbacks)  # its wall clock starts now
        self._resume = resume
        self.clock = SimClock(resume.clock if resume is not None else 0.0)
        self.model_version = resume.model_version if resume is not None else 0
        self._next_task = resume.next_task if resume is not None else 0
        self.start_round = resume.round + 1 if resume is not None else 0  # the first round still to run
        self.server_state: Any = None
        self.driver_state: dict[str, Any] = dict(getattr(resume, "driver", {}) or {})  # checkpointed
        self._decisions: dict[int, dict[int, bool]] = {}  # host -> {task id: accepted}
        self.pools: list[AsyncPool] = []  # every async pool made, in order (a checkpoint holds their tasks)
        self._inputs: dict[int, TaskInput] = {}  # task id -> what it was given, until decided
        self._kept_call: KeptCall | None = None  # the last call's outputs kept on hosts
        self._presums: dict[int, dict[str, list[Partial]]] = {}  # host -> key -> partial sums
        self._exponents: dict[str, int] = {}  # key -> its last weighted sum's grid exponent
        self.presums_used = 0  # host partial sums taken from a call's answer, without asking again
        self._journal: list[TaskInput] = []  # accepted state-changing tasks since the checkpoint
        self.tasks_discarded = 0  # in flight when an async run ended: never logged
        self.client_tags: dict[int, dict[str, Any]] = {}  # extra `clients` columns per client (e.g. byzantine)

        # the server's own rows, read from the files now when the hosts read the train features
        self._server_x = server_rows(dataset.train_x, dataset.server_train)
        self.model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.forward_flops = forward_flops_per_sample(self.model, dataset.input_shape)
        self.system = SystemModel(cfg.system, dataset.num_clients, self.forward_flops, self.seed)
        self.population = Population(cfg, dataset, self.system, self.clock)
        self.placement = placement if placement is not None else check_cluster(cfg.engine, dataset.num_clients)
        self.hosts = Hosts(cfg, dataset, self.placement, self.forward_flops)
        self.pipeline = RoundPipeline.of(cfg, self)  # privacy, compression, robust (None: all off)
        self.hosts.start()
        if resume is not None:
            try:
                states = resume.client_states
                ray.get([self.hosts[h].import_states.remote({c: states[c] for c in cs})
                         for h, cs in self.by_host(states).items()])
                self.runlog.restore(resume)
            except BaseException:  # the hosts (and any pooled ones leased) go with the failed start
                self.shutdown()
                raise
        self.runlog.callbacks.start(resumed=resume is not None)

    def shutdown(self) -> None:
        """Stop the run's hosts (pooled ones go back to the pool, emptied)."""
        self.hosts.shutdown()

    # ------------------------------------------------------------------ clients

    @property
    def num_clients(self) -> int:
        """Clients in the run, trainable or not."""
        return self.population.num_clients

    @property
    def client_sizes(self) -> np.ndarray:
        """Training samples per client (read-only)."""
        return self.population.sizes

    def client_weights(self, client_ids: list[int] | None = None, kind: str = "samples") -> np.ndarray:
        """Aggregation weights over `client_ids` summing to 1, by sample count or uniform."""
        return self.population.weights(client_ids, kind)

    @property
    def trainable_clients(self) -> np.ndarray:
        """Clients holding at least one training sample: the only ones ever sampled to train."""
        return self.population.trainable

    def sample(self, round: int, k: int | None = None, fraction: float | None = None) -> list[int]:
        """Uniform participation without replacement among the clients online now, seeded by
        (seed, 'sample', round): the same clients whatever the placement. Over-selection picks
        more and keeps the first k to finish (`Population.sample`); DP's Poisson sampling
        draws each client with the pipeline's rate."""
        poisson = self.pipeline.mechanism.rate if self.pipeline is not None and self.pipeline.poisson else None
        return self.population.sample(round, k, fraction, poisson)

    @property
    def now(self) -> float:
        """Simulated seconds since the start of the run."""
        return self.clock.now

    def host_of(self, client: int) -> int:
        """The host that holds `client` (its state, its rows)."""
        return self.placement.host_of(client)

    def by_host(self, client_ids: Iterable[int]) -> dict[int, list[int]]:
        """The clients grouped by the host that holds them, in the order given."""
        groups: dict[int, list[int]] = {}
        for c in client_ids:
            groups.setdefault(self.host_of(c), []).append(int(c))
        return groups

    def assign(self, ids: list[int], fn: ClientFn, payload: Mapping[str, Any],
               per_client: Mapping[int, Mapping[str, Any]] | None) -> dict[int, list[int]]:
        """Which host runs each client of a call: the one that holds it, or under
        `engine.balance: auto` for a stateless client function (rayfl.engine.balance) the
        hosts' work evened out. Not for data the hosts make or read themselves (lazy,
        FileRows)."""
        if not self.runs_anywhere(fn):
            return self.by_host(ids)
        sizes = self.client_sizes
        work = [expected_rows(int(sizes[c]), {**payload, **(per_client.get(c, {}) if per_client else {})}) for c in ids]
        return balanced_assignment(ids, work, len(self.hosts))

    def runs_anywhere(self, fn: ClientFn) -> bool:
        """Whether `fn`'s tasks may run on any host (`assign`, the async pool): under
        `engine.balance: auto`, for a stateless function, with nothing else keeping client
        state, on data every host maps."""
        return not (self.cfg.engine.balance != "auto" or len(self.hosts) < 2 or not is_stateless(fn)
                    or (self.pipeline is not None and self.pipeline.keeps_client_state)
                    or getattr(self.dataset, "source", None) is not None or is_file_rows(self.dataset.train_x))

    # ------------------------------------------------------------------ the server loop's side

    def async_pool(self) -> AsyncPool:
        """A pool of asynchronous tasks committed in simulated-time order (see AsyncPool). In a
        resumed run the pool comes back with the tasks that were in flight at the checkpoint."""
        pool = AsyncPool(self)
        if self._resume is not None and len(self.pools) < len(self._resume.pools):
            pool.restore(self._resume.pools[len(self.pools)])
        self.pools.append(pool)
        return pool

    def track(self, state: T) -> T:
        """Register the server loop's state (model, control variates, buffers: one object the
        loop reads and updates) as `fed.server_state`, where checkpoints and tests find it.
        In a resumed run this returns the checkpoint's state instead of `state`.

        The pattern every algorithm follows, so it is checkpointable without code of its own:

            s = fed.track(MyState(x=fed.initial_params(), ...))
            for r in fed.rounds(run.rounds):
                ...                         # read and update s.x, s.whatever
                fed.log_round(r, **metrics)  # may checkpoint s here
        """
        if self._resume is not None:
            state = self._resume.server_state
        self.server_state = state
        return state

    def rounds(self, total: int) -> Iterator[int]:
        """The server rounds still to run: all of them, or those after a resumed checkpoint,
        until a callback stops the run (early stopping, a budget)."""
        for r in range(self.start_round, total):
            if self.runlog.stopped_early is not None:
                return
            yield r

    def advance_version(self) -> int:
        """Count one more global-model version (staleness = versions applied since download)."""
        self.model_version += 1
        return self.model_version

    def initial_params(self) -> np.ndarray:
        """The initial global model (rayfl.engine.evaluation.initial_model_params)."""
        return initial_model_params(self.cfg, self.dataset, self.seed)

    def evaluate(self, params: np.ndarray, batch_size: int = 2048) -> dict[str, float]:
        """Loss and accuracy of a global model on the global test set (on the driver)."""
        return evaluate_arrays(self.model, params, self.dataset.test_x, self.dataset.test_y, batch_size, prefix="test_")

    @property
    def server_data(self) -> ServerData | None:
        """The data the server owns itself (`data.server_fraction`), or None."""
        return ServerData.of(self.dataset, self._server_x, self.seed)

    def log_round(self, round: int, **metrics: Any) -> None:
        """One row of `rounds`, which the callbacks see; a checkpoint follows every
        `output.checkpoint_every` rounds and when the run stops (`RunLog.log_round`)."""
        self.runlog.log_round(round, **metrics)

    def log_eval(self, round: int, metrics: Mapping[str, Any], client: int = -1, split: str = "test") -> None:
        """One row of `evals`: client -1 is the global model."""
        self.runlog.log_eval(round, metrics, client, split)

    # ------------------------------------------------------------------ calls

    def call(
        self,
        client_ids: list[int],
        fn: ClientFn,
        *,
        round: int,
        per_client: Mapping[int, Mapping[str, Any]] | None = None,
        phase: str = "train",
        timed: bool = True,
        keep: tuple[str, ...] = (),
        expect_weights: Mapping[str, Mapping[int, float]] | None = None,
        **payload: Any,
    ) -> list[ClientResult]:
        """One synchronous step: run `fn(ctx, **payload, **per_client[c])` on every client,
        apply the round policy on the simulated clock (sync, deadline, over-selection; dropouts
        and clients going offline), advance the clock and log every task. Returns the tasks the
        round counts (outcome ok), sorted by client id; late and failed tasks are only logged.
        `timed=False` runs a side computation (e.g. personalized evaluation) off the clock.

        `keep` names outputs the algorithm only ever sums (`weighted_sum`, before the next
        call): with `engine.preaggregate: on` they stay on the hosts, which return one partial
        sum each instead of one vector per client. `expect_weights` (key -> client -> weight):
        the weights the algorithm will sum a kept key with if every client is accepted; the
        hosts then sum at once, on the last round's grid, and `weighted_sum` needs no second
        call to them when its sum is that one (the same bits either way)."""
        import ray

        summed = tuple(keep)
        keep = summed if self.preaggregating else ()
        self._kept_call = None
        self._presums = {}

        ids = sorted(int(c) for c in client_ids)
        if not ids:
            return []
        uploads = None
        if self.pipeline is not None:
            self.pipeline.keys = ()  # only an upload call's sums go through the pipeline
            if summed and timed:
                self.pipeline.round = round
                uploads = self.pipeline.upload_spec(summed, ids)
        start = self.clock.now
        sys_cfg = self.cfg.system
        plans = {c: plan_task(self.system, self.seed, c, round, round, start, self.model_version) for c in ids}
        budgets = None
        if timed and sys_cfg.policy == "deadline" and sys_cfg.late_policy == "partial":
            budgets = deadline_budgets(self.system, ids, sys_cfg.deadline, payload, per_client, uploads, self.num_params)
        expected = {key: (self._exponents.get(key), weights, total_weight(weights))
                    for key, weights in (expect_weights or {}).items() if key in keep and uploads is None}
        by_host = self.assign(ids, fn, payload, per_client)
        foreign = {h: {c: self.population.rows_of(c) for c in hids if self.host_of(c) != h} for h, hids in by_host.items()}
        payload_ref = ray.put(payload)  # shipped once; hosts read it zero-copy
        tasks = self.new_task_ids(ids)
        for c in ids:
            extra = per_client.get(c) if per_client else None
            self._inputs[tasks[c]] = TaskInput(c, fn, round, payload_ref, extra, budgets.get(c) if budgets else None, tasks[c],
                                               uploads)

        def launch(h: int) -> Any:
            hids = by_host[h]
            sub = {c: per_client[c] for c in hids if c in per_client} if per_client else None
            bud = {c: budgets[c] for c in hids} if budgets is not None else None
            mine = {c: tasks[c] for c in hids}
            presum = {key: Expected(e, {tasks[c]: float(w[c]) for c in hids if c in w}, total)
                      for key, (e, w, total) in expected.items()}
            return self.hosts[h].run_call.remote(payload_ref, (fn, hids, round, sub, bud, mine, self.take_decisions(h),
                                                              keep, foreign[h] or None, uploads, presum or None))

        batches, rerun = self.on_hosts(launch, list(by_host), launched=lambda: self.hosts.count_dispatch(len(ids)))
        records = sorted((rec for batch in batches for rec in batch), key=lambda r: r["client"])
        for rec in records:
            if PRESUM in rec:
                self._presums[rec["host"]] = rec.pop(PRESUM)
        results = [settle(plans[rec["client"]], rec, self.system, round) for rec in records]
        for r in results:
            r.task = tasks[r.client]
            if r.host in rerun:
                r.extra["rerun"] = True
        if not timed:
            for r in results:
                r.finish_time = start
                if r.outcome != NONFINITE:
                    r.outcome = "ok"
        else:
            end = close_round(results, sys_cfg.policy, start, sys_cfg.deadline, self.population.keep.get(round))
            self.clock.advance_to(end)
        self.runlog.record_tasks(results, round, phase)
        if keep:  # before `decide` pops the inputs: a lost host's kept tasks are re-run from them
            accepted = [r for r in results if r.ok]
            self._kept_call = KeptCall(keep, {r.task: self._inputs[r.task] for r in accepted},
                                       {r.task: r.host for r in accepted})
        self.decide(results)
        accepted = [r for r in results if r.ok]
        if uploads is not None:
            self.pipeline.after_call(accepted)
        return accepted

    @property
    def preaggregating(self) -> bool:
        """Whether outputs only ever summed stay on the hosts (`engine.preaggregate`)."""
        mode = self.cfg.engine.preaggregate
        return mode == "on" or (mode == "auto" and not (self.pipeline is not None and self.pipeline.needs_every_update))

    # ------------------------------------------------------------------ state commits

    @property
    def tasks_issued(self) -> int:
        """Client tasks created so far (each logged once in `clients`, re-runs included, unless
        still in flight when an asynchronous run ends)."""
        return self._next_task

    def new_task_ids(self, clients: list[int]) -> dict[int, int]:
        """Fresh task ids, one per client: the handle under which a host stages a task's state."""
        ids = {c: self._next_task + i for i, c in enumerate(clients)}
        self._next_task += len(clients)
        return ids

    def decide(self, results: list[ClientResult]) -> None:
        """Settle finished tasks: an ok task's staged client state is committed, any other
        outcome's discarded. The decisions travel with the next call to each host. With
        `algorithm.nonfinite: fail` a non-finite answer then stops the run."""
        for r in results:
            self._decisions.setdefault(r.host, {})[r.task] = r.ok
            given = self._inputs.pop(r.task, None)
            if r.ok and r.state_changed and given is not None:
                self._journal.append(given)
        bad = next((r for r in results if r.outcome == NONFINITE), None)
        if bad is not None and self.cfg.algorithm.nonfinite == "fail":
            keys = ", ".join(nonfinite_keys(bad.values, bad.local_steps))
            raise NonFiniteUpdateError(
                f"client {bad.client} returned non-finite values ({keys}) in round {bad.round}; "
                "algorithm.nonfinite is 'fail' (set it to 'drop' to skip such updates)"
            )

    def discard(self, host: int, task: int) -> None:
        """Settle a task the server never read (still in flight at the end): nothing commits."""
        self._decisions.setdefault(host, {})[task] = False
        self._inputs.pop(task, None)
        self.tasks_discarded += 1

    def remember_input(self, task: int, given: TaskInput) -> None:
        """Keep what an asynchronous task was given until the server decides on it."""
        self._inputs[task] = given

    # ------------------------------------------------------------------ aggregation

    def weighted_sum(self, results: list[ClientResult], key: str, weights: Iterable[float]) -> np.ndarray:
        """`sum_k weights[k] * results[k][key]` in float64, exactly rounded onto a common
        fixed-point grid (rayfl.engine.exact_sum), so the bits never depend on how clients are
        spread over hosts. Outputs the last `call` kept on the hosts (`keep`, under
        `engine.preaggregate: on`) are summed there, one partial sum per host; the others
        (pre-aggregation off, the server's own update) here. On and off give the same bits.

        For an upload the round pipeline handles (rayfl.pipeline), the pipeline's combination
        instead: robust aggregation, or the clipped sum plus DP noise."""
        if self.pipeline is not None and key in self.pipeline.keys:
            return self.pipeline.combine(results, key, list(weights), self._exact_sum)
        return self._exact_sum(results, key, weights)

    def _exact_sum(self, results: list[ClientResult], key: str, weights: Iterable[float]) -> np.ndarray:
        """sum_k weights[k] * results[k][key], exactly (see `weighted_sum`)."""
        weights = [float(w) for w in weights]
        values = [r.values[key] for r in results]
        if not values:
            raise ValueError("weighted_sum of no results")
        if len(values) == 1:  # one term needs no grid: float64(v) * w, rounded once, on any host
            return self._one_term(results[0], key, weights[0])
        exponent = common_exponent(weights, [max_abs(v) for v in values])
        shape = values[0].shape
        local = [(v, w) for v, w in zip(values, weights, strict=True) if not isinstance(v, KeptValue)]
        total = fixed_point_sum(local, exponent, shape)
        by_host: dict[int, dict[int, float]] = {}
        for r, v, w in zip(results, values, weights, strict=True):
            if isinstance(v, KeptValue):
                if self._kept_call is None or r.task not in self._kept_call.inputs:
                    raise RuntimeError(f"{key!r} of client {r.client} was kept on its host by an earlier call; "
                                       "call fed.weighted_sum before the next fed.call")
                by_host.setdefault(r.host, {})[r.task] = w
        self._exponents[key] = exponent
        for h in list(by_host):  # partial sums the hosts made with the call, if one is this
            for exponent_then, weights_then, part in self._presums.get(h, {}).get(key, []):
                if exponent_then == exponent and weights_then == by_host[h]:
                    total += part
                    del by_host[h]
                    self.presums_used += 1
                    break
        if by_host:
            def launch(h: int) -> Any:
                return self.hosts[h].reduce.remote(key, by_host[h], exponent)

            partials, _ = self.on_hosts(launch, list(by_host), on_failure=self._rerun_kept)
            for part in partials:
                total += part
        return to_float(total, exponent)

    def _one_term(self, result: ClientResult, key: str, weight: float) -> np.ndarray:
        """weight * result[key] in float64, the value fetched from its host if it kept it."""
        value = result.values[key]
        if not isinstance(value, KeptValue):
            return np.multiply(value, weight, dtype=np.float64)
        if self._kept_call is None or result.task not in self._kept_call.inputs:
            raise RuntimeError(f"{key!r} of client {result.client} was kept on its host by an earlier call; "
                               "call fed.weighted_sum before the next fed.call")
        (total,), _ = self.on_hosts(lambda h: self.hosts[h].reduce.remote(key, {result.task: weight}, None), [result.host],
                                    on_failure=self._rerun_kept)
        return total

    def _rerun_kept(self, h: int) -> None:
        """Host `h` died holding kept outputs: rebuild its clients' states as of before the last
        call, run that call's accepted tasks again (same inputs, task ids and seeds, so the same
        outputs), commit them as the first run did, and keep their outputs again."""
        import ray

        kept = self._kept_call
        assert kept is not None
        mine = {t: given for t, given in kept.inputs.items() if kept.hosts[t] == h}
        self.replace_host(h, skip_tasks=set(mine))
        by_round: dict[Any, dict[int, TaskInput]] = {}
        for t, given in mine.items():  # one call has one (fn, round, payload); grouped to be safe
            by_round.setdefault((id(given.fn), given.key, id(given.payload_ref)), {})[t] = given
        for group in by_round.values():
            first = next(iter(group.values()))
            ids = sorted(g.client for g in group.values())
            extra = {g.client: g.extra for g in group.values() if g.extra is not None} or None
            budgets = {g.client: g.budget for g in group.values() if g.budget is not None} or None
            task_ids = {g.client: t for t, g in group.items()}
            foreign = {c: self.population.rows_of(c) for c in ids if self.host_of(c) != h} or None  # balanced here
            ray.get(self.hosts[h].run.remote(first.fn, ids, first.key, first.payload_ref, extra, budgets, task_ids,
                                             None, kept.keep, foreign, first.uploads))
            ray.get(self.hosts[h].settle.remote(dict.fromkeys(group, True)))

    # ------------------------------------------------------------------ failures

    def on_hosts(
        self, launch: Callable[[int], Any], hosts: list[int], launched: Callable[[], None] | None = None,
        on_failure: Callable[[int], None] | None = None,
    ) -> tuple[list[Any], set[int]]:
        """Gather `launch(h)` (a remote call on `self.hosts[h]`) from every host in `hosts`. A
        host that dies (killed, out of memory, node lost) or hangs past `engine.task_timeout`
        is replaced and its call launched again (client tasks with the same task ids and seeds),
        so the outcome is the failure-free one. `on_failure(h)` replaces the host instead of
        `replace_host` (it must leave a working `self.hosts[h]`). Returns the answers (in no
        particular order) and the hosts that were replaced."""
        import ray

        pending = {launch(h): h for h in hosts}
        if launched is not None:
            launched()
        answers: list[Any] = []
        rerun: set[int] = set()
        while pending:
            ready, stuck = ray.wait(list(pending), num_returns=len(pending), timeout=self.cfg.engine.task_timeout)
            failed = [pending.pop(ref) for ref in stuck]
            for ref in ready:
                h = pending.pop(ref)
                try:
                    answers.append(ray.get(ref))
                except host_lost():
                    failed.append(h)
            for h in failed:
                (on_failure or self.replace_host)(h)
                rerun.add(h)
                pending[launch(h)] = h
        return answers, rerun

    def replace_host(self, h: int, skip_tasks: set[int] | None = None) -> None:
        """Replace dead (or hung) host `h`: a fresh actor for the same clients, their state
        restored from the last checkpoint plus the accepted tasks since (replayed in order with
        the same inputs and seeds), then the asynchronous tasks it held launched again. At most
        `engine.max_restarts` replacements per run."""
        import ray

        self._decisions.pop(h, None)  # decisions for tasks staged on the dead actor: moot
        host = self.hosts.replace(h)
        mine = self.placement.assignment[h]
        base = {c: st for c, st in self.base_client_states().items() if int(c) in mine}
        waits = [host.import_states.remote(base)] if base else []
        for given in self._journal:
            if int(given.client) in mine and (skip_tasks is None or given.task not in skip_tasks):
                c = given.client
                extra = {c: given.extra} if given.extra is not None else None
                budget = {c: given.budget} if given.budget is not None else None
                waits.append(host.run.remote(given.fn, [c], given.key, given.payload_ref, extra, budget,
                                             uploads=given.uploads))
        ray.get(waits)
        for pool in self.pools:  # their tasks on the dead actor, running or staged, run again
            pool.host_replaced(h)

    def base_client_states(self) -> dict[int, dict[str, Any]]:
        """Client states as of the last checkpoint (or the resumed one, or empty at the start):
        what a replaced host starts from before the journal is replayed."""
        ckpt = self.runlog.saved() or self._resume
        return ckpt.client_states if ckpt is not None else {}

    def checkpointed(self) -> None:
        """A checkpoint now holds every client's state: a replaced host starts from it, so the
        tasks accepted before it need no replay."""
        self._journal.clear()

    def take_decisions(self, host: int) -> dict[int, bool] | None:
        """The decisions not yet sent to `host` (None when there are none), now handed over."""
        return self._decisions.pop(host, None) or None

    def flush_decisions(self) -> None:
        """Send every pending decision now and wait, so each host's states are committed."""
        waiting = [h for h, d in self._decisions.items() if d]
        self.on_hosts(lambda h: self.hosts[h].settle.remote(self.take_decisions(h) or {}), waiting)

    def client_state(self, client_ids: list[int], key: str) -> dict[int, Any]:
        """One committed state entry of some clients (e.g. personal models), read on their hosts."""
        by_host = self.by_host(client_ids)
        return self._merged(lambda h: self.hosts[h].get_state.remote(by_host[h], key, self.take_decisions(h)), list(by_host))

    def export_states(self) -> dict[int, dict[str, Any]]:
        """Every client's committed state, read from the hosts once the pending decisions are
        applied: what a checkpoint holds."""
        return self._merged(lambda h: self.hosts[h].export_states.remote(self.take_decisions(h)), list(range(len(self.hosts))))

    def _merged(self, launch: Callable[[int], Any], hosts: list[int]) -> dict[int, Any]:
        """The answers of `launch` on `hosts` (`on_hosts`), each a dict by client id, merged."""
        parts, _ = self.on_hosts(launch, hosts)
        return {c: value for part in parts for c, value in part.items()}
