"""Warm pooled hosts (rayfl.engine.pool): a run that leases them writes the same tables as a
run with fresh hosts; a lease is exclusive while its driver lives and taken over once it is
gone; a host whose loaded code changed on disk, or whose Python stack differs from the
driver's, refuses, and the run starts a fresh host instead and refills the pool."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from rayfl.config import ConfigError, load_config
from rayfl.engine import pool
from rayfl.results import load
from rayfl.runner import run_experiment

LAYOUT_COLUMNS = ["wall_time", "run_id", "experiment"]


def run(results_dir: Path, run_id: str, *extra: str):
    cfg = load_config(None, [
        "data.dataset=synthetic", "partition.num_clients=12", "algorithm.name=fedavg", "algorithm.clients_per_round=6",
        "run.rounds=3", "engine.num_hosts=2", "engine.vectorize=on", "output.log_clients=true", f"output.dir={results_dir}",
        f"run.run_id={run_id}", *extra,
    ])
    out = run_experiment(cfg)
    return load(out.run_dir), out.run_dir


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in LAYOUT_COLUMNS if c in df.columns]).reset_index(drop=True)


@pytest.fixture
def empty_pool(ray_local, refill_pool):
    """No pooled host, then the session's test pool back (tests/conftest.py)."""
    pool.stop_pool()
    _wait_gone()
    yield pool
    pool.stop_pool()
    _wait_gone()
    refill_pool()


def _wait_gone(timeout: float = 20.0) -> None:
    end = time.time() + timeout
    while pool.pool_names() and time.time() < end:
        time.sleep(0.1)
    assert not pool.pool_names()


def manifest_hosts(run_dir) -> list[dict]:
    import json

    return json.loads((Path(run_dir) / "manifest.json").read_text())["placement"]["hosts"]


def test_leased_hosts_give_the_fresh_hosts_tables_and_go_back_idle(empty_pool, results_dir):
    fresh, fresh_dir = run(results_dir, "fresh")
    assert not any("pool" in h for h in manifest_hosts(fresh_dir))
    assert sorted(pool.start_pool(2)) == ["rayfl-pool-host-0", "rayfl-pool-host-1"]
    pids = {s["name"]: s["pid"] for s in pool.pool_status()}
    for i in range(2):  # twice: a host emptied by its release starts as fresh as a new one
        warm, warm_dir = run(results_dir, f"warm{i}")
        hosts = manifest_hosts(warm_dir)
        assert sorted(h["pool"] for h in hosts) == sorted(pids)
        assert {h["pid"] for h in hosts} == set(pids.values())
        for table in ("rounds", "clients", "evals"):
            pd.testing.assert_frame_equal(comparable(getattr(fresh, table)), comparable(getattr(warm, table)))
    status = pool.pool_status()
    assert [s["leased_by"] for s in status] == [None, None]
    assert [s["leases"] for s in status] == [2, 2]
    off, off_dir = run(results_dir, "pool-off", "engine.pool=off")
    assert not any("pool" in h for h in manifest_hosts(off_dir))
    assert [s["leases"] for s in pool.pool_status()] == [2, 2]


def test_a_stale_pooled_host_is_skipped_and_replaced(empty_pool, results_dir, tmp_path):
    pool.start_pool(1)
    import ray

    before = pool.pool_status()[0]
    handle = ray.get_actor(before["name"], namespace=pool.NAMESPACE)
    # make the host believe a file it loaded changed since: its stamp no longer matches the disk
    mod = tmp_path / "pooled_mod.py"
    mod.write_text("X = 1\n")
    ray.get(handle.__ray_call__.remote(lambda self: self._slot.files.__setitem__(str(mod), (1, 1))))
    res, run_dir = run(results_dir, "stale", "engine.num_hosts=1")
    assert not any("pool" in h for h in manifest_hosts(run_dir))  # a fresh host ran the clients
    end = time.time() + 60
    while time.time() < end:
        after = pool.pool_status() if pool.pool_names() else []
        if after and after[0]["pid"] != before["pid"]:
            break
        time.sleep(0.2)
    assert after and after[0]["name"] == before["name"] and after[0]["pid"] != before["pid"]
    assert not after[0]["stale"]


@pytest.fixture
def host(ray_local):
    return pool.PooledHost("in-process")


def dead_holder() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    import psutil

    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return {**pool.holder(), "pid": proc.pid, "started": started}


