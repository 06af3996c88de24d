"""`python -m rayfl.engine.head_process`: a process that starts a local Ray head and keeps it.

It prints one JSON line on stdout, `{"address": ...}` once the head is up or `{"error": ...}`,
then holds the head until its stdin closes (the run stopping it, or the run's process dying),
and kills the head's processes before it exits. Ray ties each process it starts to the thread
that started it (PR_SET_PDEATHSIG), so this process must live as long as the head does.

Being a process of its own is the point: it imports Ray and starts the head on the other core
while the run's process imports torch and loads its config. A thread in the run's process
did the same under the GIL, and both took longer (measured: config 2.7 -> 4.5 s).

Which processes the head runs: the GCS, the raylet (with its dashboard and runtime-env agents)
and, as a thread of this process, the log monitor (workers' output still reaches the
terminal). Not the
API server (dashboard, job submission, state API) that ray 2.60 starts even with
`include_dashboard=False` and waits for, nor the autoscaler monitor: a run's own one-machine
Ray uses neither, and they took ~1.8 s of CPU.

Three more things keep Ray's own start off the run's critical path on a small machine:
- **The agents' ports are chosen here.** The raylet registers, and starts its workers, only once
  its agents have written the ports they bound, ~1.7 s of importing later; told the ports up
  front it does not wait. Free ports are picked by binding them and letting go, from below the
  kernel's ephemeral range: should another process take one in between, the agent fails to
  bind it, and the raylet, which shares its fate with the dashboard agent, dies with the run.
  Every outgoing connection's source port, and every port a process binds as "any", comes from
  the ephemeral range, so a port picked there can be taken in that window (one was, in a test
  suite starting many heads at once); below it, only a process binding that very port could.
- **The agents yield** (nice 19) to this process, the GCS and the raylet, which share their
  session (Linux groups a session's processes for CPU: nice ranks them within it).
- **Workers are forked warm** (rayfl.engine.worker_fork, through rayfl.engine.worker_launch):
  every worker is forked from one process that has imported Ray, torch and rayfl, instead of
  importing them all again, twice per worker with Ray's own `setup_worker.py`. For a run's early
  head that process is a fork of the run's own (`--fork-socket`: rayfl.engine.local_ray); a head
  started on its own launches one here, first, so that its imports overlap Ray's start."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What every host imports before its first call; Ray's idle workers (one per CPU, started with
# the node, and the hosts become them) import these while the run is still busy. A worker that
# cannot (an unusual sys.path) logs the error to its own log and starts as usual.
HOST_MODULES = ("torch", "rayfl.engine.host")
# ... and every algorithm's module, for workers that may be asked to run any; a run's own fork
# server has the one its run imported (rayfl.algorithms imports each on first use)
EVERY_ALGORITHM = "rayfl.algorithms.all"
# What a worker's first (de)serialization imports (ray.util.serialization_addons: pydantic,
# starlette where installed, Ray's Arrow serializers): 0.1-0.3 s of each host's start, unless
# the workers' fork server has imported them (rayfl.engine.worker_fork).
SERIALIZATION_MODULES = ("ray._common.pydantic_compat", "starlette.datastructures", "ray._private.arrow_serialization")
AGENT_NICENESS = 19  # the raylet's agents: after the head's own processes


# The lowest port the head picks for its agents: above Ray's worker ports (10002-19999 unless
# set otherwise), below the kernel's ephemeral range (see the module docstring).
PICK_FROM = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free right now (bound, noted, released), drawn at random from
    [PICK_FROM, the ephemeral range), or chosen by the kernel where that gap is too narrow."""
    high = ephemeral_start() - 1
    draw = random.SystemRandom()
    held: dict[int, socket.socket] = {}
    try:
        for _ in range(50 * count):
            if len(held) == count:
                return list(held)
            s = socket.socket()
            try:  # a port held already, here or elsewhere, fails to bind: draw another
                s.bind(("", draw.randint(PICK_FROM, high) if high - PICK_FROM >= 1000 else 0))
            except OSError:
                s.close()
                continue
            held[s.getsockname()[1]] = s
        if len(held) == count:
            return list(held)
        raise OSError(f"found {len(held)} of {count} free ports in [{PICK_FROM}, {high}]")
    finally:
        for s in held.values():
            s.close()


