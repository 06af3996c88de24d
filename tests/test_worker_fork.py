"""Workers of the head rayfl starts: launched without Ray's double import, forked from one warm
process (rayfl.engine.worker_launch, rayfl.engine.worker_fork), and the same runs either way."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rayfl.engine.worker_launch import (
    direct_command,
    forkable,
    receive_message,
    run_forked,
    send_message,
)

REPO = Path(__file__).resolve().parents[1]
WORKER = ["/ray/_private/workers/default_worker.py", "--node-ip-address=1.2.3.4", "--language-server=x"]


def context(**fields) -> str:
    return "--serialized-runtime-env-context=" + json.dumps(fields)


def test_an_empty_runtime_env_context_execs_the_worker_directly():
    assert direct_command([context(), "--language=PYTHON", *WORKER]) == [sys.executable, *WORKER]
    assert direct_command(["--language=PYTHON", *WORKER]) == [sys.executable, *WORKER]
    assert direct_command([context(py_executable="/other/python", env_vars={}), "--language=PYTHON", *WORKER]) == [
        "/other/python", *WORKER]
    assert forkable([sys.executable, *WORKER])
    assert not forkable(["/other/python", *WORKER]) and not forkable([sys.executable, "-S", *WORKER])


@pytest.mark.parametrize("fields", [{"env_vars": {"A": "1"}}, {"command_prefix": ["conda", "run"]},
                                    {"override_worker_entrypoint": "/w.py"}, {"java_jars": ["a.jar"]}])
def test_a_runtime_env_context_that_asks_for_something_goes_to_rays_own_script(fields):
    assert direct_command([context(**fields), "--language=PYTHON", *WORKER]) is None
    assert direct_command([context(), "--language=JAVA", *WORKER]) is None
    assert direct_command(["--serialized-runtime-env-context={oops", "--language=PYTHON", *WORKER]) is None


def test_messages_carry_json_and_file_descriptors(tmp_path):
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    path = tmp_path / "f.txt"
    with open(path, "w") as f:
        send_message(left, {"argv": ["x"] * 5000, "env": {"K": "é"}}, [f.fileno()])
        message, fds = receive_message(right)
    assert message == {"argv": ["x"] * 5000, "env": {"K": "é"}} and len(fds) == 1
    os.write(fds[0], b"through the passed descriptor")
    os.close(fds[0])
    assert path.read_text() == "through the passed descriptor"
    left.close()
    with pytest.raises(EOFError):
        receive_message(right)
    right.close()


def test_the_launcher_execs_its_worker_when_no_server_forks_it(tmp_path):
    """No server at the socket, or a refusal: nothing was started, so the launcher execs."""
    import threading

    assert run_forked(str(tmp_path / "absent.sock"), WORKER) is None
    path = str(tmp_path / "refusing.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    seen = []

    def refuse() -> None:
        conn, _ = listener.accept()
        request, fds = receive_message(conn)
        seen.append((request["argv"], len(fds)))
        for fd in fds:
            os.close(fd)
        send_message(conn, {"refused": "RAY_JOB_ID differs"})
        conn.close()

    server = threading.Thread(target=refuse)
    server.start()
    assert run_forked(path, WORKER) is None
    server.join(timeout=10)
    listener.close()
    assert seen == [(WORKER, 3)]  # the worker's argv and its three standard streams


def test_a_worker_with_other_internal_flags_is_not_forked():
    from rayfl.engine.worker_fork import ForkServer

    server = ForkServer.__new__(ForkServer)
    server.flags = {"RAY_RAYLET_PID": "41", "RAY_JOB_ID": "ffffffff"}
    ok = {"argv": WORKER, "cwd": "/", "env": {"RAY_RAYLET_PID": "41", "RAY_JOB_ID": "ffffffff"}}
    assert server.refusal(ok) is None
    assert "RAY_JOB_ID" in server.refusal({**ok, "env": {**ok["env"], "RAY_JOB_ID": "01000000"}})
    assert "RAY_RAYLET_PID" in server.refusal({**ok, "env": {"RAY_JOB_ID": "ffffffff"}})
    assert server.refusal({"argv": WORKER}) == "malformed request"


def test_launchers_that_come_before_the_heads_flags_wait_for_them(tmp_path):
    """The raylet may start its workers before the head has sent the fork server Ray's internal
    flags: their requests are kept, in order, with their standard streams, and served after."""
    from rayfl.engine.head_process import fork_socket
    from rayfl.engine.worker_fork import tell_flags, wait_for_flags

    listener, path = fork_socket(tmp_path)
    launcher = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    launcher.connect(path)  # before anyone accepts: it waits in the backlog
    send_message(launcher, {"argv": WORKER, "env": {}, "cwd": "/"}, [0, 1, 2])
    stray = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stray.connect(path)
    stray.close()  # connects and says nothing: skipped
    tell_flags(path, {"RAY_RAYLET_PID": "41", "RAY_JOB_ID": "ffffffff"})
    flags, early = wait_for_flags(listener)
    assert flags == {"RAY_RAYLET_PID": "41", "RAY_JOB_ID": "ffffffff"}
    assert [(request["argv"], len(fds)) for _, request, fds in early] == [(WORKER, 3)]
    for conn, _, fds in early:
        for fd in fds:
            os.close(fd)
        conn.close()
    launcher.close()
    listener.close()
    tell_flags(path, {"RAY_RAYLET_PID": "41"})  # nobody listening any more: no error, the workers are exec'd


def test_the_fork_server_is_never_forked_from_a_process_that_imported_ray(tmp_path):
    import ray  # noqa: F401 - its internal flags would be the driver's

    from rayfl.engine.head_process import fork_socket
    from rayfl.engine.worker_fork import fork_from_here

    listener, _ = fork_socket(tmp_path)
    with listener, pytest.raises(RuntimeError, match="before Ray is imported"):
        fork_from_here(listener)


GUARDED_FORK = """
import json, sys
import torch
from rayfl.engine.local_ray import DriverForkServer

