"""`Federation`: the driver-side handle an algorithm's server loop uses.

The algorithm is plain Python; the Federation hides Ray (hosts, object store, futures), the
simulated clock and the results writer. A synchronous step is

    results = fed.call(client_ids, client_fn, round=r, params=x, lr=0.1)

which ships the broadcast payload once through the object store, makes one remote call per
host, gathers the records, charges each client's task on the simulated clock and logs one
`clients` row per task. Results come back sorted by client id, so any aggregation the algorithm
does in that order is identical whatever the number of hosts or the order futures finish in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rayfl.callbacks.base import Callback
from rayfl.callbacks.runner import CallbackRunner
from rayfl.config import Config, ConfigError
from rayfl.data import FederatedDataset
from rayfl.data.rows import is_file_rows, server_rows
from rayfl.engine.asyncpool import AsyncPool, TaskInput, host_lost
from rayfl.engine.balance import balanced_assignment, expected_rows, is_stateless
from rayfl.engine.checkpoint import CHECKPOINT_FILE, Checkpoint, load_checkpoint, save_checkpoint
from rayfl.engine.clock import SimClock
from rayfl.engine.exact_sum import (
    PRESUM,
    KeptValue,
    common_exponent,
    fixed_point_sum,
    max_abs,
    to_float,
)
from rayfl.engine.host import ClientFn, remote_host_class
from rayfl.engine.payload import payload_nbytes
from rayfl.engine.placement import Placement, plan_placement
from rayfl.engine.system import SystemModel, forward_flops_per_sample
from rayfl.engine.tasks import (
    NONFINITE,
    OUTCOMES,
    ClientResult,
    NonFiniteUpdateError,
    close_round,
    nonfinite_keys,
    plan_task,
    settle,
)
from rayfl.models import build_model
from rayfl.models.metrics import loss_correct_count
from rayfl.models.params import get_flat, set_flat
from rayfl.pipeline.server import RoundPipeline
from rayfl.registry import Plugins
from rayfl.rng import derive_seed, numpy_rng

ProgressFn = Callable[[dict[str, Any]], None]
T = TypeVar("T")


@dataclass
class KeptCall:
    """The last `call`'s outputs kept on hosts (`keep`): which keys, and what its accepted
    tasks were given, to run them again should a host die before `weighted_sum` reads them."""

    keep: tuple[str, ...]
    inputs: dict[int, TaskInput]  # task id -> its input
    hosts: dict[int, int]  # task id -> the host that ran it (and keeps its outputs)


@dataclass
class ServerData:
    """Data the server itself owns (ZO-HFL's f1 term), sampled with its own seeded stream."""

    x: torch.Tensor
    y: torch.Tensor
    seed: int

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def batch(self, batch_size: int, round: int, purpose: str = "server.batch") -> tuple[torch.Tensor, torch.Tensor]:
        rng = numpy_rng(self.seed, purpose, round)
        idx = torch.from_numpy(rng.choice(self.num_samples, size=min(batch_size, self.num_samples), replace=False))
        return self.x[idx], self.y[idx]


class HostFailureError(RuntimeError):
    """Hosts kept dying: more replacements than engine.max_restarts allows."""


class RunInterrupted(KeyboardInterrupt):
    """A stop was requested (SIGTERM, Ctrl-C): the run checkpointed after a round and stops;
    the results writer closes it as `interrupted`."""


class Federation:
    """Hosts, clock, evaluation and logging for one run."""

    pipeline: RoundPipeline | None = None  # the run's privacy / compression / robust, set in __init__

    def __init__(
        self,
        cfg: Config,
        dataset: FederatedDataset,
        writer: Any | None = None,
        progress: ProgressFn | None = None,
        resume: Checkpoint | None = None,
        callbacks: Sequence[Callback] = (),
    ):
        import ray

        self.cfg = cfg
        self.dataset = dataset
        self.writer = writer
        self.progress = progress
        self.seed = cfg.run.seed
        self.clock = SimClock()
        self._wall_start = time.perf_counter()
        self._round_bytes = 0
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._keep: dict[int, int] = {}
        self.model_version = 0
        self._next_task = 0
        self._trainable: np.ndarray | None = None
        self._trainable_mask: np.ndarray | None = None  # bool [num_clients], for _candidates
        self.server_state: Any = None
        self._decisions: dict[int, dict[int, bool]] = {}  # host -> {task id: accepted}
        self._pools: list[AsyncPool] = []
        self._resume = resume
        self.start_round = 0
        self.stop_requested = False  # set by a signal handler: checkpoint after this round, stop
        self.last_checkpoint: int | None = None
        self._inputs: dict[int, TaskInput] = {}  # task id -> what it was given, until decided
        self._kept_call: KeptCall | None = None  # the last call's outputs kept on hosts
        self._presums: dict[int, dict[str, tuple[int, dict[int, float], np.ndarray]]] = {}  # host -> key -> partial
        self._exponents: dict[str, int] = {}  # key -> its last weighted sum's grid exponent
        self.presums_used = 0  # host partial sums taken from a call's answer, without asking again
        self._journal: list[TaskInput] = []  # accepted state-changing tasks since the checkpoint
        self.host_failures = 0
        self._round_failures = 0
        self._dispatched = 0  # tasks launched, for engine.kill_host_every
        self.tasks_discarded = 0  # in flight when an async run ended: never logged
        self.client_tags: dict[int, dict[str, Any]] = {}  # extra `clients` columns per client (e.g. byzantine)

        self.plugins = Plugins.of(cfg)  # the user code hosts must import
        # the server's own rows, read from the files now when the hosts read the train features
        self._server_x = server_rows(dataset.train_x, dataset.server_train)
        self.model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.forward_flops = forward_flops_per_sample(self.model, dataset.input_shape)
        self.system = SystemModel(cfg.system, dataset.num_clients, self.forward_flops, self.seed)
        self.placement: Placement = plan_placement(cfg.engine, dataset.num_clients, ray.cluster_resources())
        self._host_of = self.placement.host_of()
        self._leases: Any = None  # pooled hosts leased for this run (rayfl.engine.pool)
        self._pooled: dict[int, str] = {}  # host index -> pooled host name
        self._pinned: Path | None = None  # the mapped dataset file's pinned name (rayfl.data.cache)
        self.hosts: list[Any] = []
        self.pipeline = RoundPipeline.of(cfg, self)  # privacy, compression, robust (None: all off)
        self.callbacks = CallbackRunner(cfg, self, callbacks)
        self.stopped_early: dict[str, Any] | None = None  # a callback's stop: the round and why
        self.hosts = self._start_hosts()
        if resume is not None:
            try:
                self._restore(resume)
            except BaseException:  # the hosts (and any pooled ones leased) go with the failed start
                self.shutdown()
                raise
        self.callbacks.start(resumed=resume is not None)

    # ------------------------------------------------------------------ set-up

    def _start_hosts(self) -> list[Any]:
        """Start the hosts after checking the cluster can hold them (Ray would otherwise queue
        an unplaceable actor for ever), and wait at most engine.start_timeout for them. Idle
        warm hosts of the joined Ray's pool (rayfl.engine.pool) stand in for fresh ones."""
        import ray

        from rayfl.engine import resources

        request = resources.host_request(self.cfg.engine, self.placement, self.dataset.num_clients)
        resources.check_request(request, resources.cluster_capacity())
        self._arrays_ref = ray.put(self._host_arrays())
        self._leases = self._lease_pool()
        free = list(self._leases.handles) if self._leases is not None else []
        hosts, info_refs = [], []
        for h in range(self.placement.num_hosts):
            if free:
                name = free.pop(0)
                self._pooled[h] = name
                host = self._leases.handles[name]
                args, kwargs = self._host_args(h)
                info_refs.append(host.become.remote(self._leases.by, *args, **kwargs))
            else:
                host = self._spawn_host(h)
                info_refs.append(host.info.remote())
            hosts.append(host)
        try:
            timeout = self.cfg.engine.start_timeout
            self.host_info = resources.await_hosts(info_refs, request, timeout)
        except BaseException:
            self.hosts = hosts
            self.shutdown()  # pending actors would otherwise hold their place in Ray's queue
            raise
        for h, name in self._pooled.items():
            self.host_info[h]["pool"] = name
        self.hosts = hosts
        self._check_started(self.host_info)
        return hosts

    def _check_started(self, infos: list[dict[str, Any]]) -> None:
        """A host that could not import the run's user code fails the run at start, in one
        line naming the job key, the import path and the node."""
        for info in infos:
            if "start_error" in info:
                self.shutdown()
                raise ConfigError(*info["start_error"])

    def _host_arrays(self) -> Any:
        """What the hosts get of the dataset's rows, through the object store once: a lazy
        population's source (rayfl.data.lazy); the path of the file the arrays are mapped from
        when every host runs on this machine (rayfl.data.mapped: no copy, and 0.4-0.9 s less
        start-up for 235 MB); else the arrays themselves, train features left in their files
        (rayfl.data.rows.FileRows) as such: each host reads its own clients' rows."""
        from rayfl.engine import local_ray

        ds = self.dataset
        lazy = getattr(ds, "source", None)
        if lazy is not None:
            return lazy
        names = ["train_x", "train_y", "test_x", "test_y"]
        mapped = getattr(ds, "mapped", None)
        # the arrays must still be the file's own (not replaced since the dataset was loaded)
        if mapped is not None and all(getattr(ds, n) is mapped.get(n) for n in names) and local_ray.single_machine():
            from rayfl.data.cache import pin_entry

            self._pinned = pin_entry(Path(mapped.path))
            if self._pinned is not None:
                return mapped.only(names, self._pinned)
        return {n: getattr(ds, n) if is_file_rows(getattr(ds, n)) else np.asarray(getattr(ds, n)) for n in names}

    def _lease_pool(self) -> Any:
        """The pooled hosts this run may use, or None (engine.pool off, no pool, GPU hosts, user
        code named by the job, or a head this process started: private to it, so no pool there,
        and asking took 0.2-0.4 s)."""
        from rayfl.engine import local_ray, pool

        if self.cfg.engine.pool == "off" or self.placement.num_gpus > 0 or self.cfg.engine.device == "cuda":
            return None
        if self.plugins.names:  # a pooled host may hold another run's module of the same name: fresh hosts
            return None
        if local_ray.joined_own_head():
            return None
        try:
            leases = pool.lease_hosts(self.placement.num_hosts)
        except Exception as e:  # a pool is a shortcut: a Ray that cannot be asked gets fresh hosts
            logging.getLogger(__name__).warning("engine.pool: could not look for pooled hosts (%s); starting fresh ones", e)
            return None
        if leases is not None and len(leases.handles) < self.placement.num_hosts and leases.refused:
            why = "; ".join(f"{n}: {r}" for n, r in sorted(leases.refused.items()))
            logging.getLogger(__name__).warning(
                "engine.pool: %d of %d hosts leased from the pool, fresh ones start for the rest (%s)",
                len(leases.handles), self.placement.num_hosts, why)
        return leases

    def _host_args(self, h: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """`ClientHostImpl`'s arguments for host `h`'s clients."""
        ds = self.dataset
        ids = self.placement.assignment[h]
        if getattr(ds, "source", None) is not None:  # lazy: the host makes rows from its id range
            train, test = ids, None
        else:
            train = {int(c): ds.client_train[c] for c in ids}
            test = {int(c): ds.client_test[c] for c in ids} if ds.client_test is not None else None
        args = (h, self._arrays_ref, train, test, dataclasses.asdict(self.cfg.model), tuple(ds.input_shape), ds.num_classes,
                self.seed, self.cfg.engine.torch_threads, self.cfg.engine.device, self.forward_flops, self.cfg.system.backward_cost)
        return args, {"vectorize": self.cfg.engine.vectorize, "plugins": self.plugins,
                      "channels_last": self.cfg.engine.channels_last}

    def _spawn_host(self, h: int) -> Any:
        """Start the actor for host `h`'s clients (at start-up, or to replace a dead host; Ray's
        own restarts are off: rayfl restores the clients' state itself, see `replace_host`)."""
        args, kwargs = self._host_args(h)
        actor = remote_host_class().options(num_cpus=self.placement.num_cpus, num_gpus=self.placement.num_gpus, max_restarts=0)
        return actor.remote(*args, **kwargs)

    def shutdown(self) -> None:
        """Kill the run's own hosts and hand pooled ones back to the pool, emptied."""
        import ray

        from rayfl.engine import pool

        for h, host in enumerate(self.hosts):
            if h not in self._pooled:
                ray.kill(host)
        if self._leases is not None:
            pool.release_hosts(self._leases)
            self._leases = None
        self.hosts = []
        if self._pinned is not None:  # the hosts that mapped it are gone
            from rayfl.data.cache import unpin

            unpin(self._pinned)
            self._pinned = None

    # ------------------------------------------------------------------ clients

    @property
    def num_clients(self) -> int:
        return self.dataset.num_clients

    @property
    def client_sizes(self) -> np.ndarray:
        return self.dataset.client_sizes()

    def client_weights(self, client_ids: list[int] | None = None, kind: str = "samples") -> np.ndarray:
        """Aggregation weights over `client_ids` summing to 1: by sample count or uniform.
        Always finite: clients that hold no samples all get weight 0 by sample count."""
        ids = np.arange(self.num_clients) if client_ids is None else np.asarray(client_ids, dtype=np.int64)
        w = self.client_sizes[ids].astype(np.float64) if kind == "samples" else np.ones(len(ids))
        total = w.sum()
        return w / total if total > 0 else np.zeros(len(ids))

    @property
    def trainable_clients(self) -> np.ndarray:
        """Clients holding at least one training sample: the only ones ever sampled to train
        (a partition may leave some empty, e.g. Dirichlet with min_size 0)."""
        if self._trainable is None:
            self._trainable = np.flatnonzero(self.client_sizes > 0).astype(np.int64)
            if len(self._trainable) == 0:
                raise ValueError("no client holds any training sample; check the partition")
        return self._trainable

    def _candidates(self) -> np.ndarray:
        """Clients that may be sampled now: trainable and, under an availability model, online."""
        if self.cfg.system.availability.kind == "always":
            return self.trainable_clients
        online = self.online_clients()  # sorted, so the filtered ids equal intersect1d's
        if self._trainable_mask is None:
            self._trainable_mask = np.zeros(self.num_clients, dtype=bool)
            self._trainable_mask[self.trainable_clients] = True
        return online[self._trainable_mask[online]]

    @property
    def now(self) -> float:
        """Simulated seconds since the start of the run."""
        return self.clock.now

    @property
    def wall_time(self) -> float:
        return time.perf_counter() - self._wall_start

    def host_of(self, client: int) -> int:
        return int(self._host_of[client])

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
        if (self.cfg.engine.balance != "auto" or len(self.hosts) < 2 or not is_stateless(fn)
                or (self.pipeline is not None and self.pipeline.keeps_client_state)
                or getattr(self.dataset, "source", None) is not None or is_file_rows(self.dataset.train_x)):
            return self.by_host(ids)
        sizes = self.client_sizes
        work = [expected_rows(int(sizes[c]), {**payload, **(per_client.get(c, {}) if per_client else {})}) for c in ids]
        return balanced_assignment(ids, work, len(self.hosts))

    def _rows_of(self, client: int) -> tuple[np.ndarray, np.ndarray | None]:
        """A client's train and test row indices, for a host that does not hold it."""
        ds = self.dataset
        return np.asarray(ds.client_train[client]), None if ds.client_test is None else np.asarray(ds.client_test[client])

    def online_clients(self) -> np.ndarray:
        """Clients online now (an error if nobody is: the availability model is then broken)."""
        online = np.flatnonzero(self.system.availability.online_mask(self.now, self.num_clients)).astype(np.int64)
        if len(online) == 0:
            raise RuntimeError(f"no client is online at simulated time {self.now:.1f}s; check system.availability")
        return online

    def sample(self, round: int, k: int | None = None, fraction: float | None = None) -> list[int]:
        """Uniform participation without replacement among the clients online now, seeded by
        (seed, 'sample', round): the same clients whatever the placement. Under
        `over_selection` it picks ceil((1 + o) k) and the round keeps the first k to finish."""
        if k is None:
            k = self.num_clients if fraction is None else max(1, round_half_up(fraction * self.num_clients))
        candidates = self._candidates()
        if len(candidates) == 0:
            raise RuntimeError(f"no trainable client is online at simulated time {self.now:.1f}s; check system.availability")
        if self.pipeline is not None and self.pipeline.poisson:  # what the privacy accountant assumes
            return self.pipeline.sample(round, candidates)
        k = min(k, len(candidates))
        picks = k
        if self.cfg.system.policy == "over_selection":
            picks = min(len(candidates), int(np.ceil((1.0 + self.cfg.system.over_selection) * k - 1e-9)))
            self._keep[round] = k
        rng = numpy_rng(self.seed, "sample", round)
        return sorted(int(c) for c in rng.choice(candidates, size=picks, replace=False))

    def sample_idle(self, busy: set[int], key: int) -> int | None:
        """One client, uniformly among those online, trainable and not busy, for an async slot."""
        candidates = self._candidates()
        idle = np.setdiff1d(candidates, np.fromiter(busy, dtype=np.int64, count=len(busy)))
        if len(idle) == 0:
            return None
        return int(numpy_rng(self.seed, "async.sample", key).choice(idle))

    def async_pool(self) -> AsyncPool:
        """A pool of asynchronous tasks committed in simulated-time order (see AsyncPool). In a
        resumed run the pool comes back with the tasks that were in flight at the checkpoint."""
        pool = AsyncPool(self)
        if self._resume is not None and len(self._pools) < len(self._resume.pools):
            pool.restore(self._resume.pools[len(self._pools)])
        self._pools.append(pool)
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
            if self.stopped_early is not None:
                return
            yield r

    def advance_version(self) -> int:
        """Count one more global-model version (staleness = versions applied since download)."""
        self.model_version += 1
        return self.model_version

    def initial_params(self) -> np.ndarray:
        """The initial global model (`initial_model_params`)."""
        return initial_model_params(self.cfg, self.dataset, self.seed)

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
            # upload assumed as large as the download (model in, model out) when budgeting, or
            # the encoded size of the model's update when the pipeline compresses it
            base = payload_nbytes(payload)
            budgets = {}
            for c in ids:
                down = base + (payload_nbytes(per_client.get(c)) if per_client else 0)
                up = down if uploads is None else uploads.estimate(self.num_params, down)
                budgets[c] = self.system.compute_budget(c, sys_cfg.deadline, down, up)
        expected = {key: (self._exponents[key], weights) for key, weights in (expect_weights or {}).items()
                    if key in keep and key in self._exponents and uploads is None}
        by_host = self.assign(ids, fn, payload, per_client)
        foreign = {h: {c: self._rows_of(c) for c in hids if self.host_of(c) != h} for h, hids in by_host.items()}
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
            presum = {key: (e, {tasks[c]: float(w[c]) for c in hids if c in w}) for key, (e, w) in expected.items()}
            return self.hosts[h].run.remote(fn, hids, round, payload_ref, sub, bud, mine, self.take_decisions(h), keep,
                                            foreign[h] or None, uploads, presum or None)

        batches, rerun = self.on_hosts(launch, list(by_host), launched=lambda: self.count_dispatch(len(ids)))
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
            end = close_round(results, sys_cfg.policy, start, sys_cfg.deadline, self._keep.get(round))
            self.clock.advance_to(end)
        self.record_tasks(results, round, phase)
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
        for h in list(by_host):  # partial sums the hosts made with the call, if they are these
            exponent_then, weights_then, part = self._presums.get(h, {}).get(key, (None, None, None))
            if exponent_then == exponent and weights_then == by_host[h]:
                total += part
                del by_host[h]
                self.presums_used += 1
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
            foreign = {c: self._rows_of(c) for c in ids if self.host_of(c) != h} or None  # balanced here
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
        the same inputs and seeds). At most `engine.max_restarts` replacements per run."""
        import ray

        self.host_failures += 1
        self._round_failures += 1
        if self.host_failures > self.cfg.engine.max_restarts:
            raise HostFailureError(
                f"host {h} failed ({self.host_failures} host failures in this run, engine.max_restarts="
                f"{self.cfg.engine.max_restarts}); see the Ray logs for why it died"
            )
        with contextlib.suppress(Exception):
            ray.kill(self.hosts[h], no_restart=True)
        if h in self._pooled:  # a pooled host that died leaves the pool; a fresh one refills it at the end
            name = self._pooled.pop(h)
            self._leases.handles.pop(name)
            self._leases.replace.append(name)
        self._decisions.pop(h, None)  # decisions for tasks staged on the dead actor: moot
        host = self._spawn_host(h)
        self._check_started([ray.get(host.info.remote())])  # its node may not have the user code
        mine = set(int(c) for c in self.placement.assignment[h])
        base = {c: st for c, st in self.base_client_states().items() if c in mine}
        waits = [host.import_states.remote(base)] if base else []
        for given in self._journal:
            if given.client in mine and (skip_tasks is None or given.task not in skip_tasks):
                c = given.client
                extra = {c: given.extra} if given.extra is not None else None
                budget = {c: given.budget} if given.budget is not None else None
                waits.append(host.run.remote(given.fn, [c], given.key, given.payload_ref, extra, budget,
                                             uploads=given.uploads))
        ray.get(waits)
        self.hosts[h] = host

    def base_client_states(self) -> dict[int, dict[str, Any]]:
        """Client states as of the last checkpoint (or the resumed one, or empty at the start):
        what a replaced host starts from before the journal is replayed."""
        if self.last_checkpoint is not None and self.writer is not None:
            ckpt = load_checkpoint(self.writer.location)
            if ckpt is not None:
                return ckpt.client_states
        if self._resume is not None:
            return self._resume.client_states
        return {}

    def count_dispatch(self, n: int) -> None:
        """Count launched tasks; with `engine.kill_host_every` (a fault-injection hook for soak
        tests) kill a seeded-random host each time the count passes a multiple of it."""
        import ray

        every = self.cfg.engine.kill_host_every
        before, self._dispatched = self._dispatched, self._dispatched + n
        if not every or before // every == self._dispatched // every:
            return
        victim = int(numpy_rng(self.seed, "chaos", self._dispatched // every).integers(len(self.hosts)))
        ray.kill(self.hosts[victim], no_restart=True)

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
        parts, _ = self.on_hosts(lambda h: self.hosts[h].get_state.remote(by_host[h], key, self.take_decisions(h)), list(by_host))
        out: dict[int, Any] = {}
        for part in parts:
            out.update(part)
        return out

    def record_tasks(self, results: list[ClientResult], round: int, phase: str) -> None:
        """Count outcomes and bytes for the round row, and write one `clients` row per task."""
        for r in results:
            self._outcomes[r.outcome] += 1
            self._round_bytes += r.bytes_up + r.bytes_down
        if self.writer is None or not self.cfg.output.log_clients:
            return
        rows = []
        for r in results:
            row = {
                "round": round,
                "phase": phase,
                "client": r.client,
                "host": r.host,
                "outcome": r.outcome,
                "dispatch_time": r.dispatch_time,
                "finish_time": r.finish_time,
                "compute_seconds": r.timing.compute,
                "download_seconds": r.timing.download,
                "upload_seconds": r.timing.upload,
                "version": r.version,
                "staleness": r.staleness,
                "num_samples": r.num_samples,
                "local_steps": r.local_steps,
                "truncated": r.truncated,
                "forward_samples": r.forward_samples,
                "backward_samples": r.backward_samples,
                "bytes_up": r.bytes_up,
                "bytes_down": r.bytes_down,
                "rerun": bool(r.extra.get("rerun", False)),
                "task": r.task,
                **self.client_tags.get(r.client, {}),
                **r.extra.get("pipeline", {}),
            }
            loss = r.values.get("loss") if isinstance(r.values, dict) else None
            if isinstance(loss, (int, float, np.floating)):
                row["local_loss"] = float(loss)
            rows.append(row)
        self.writer.extend("clients", rows)

    # ------------------------------------------------------------------ server side

    @property
    def server_data(self) -> ServerData | None:
        idx = self.dataset.server_train
        if idx is None or len(idx) == 0:
            return None
        return ServerData(
            torch.from_numpy(self._server_x if self._server_x is not None else self.dataset.train_x[idx]),
            torch.from_numpy(self.dataset.train_y[idx]),
            self.seed,
        )

    def evaluate(self, params: np.ndarray, batch_size: int = 2048) -> dict[str, float]:
        """Loss and accuracy of a global model on the global test set (on the driver)."""
        return evaluate_arrays(self.model, params, self.dataset.test_x, self.dataset.test_y, batch_size, prefix="test_")

    # ------------------------------------------------------------------ logging

    def log_round(self, round: int, **metrics: Any) -> None:
        """One row of `rounds`. The writer flushes by its own policy (rows buffered, their age;
        see rayfl.results.writer) checked here once per server step, and also every
        `output.flush_every_rounds` rounds when that is set; `last_round` reaches the manifest
        at the flush that writes its row."""
        row = {
            "round": round,
            "sim_time": self.clock.now,
            "wall_time": self.wall_time,
            "bytes": self._round_bytes,
            **{f"clients_{k}": v for k, v in self._outcomes.items()},
            "host_failures": self._round_failures,
            **{k: _scalar(v) for k, v in metrics.items()},
            **(self.pipeline.finish_round(round) if self.pipeline is not None else {}),
        }
        self._round_bytes = 0
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._round_failures = 0
        if self.writer is not None:
            self.writer.append("rounds", row)
            self.writer.note_progress(last_round=round, sim_time=self.clock.now)
            every = self.cfg.output.flush_every_rounds
            if every and (round + 1) % every == 0:
                self.writer.flush()
            else:
                self.writer.maybe_flush()
        if self.progress is not None:
            self.progress(row)
        why = self.callbacks.on_round(row)
        if why is not None:
            self.stopped_early = {"round": round, "reason": why}
            if self.writer is not None:
                self.writer.update_manifest(stopped_early=self.stopped_early)
        every = self.cfg.output.checkpoint_every
        if self.stop_requested or self.stopped_early is not None or (every and (round + 1) % every == 0):
            self.checkpoint(round)
        if self.stop_requested:
            where = self.writer.run_dir if self.writer is not None else "<run dir>"
            raise RunInterrupted(f"stopped after round {round}; continue with: rayfl resume {where}")

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, round: int) -> Checkpoint | None:
        """Save the run's state after `round` (see rayfl.engine.checkpoint) beside its Parquet.
        Every row logged so far is flushed first, so the checkpoint names complete part files."""

        if self.writer is None:
            return None
        self.writer.flush()
        parts, _ = self.on_hosts(lambda h: self.hosts[h].export_states.remote(self.take_decisions(h)), list(range(len(self.hosts))))
        states: dict[int, dict[str, Any]] = {}
        for part in parts:
            states.update(part)
        ckpt = Checkpoint(
            round=round,
            server_state=self.server_state,
            client_states=states,
            clock=self.clock.now,
            model_version=self.model_version,
            next_task=self._next_task,
            pools=[pool.snapshot() for pool in self._pools],
            parts=self.writer.part_counts(),
            pipeline=self.pipeline.state_dict() if self.pipeline is not None else None,
            callbacks=self.callbacks.state_dict(),
        )
        save_checkpoint(self.writer.location, ckpt)
        self._journal.clear()  # the checkpoint now holds what they changed
        self.writer.update_manifest(checkpoint={"round": round, "sim_time": self.clock.now, "file": CHECKPOINT_FILE})
        self.last_checkpoint = round
        return ckpt

    def _restore(self, ckpt: Checkpoint) -> None:
        """Put a checkpoint's client states back on the hosts and the clock where it was."""
        import ray

        states = ckpt.client_states
        groups = self.by_host(states)
        ray.get([self.hosts[h].import_states.remote({c: states[c] for c in cs}) for h, cs in groups.items()])
        self.clock = SimClock(ckpt.clock)
        self.model_version = ckpt.model_version
        self._next_task = ckpt.next_task
        self.start_round = ckpt.round + 1
        saved = getattr(ckpt, "pipeline", None)
        if self.pipeline is not None:
            self.pipeline.round = self.start_round
            if saved is not None:
                self.pipeline.load_state_dict(saved)
        self.callbacks.load_state_dict(getattr(ckpt, "callbacks", None) or [])

    def log_eval(self, round: int, metrics: Mapping[str, Any], client: int = -1, split: str = "test") -> None:
        """One row of `evals`: client -1 is the global model."""
        row = {"round": round, "sim_time": self.clock.now, "wall_time": self.wall_time, "client": client, "split": split}
        row.update({k: _scalar(v) for k, v in metrics.items()})
        if self.writer is not None:
            self.writer.append("evals", row)
        self.callbacks.on_eval(row)


def initial_model_params(cfg: Config, dataset: FederatedDataset, seed: int) -> np.ndarray:
    """The initial global model: the model's own default initialisation under a torch seed
    derived from (seed, 'model.init'), so every run with the same seed starts equal (and so does
    the benchmarks' reference loop)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model.init"))
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        if getattr(cfg.model, "init_from", None):  # another run's model (rayfl.models.init_from)
            from rayfl.models.init_from import initial_vector

            return initial_vector(model, get_flat(model).numpy(), cfg.model.init_from, dataset.input_shape, dataset.num_classes)
    return get_flat(model).numpy()


def evaluate_arrays(
    model: torch.nn.Module,
    params: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 2048,
    prefix: str = "",
) -> dict[str, float]:
    """Mean cross-entropy and accuracy of `params` on (x, y), per target (padding excluded)."""
    set_flat(model, torch.as_tensor(params))
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for xb, yb in iterate(x, y, batch_size):
            batch_loss, batch_correct, batch_count = loss_correct_count(model(xb), yb)
            loss_sum, correct, count = loss_sum + batch_loss, correct + batch_correct, count + batch_count
    n = max(count, 1)  # targets, not samples: a sequence model is scored per real (non-padding) token
    return {f"{prefix}loss": loss_sum / n, f"{prefix}accuracy": correct / n}


def iterate(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, len(y), batch_size):
        yield torch.from_numpy(x[start : start + batch_size]), torch.from_numpy(y[start : start + batch_size])


def round_half_up(v: float) -> int:
    return int(np.floor(v + 0.5))


def _scalar(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return v
