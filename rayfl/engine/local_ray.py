"""Starting and stopping the Ray that a run brings up itself, as fast as Ray allows.

On 2 cores a short run's start was mostly Ray's own (docs/explanation/engine-speed.md, "A run's start"): CPU-bound,
and serial with the driver's own work. Now:

- **Fewer processes.** The head runs without the API server and the autoscaler monitor that
  `ray.init` starts (rayfl.engine.head_process says why neither is needed), and its log monitor
  is a thread of the head's process.
- **Started early, beside the driver.** `rayfl run` launches the head's process first thing,
  before it loads the config: Ray starts on the other core while the driver imports torch and
  the algorithms. A mistake found meanwhile stops the head at once (`discard_head`): the user
  reads the same one line, and nothing is left running.
- **Idle workers, forked warm.** Ray starts one idle worker per CPU with the node, and the hosts
  become those workers. They are forked from one process that has torch and rayfl imported
  (rayfl.engine.worker_fork): one import of each, not one per host. For the early head that
  process is a fork of the run's own, made once the config is loaded (`fork_workers_here`):
  the driver imports torch and rayfl anyway, so only Ray is imported a second time.
  RAYFL_FORK_WORKERS=off has Ray exec them instead (they then import both themselves).

The run then joins the head (`ray.init(address=...)`) and, at its end, disconnects and stops it.
A Ray that the run joined (`engine.address`, RAY_ADDRESS) is not configured, only left."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rayfl.engine.head_process import fork_socket, kill_tree

INIT_ONLY = ("logging_level", "log_to_driver")  # ray.init settings, not the head's
STOP_TIMEOUT = 30.0  # seconds for the head's process to kill Ray's and exit
# "off": the head's workers are exec'd as Ray does, not forked warm (rayfl.engine.worker_fork)
FORK_WORKERS_ENV = "RAYFL_FORK_WORKERS"


class HeadStartError(RuntimeError):
    """The local head did not start; the message is its process's."""


def fork_workers_off() -> bool:
    return os.environ.get(FORK_WORKERS_ENV, "").strip().lower() in ("off", "0", "false", "no")


class DriverForkServer:
    """The early head's fork server, forked from the run's own process once the config is loaded
    (torch and rayfl imported, Ray not yet). Its socket is bound before the head starts, so the
    head's flags and the workers' launchers wait in its backlog until it is forked."""

    def __init__(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="rayfl-fork-"))  # short: a socket's path is limited
        self.listener: socket.socket | None
        self.listener, self.path = fork_socket(self.scratch)
        self.pid: int | None = None

    def start(self) -> None:
        """Fork the server now, if this process still can be its template; otherwise close the
        socket, and the workers' launchers exec them instead."""
        if self.listener is None:
            return
        try:
            if "ray" not in sys.modules:
                from rayfl.engine.worker_fork import fork_from_here, preload_hosts

                preload_hosts(every_algorithm=False)  # torch and rayfl: a run's config imported most
                import torch

                # none of them imports Ray; and a CUDA this process has initialised (a user's
                # algorithm module at import, say) would be unusable in the forked workers
                if "ray" not in sys.modules and not torch.cuda.is_initialized():
                    self.pid = fork_from_here(self.listener)
        finally:
            self.listener.close()
            self.listener = None

    def stop(self) -> None:
        """Kill the server and the workers it forked, and wait for them."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.pid is not None:
            kill_tree(self.pid, include_root=True)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None
        shutil.rmtree(self.scratch, ignore_errors=True)


AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's own setting: "token" or "disabled"
# Ray's own setting for a Ray that is this machine only (its default on macOS and Windows): "0"
# makes loopback every process's node address, so each of Ray's servers listens on 127.0.0.1
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def require_token() -> None:
    """Token auth for the head a run starts, unless the user set RAY_AUTH_MODE. The head
    listens on loopback only (`loopback_only`), but every local user can reach loopback; without
    a token, any of them could join the run's Ray and run code in it. `ray.init()` turns token
    auth on for a head it starts; this does the same for ours. Set in this process's environment,
    so the head, the workers forked from this process and its own `ray.init` all use the token
    (~/.ray/auth_token)."""
    if os.environ.get(AUTH_MODE_ENV) is not None:
        return
    os.environ[AUTH_MODE_ENV] = "token"
    if "ray._raylet" in sys.modules:  # Ray read its config already: have it read the mode again
        with contextlib.suppress(Exception):
            from ray._raylet import Config

            Config.initialize("")


def loopback_only() -> str | None:
    """Have the head a run starts, and this process's connection to it, use 127.0.0.1 as the
    node's address, unless the user set LOOPBACK_ENV: then the GCS, the raylet, its agents,
    every worker and the driver listen on loopback only, and nothing of the run can be reached
    from the network. Ray derives each server's bind address from the node's address; with its
    default on Linux, the machine's network address, they listen on all interfaces. Set in this
    process's environment, which the head and the workers inherit. Returns what the setting was
    before (`restore_network`)."""
    before = os.environ.get(LOOPBACK_ENV)
    if before is None:
        os.environ[LOOPBACK_ENV] = "0"
        constants = sys.modules.get("ray._private.ray_constants")
        if constants is not None:  # Ray read the setting already, at its import
            constants.ENABLE_RAY_CLUSTER = False
    return before


def restore_network(before: str | None) -> None:
    """Undo `loopback_only` once the run's own Ray is gone, so that a later run of this process
    can join a cluster (`engine.address`) as if none had run here."""
    if before is not None or os.environ.get(LOOPBACK_ENV) != "0":
        return
    del os.environ[LOOPBACK_ENV]
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = constants.env_bool(LOOPBACK_ENV, not constants.IS_WINDOWS_OR_OSX)


class LocalHead:
    """A local Ray head held by a child process (`python -m rayfl.engine.head_process`)."""

    def __init__(self, num_cpus: int | None = None, num_gpus: int | None = None,
                 fork_server: DriverForkServer | None = None):
        require_token()
        self._network_before = loopback_only()
        cmd = [sys.executable, "-m", "rayfl.engine.head_process"]
        if num_cpus is not None:
            cmd += ["--num-cpus", str(int(num_cpus))]
        if num_gpus is not None:
            cmd += ["--num-gpus", str(int(num_gpus))]
        if fork_workers_off():
            cmd += ["--no-fork"]
        elif fork_server is not None:
            cmd += ["--fork-socket", fork_server.path]
        self.fork_server = fork_server
        # its own session: Ctrl-C in the terminal reaches the run (which stops after the round
        # and then stops the head), not the head under it
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self._answer: dict[str, Any] | None = None

    def wait(self) -> str:
        """The head's GCS address, once it is up."""
        if self._answer is None:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            try:
                self._answer = json.loads(line)
            except ValueError:
                self._answer = {"error": f"its process exited ({self.process.poll()}) without an answer"}
        if "error" in self._answer:
            raise HeadStartError(f"the local Ray head did not start: {self._answer['error']}")
        return str(self._answer["address"])

    def stop(self) -> None:
        """Stop the head and wait for its processes to go (idempotent): at once, also while
        it is still starting."""
        if self.fork_server is not None:  # its workers first: then the head's are all of Ray's
            self.fork_server.stop()
        if self._answer is None and self.process.poll() is None:
            kill_tree(self.process.pid, include_root=True)  # still starting: all it started so far
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        restore_network(self._network_before)


