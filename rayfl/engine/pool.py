"""Warm hosts that outlive a run, on a Ray that outlives runs.

A run that starts its own Ray spends most of its start-up on Ray's processes and on each host
importing torch and rayfl (docs/explanation/engine-speed.md, "A run's start"). Joining a running head
(`ray start --head`) removes the first; `rayfl pool start` removes the second: it leaves host
processes on that head that have already imported everything. A run that joins the head
(engine.address / RAY_ADDRESS, `engine.pool: auto`) leases them instead of starting its own
hosts, loads its clients into them, and hands them back, emptied, when it ends.

What makes a leased host as good as a fresh one:
- it is reset to exactly a fresh host's state (`ClientHostImpl.__init__` on an emptied object),
  so the results are the same bits (tests/test_pool.py);
- it never runs code older than the files on disk: it refuses a lease once any module it has
  loaded changed on disk since (or was imported during a lease and is newer than its start), or
  when the driver's Python, rayfl checkout, torch, numpy or runtime env differ from its own. The run then
  starts a fresh host, and the stale one is replaced by a fresh pooled host as the run ends;
- one run at a time: a lease names the run (two runs in one process never share a host), its
  driver's process and node, and a lease whose process is gone (a killed run) is taken over.

Pooled hosts reserve no CPU (`num_cpus=0`), so an idle pool never blocks other work on the
head; two runs leasing at once share the cores as two runs of fresh hosts would not. They hold
no GPU: a run whose hosts want one starts its own."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rayfl.engine.host import ClientHostImpl

NAMESPACE = "rayfl-pool"
PREFIX = "rayfl-pool-host-"


def identity() -> dict[str, str]:
    """What must match between a driver and a pooled host for the host to run the driver's code.
    The runtime env too: a driver of `ray job submit --working-dir` imports code that the pooled
    hosts (started by another job, without it) could not."""
    import json

    import numpy
    import ray
    import torch

    return {
        "runtime_env": json.dumps(dict(ray.get_runtime_context().runtime_env), sort_keys=True, default=str),
        "python": sys.version,
        "executable": sys.executable,
        "rayfl": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }


def _stamp(path: str) -> tuple[int, int] | None:
    """(mtime_ns, size) of a file, None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def module_files() -> dict[str, tuple[int, int]]:
    """The stamps of the files of every loaded module (2,000-odd with torch; ~10 ms)."""
    paths = {getattr(mod, "__file__", None) for mod in list(sys.modules.values())}
    return {p: st for p in paths if p and (st := _stamp(p)) is not None}


def changed_files(known: dict[str, tuple[int, int]]) -> list[str]:
    """The files among `known` that changed (or vanished) on disk."""
    return [path for path, stamp in known.items() if _stamp(path) != stamp]


def holder() -> dict[str, Any]:
    """A new lease holder for one run of this driver: its process (with its start time, against
    pid reuse), its Ray node (a process id means nothing on another node) and a token of its
    own, so that two runs in one process (threads, a notebook) never share a host."""
    import uuid

    import psutil
    import ray

    return {"pid": os.getpid(), "started": psutil.Process().create_time(),
            "node_id": ray.get_runtime_context().get_node_id(), "run": uuid.uuid4().hex}


def _alive(h: dict[str, Any]) -> bool:
    import psutil

    try:
        return psutil.Process(h["pid"]).create_time() == h["started"]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@dataclass
class Slot:
    """A pooled host's own bookkeeping, kept across resets."""

    name: str
    identity: dict[str, str]
    files: dict[str, tuple[int, int]]
    lease: dict[str, Any] | None = None
    leased_at: float = 0.0  # when the last lease began (at first: when the host started)
    leases: int = 0
    stale: list[str] = field(default_factory=list)


