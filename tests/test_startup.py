"""Start-up (issue 13, part 7): commands that run nothing import neither torch nor Ray, and
`rayfl bench startup` splits a whole `rayfl run` process into phases that add up."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rayfl.bench.startup import PHASES, phase_seconds
from rayfl.cli import main

REPO = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter (this test process has torch loaded long ago): commands that run
# nothing import neither torch nor Ray, and config mistakes never import Ray.
PROBE = """
import json, sys
from rayfl.cli import main
codes = []
for argv in (["--help"], ["run", "--help"], ["bench", "startup", "--help"]):
    try:
        main(argv)
    except SystemExit as e:
        codes.append(e.code)
try:
    main(["report", sys.argv[1]])
except FileNotFoundError:
    codes.append("no runs")
light = sorted(m for m in ("torch", "ray", "rayfl.engine.federation") if m in sys.modules)
codes.append(main(["run", "--set", "algorithm.lr=-1"]))
print(json.dumps({"codes": codes, "light": light, "ray": "ray" in sys.modules}))
"""


def test_help_and_report_import_neither_torch_nor_ray(tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["codes"] == [0, 0, 0, "no runs", 2], proc.stderr
    assert out["light"] == [], f"imported by commands that run nothing: {out['light']}"
    assert not out["ray"], "a config mistake imported Ray"
    assert "algorithm.lr" in proc.stderr


def test_phase_seconds_cover_launch_to_exit():
    marks = [("cli", 100.5), ("config", 101.0), ("dataset", 103.0), ("ray_init", 107.5), ("printed", 120.0)]
    phases = phase_seconds(100.0, 120.25, marks)
    assert phases == {"cli": 0.5, "config": 0.5, "dataset": 2.0, "ray_init": 4.5, "printed": 12.5, "exit": 0.25}
    assert sum(phases.values()) == pytest.approx(20.25)


def test_bench_startup_writes_phases_that_add_up(tmp_path, monkeypatch, capsys):
    """One real `rayfl run` process (tiny: 12 clients, 2 rounds) through the CLI subcommand.
    Block-buffered stdout in the child: the run's fast exit must still flush its results line."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    out = tmp_path / "startup.json"
    tiny = ["partition.num_clients=12", "algorithm.clients_per_round=3", "model.hidden=[8]", "engine.num_hosts=1"]
    argv = ["bench", "startup", "--rounds", "2", "--out", str(out)]
    for s in tiny:
        argv += ["--set", s]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result == json.loads(capsys.readouterr().out)
    run = result["runs"][0]
    assert set(run["phases"]) == set(PHASES), "every phase of a run is marked, once"
    assert sum(run["phases"].values()) == pytest.approx(run["total_seconds"], abs=0.02)
    assert 0 < run["rounds_seconds"] < run["rounds_seconds_table"] < run["total_seconds"]
    # each of the three is rounded to milliseconds on its own
    assert run["outside_rounds_seconds"] == pytest.approx(run["total_seconds"] - run["rounds_seconds"], abs=2.5e-3)
    # the rounds' own wall time is the `rounds_done` phase, up to the time between the last
    # round's row and the run's end (the summary)
    assert run["rounds_seconds"] == pytest.approx(run["phases"]["rounds_done"], abs=0.5)
    assert len(run["round_seconds"]) == 2 and sum(run["round_seconds"]) == pytest.approx(run["rounds_seconds"], abs=1e-2)
    assert result["outside_rounds_seconds"] == run["outside_rounds_seconds"]  # one run: it is the median
    assert "engine.num_hosts=1" in result["command"] and result["command"].split()[1] == "run"
    assert run["cpu_seconds"] > 0
    assert Path(run["run_dir"], "manifest.json").is_file()


@pytest.mark.slow
def test_bench_startup_warm_joins_its_own_head_and_leases_its_pool(tmp_path, capsys):
    """`--warm`: a head of the bench's own (`ray start --head --block`), a pool on it started
    through `rayfl pool start`, a timed run in another process that leases the pooled host,
    and the head's processes gone at the end."""
    import psutil

    out = tmp_path / "startup.json"
    argv = ["bench", "startup", "--warm", "--hosts", "1", "--rounds", "2", "--out", str(out)]
    for s in ["partition.num_clients=12", "algorithm.clients_per_round=3", "model.hidden=[8]", "engine.num_hosts=1"]:
        argv += ["--set", s]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["mode"].startswith("warm")
    run = result["runs"][0]
    hosts = json.loads(Path(run["run_dir"], "manifest.json").read_text())["placement"]["hosts"]
    assert [h.get("pool") for h in hosts] == ["rayfl-pool-host-0"]
    left = []
    for p in psutil.process_iter(["cmdline"]):
        if any("rayfl-head-" in part for part in (p.info["cmdline"] or [])):
            left.append(p.pid)
    assert not left, f"the bench's head left processes {left}"


