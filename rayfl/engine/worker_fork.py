"""Ray workers forked from one warm process: the driver itself, or `python -m rayfl.engine.worker_fork`.

Each Ray worker is a fresh interpreter that imports Ray, and each host then imports torch and
rayfl: ~3.5 s of CPU per host on this 2-core machine, twice before a 2-host run's first round,
beside the driver's own torch import. This process imports all of it once, while the run loads
its config, and forks the head's prestarted workers from that state (the hosts become them): a
worker is ready as soon as it is forked, and the imports' CPU is spent once, not once per worker.
It runs in one of two ways. `rayfl run` forks it from its own process once the config is loaded (`fork_from_here`):
the driver has imported torch and rayfl by then, so the server starts with them and only imports
Ray, ~2.7 s of CPU less on a machine whose start is CPU-bound. A head started on its own
(`start_local_ray` in a program) launches it as `python -m rayfl.engine.worker_fork --fd N`.
Either way it is handed a listening socket bound before the head started, and its first
message there is the head's: Ray's internal flags (`{"flags": ...}`), sent once the raylet runs.

The raylet still launches and tracks each worker as usual; what it launches is
rayfl.engine.worker_launch (the head's `setup_worker_path`), which asks this process over a
Unix socket for a fork with its arguments, environment, working directory and standard streams,
then stands in for the forked worker: it forwards signals to it, exits with its exit status, and
its death (the raylet killing it) kills the worker. The worker registers with the raylet under
its own pid, as a worker behind a shim does (a container runtime env does the same). Whatever
cannot be served here (the process not running, a failed import, a request it cannot read, a
worker with other internal flags than the prestarted ones) leaves the launcher to exec the
worker itself, exactly as Ray would.

Fork safety: nothing here starts a thread before forking except pyarrow's jemalloc background
thread (jemalloc handles fork), and OpenBLAS is held to one thread (its pool would not survive
a fork); torch's and Ray's own threads start in the worker, after the fork. CUDA is never
initialised here (a driver that has initialised it is not forked), so each worker initialises it
itself: hosts sharing a GPU in forked workers gave the same tables as exec'd ones on an H200
(docs/explanation/engine-speed.md, "A run's start"). Forked from the driver, the server keeps none of the driver's threads (a fork
copies only the calling one) and closes every file the driver had open but its listener and
stderr: the head's pipes must see the driver's end alone."""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import socket
import sys
import threading
import warnings
from typing import Any

from rayfl.engine.worker_launch import receive_message, send_message


def preload_hosts(every_algorithm: bool = True) -> None:
    """What every host imports: torch and rayfl (none of it imports Ray), and every algorithm's
    module unless told the workers run only what this process imported already."""
    from rayfl.engine.head_process import EVERY_ALGORITHM, HOST_MODULES

    for name in (*HOST_MODULES, EVERY_ALGORITHM) if every_algorithm else HOST_MODULES:
        __import__(name)


def preload_ray(flags: dict[str, str]) -> str:
    """Ray's worker entry point and its imports; returns the path of its default_worker.py.
    Ray reads its internal flags (the raylet's pid, the worker's job) from the environment once,
    as `ray._raylet` loads, so they are set first: the head's, which every worker it prestarts
    shares; a worker that needs others is not forked (`ForkServer.refusal`)."""
    os.environ.update(flags)
    import ray._private.workers.default_worker as default_worker  # its __main__ part runs in a fork only

    from rayfl.engine.head_process import SERIALIZATION_MODULES

    for name in SERIALIZATION_MODULES:  # else each host's first call imports them
        with contextlib.suppress(ImportError):
            __import__(name)
    return str(default_worker.__file__)


