"""`rayfl bench startup`: where a short run's seconds go outside its rounds.

Runs `rayfl run` of a workload (default `fedavg-mlp`, 10 rounds, evaluated once at the end)
as a separate process, exactly as a user would, with RAYFL_TIMING set so the run writes the
wall-clock time at which each of its phases ended (`rayfl.progress.mark`). The parent's own
clock gives the total (process launch to exit) and the interpreter start-up before rayfl's
first mark and the exit after its last; the run's `rounds` table gives the rounds.

The rounds' wall time counted here runs from the moment the hosts are ready (the first round
can start) to the last round's row, final evaluation included: the table's own `wall_time`
counts from the Federation's creation, host start-up included, and is reported as well.

`--warm` measures the path for iterating on short runs: the bench first starts a Ray head of its
own (`ray start --head --block`, in a temporary directory, on loopback) and a pool of warm hosts
on it (`rayfl pool start`), untimed, then times runs that join that head; it stops the head at
the end. Either way a run's synthetic data come from the dataset cache once the first run has
built them (rayfl.data.cache; RAYFL_CACHE_DIR=off times the generation every time)."""

from __future__ import annotations

import contextlib
import os
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

from rayfl.bench.common import load_average, write_result
from rayfl.engine.resources import available_cpus

# What each mark ends (the phase runs from the previous mark, or from the launch).
PHASES = {
    "cli": "interpreter start-up and `import rayfl.cli`",
    "config": "parse arguments, load and validate the config (imports the algorithms: torch)",
    "dataset": "build the federated dataset (synthetic data generated from the seed)",
    "ray_init": "import ray and start (or join) it",
    "writer_open": "cluster check, manifest, open the Parquet writer",
    "hosts_ready": "model, ray.put of the data, ClientHost actors started and answering",
    "rounds_done": "the rounds, final evaluation included",
    "writer_closed": "flush and close the Parquet tables",
    "hosts_stopped": "kill the host actors",
    "ray_shutdown": "ray.shutdown (a local Ray's processes stopped)",
    "printed": "print the results line",
    "exit": "interpreter exit",
}


def workload_command(workload: str, rounds: int, out_dir: Path, run_id: str, extra: list[str]) -> list[str]:
    """The `rayfl run` command line of the workload, as a user would type it."""
    from rayfl.bench.workloads import workload as spec

    sets = [*spec(workload).overrides, "output.log_clients=true", f"run.rounds={rounds}", f"run.eval_every={rounds}",
            f"output.dir={out_dir}", "run.experiment=bench_startup", f"run.run_id={run_id}", *extra]
    exe = Path(sys.executable).with_name("rayfl")
    head = [str(exe)] if exe.is_file() else [sys.executable, "-m", "rayfl.cli"]
    return [*head, "run", *(a for s in sets for a in ("--set", s)), "--quiet"]