@contextlib.contextmanager
def raylet_told_its_agents(listen_port: int) -> Iterator[None]:
    """While the node starts: the raylet's command gets the dashboard agent's HTTP port (Ray's
    own start passes it to the agent only, so the raylet waits for the agent to report it), and
    both agents start under `nice`."""
    import ray._private.services as services
    from ray._private import ray_constants

    plain = services.start_ray_process

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            prefix = f"nice -n {AGENT_NICENESS} " if shutil.which("nice") else ""
            command = [
                a.replace("--dashboard_agent_command=", "--dashboard_agent_command=" + prefix, 1)
                 .replace("--runtime_env_agent_command=", "--runtime_env_agent_command=" + prefix, 1)
                for a in command
            ] + [f"--dashboard_agent_listen_port={listen_port}"]
        return plain(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process
    try:
        yield
    finally:
        services.start_ray_process = plain


def fork_socket(directory: Path) -> tuple[socket.socket, str]:
    """A listening Unix socket for a fork server, bound now so that launchers and the head can
    connect before the server is there (they wait in its backlog), and its path."""
    path = str(directory / "fork.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    return listener, path


def start_fork_server(directory: Path) -> str:
    """Launch the process the head's workers are forked from, for a head started on its own (a
    run's early head has the run fork it: rayfl.engine.local_ray); returns its socket's path.
    It dies with this process (PR_SET_PDEATHSIG), and `kill_tree` stops it with the rest."""
    listener, path = fork_socket(directory)
    with listener:
        subprocess.Popen([sys.executable, "-m", "rayfl.engine.worker_fork", "--fd", str(listener.fileno())],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=[listener.fileno()])
    return path


def tell_fork_server(socket_path: str, node: Any) -> None:
    """Ray's internal flags that the head's prestarted workers get from their raylet: the fork
    server sets them before it imports Ray, which reads them once."""
    from ray._private import ray_constants

    from rayfl.engine.worker_fork import tell_flags

    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    tell_flags(socket_path, {"RAY_RAYLET_PID": str(raylet), "RAY_JOB_ID": "ffffffff"})  # no job yet: the nil JobID


def ensure_token() -> None:
    """The token the head requires (rayfl.engine.local_ray.require_token), created in the
    user's ~/.ray/auth_token when there is none yet, as `ray.init()` does for its own head."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            ensure_token_if_auth_enabled,
        )
    except ImportError:  # a Ray without token auth
        return
    ensure_token_if_auth_enabled(None, create_token_if_missing=True)


def start_node(num_cpus: int | None, num_gpus: int | None) -> Any:
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    class HeadWithoutApiServer(Node):
        def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
            """No dashboard, no job submission, no state API: nothing a local run reads."""

        def start_log_monitor(self) -> None:
            """Started once the node is up, as a thread of this process (`start_log_monitor`)."""

    metrics_agent, metrics_export, runtime_env_agent, agent_listen = free_ports(4)
    # enable_worker_prestart: the idle workers start as soon as the raylet registers, not when
    # the first driver connects (~1 s sooner on 2 cores).
    # task_events_report_interval_ms 0: no task events, which only the state API and the
    # dashboard read, neither of which this head runs; ray.shutdown waited for their last flush
    # (0.3 s -> 0.08 s, medians of 9 and 6).
    params = RayParams(
        num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, no_monitor=True,
        metrics_agent_port=metrics_agent, metrics_export_port=metrics_export,
        runtime_env_agent_port=runtime_env_agent, dashboard_agent_listen_port=agent_listen,
        setup_worker_path=str(Path(__file__).with_name("worker_launch.py")),
        _system_config={"preload_python_modules": [*HOST_MODULES, EVERY_ALGORITHM], "enable_worker_prestart": True,
                        "task_events_report_interval_ms": 0},
    )
    # spawn_reaper: Ray's reaper kills the head's processes should this process die uncleanly
    with raylet_told_its_agents(agent_listen):
        node = HeadWithoutApiServer(params, head=True, shutdown_at_exit=False, spawn_reaper=True)
    start_log_monitor(node)
    return node


def start_log_monitor(node: Any) -> None:
    """Ray's log monitor (workers' output, published to the run's terminal) as a thread of this
    process, which has nothing else to do while it holds the head and has imported Ray already:
    as a process of its own it spent ~0.9 s of CPU starting, beside the run's own start. Should
    the thread not start, Ray's process is started instead."""
    import threading

    try:
        from ray._private import ray_constants
        from ray._private.log_monitor import LogMonitor, is_proc_alive
        from ray._private.ray_logging import setup_component_logger
        from ray._raylet import GcsClient

        # its own log goes to its file in the session's logs, as the process's does, not to the run's terminal
        setup_component_logger(logging_level=ray_constants.LOGGER_LEVEL, logging_format=ray_constants.LOGGER_FORMAT,
                               log_dir=node.get_logs_dir_path(), filename=ray_constants.LOG_MONITOR_LOG_FILE_NAME,
                               max_bytes=node.max_bytes, backup_count=node.backup_count,
                               logger_name="ray._private.log_monitor", propagate=False)
        monitor = LogMonitor(node.node_ip_address, node.get_logs_dir_path(), GcsClient(address=node.gcs_address),
                             is_proc_alive, gcs_address=node.gcs_address)
    except Exception:  # noqa: BLE001 - a Ray whose log monitor moved: its own process, as Ray starts it
        from ray._private.node import Node

        Node.start_log_monitor(node)
        return
    threading.Thread(target=monitor.run, name="rayfl-log-monitor", daemon=True).start()


def kill_tree(root_pid: int, include_root: bool) -> None:
    """SIGKILL every process `root_pid` started, theirs included (workers, agents), and the
    root itself if asked, then wait for them all. Each is stopped (SIGSTOP) first, until no new
    one appears, so that none can start another in between. Killing the head's process alone
    would leave the raylet's agents running; `ray.shutdown`'s SIGTERM with a second's grace per
    process took 1 s apiece for the GCS and the raylet. The run has disconnected before, so
    nothing is lost, and the next run here finds the agents' fixed ports free."""
    import psutil

    try:
        root = psutil.Process(root_pid)
    except psutil.Error:
        return
    doomed: dict[int, Any] = {root_pid: root} if include_root else {}
    new = list(doomed.values())
    while True:
        for proc in new:
            with contextlib.suppress(psutil.Error):
                proc.suspend()
        try:
            new = [p for p in root.children(recursive=True) if p.pid not in doomed]
        except psutil.Error:
            new = []
        if not new:
            break
        doomed.update((p.pid, p) for p in new)
    for proc in doomed.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(_alive(proc) for proc in doomed.values()):
        time.sleep(0.01)


def _alive(proc: Any) -> bool:
    """Still running: a dead grandchild stays a zombie until whoever adopted it reaps it (a
    container's init may take its time), but it holds no port or memory any more."""
    import psutil

    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError, psutil.Error):
                proc.wait(timeout=0)  # reap our own children
            return False
        return True
    except psutil.Error:
        return False


_scratch: Path | None = None  # this process's temporary directory (the fork server's socket)


def on_sigterm(signum: int, frame: Any) -> None:
    kill_tree(os.getpid(), include_root=False)
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--num-gpus", type=int, default=None)
    p.add_argument("--no-fork", action="store_true", help="workers exec'd as Ray does, not forked warm")
    p.add_argument("--fork-socket", default=None,
                   help="the run serves the forks (rayfl.engine.local_ray): its server's socket, for the flags")
    args = p.parse_args(argv)
    global _scratch
    _scratch = Path(tempfile.mkdtemp(prefix="rayfl-fork-"))  # short: a Unix socket's path is limited
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return serve(args, _scratch)
    finally:
        shutil.rmtree(_scratch, ignore_errors=True)


def serve(args: argparse.Namespace, scratch: Path) -> int:
    """Start the head (and its fork server), answer, hold it until stdin closes, stop it."""
    from rayfl.engine.worker_launch import FORK_SOCKET_ENV  # the standard library only

    socket_path = args.fork_socket
    if socket_path is None and not args.no_fork:
        socket_path = start_fork_server(scratch)  # first: its imports overlap Ray's start
    if socket_path is not None:
        os.environ[FORK_SOCKET_ENV] = socket_path  # the raylet's, so every worker launcher's
    try:
        ensure_token()
        node = start_node(args.num_cpus, args.num_gpus)
        if socket_path is not None:
            tell_fork_server(socket_path, node)
    except Exception as e:  # noqa: BLE001 - told to the run, which raises it
        kill_tree(os.getpid(), include_root=False)
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps({"address": node.address, "session_dir": node.get_session_dir_path()}), flush=True)
    sys.stdin.read()  # until the run closes it, or its process dies
    kill_tree(os.getpid(), include_root=False)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # without the interpreter's teardown of Ray's modules (~0.5 s)