class PooledHost(ClientHostImpl):
    """A host process kept warm between runs: empty until leased, then a `ClientHostImpl`."""

    def __init__(self, name: str):  # no ClientHostImpl.__init__: it holds nothing until leased
        self._slot = Slot(name, identity(), module_files(), leased_at=time.time())

    def lease(self, by: dict[str, Any], driver: dict[str, str]) -> str | None:
        """Take the lease for driver `by` (running `driver`'s code); the reason when refused."""
        import ray

        slot = self._slot
        if slot.lease is not None and slot.lease != by and _alive(slot.lease):
            mine = " (another run of this driver)" if slot.lease["pid"] == by["pid"] else ""
            return f"leased by process {slot.lease['pid']}{mine}"
        if by["node_id"] != ray.get_runtime_context().get_node_id():
            return "serves drivers on its own node only"
        if driver != slot.identity:
            diff = sorted(k for k in {*driver, *slot.identity} if driver.get(k) != slot.identity.get(k))
            return f"runs another {', '.join(diff)} than the driver"
        slot.stale = slot.stale or changed_files(slot.files) or self._watch_new_modules()
        if slot.stale:
            return f"stale: {slot.stale[0]} changed on disk since this host loaded it"
        self.__dict__ = {"_slot": slot}  # a killed run's clients, if it held the lease
        slot.lease, slot.leased_at = by, time.time()
        slot.leases += 1
        return None

    def become(self, by: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Be a fresh host with `ClientHostImpl`'s arguments; its `info()`."""
        slot = self._slot
        if slot.lease != by:
            raise RuntimeError(f"pooled host {slot.name} is not leased to this driver")
        self.__dict__ = {"_slot": slot}
        ClientHostImpl.__init__(self, *args, **kwargs)
        return self.info()

    def _watch_new_modules(self) -> list[str]:
        """Modules first imported since the last check (a run's own code, loaded as its client
        functions arrived) join the watched files. One whose file is newer than the last
        lease's start (or the host's) may have changed after it was imported: those are
        returned (stale)."""
        slot = self._slot
        newer = []
        for path, stamp in module_files().items():
            if path not in slot.files:
                slot.files[path] = stamp
                if stamp[0] > slot.leased_at * 1e9:
                    newer.append(path)
        return newer

    def release(self, by: dict[str, Any]) -> bool:
        """Drop the run's clients and end the lease (cheap: the run's driver waits for it)."""
        slot = self._slot
        if slot.lease != by:
            return False
        self.__dict__ = {"_slot": slot}
        slot.lease = None
        return True

    def tidy(self) -> None:
        """After a release: collect the run's cycles and hand its freed heap (kept by
        retain_freed_memory) back to the system. Nobody waits for it."""
        gc.collect()
        _trim_heap()

    def status(self) -> dict[str, Any]:
        import psutil

        slot = self._slot
        return {"name": slot.name, "pid": os.getpid(), "leases": slot.leases,
                "leased_by": None if slot.lease is None else slot.lease["pid"],
                "stale": bool(slot.stale or changed_files(slot.files)),
                "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1)}


def _trim_heap() -> None:
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL(None).malloc_trim(0)


def _remote_class():
    import ray

    return ray.remote(PooledHost)


_private: list[str] | None = None  # a sweep's trial worker: the sweep's own hosts, leased by its runs alone


def use_private_hosts(names: list[str] | None) -> None:
    """Have this process's runs lease only `names`, pooled hosts of a private pool (a sweep's,
    started with their own `prefix`, which no other run lists), plug-ins included: every run
    that leases them is a trial of the same job, with the same user modules. None: the pool."""
    global _private
    _private = None if names is None else list(names)


def private_hosts() -> list[str] | None:
    return _private


def pool_names(prefix: str = PREFIX) -> list[str]:
    """Names of the pooled hosts on the connected Ray (live or starting)."""
    import ray

    names = ray.util.list_named_actors(all_namespaces=True)
    return sorted(n["name"] for n in names if n["namespace"] == NAMESPACE and n["name"].startswith(prefix))


def start_pool(num_hosts: int, wait: bool = True, prefix: str = PREFIX, strategy: Any = None) -> list[str]:
    """Top the pool up to `num_hosts` hosts (detached actors: they outlive this driver); a
    `prefix` of its own makes a private pool that runs do not list (see use_private_hosts),
    and a scheduling `strategy` puts it where its runs' drivers are (a sweep slot's group)."""
    import ray

    have = set(pool_names(prefix))
    free = (f"{prefix}{i}" for i in range(num_hosts + len(have)) if f"{prefix}{i}" not in have)
    names = [next(free) for _ in range(max(0, num_hosts - len(have)))]
    actors = [_spawn(name, strategy) for name in names]
    if wait and actors:
        ray.get([a.status.remote() for a in actors])
    return names


def _spawn(name: str, strategy: Any = None) -> Any:
    placed = {} if strategy is None else {"scheduling_strategy": strategy}
    return _remote_class().options(name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                                   max_restarts=0, **placed).remote(name)


def pool_status() -> list[dict[str, Any]]:
    import ray

    handles = [ray.get_actor(n, namespace=NAMESPACE) for n in pool_names()]
    return ray.get([h.status.remote() for h in handles])


def stop_pool() -> int:
    """Kill every pooled host; how many there were."""
    import ray

    names = pool_names()
    for n in names:
        ray.kill(ray.get_actor(n, namespace=NAMESPACE), no_restart=True)
    return len(names)


@dataclass
class Leases:
    """The pooled hosts one run holds (by name), what the others answered, and the names of
    pooled hosts this run killed (stale, or lost mid-run) for `release_hosts` to replace."""

    by: dict[str, Any]
    handles: dict[str, Any]
    refused: dict[str, str]
    replace: list[str]


def lease_hosts(count: int) -> Leases | None:
    """Lease up to `count` idle pooled hosts (None when the connected Ray has no pool).
    Stale hosts found on the way are killed; `release_hosts` replaces them at the run's end."""
    import ray

    names = pool_names() if _private is None else _private
    if not names or count <= 0:
        return None
    by, me = holder(), identity()
    handles = {n: ray.get_actor(n, namespace=NAMESPACE) for n in names}
    answers = dict(zip(names, ray.get([h.lease.remote(by, me) for h in handles.values()]), strict=True))
    granted = [n for n, why in answers.items() if why is None]
    for n in granted[count:]:  # more than this run needs
        handles[n].release.remote(by)
    stale = [n for n, why in answers.items() if why is not None and why.startswith("stale")]
    for n in stale:
        ray.kill(handles[n], no_restart=True)
    refused = {n: why for n, why in answers.items() if why is not None}
    return Leases(by, {n: handles[n] for n in granted[:count]}, refused, stale)


def release_hosts(leases: Leases, timeout: float = 10.0) -> None:
    """Hand the run's pooled hosts back (emptied), and start fresh pooled hosts in place of
    those it killed. They warm up after the run, while nobody waits for them; a name still
    held by a dying actor is left for `rayfl pool start`."""
    import ray

    refs = [h.release.remote(leases.by) for h in leases.handles.values()]
    ray.wait(refs, num_returns=len(refs), timeout=timeout)
    for h in leases.handles.values():
        h.tidy.remote()
    for name in leases.replace:
        with contextlib.suppress(ValueError):  # the name is still taken
            _spawn(name)
