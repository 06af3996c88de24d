"""Ray's worker entry point for the heads rayfl starts: a worker forked warm, or exec'd without
importing Ray twice.

Ray starts every worker as `python setup_worker.py ... default_worker.py ...`: that script imports
Ray (0.7 s of CPU more than this one, measured) only to read the runtime-env context, then execs
`bash -c "exec python default_worker.py ..."`, which imports Ray again. Without a runtime
environment the context says nothing, so this script, given to the head as `setup_worker_path`,
reads it with the standard library and execs the worker directly (with the context's interpreter,
if it names one); a context that does say something (a runtime_env's environment variables, a
command prefix, another entry point) goes to Ray's own script unchanged.

When the head runs a fork server (rayfl.engine.worker_fork; its socket in RAYFL_WORKER_FORK),
the worker is not exec'd but forked there, from a process that imported Ray, torch and rayfl
once; this process then stands in for it (signals forwarded, its exit status returned). If the
server cannot serve the request, the worker is exec'd as above.

It runs as a file, not a module: it must not import rayfl or Ray (the fork server imports its
message functions from here)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import struct
import sys
from typing import Any

FORK_SOCKET_ENV = "RAYFL_WORKER_FORK"  # the fork server's socket, set by rayfl.engine.head_process
HEADER = struct.Struct("!I")  # a message: its length, then that much JSON
MAX_FDS = 3  # sent with a request: the worker's stdin, stdout and stderr
WAIT_FOR_SERVER = 30.0  # seconds for the server's imports and the fork; then the worker is exec'd
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def ray_setup_worker() -> str:
    """Ray's own setup_worker.py, found without importing Ray."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("ray is not importable by this interpreter")
    return os.path.join(list(spec.submodule_search_locations)[0], "_private", "workers", "setup_worker.py")


def direct_command(argv: list[str]) -> list[str] | None:
    """The worker's own command line when the runtime-env context asks for nothing; else None."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--serialized-runtime-env-context", type=str)
    parser.add_argument("--language", type=str)
    args, rest = parser.parse_known_args(argv)
    try:
        context = json.loads(args.serialized_runtime_env_context or "{}")
    except ValueError:
        return None
    if args.language != "PYTHON" or not isinstance(context, dict):
        return None
    if any(context.get(k) for k in ("command_prefix", "env_vars", "override_worker_entrypoint", "java_jars")):
        return None
    python = context.get("py_executable") or sys.executable
    return [python, *rest]


def send_message(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
    conn.sendmsg([HEADER.pack(len(data)) + data], ancillary)


def receive_message(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message, and the file descriptors that came with it; EOFError if the peer is gone."""
    fds: list[int] = []
    buffer = b""
    while len(buffer) < HEADER.size or len(buffer) < HEADER.size + HEADER.unpack_from(buffer)[0]:
        data, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(MAX_FDS * struct.calcsize("i")))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                whole = len(payload) - len(payload) % struct.calcsize("i")
                fds.extend(struct.unpack(f"{whole // struct.calcsize('i')}i", payload[:whole]))
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError("the other side closed the connection")
        buffer += data
    (size,) = HEADER.unpack_from(buffer)
    return json.loads(buffer[HEADER.size : HEADER.size + size]), fds


def forkable(command: list[str]) -> bool:
    """A plain `python default_worker.py ...` by this interpreter: what the fork server runs."""
    return (len(command) > 1 and not command[1].startswith("-")
            and os.path.realpath(command[0]) == os.path.realpath(sys.executable))


def run_forked(socket_path: str, worker_argv: list[str]) -> int | None:
    """Have the fork server start the worker and stand in for it: its exit status, or None
    (nothing started) when the server could not be asked or did not answer."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(WAIT_FOR_SERVER)
        conn.connect(socket_path)
        send_message(conn, {"argv": worker_argv, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
        reply, _ = receive_message(conn)  # waits while the server still imports
        pid = int(reply["pid"])  # a refusal has none
        conn.settimeout(None)
    except (OSError, EOFError, ValueError, KeyError, TypeError):  # a timeout is an OSError
        conn.close()  # a worker forked after all sees it and ends
        return None

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        reply, _ = receive_message(conn)
        code = int(reply["exit"])
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        code = 1
    if code < 0:  # killed by a signal: die the same way, as an exec'd worker would have
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition cannot be set
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal whose default is not to end the process
    return code


def main() -> None:
    command = direct_command(sys.argv[1:])
    if command is None:
        command = [sys.executable, ray_setup_worker(), *sys.argv[1:]]
    elif os.environ.get(FORK_SOCKET_ENV) and forkable(command):
        code = run_forked(os.environ[FORK_SOCKET_ENV], command[1:])
        if code is not None:
            os._exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