def test_build_dataset_on_one_blas_thread_gives_the_same_data(monkeypatch, tmp_path):
    """The run's dataset is built with BLAS on one thread (fast on a busy machine): the very
    same arrays as the plain build, and BLAS gets its threads back afterwards."""
    import numpy as np
    from threadpoolctl import threadpool_info

    from rayfl import runner
    from rayfl.config import load_config
    from rayfl.data import build_federated_dataset

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    seen: list[list[int]] = []

    def spy(*args):
        seen.append(blas_threads())
        return build_federated_dataset(*args)

    cfg = load_config(None, ["data.dataset=synthetic", "data.features=300", "partition.num_clients=30"])
    monkeypatch.setenv("RAYFL_CACHE_DIR", str(tmp_path))  # an empty dataset cache: this run builds
    threads = blas_threads()
    monkeypatch.setattr(runner, "build_federated_dataset", spy)
    ours, plain = runner.build_dataset(cfg), build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    assert seen and all(n == 1 for n in seen[0]), seen
    for key in ("train_x", "train_y", "test_x", "test_y"):
        assert np.array_equal(getattr(ours, key), getattr(plain, key)), key
    assert blas_threads() == threads


# A local Ray as a run starts it: a head held by a process of its own, without the API server
# and the autoscaler monitor, whose idle workers have imported the hosts' modules before any
# host asks them to; stopping it leaves no process behind.
KINDS = """
def kind(proc):
    line = " ".join(proc.cmdline())
    for key, name in (("dashboard/agent.py", "dashboard_agent"), ("runtime_env/agent/main.py", "runtime_env_agent"),
                      ("gcs_server", "gcs"), ("raylet", "raylet"), ("log_monitor.py", "log_monitor"),
                      ("dashboard/dashboard.py", "api_server"), ("autoscaler/_private/monitor.py", "autoscaler"),
                      ("ray::DashboardAgent", "dashboard_agent"), ("ray::RuntimeEnvAgent", "runtime_env_agent"),
                      ("rayfl.engine.worker_fork", "fork_server"),
                      ("default_worker.py", "worker"), ("ray::", "worker")):
        if key in line:
            return name
    return line[:60]

def alive(proc):
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
"""
LOCAL_RAY = KINDS + """
import json, sys, time
import psutil, ray
from rayfl.engine import local_ray

local_ray.start_local_ray(num_cpus=1, logging_level="ERROR")
helper = psutil.Process(local_ray._head.process.pid)
own = local_ray.joined_own_head()  # a private head: a run here never asks it for pooled hosts
single = local_ray.single_machine()  # its hosts may map this machine's files (rayfl.data.mapped)
task_events = ray._private.state.state.get_system_config().get("task_events_report_interval_ms")
node_address = [n["NodeManagerAddress"] for n in ray.nodes()]

@ray.remote(num_cpus=1)
def preloaded():
    return sorted(m for m in ("torch", "rayfl.engine.host", "rayfl.algorithms") if m in sys.modules)

@ray.remote(num_cpus=1)
def shout():
    print("a worker's line for the terminal")

time.sleep(1)
mods = ray.get(preloaded.remote())
ray.get(shout.remote())
time.sleep(1.5)  # the log monitor reads the worker's file every 0.1 s; the driver prints what it publishes
tree = helper.children(recursive=True)
kinds = sorted({kind(p) for p in tree})
local_ray.stop_ray()
import os
from ray._private import ray_constants
network = [node_address, os.environ.get(local_ray.LOOPBACK_ENV), ray_constants.ENABLE_RAY_CLUSTER]
print(json.dumps({"network": network, "preloaded": mods, "kinds": kinds, "left": [kind(p) for p in [helper, *tree] if alive(p)],
                  "up": ray.is_initialized(), "head": local_ray._head is None,
                  "own": [own, local_ray.joined_own_head()], "single": single, "task_events": task_events}))
"""