def phase_seconds(launch: float, end: float, marks: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds per phase: from the previous mark (the launch for the first) to each mark, and
    from the last mark to `end` as `exit`. A phase met twice (it should not be) adds up."""
    out: dict[str, float] = {}
    prev = launch
    for name, t in marks:
        out[name] = out.get(name, 0.0) + (t - prev)
        prev = t
    out["exit"] = end - prev
    return {k: round(v, 3) for k, v in out.items()}


def measure_once(workload: str, rounds: int, out_dir: Path, extra: list[str],
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """One timed `rayfl run` in a child process; its phases, rounds and totals."""
    import json

    from rayfl.results import load

    run_id = f"startup-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    cmd = workload_command(workload, rounds, out_dir, run_id, extra)
    with tempfile.TemporaryDirectory() as tmp:
        timing = Path(tmp) / "timing.json"
        env = {**os.environ, **(env or {}), "RAYFL_TIMING": str(timing)}
        load_before = load_average()
        cpu_before = _children_cpu()
        launch = time.time()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        end = time.time()
        cpu = _children_cpu() - cpu_before
        if proc.returncode != 0 or "results:" not in proc.stdout:
            raise RuntimeError(f"`rayfl run` exited {proc.returncode} without its results line:\n"
                               f"{proc.stdout[-1000:]}\n{proc.stderr[-2000:]}")
        if not timing.is_file():
            raise RuntimeError("the run wrote no timing marks (RAYFL_TIMING ignored?)")
        written = json.loads(timing.read_text())
    marks = [(str(n), float(t)) for n, t in written["marks"]]
    at = dict(marks)
    wall = load(written["run_dir"]).rounds.sort_values("round")["wall_time"].to_numpy()
    total = end - launch
    table_rounds = float(wall[-1])  # from the Federation's creation: host start-up included
    host_start = at["hosts_ready"] - at["writer_open"]
    rounds_s = table_rounds - host_start
    per_round = [round(float(v), 3) for v in [wall[0] - host_start, *(wall[1:] - wall[:-1])]]
    return {
        "total_seconds": round(total, 3),
        "rounds_seconds": round(rounds_s, 3),
        "outside_rounds_seconds": round(total - rounds_s, 3),
        "rounds_seconds_table": round(table_rounds, 3),
        "outside_rounds_seconds_table": round(total - table_rounds, 3),
        "round_seconds": per_round,
        # CPU of the run and the processes it waited for (Ray's, stopped by ray.shutdown): a
        # busy machine stretches the wall times, much less this
        "cpu_seconds": round(cpu, 3),
        "phases": phase_seconds(launch, end, marks),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "run_dir": written["run_dir"],
    }


def run_startup_bench(workload: str, rounds: int, repeat: int, out: Path, extra: list[str] | None = None,
                      warm: bool = False, hosts: int = 2) -> dict[str, Any]:
    """`repeat` timed runs of the workload; the summary reports the run with the median
    outside-rounds time, and every run's numbers. `warm`: runs join a head with `hosts`
    pooled hosts that the bench starts first (untimed) and stops at the end."""
    if rounds < 1 or repeat < 1:
        raise ValueError("--rounds and --repeat must be >= 1")
    extra = list(extra or [])
    with (warm_head(hosts) if warm else contextlib.nullcontext()) as address:
        if address is not None:
            extra = [*extra, f"engine.address={address}"]
        env = JOIN_ENV if warm else {}
        runs = [measure_once(workload, rounds, out.parent / "results", extra, env) for _ in range(repeat)]
    ranked = sorted(runs, key=lambda r: r["outside_rounds_seconds"])
    median = ranked[(len(ranked) - 1) // 2]
    summary = {
        "workload": workload,
        "rounds": rounds,
        "mode": "warm: joins a running head, leases pooled hosts" if warm else "cold: the run starts its own Ray",
        "command": " ".join(workload_command(workload, rounds, out.parent / "results", "<run_id>", extra)),
        "cpus": available_cpus(),
        "definitions": {
            "total_seconds": "process launch to exit, measured by the parent",
            "rounds_seconds": "hosts ready to the last round's row (final evaluation included)",
            "outside_rounds_seconds": "total_seconds - rounds_seconds",
            "rounds_seconds_table": "the rounds table's last wall_time (counts from the Federation's creation)",
            "cpu_seconds": ("CPU of the run's process and of the descendants reaped through their parents "
                            "(RUSAGE_CHILDREN). Not comparable between worker modes: forked workers (the "
                            "default) count when they end before the head is stopped, rounds included, and "
                            "not otherwise; Ray's exec'd workers never do (the raylet ignores SIGCHLD, which "
                            "discards their usage)"),
            "phases": PHASES,
        },
        **{k: v for k, v in median.items() if k != "run_dir"},
        "runs": runs,
    }
    write_result(out, summary)
    return summary


# `ray start` heads use token auth here; a driver joining one must say so
JOIN_ENV = {"RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}


@contextlib.contextmanager
def warm_head(hosts: int, timeout: float = 120.0) -> Iterator[str]:
    """A Ray head of the bench's own (its processes in their own session, stopped with it)
    holding `hosts` warm pooled hosts; yields its address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="rayfl-head-")
    env = {**os.environ, **JOIN_ENV}
    ray_cli = Path(sys.executable).with_name("ray")
    log = Path(temp) / "ray-start.log"  # a file, not a pipe: a full pipe would stall the head
    with open(log, "wb") as sink:
        head = subprocess.Popen(
            [str(ray_cli), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
             f"--temp-dir={temp}", f"--num-cpus={available_cpus()}", "--include-dashboard=false", "--disable-usage-stats"],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        rayfl = Path(sys.executable).with_name("rayfl")
        cmd = [str(rayfl)] if rayfl.is_file() else [sys.executable, "-m", "rayfl.cli"]
        from rayfl.engine.local_ray import unreachable

        end = time.time() + timeout
        while unreachable(address, timeout=1.0) is not None:  # the head's GCS is not listening yet
            if head.poll() is not None or time.time() > end:
                break
            time.sleep(0.2)
        while True:  # the pool command connects once the head is up
            if head.poll() is not None:
                raise RuntimeError(f"`ray start --head` exited {head.returncode}: {log.read_text()[-2000:]}")
            pool = subprocess.run([*cmd, "pool", "start", f"--hosts={hosts}", f"--address={address}"],
                                  env=env, capture_output=True, text=True)
            if pool.returncode == 0:
                break
            if time.time() > end:
                raise RuntimeError(f"no pool on the bench's head after {timeout:g}s: {pool.stderr[-2000:]}")
            time.sleep(1.0)
        yield address
    finally:
        # SIGTERM to the head's whole session, then SIGKILL: `ray start --block` itself can
        # take 30 s and more to go after a SIGTERM (its processes are gone long before), and
        # this head is the bench's own, with nothing to save
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)  # the head's session logs


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