_head: LocalHead | None = None  # the head this process started (at most one at a time)


def start_early() -> None:
    """Launch the head a `rayfl run` will need before the run loads its config; its workers
    will be forked from this process (`fork_workers_here`)."""
    global _head
    if _head is None:
        _head = LocalHead(fork_server=None if fork_workers_off() else DriverForkServer())


def fork_workers_here() -> None:
    """Once the run's config is loaded: fork the early head's worker server from this process."""
    if _head is not None and _head.fork_server is not None:
        _head.fork_server.start()


def discard_head() -> None:
    """Stop the head this process started, if any (a mistake, a Ray to join instead, the end)."""
    global _head
    head, _head = _head, None
    if head is not None:
        head.stop()


def joined_own_head() -> bool:
    """Whether the Ray this process is connected to is the local head it started itself: a
    head private to this process, where no other driver can have started pooled hosts."""
    import ray

    answer = _head._answer if _head is not None else None
    if answer is None or not ray.is_initialized():
        return False
    return bool(ray.get_runtime_context().gcs_address == answer.get("address"))


def single_machine() -> bool:
    """Whether every process of the Ray this process is connected to runs on this machine and
    sees its files: a Ray this process started, its own head or `ray.init()`'s local instance
    (no autoscaler adds nodes to either). A cluster joined by address may hold or gain other
    machines, even when it has one node now."""
    import ray

    if joined_own_head():
        return True
    try:  # ray.init() without an address started this node as a head and owns it
        node = ray._private.worker._global_node
        return bool(ray.is_initialized() and node is not None and node.is_head())
    except AttributeError:  # Ray's internals moved: assume another machine may be involved
        return False


def start_local_ray(**kwargs: Any) -> None:
    """Join a fresh local Ray (never whatever cluster /tmp/ray last pointed at): the early head
    if this process launched one, else a new one. `num_cpus` / `num_gpus` size a new head;
    the rest goes to `ray.init`."""
    fork_workers_here()  # not forked yet (Ray imported first): its socket is closed, workers exec'd
    import ray

    global _head
    init = {k: v for k, v in kwargs.items() if k in INIT_ONLY}
    node = {k: v for k, v in kwargs.items() if k not in INIT_ONLY}
    if set(node) - {"num_cpus", "num_gpus"}:
        raise TypeError(f"start_local_ray: unexpected settings {sorted(set(node) - {'num_cpus', 'num_gpus'})}")
    if _head is None or node:
        discard_head()
        _head = LocalHead(**node)
    try:
        ray.init(address=_head.wait(), **init)
    except BaseException:
        discard_head()
        raise


def unreachable(address: str, timeout: float = 3.0) -> str | None:
    """Why nothing answers at a `host:port` Ray address (None when something does, or for
    "auto", "local" and `ray://` addresses, which Ray resolves itself). `ray.init` would wait
    a minute and more for a GCS that is not there; a TCP connect says so at once."""
    import socket

    if "://" in address or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return f"{address!r} is not host:port"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as e:
        return f"nothing answers at {address} ({e.strerror or e}); is a head running there (`ray start --head`)?"


def refuses_without_token(address: str, timeout: float = 5.0) -> bool:
    """Whether the Ray at a `host:port` address has token auth on while this process would
    join it without a token (RAY_AUTH_MODE is not "token"): one gRPC call to its GCS without
    the token, answered UNAUTHENTICATED at once, where `ray.init` retries for ~20 s first."""
    if os.environ.get(AUTH_MODE_ENV, "").strip().lower() == "token" or "://" in address or ":" not in address:
        return False
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray without these modules: let ray.init say it
        return False
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetAllNodeInfo(
                gcs_service_pb2.GetAllNodeInfoRequest(), timeout=timeout)
        except grpc.RpcError as e:
            return e.code() == grpc.StatusCode.UNAUTHENTICATED
    return False


def stop_ray() -> None:
    """Disconnect from Ray, and stop the local head this process started, if any."""
    import ray

    ray.shutdown()
    discard_head()