def test_a_lease_is_exclusive_while_its_driver_lives(host):
    me, ident = pool.holder(), pool.identity()
    assert host.lease(me, ident) is None
    other = {**me, "pid": os.getppid()}
    import psutil

    other["started"] = psutil.Process(os.getppid()).create_time()
    assert "leased by process" in host.lease(other, ident)
    with pytest.raises(RuntimeError, match="not leased to this driver"):
        host.become(other, 0, {}, {}, None, None, (2,), 2, 0)
    assert host.release(other) is False
    assert host.release(me) is True
    assert host.lease(other, ident) is None


def test_two_runs_of_one_driver_never_share_a_host(host):
    """Two runs in one process (threads, a notebook, the tests' own runs) hold their own leases:
    the second may not empty the first's host."""
    first, second, ident = pool.holder(), pool.holder(), pool.identity()
    assert first["pid"] == second["pid"] and first != second
    assert host.lease(first, ident) is None
    host.clients = "the first run's clients"
    assert "another run of this driver" in host.lease(second, ident)
    with pytest.raises(RuntimeError, match="not leased to this driver"):
        host.become(second, 0, {}, {}, None, None, (2,), 2, 0)
    assert host.release(second) is False and host.clients == "the first run's clients"
    assert host.release(first) is True
    assert host.lease(second, ident) is None


def test_a_dead_drivers_lease_is_taken_over_and_its_clients_dropped(host):
    gone = dead_holder()
    assert host.lease(gone, pool.identity()) is None
    host.leftover = "a killed run's clients"
    me = pool.holder()
    assert host.lease(me, pool.identity()) is None
    assert not hasattr(host, "leftover")


def test_another_python_stack_or_node_is_refused(host):
    me, ident = pool.holder(), pool.identity()
    assert "runs another torch" in host.lease(me, {**ident, "torch": "0.0"})
    assert "runs another rayfl" in host.lease(me, {**ident, "rayfl": "/elsewhere/rayfl"})
    # a driver of `ray job submit --working-dir .` imports code the pooled host never saw
    assert "runs another runtime_env" in host.lease(me, {**ident, "runtime_env": '{"working_dir": "gcs://_ray_pkg_x.zip"}'})
    assert "its own node" in host.lease({**me, "node_id": "f" * 56}, ident)
    assert host.lease(me, ident) is None


def test_code_changed_on_disk_makes_the_host_stale(ray_local, tmp_path, monkeypatch):
    me, ident = pool.holder(), pool.identity()
    monkeypatch.syspath_prepend(str(tmp_path))

    def module(name: str, mtime_ns: int) -> None:
        path = tmp_path / f"{name}.py"
        path.write_text("X = 1\n")
        os.utime(path, ns=(mtime_ns, mtime_ns))

    try:
        # a module the host had loaded when it started, changed since
        module("pool_old_mod", time.time_ns() - 10**10)
        importlib.import_module("pool_old_mod")
        watching = pool.PooledHost("watching")
        assert watching.lease(me, ident) is None and watching.release(me)
        os.utime(tmp_path / "pool_old_mod.py", ns=(time.time_ns(), time.time_ns()))
        assert "pool_old_mod.py changed on disk" in watching.lease(me, ident)

        # a module first imported during a lease, from a file newer than the lease's start
        second = pool.PooledHost("second")
        assert second.lease(me, ident) is None
        module("pool_new_mod", time.time_ns() + 10**9)
        importlib.import_module("pool_new_mod")
        assert second.release(me)
        assert "pool_new_mod.py" in second.lease(me, ident)

        # one imported during a lease from an older file is watched from then on, not stale
        calm = pool.PooledHost("calm")
        assert calm.lease(me, ident) is None
        module("pool_older_mod", time.time_ns() - 10**10)
        importlib.import_module("pool_older_mod")
        assert calm.release(me) and calm.lease(me, ident) is None
        assert str(tmp_path / "pool_older_mod.py") in calm._slot.files
        os.utime(tmp_path / "pool_older_mod.py", ns=(time.time_ns(), time.time_ns()))
        assert calm.release(me)
        assert "pool_older_mod.py changed on disk" in calm.lease(me, ident)
    finally:
        for name in ("pool_old_mod", "pool_new_mod", "pool_older_mod"):
            sys.modules.pop(name, None)


def test_engine_pool_is_validated():
    with pytest.raises(ConfigError, match="engine.pool"):
        load_config(None, ["engine.pool=sometimes"])
