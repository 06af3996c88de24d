"""The run's client hosts as actors: started (or leased warm from the pool), replaced one at a
time when one dies, and stopped at the end.

Host h holds the clients `placement.assignment[h]`, their rows and their state
(`rayfl.engine.host.ClientHostImpl`). This module owns only the actors' lives; what a host
runs, and how a replaced host gets its clients' states back, is the Federation's."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.config import ConfigError
from rayfl.data.rows import is_file_rows
from rayfl.engine.host import remote_host_class
from rayfl.registry import Plugins
from rayfl.rng import numpy_rng

if TYPE_CHECKING:
    from rayfl.config import Config
    from rayfl.data import FederatedDataset
    from rayfl.engine.placement import Placement


class HostFailureError(RuntimeError):
    """Hosts kept dying: more replacements than engine.max_restarts allows."""


class Hosts:
    """A run's host actors: `hosts[h]` is host h's handle, `len(hosts)` their number, `info`
    their first answers (node, rows, pool name) and `failures` the replacements so far."""

    def __init__(self, cfg: Config, dataset: FederatedDataset, placement: Placement, forward_flops: float):
        self.cfg = cfg
        self.dataset = dataset
        self.placement = placement
        self.forward_flops = forward_flops
        self.plugins = Plugins.of(cfg)  # the user code hosts must import
        self.info: list[dict[str, Any]] = []
        self.arrays_ref: Any = None  # the dataset's rows in the object store, put once for every host
        self._actors: list[Any] = []
        self._leases: Any = None  # pooled hosts leased for this run (rayfl.engine.pool)
        self._pooled: dict[int, str] = {}  # host index -> pooled host name
        self._pinned: Path | None = None  # the mapped dataset file's pinned name (rayfl.data.cache)
        self._dispatched = 0  # tasks launched, for engine.kill_host_every
        self.failures = 0  # hosts replaced in this run

    def __len__(self) -> int:
        return len(self._actors)

    def __getitem__(self, h: int) -> Any:
        return self._actors[h]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._actors)

    def start(self) -> None:
        """Start every host and wait at most engine.start_timeout for them (the placement was
        checked against the cluster: rayfl.engine.resources.check_cluster). Idle warm hosts of
        the joined Ray's pool (rayfl.engine.pool) stand in for fresh ones. A failed start stops
        what it started: pending actors would otherwise hold their place in Ray's queue."""
        import ray

        from rayfl.engine import resources

        request = resources.host_request(self.cfg.engine, self.placement, self.dataset.num_clients)
        try:
            self.arrays_ref = ray.put(self._arrays())
            self._leases = self._lease_pool()
            free = list(self._leases.handles) if self._leases is not None else []
            info_refs = []
            for h in range(self.placement.num_hosts):
                if free:
                    name = free.pop(0)
                    self._pooled[h] = name
                    host = self._leases.handles[name]
                    args, kwargs = self._args(h)
                    info_refs.append(host.become.remote(self._leases.by, *args, **kwargs))
                else:
                    host = self._spawn(h)
                    info_refs.append(host.info.remote())
                self._actors.append(host)
            self.info = resources.await_hosts(info_refs, request, self.cfg.engine.start_timeout)
        except BaseException:
            self.shutdown()
            raise
        for h, name in self._pooled.items():
            self.info[h]["pool"] = name
        self._check_started(self.info)

    def replace(self, h: int) -> Any:
        """Host `h` died or hung: kill what is left of it and start a fresh actor for its
        clients, returned with no client state yet (Ray's own restarts are off: the Federation
        restores the states itself). A pooled host leaves the pool; a fresh one refills it at
        the end. At most `engine.max_restarts` replacements per run."""
        import ray

        self.failures += 1
        if self.failures > self.cfg.engine.max_restarts:
            raise HostFailureError(
                f"host {h} failed ({self.failures} host failures in this run, engine.max_restarts="
                f"{self.cfg.engine.max_restarts}); see the Ray logs for why it died"
            )
        with contextlib.suppress(Exception):
            ray.kill(self._actors[h], no_restart=True)
        if h in self._pooled:
            name = self._pooled.pop(h)
            self._leases.handles.pop(name)
            self._leases.replace.append(name)
        host = self._actors[h] = self._spawn(h)
        self._check_started([ray.get(host.info.remote())])  # its node may not have the user code
        return host

    def count_dispatch(self, n: int) -> int | None:
        """Count launched tasks; with `engine.kill_host_every` (a fault-injection hook for soak
        tests) kill a seeded-random host each time the count passes a multiple of it. Returns
        the host it killed, if any."""
        import ray

        every = self.cfg.engine.kill_host_every
        before, self._dispatched = self._dispatched, self._dispatched + n
        if not every or before // every == self._dispatched // every:
            return None
        victim = int(numpy_rng(self.cfg.run.seed, "chaos", self._dispatched // every).integers(len(self)))
        ray.kill(self._actors[victim], no_restart=True)
        return victim

    def shutdown(self) -> None:
        """Kill the run's own hosts and hand pooled ones back to the pool, emptied."""
        import ray

        from rayfl.engine import pool

        for h, host in enumerate(self._actors):
            if h not in self._pooled:
                ray.kill(host)
        if self._leases is not None:
            pool.release_hosts(self._leases)
            self._leases = None
        self._actors = []
        if self._pinned is not None:  # the hosts that mapped it are gone
            from rayfl.data.cache import unpin

            unpin(self._pinned)
            self._pinned = None

    def _check_started(self, infos: list[dict[str, Any]]) -> None:
        """A host that could not import the run's user code fails the run at start, in one
        line naming the job key, the import path and the node."""
        for info in infos:
            if "start_error" in info:
                self.shutdown()
                raise ConfigError(*info["start_error"])

    def _arrays(self) -> Any:
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

            self._pinned = pin_entry(Path(mapped.path), mapped.identity)
            if self._pinned is not None:
                return mapped.only(names, self._pinned)
        return {n: getattr(ds, n) if is_file_rows(getattr(ds, n)) else np.asarray(getattr(ds, n)) for n in names}

    def _lease_pool(self) -> Any:
        """The pooled hosts this run may use, or None (engine.pool off, no pool, GPU hosts, user
        code named by the job, or a head this process started: private to it, so no pool there,
        and asking took 0.2-0.4 s), unless a sweep's trial uses the sweep's own pool."""
        from rayfl.engine import local_ray, pool

        wanted = self.placement.num_hosts
        if self.cfg.engine.pool == "off" or self.placement.num_gpus > 0 or self.cfg.engine.device == "cuda":
            return None
        # a pooled host may hold another run's module of the same name (user code: fresh hosts), and
        # a head this process started has no pool, unless a sweep's own, which serves one job's trials
        if pool.private_hosts() is None and (self.plugins.names or local_ray.joined_own_head()):
            return None
        try:
            leases = pool.lease_hosts(wanted)
        except Exception as e:  # a pool is a shortcut: a Ray that cannot be asked gets fresh hosts
            logging.getLogger(__name__).warning("engine.pool: could not look for pooled hosts (%s); starting fresh ones", e)
            return None
        if leases is not None and len(leases.handles) < wanted and leases.refused:
            why = "; ".join(f"{n}: {r}" for n, r in sorted(leases.refused.items()))
            logging.getLogger(__name__).warning(
                "engine.pool: %d of %d hosts leased from the pool, fresh ones start for the rest (%s)",
                len(leases.handles), wanted, why)
        return leases

    def _args(self, h: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """`ClientHostImpl`'s arguments for host `h`'s clients."""
        ds, cfg = self.dataset, self.cfg
        ids = self.placement.assignment[h]
        if getattr(ds, "source", None) is not None:  # lazy: the host makes rows from its id range
            train, test = ids, None
        else:
            train = {int(c): ds.client_train[c] for c in ids}
            test = {int(c): ds.client_test[c] for c in ids} if ds.client_test is not None else None
        args = (h, self.arrays_ref, train, test, dataclasses.asdict(cfg.model), tuple(ds.input_shape), ds.num_classes,
                cfg.run.seed, cfg.engine.torch_threads, cfg.engine.device, self.forward_flops, cfg.system.backward_cost)
        return args, {"vectorize": cfg.engine.vectorize, "plugins": self.plugins, "channels_last": cfg.engine.channels_last,
                      "clients_per_chunk": cfg.engine.clients_per_chunk}

    def _spawn(self, h: int) -> Any:
        """A fresh actor for host `h`'s clients (Ray's own restarts off: see `replace`)."""
        args, kwargs = self._args(h)
        actor = remote_host_class().options(num_cpus=self.placement.num_cpus, num_gpus=self.placement.num_gpus, max_restarts=0)
        return actor.remote(*args, **kwargs)
