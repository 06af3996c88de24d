"""Starting and stopping the Ray that a run brings up itself, as fast as Ray allows.

About 1.4 s of a short run's start-up and shutdown on 2 cores (shutdown 1.55 -> 0.49 s, hosts
ready 2.22 -> 1.85 s; docs/benchmarks.md) were Ray doing serially what need not be:

- Ray starts one idle worker process per CPU while it starts, and the hosts become those
  workers; each then imported torch and rayfl (1.4-1.9 s on this 2-core machine) only once it
  was asked to be a host. Ray's `preload_python_modules` has the idle workers import them
  while Ray is still starting and the driver waits.
- `ray.shutdown` stops the processes of a local Ray one after another and gives each a second
  to exit on SIGTERM. The autoscaler monitor always takes the whole second (the GCS it would
  report to is stopped before it); a local Ray has no autoscaling to wind down, so it is
  stopped at once.

A Ray that the run joined (`engine.address`, RAY_ADDRESS) is not configured, only left."""

from __future__ import annotations

from typing import Any

# What every host imports before its first call; a worker that cannot import them (an
# unusual sys.path) logs the error to its own log and starts as usual.
HOST_MODULES = ("torch", "rayfl.engine.host", "rayfl.algorithms")


def start_local_ray(**kwargs: Any) -> None:
    """A fresh local Ray ("local" never attaches to whatever cluster /tmp/ray last pointed
    at), its idle workers preloaded with the hosts' modules."""
    import ray

    ray.init(address="local", include_dashboard=False,
             _system_config={"preload_python_modules": list(HOST_MODULES)}, **kwargs)


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


def stop_ray() -> list[int]:
    """`ray.shutdown`, stopping a local Ray's autoscaler monitor first with SIGKILL (0.4 s
    instead of 1.4 s for the whole shutdown here). Returns the pids stopped ahead of the
    shutdown: none for a joined Ray, whose node lists no processes of its own."""
    import ray
    from ray._private import ray_constants, worker

    processes = getattr(getattr(worker, "_global_node", None), "all_processes", None) or {}
    stopped = []
    for info in processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
        if info.process.poll() is None:
            info.process.kill()
            info.process.wait(timeout=10)
            stopped.append(info.process.pid)
    ray.shutdown()
    return stopped