def run_worker(conn: socket.socket, listener: socket.socket, request: dict[str, Any], fds: list[int],
               default_worker: str) -> None:
    """In the forked child: become the worker the launcher would have exec'd, then exit."""
    code = 1
    try:
        listener.close()
        os.setsid()  # its own process group: Ray's per-worker group cleanup must not reach this process
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)

        def die_with_launcher() -> None:
            """The launcher is the process the raylet knows: when it goes, so does the worker."""
            with contextlib.suppress(OSError):
                while conn.recv(1):
                    pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=die_with_launcher, name="rayfl-launcher-watch", daemon=True).start()
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(default_worker)
        import runpy

        runpy.run_path(default_worker, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the worker's stderr, as an exec'd worker's would be
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class ForkServer:
    """Accepts launchers' requests, forks a worker for each, and tells each launcher its worker's
    pid and, later, its exit status."""

    def __init__(self, listener: socket.socket, default_worker: str, flags: dict[str, str]):
        self.listener = listener
        self.default_worker = default_worker
        self.flags = flags
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        # worker pid -> its launcher's connection (None once the launcher is gone)
        self.children: dict[int, socket.socket | None] = {}

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=0.1):
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    self.launcher_gone(key.fileobj)  # type: ignore[arg-type]
            self.reap()

    def accept(self) -> None:
        if (received := receive_request(self.listener)) is not None:
            self.handle(*received)

    def handle(self, conn: socket.socket, request: Any, fds: list[int]) -> None:
        why = self.refusal(request)
        if why is not None:
            with contextlib.suppress(OSError):
                send_message(conn, {"refused": why})
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        with warnings.catch_warnings():  # Python >= 3.12 warns of any thread (jemalloc's: see above)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            self.selector.close()
            for other in self.children.values():
                if other is not None:
                    other.close()
            run_worker(conn, self.listener, request, fds, self.default_worker)
        for fd in fds:
            os.close(fd)
        try:
            send_message(conn, {"pid": pid})
        except OSError:
            os.kill(pid, signal.SIGKILL)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ)

    def refusal(self, request: Any) -> str | None:
        """Why this request cannot be forked (the launcher then execs the worker), or None."""
        from ray._private.ray_constants import RAY_INTERNAL_FLAGS

        if not isinstance(request, dict) or not {"argv", "env", "cwd"} <= set(request):
            return "malformed request"
        env = request["env"]
        for name in RAY_INTERNAL_FLAGS:
            if env.get(name) != self.flags.get(name, os.environ.get(name)):
                return f"{name} differs from this server's"
        return None

    def launcher_gone(self, conn: socket.socket) -> None:
        """A launcher's connection became readable: it has nothing to say, so it is gone (its
        worker sees the same and kills itself); stop listening to it."""
        with contextlib.suppress(OSError):
            if conn.recv(1):
                return
        self.selector.unregister(conn)
        conn.close()
        for pid, other in list(self.children.items()):
            if other is conn:
                self.children[pid] = None

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(OSError):
                send_message(conn, {"exit": os.waitstatus_to_exitcode(status)})
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            conn.close()


def receive_request(listener: socket.socket) -> tuple[socket.socket, Any, list[int]] | None:
    """The next connection and its message (with its file descriptors), or None if it sent none."""
    conn, _ = listener.accept()
    try:
        conn.settimeout(10.0)  # a launcher sends its request at once; nothing else may hold the server
        message, fds = receive_message(conn)
        conn.settimeout(None)
    except (OSError, EOFError, ValueError):
        conn.close()
        return None
    return conn, message, fds


def wait_for_flags(listener: socket.socket) -> tuple[dict[str, str], list[tuple[socket.socket, Any, list[int]]]]:
    """The head's internal flags, its first message here once its raylet runs, and the
    launchers' requests that came before them (the raylet may start its workers first)."""
    early: list[tuple[socket.socket, Any, list[int]]] = []
    while True:
        if (received := receive_request(listener)) is None:
            continue
        conn, message, fds = received
        if isinstance(message, dict) and isinstance(message.get("flags"), dict) and not fds:
            conn.close()
            return {str(k): str(v) for k, v in message["flags"].items()}, early
        early.append(received)


def tell_flags(socket_path: str, flags: dict[str, str]) -> None:
    """The head's side: send its internal flags to the fork server listening at `socket_path`.
    Nothing is listening (the run closed it, no server) is no error: workers are then exec'd."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5.0)
        conn.connect(socket_path)
        send_message(conn, {"flags": flags})


def serve(listener: socket.socket, every_algorithm: bool = True) -> int:
    """Import what workers need (what is not imported yet), then fork a worker for each
    launcher's request until killed. Whatever fails before serving ends this process quietly: the
    launchers then see it close and exec their workers, which report such a failure in their
    own logs."""
    try:
        preload_hosts(every_algorithm)
        flags, early = wait_for_flags(listener)
        default_worker = preload_ray(flags)
    except Exception:  # noqa: BLE001 - see above
        return 1
    server = ForkServer(listener, default_worker, flags)
    for conn, request, fds in early:
        server.handle(conn, request, fds)
    server.serve()
    return 0


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the head's process, or the run's) dies."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, b"rayfl-fork")  # PR_SET_NAME: how `ps -o comm` and psutil name it


def fork_from_here(listener: socket.socket) -> int:
    """Fork the server from this process, a `rayfl run` driver that has imported torch and rayfl
    but not Ray (which would have read the driver's internal flags); returns its pid. The child
    keeps the listener and stderr, nothing else of the driver's: its own session (Ctrl-C in the
    terminal is the run's), default signal handlers, stdin and stdout on /dev/null, the other
    files closed, BLAS on one thread, and it dies with the driver."""
    if "ray" in sys.modules:
        raise RuntimeError("the fork server must be forked before Ray is imported")
    with warnings.catch_warnings():  # Python >= 3.12 warns of any thread (jemalloc's, OpenBLAS's)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        keep = listener.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        die_with_parent()
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")  # as in the server started on its own (OPENBLAS_NUM_THREADS)
        code = serve(listener, every_algorithm=False)  # its hosts run the run's algorithm, imported
    finally:
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fd", type=int, required=True, help="a listening Unix socket inherited from the head")
    args = p.parse_args(argv)
    die_with_parent()
    try:
        listener = socket.socket(fileno=args.fd)
    except OSError:
        return 1
    return serve(listener)


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads OpenBLAS: no pool to lose in a fork
    sys.exit(main())