def test_local_ray_is_a_lean_head_with_preloaded_workers_and_leaves_nothing():
    proc = subprocess.run([sys.executable, "-c", LOCAL_RAY], capture_output=True, text=True, cwd=REPO, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["preloaded"] == ["rayfl.algorithms", "rayfl.engine.host", "torch"]
    # the agents (niced: they may not have set their titles yet) and the workers' fork server;
    # the log monitor is a thread of the head's process, and workers' output still reaches the run
    assert {"gcs", "raylet", "dashboard_agent", "runtime_env_agent", "worker", "fork_server"} <= set(out["kinds"]), out
    assert not {"api_server", "autoscaler", "log_monitor"} & set(out["kinds"]), out
    assert "a worker's line for the terminal" in proc.stdout + proc.stderr
    assert out["own"] == [True, False], out  # joined its own head; then stopped it
    assert out["single"] is True, out
    assert out["task_events"] == 0, out  # off: nothing reads them, and ray.shutdown waited for their flush
    assert out["left"] == [] and not out["up"] and out["head"], out
    # the node's address was loopback (Ray imported before the head started); afterwards this
    # process is as before, free to join a cluster
    assert out["network"] == [["127.0.0.1"], None, True], out


# `rayfl run` as its own process (main() without argv) starts the head before it loads the
# config; a mistake found meanwhile stops it, and everything it started, at once.
EARLY_HEAD = KINDS + """
import json, sys, time
import psutil
from rayfl.cli import main
from rayfl.engine import local_ray

seen = []
stop = local_ray.LocalHead.stop
def spy(self):
    helper = psutil.Process(self.process.pid)
    seen.append([helper, *helper.children(recursive=True)])
    t = time.perf_counter()
    stop(self)
    seen[-1] = (seen[-1], time.perf_counter() - t)
local_ray.LocalHead.stop = spy
sys.argv = ["rayfl", "run", "--quiet", "--set", sys.argv[1]]
code = main()
procs, took = seen[0]
print(json.dumps({"code": code, "heads": len(seen), "left": [kind(p) for p in procs if alive(p)],
                  "stop_seconds": took}))
"""


def test_a_mistake_after_the_early_head_started_stops_it_at_once():
    proc = subprocess.run([sys.executable, "-c", EARLY_HEAD, "algorithm.lr=-1"], capture_output=True, text=True,
                          cwd=REPO, timeout=180)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["code"] == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rayfl: error:")]
    assert len(errors) == 1 and "algorithm.lr" in errors[0], proc.stderr
    assert out["heads"] == 1 and out["left"] == [], out
    assert out["stop_seconds"] < 5.0, out


def test_a_local_ray_that_does_not_start_is_one_line_and_status_1(tmp_path):
    """Not a bug of rayfl's (here an unusable RAY_TMPDIR): the reason Ray gave, on one line."""
    import os

    env = {**os.environ, "RAY_TMPDIR": "/proc/no-such-dir"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "rayfl.cli", "run", "--quiet", "--set", "run.rounds=1",
                           "--set", f"output.dir={tmp_path}"], capture_output=True, text=True, cwd=REPO,
                          timeout=180, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rayfl: error:")]
    assert len(errors) == 1 and "did not start" in errors[0] and "/proc/no-such-dir" in errors[0], proc.stderr


def test_the_heads_agent_ports_are_free_and_below_the_ephemeral_range(monkeypatch):
    """The agents' ports are picked before the agents bind them: from below the range every
    outgoing connection's source port comes from, never one held now, never twice; where that
    gap is too narrow, the kernel picks them."""
    from rayfl.engine import head_process

    ports = head_process.free_ports(4)
    assert len(set(ports)) == 4
    assert all(head_process.PICK_FROM <= p < head_process.ephemeral_start() for p in ports)
    with socket.socket() as held:
        held.bind(("", ports[0]))
        taken = held.getsockname()[1]
        draws = iter([taken, taken + 1, taken + 1, taken + 2])
        monkeypatch.setattr(random.SystemRandom, "randint", lambda self, a, b: next(draws))
        assert head_process.free_ports(2) == [taken + 1, taken + 2]  # held ports skipped: elsewhere, and its own
    monkeypatch.setattr(head_process, "ephemeral_start", lambda: head_process.PICK_FROM + 10)
    wide = head_process.free_ports(3)
    assert len(set(wide)) == 3 and all(p > 0 for p in wide)  # the kernel's choice: anywhere free