if sys.argv[1] == "cuda":
    torch.cuda.is_initialized = lambda: True  # as if this process had used its GPU
server = DriverForkServer()
server.start()
forked = server.pid is not None
server.stop()
print(json.dumps({"forked": forked, "listener_closed": server.listener is None}))
"""


@pytest.mark.parametrize("cuda", ["cuda", "none"])
def test_a_driver_that_initialised_cuda_is_not_forked(cuda):
    """CUDA initialised before a fork is unusable in the child: such a driver's socket is closed
    instead, and the launchers exec their workers."""
    proc = subprocess.run([sys.executable, "-c", GUARDED_FORK, cuda], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"forked": cuda == "none", "listener_closed": True}


# `rayfl run` starting its own Ray forks the workers' server from its own process once its
# config is loaded: the hosts are children of that server (named rayfl-fork), a child of the
# run's process, and nothing of either is left once the run's process has exited.
WATCHED_RUN = """
import json, os, subprocess, sys, time
import psutil
cmd, tmp = json.loads(sys.argv[1]), sys.argv[2]
run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
hosts = {}
while run.poll() is None:
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["cmdline"] and p.info["cmdline"][0].startswith("ray::ClientHost") and p.pid not in hosts \
                    and p.environ().get("RAY_TMPDIR") == tmp:  # this run's: other tests' hosts run beside it
                server = p.parent()
                hosts[p.pid] = [server.name(), server.ppid() == run.pid]
        except (psutil.Error, TypeError):
            pass
    time.sleep(0.05)
out, err = run.communicate()
left, me = [], os.getpid()
for p in psutil.process_iter(["pid", "name", "status"]):
    try:
        if p.pid != me and p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get("RAY_TMPDIR") == tmp:
            left.append(" ".join(p.cmdline())[:200])
    except psutil.Error:
        pass
print(json.dumps({"rc": run.returncode, "results": "results:" in out, "hosts": list(hosts.values()),
                  "left": left, "err": err[-2000:]}))
"""


def test_a_runs_hosts_are_forked_from_its_own_process_and_go_with_it(tmp_path):
    import shutil
    import tempfile

    ray_tmp = Path(tempfile.mkdtemp(prefix="rf-"))  # short: Ray's socket paths live under it
    sets = ["data.dataset=digits", "partition.method=iid", "partition.num_clients=20", "algorithm.clients_per_round=6",
            "run.rounds=40", "model.name=mlp", "model.hidden=[16]", "engine.num_hosts=2", "engine.pool=off",
            f"output.dir={tmp_path}"]
    cmd = [sys.executable, "-m", "rayfl.cli", "run", "--quiet", *(a for s in sets for a in ("--set", s))]
    env = {k: v for k, v in os.environ.items() if k not in ("RAYFL_FORK_WORKERS", "RAY_ADDRESS")}
    env["RAY_TMPDIR"] = str(ray_tmp)
    try:
        proc = subprocess.run([sys.executable, "-c", WATCHED_RUN, json.dumps(cmd), str(ray_tmp)], capture_output=True,
                              text=True, cwd=REPO, timeout=240, env=env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0 and out["results"], out["err"]
    assert out["hosts"] == [["rayfl-fork", True], ["rayfl-fork", True]], out
    assert out["left"] == [], out


# A head as `rayfl run` starts it. Its workers are forked by its fork server and their launchers
# are the processes the raylet knows; a worker whose runtime_env sets variables goes through
# Ray's own setup script, and one started later for the job is refused by the server: both are
# exec'd. Killing a launcher kills its worker; killing a worker ends
# its launcher; stopping the head leaves nothing.
FORKED = """
import json, os, sys, time
import psutil, ray
from rayfl.engine import local_ray

