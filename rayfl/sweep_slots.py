"""How `rayfl sweep` runs its trials (the fifo scheduler): on warm slots, not one Tune trial each.

A trial that starts its own process and hosts and builds its data again pays more for that
than a short run computes (a Ray Tune trial per run cost 2.2x a loop of `rayfl run`s on the
digits grid). So the sweep holds `slots` placement groups, each sized for one trial's hosts,
and in each a trial worker (an actor that has imported rayfl and torch, running the slot's
trials one after another) and the slot's warm hosts: a private pool (rayfl.engine.pool) that
its trials lease in turn, on the group's node. One slot on one machine runs its trials in the
sweep's own process. The sweep builds each distinct dataset once (data, partition and run
seed) and hands it to the trials through the object store. ASHA, which stops trials early,
still runs them as Tune trials (rayfl.sweep).

Nothing carries over between trials: a leased host is reset to a fresh host's state (client
states, the pipeline's state and every RNG stream are the run's own), a trial's user modules
are the job's (the same for every trial of the sweep), and each trial is the run it would be
alone (tests/test_sweep.py).

A trial's run is `rayfl.sweep.run_or_resume`'s: a completed run is left alone, one with a
checkpoint resumes, any other leftover starts over; a failed trial is retried up to
`max_failures` times. SIGTERM or Ctrl-C stops every running trial after its round with a
checkpoint, so the same command resumes the sweep where it stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from rayfl.config import config_from_dict
from rayfl.engine import pool
from rayfl.engine.asyncpool import host_lost
from rayfl.sweep import Trial, placement_groups, reserve, run_or_resume, trial_payload


def slot_count(trials: Sequence[Trial], cluster: Mapping[str, float], max_concurrent: int | None) -> int:
    """How many trials run side by side: `max_concurrent`, else as many as the cluster's CPUs
    (and GPUs) hold with each trial's hosts planned on the whole cluster, at least one."""
    if max_concurrent is not None:
        return max(1, min(max_concurrent, len(trials)))
    reserve(trials, cluster, 1)
    fits = []
    for kind in ("CPU", "GPU"):
        need = max(sum(b.get(kind, 0.0) for b in t.bundles) for t in trials)
        if need > 0:
            fits.append(int(cluster.get(kind, 0.0) // need))
    return max(1, min([len(trials), *fits]))


def data_key(raw: Mapping[str, Any]) -> str:
    """What a trial's dataset depends on: its data and partition sections and the run seed
    (the split's seed when data.seed is null), as rayfl.data.cache keys a built dataset."""
    return json.dumps([raw["data"], raw["partition"], raw["run"]["seed"]], sort_keys=True, default=str)


class TrialWorker:
    """One slot's trial worker (a Ray actor in the slot's placement group, which also captures
    any fresh host a run starts): runs trials one at a time; `stop` asks the running one to
    checkpoint after its round and close as interrupted."""

    def __init__(self, hosts: list[str]) -> None:
        """`hosts`: the slot's own warm hosts (rayfl.engine.pool), leased by its trials alone."""
        self._stopping = threading.Event()
        self._fed: Any = None
        if hosts:  # the sweep's own warm hosts: its trials lease them, plug-ins or not
            pool.use_private_hosts(hosts)

    def run(self, payload: dict[str, Any], dataset: Any) -> dict[str, Any]:
        """Run one trial; the one-line error it ended with (None when it ran), and whether it
        was stopped."""
        raw = payload["trial"]
        started = time.perf_counter()

        def on_start(_: Any, fed: Any) -> None:
            self._fed = fed
            if self._stopping.is_set():
                fed.runlog.stop_requested = True
            if fed.runlog.writer is not None:
                fed.runlog.writer.update_manifest(sweep={**payload["sweep"], **placement_groups(fed)})

        error, interrupted = None, False
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # shared data: read only
        try:
            payload["plugins"].install("a sweep's trial worker")
            run_or_resume(raw, on_start=on_start, dataset=dataset)
        except KeyboardInterrupt:  # asked by the sweep; in the sweep's own process also a signal, which
            interrupted = True  # stops a run that has not begun its rounds at once
        except Exception as e:  # the trial failed: the sweep retries it or reports it
            error = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        finally:
            self._fed = None
        return {"run_id": raw["run"]["run_id"], "error": error, "interrupted": interrupted,
                "seconds": time.perf_counter() - started}

    def stop(self) -> None:
        self._stopping.set()
        fed = self._fed
        if fed is not None:
            fed.runlog.stop_requested = True


class InProcess:
    """The one slot of a sweep that runs one trial at a time, in the sweep's own process (no
    worker process to start), called as its actor would be: `run.remote` runs the trial at
    once and hands back its result's object reference. A signal reaches the trial's run,
    which stops after its round with a checkpoint."""

    def __init__(self, worker: TrialWorker):
        self.worker = worker
        self.run = SimpleNamespace(remote=self._run)
        self.stop = SimpleNamespace(remote=worker.stop)

    def _run(self, payload: dict[str, Any], dataset: Any) -> Any:
        import ray

        return ray.put(self.worker.run(payload, ray.get(dataset)))

    def close(self) -> None:
        pool.use_private_hosts(None)


@dataclass
class SlotRun:
    """What the slots did: the last error of each trial that failed, and whether a stop was asked."""

    errors: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def run_on_slots(trials: Sequence[Trial], name: str, cluster: Mapping[str, float], max_concurrent: int | None,
                 max_failures: int, build: Callable[[dict[str, Any]], Any], verbose: int = 1) -> SlotRun:
    """Run every trial on `slots` warm slots (see the module docstring). `build(raw)` makes a
    trial's dataset (once per `data_key`)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    began = time.perf_counter()
    slots = slot_count(trials, cluster, max_concurrent)
    reserve(trials, cluster, slots)  # pins an `auto` host count planned on a slot's share
    bundles = max((t.bundles[1:] for t in trials), key=len)  # the hosts of the largest trial
    if verbose:
        print(f"rayfl sweep: {len(trials)} trials, {slots} at a time, {len(bundles)} host(s) each",
              file=sys.stderr, flush=True)
    prefix = f"rayfl-sweep-{os.getpid()}-{time.time_ns() % 10**9}-"
    pooling = leases_pool(trials)
    pooled: list[list[str]] = []  # each slot's own warm hosts: its trials never race another slot's for them
    groups, workers, placed = [], [], []
    if slots == 1 and single_machine():  # no worker process to start: the trials run here
        pooled.append(pool.start_pool(len(bundles), prefix=prefix) if pooling else [])
        workers.append(InProcess(TrialWorker(pooled[0])))
    else:  # a slot's worker and warm hosts on its group's node
        strategy = "STRICT_PACK" if fits_one_node(bundles) else "PACK"
        groups = [placement_group(bundles, strategy=strategy) for _ in range(slots)]
        ray.get([g.ready() for g in groups])
        for k, g in enumerate(groups):
            placed.append(PlacementGroupSchedulingStrategy(g, -1, True))
            pooled.append(pool.start_pool(len(bundles), prefix=f"{prefix}{k}-", strategy=placed[k]) if pooling else [])
            workers.append(worker_class().options(scheduling_strategy=placed[k]).remote(pooled[k]))
    queue = deque(trials)
    attempts: dict[str, int] = {}
    datasets: dict[str, Any] = {}  # data key -> its dataset in the object store, while a trial still needs it
    needed = Counter(data_key(t.raw) for t in trials)
    running: dict[Any, tuple[int, Trial]] = {}
    idle = list(range(slots))
    out = SlotRun()

    def stop(signum: int, frame: Any) -> None:
        if out.interrupted:
            raise KeyboardInterrupt(f"signal {signum}")
        out.interrupted = True
        print(f"rayfl: {signal.Signals(signum).name}: stopping every running trial after its round with a "
              "checkpoint (send it again to stop at once)", file=sys.stderr, flush=True)
        for w in workers:
            w.stop.remote()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        while running or (queue and not out.interrupted):
            while queue and idle and not out.interrupted:
                trial = queue.popleft()
                key = data_key(trial.raw)
                if key not in datasets:
                    datasets[key] = ray.put(build(trial.raw))
                slot = idle.pop()
                ref = workers[slot].run.remote(trial_payload(name, trial), datasets[key])
                running[ref] = (slot, trial)
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                slot, trial = running.pop(ref)
                idle.append(slot)
                try:
                    result = ray.get(ref)
                except host_lost() as e:  # the worker process died: a new one in its slot, the trial failed
                    workers[slot] = worker_class().options(scheduling_strategy=placed[slot]).remote(pooled[slot])
                    result = {"error": f"its trial worker died ({type(e).__name__})", "interrupted": False, "seconds": 0.0}
                out.interrupted |= result["interrupted"]
                if result["error"] is None:
                    out.errors.pop(trial.run_id, None)
                    if verbose:
                        print(f"rayfl sweep: [{time.perf_counter() - began:.1f} s] {trial.run_id} ran in "
                              f"{result['seconds']:.1f} s", file=sys.stderr, flush=True)
                else:
                    out.errors[trial.run_id] = result["error"]
                    attempts[trial.run_id] = attempts.get(trial.run_id, 0) + 1
                    if max_failures < 0 or attempts[trial.run_id] <= max_failures:
                        queue.append(trial)  # retried: it resumes from its checkpoint if it has one
                        continue
                key = data_key(trial.raw)
                needed[key] -= 1
                if not needed[key]:  # no trial left needs it: the object store frees it
                    datasets.pop(key, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for w in workers:
            if isinstance(w, InProcess):
                w.close()
            else:
                ray.kill(w)
        for names in pooled:
            stop_hosts(names)
        for g in groups:
            remove_placement_group(g)
    return out


def worker_class() -> Any:
    import ray

    return ray.remote(num_cpus=0, max_concurrency=2, max_restarts=0)(TrialWorker)


def single_machine() -> bool:
    """Whether the sweep's Ray is this machine alone (then one slot runs in this process)."""
    import ray

    return len([n for n in ray.nodes() if n.get("Alive")]) == 1


def fits_one_node(bundles: Sequence[Mapping[str, float]]) -> bool:
    """Whether one node of the cluster holds a slot's bundles: then its worker and warm hosts
    share that node (a pooled host serves drivers on its own node only)."""
    import ray

    need = {k: sum(b.get(k, 0.0) for b in bundles) for k in ("CPU", "GPU")}
    return any(all(n["Resources"].get(k, 0.0) >= v for k, v in need.items()) for n in ray.nodes() if n.get("Alive"))


def leases_pool(trials: Sequence[Trial]) -> bool:
    """Whether the trials lease warm hosts (rayfl.engine.pool): not with engine.pool off or GPU hosts."""
    return not any(t.raw["engine"].get("pool") == "off" or t.raw["engine"].get("device") == "cuda"
                   or float(t.raw["engine"].get("num_gpus_per_host") or 0) > 0 for t in trials)


def stop_hosts(names: Sequence[str]) -> None:
    """Kill the sweep's private pool."""
    import ray

    from rayfl.engine.pool import NAMESPACE

    for name in names:
        with contextlib.suppress(ValueError):  # already gone
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)


def dataset_builder(raw: dict[str, Any]) -> Any:
    """A trial's dataset, built as its run would build it (from the disk cache when built before)."""
    from rayfl.runner import build_dataset

    return build_dataset(config_from_dict(raw))

