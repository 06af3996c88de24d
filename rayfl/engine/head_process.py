"""`python -m rayfl.engine.head_process`: a process that starts a local Ray head and keeps it.

It prints one JSON line on stdout, `{"address": ...}` once the head is up or `{"error": ...}`,
then holds the head until its stdin closes (the run stopping it, or the run's process dying),
and kills the head's processes before it exits. Ray ties each process it starts to the thread
that started it (PR_SET_PDEATHSIG), so this process must live as long as the head does.

Being a process of its own is the point: it imports Ray and starts the head on the other core
while the run's process imports torch and loads its config. A thread in the run's process
did the same under the GIL, and both took longer (measured: config 2.7 -> 4.5 s).

Which processes the head runs: the GCS, the raylet (with its dashboard and runtime-env agents,
which it waits for) and the log monitor (workers' output still reaches the terminal). Not the
API server (dashboard, job submission, state API) that ray 2.60 starts even with
`include_dashboard=False` and waits for, nor the autoscaler monitor: a run's own one-machine
Ray uses neither, and they took ~1.8 s of CPU."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

# What every host imports before its first call; Ray's idle workers (one per CPU, started with
# the node, and the hosts become them) import these while the run is still busy. A worker that
# cannot (an unusual sys.path) logs the error to its own log and starts as usual.
HOST_MODULES = ("torch", "rayfl.engine.host", "rayfl.algorithms")


def start_node(num_cpus: int | None, num_gpus: int | None) -> Any:
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    class HeadWithoutApiServer(Node):
        def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
            """No dashboard, no job submission, no state API: nothing a local run reads."""

    # enable_worker_prestart: the idle workers start as soon as the raylet registers, not when
    # the first driver connects (~1 s sooner on 2 cores)
    params = RayParams(
        num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, no_monitor=True,
        _system_config={"preload_python_modules": list(HOST_MODULES), "enable_worker_prestart": True},
    )
    # spawn_reaper: Ray's reaper kills the head's processes should this process die uncleanly
    return HeadWithoutApiServer(params, head=True, shutdown_at_exit=False, spawn_reaper=True)


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


def on_sigterm(signum: int, frame: Any) -> None:
    kill_tree(os.getpid(), include_root=False)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--num-gpus", type=int, default=None)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        node = start_node(args.num_cpus, args.num_gpus)
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