local_ray.start_local_ray(num_cpus=2, logging_level="ERROR")
HELPER = local_ray._head.process.pid
helper = psutil.Process(HELPER)

def alive(p):
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone, also between two calls
        return False

def role(p):
    cmd = p.cmdline()
    return ("server" if "rayfl.engine.worker_fork" in cmd and p.ppid() == HELPER else
            "launcher" if len(cmd) > 1 and cmd[1].endswith("worker_launch.py") else "other")

@ray.remote(num_cpus=0.5)  # four of them on 2 CPUs
class Probe:
    def where(self):
        me = psutil.Process()
        return {"pid": os.getpid(), "parent": role(me.parent()), "job": os.environ.get("RAY_JOB_ID"),
                "var": os.environ.get("PROBE_VAR"), "torch": "torch" in sys.modules}

forked = [Probe.remote() for _ in range(2)]
plain = Probe.options(runtime_env={"env_vars": {"PROBE_VAR": "set"}}).remote()
info = ray.get([p.where.remote() for p in [*forked, plain]])
late = Probe.remote()  # a worker started for the job, not prestarted: its flags differ
info.append(ray.get(late.where.remote()))
tree = helper.children(recursive=True)
launchers = [p for p in tree if role(p) == "launcher"]

# a worker killed: its launcher goes too
victim = psutil.Process(info[0]["pid"])
victim.kill()
deadline = time.time() + 20
while time.time() < deadline and sum(alive(p) for p in launchers) == len(launchers):
    time.sleep(0.1)
launchers_after_kill = sum(alive(p) for p in launchers)

# a launcher killed: its worker goes too
other = psutil.Process(info[1]["pid"])
for p in launchers:
    try:
        p.kill()
    except psutil.Error:
        pass
deadline = time.time() + 20
while time.time() < deadline and alive(other):
    time.sleep(0.1)
orphan_alive = alive(other)

tree = helper.children(recursive=True)
local_ray.stop_ray()
left = [p.pid for p in [helper, *tree] if alive(p)]
print(json.dumps({"info": info, "launchers": len(launchers), "launchers_after_kill": launchers_after_kill,
                  "orphan_alive": orphan_alive, "left": left}))
"""


def test_workers_are_forked_warm_and_live_and_die_with_their_launchers():
    env = {k: v for k, v in os.environ.items() if k != "RAYFL_FORK_WORKERS"}
    proc = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, cwd=REPO, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    forked, plain, late = out["info"][:2], out["info"][2], out["info"][3]
    assert all(w["parent"] == "server" and w["torch"] for w in forked), out
    assert {w["job"] for w in forked} == {"ffffffff"}  # the prestarted workers, as Ray's own have it
    assert plain["parent"] != "server" and plain["var"] == "set", out  # exec'd through Ray's setup script
    assert late["parent"] != "server" and late["job"] not in (None, "ffffffff"), out  # refused, exec'd
    assert out["launchers"] == 2, out  # the exec'd worker is no launcher any more
    assert out["launchers_after_kill"] < out["launchers"], out
    assert not out["orphan_alive"], out
    assert out["left"] == [], out


def test_forked_and_execd_workers_give_identical_runs(tmp_path):
    """The same `rayfl run` (its own head, 2 hosts) with forked workers and with Ray's exec'd ones."""
    from rayfl.results import load

    sets = ["data.dataset=digits", "partition.method=iid", "partition.num_clients=20", "algorithm.clients_per_round=6", "run.rounds=3",
            "model.name=mlp", "model.hidden=[16]", "engine.num_hosts=2", "engine.pool=off", f"output.dir={tmp_path}"]
    runs = {}
    for run_id, fork in (("forked", "on"), ("execd", "off")):
        env = {**os.environ, "RAYFL_FORK_WORKERS": fork}
        env.pop("RAY_ADDRESS", None)
        cmd = [sys.executable, "-m", "rayfl.cli", "run", "--quiet", *(a for s in [*sets, f"run.run_id={run_id}"]
                                                                          for a in ("--set", s))]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[run_id] = load(tmp_path / "default" / run_id)
    for table in ("rounds", "clients", "evals"):
        a, b = (getattr(runs[m], table) for m in ("forked", "execd"))
        drop = [c for c in ("wall_time", "run_id") if c in a.columns]
        assert len(a) > 0
        assert a.drop(columns=drop).equals(b.drop(columns=drop)), table
