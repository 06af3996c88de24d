"""Every user mistake through the CLI ends the same way: exit status 2, exactly one line on
stderr that names the field or file to fix, no traceback, and no hang, whether it is found
while loading the job, reading data or a trace, or after Ray has started.

Most cases run in-process through `rayfl.cli.main` (the `rayfl` entry point itself), those
that need a cluster on the session's real local Ray; the ones that must start Ray from nothing
(resources, GPU, a taken run id) run `python -m rayfl.cli` in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rayfl.cli import main

REPO = Path(__file__).resolve().parents[1]
CASE_SECONDS = 90  # generous for a loaded 2-core machine; a hang is what this catches

Case = Callable[[Path], tuple[list[str], tuple[str, ...]]]


@pytest.fixture(autouse=True)
def deadline() -> Iterator[None]:
    """Fail an in-process case that runs past CASE_SECONDS instead of hanging the suite."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"a user mistake took over {CASE_SECONDS}s to report")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def trace_case(name: str, text: str, *names: str) -> Case:
    """A tiny trace CSV; the error must name system.trace, the file and what is wrong."""

    def build(tmp: Path) -> tuple[list[str], tuple[str, ...]]:
        path = write(tmp, name, text)
        return ["validate", *sets(f"system.trace={path}")], ("system.trace", str(path), *names)

    return build


def plain(command: str, *overrides: str, names: tuple[str, ...]) -> Case:
    return lambda tmp: ([command, *sets(*overrides)], names)


def job_case(text: str, *names: str) -> Case:
    """A job file; "{job}" in `names` stands for its path."""

    def build(tmp: Path) -> tuple[list[str], tuple[str, ...]]:
        job = write(tmp, "job.yaml", text)
        return ["validate", str(job)], tuple(n.replace("{job}", str(job)) for n in names)

    return build


def missing_job(tmp: Path) -> tuple[list[str], tuple[str, ...]]:
    return ["run", str(tmp / "nope.yaml")], (str(tmp / "nope.yaml"),)


def job_is_a_directory(tmp: Path) -> tuple[list[str], tuple[str, ...]]:
    return ["validate", str(tmp)], (str(tmp),)


def missing_data_dir(tmp: Path) -> tuple[list[str], tuple[str, ...]]:
    where = tmp / "no-such-dir"
    argv = [
        "partition",
        *sets(
            "data.dataset=mnist",
            "partition.method=iid",
            "data.download=false",
            f"data.data_dir={where}",
        ),
    ]
    return argv, ("data.data_dir", str(where))


def empty_data_dir(tmp: Path) -> tuple[list[str], tuple[str, ...]]:
    argv = [
        "partition",
        *sets(
            "data.dataset=mnist",
            "partition.method=iid",
            "data.download=false",
            f"data.data_dir={tmp}",
        ),
    ]
    return argv, ("mnist", str(tmp), "data.download")


NO_RAY: dict[str, Case] = {
    # config values: NaN / Inf in any float field, centrally
    "nan-weight-decay": plain(
        "validate", "algorithm.weight_decay=.nan", names=("algorithm.weight_decay",)
    ),
    "nan-fedprox-mu": plain(
        "run", "algorithm.name=fedprox", "algorithm.mu=.nan", names=("algorithm.mu",)
    ),
    "inf-lr": plain("partition", "algorithm.lr=.inf", names=("algorithm.lr",)),
    "minus-inf-lr-in-job": job_case("algorithm:\n  lr: -.inf\n", "algorithm.lr"),
    "nan-string-lr": plain("validate", "algorithm.lr='nan'", names=("algorithm.lr",)),
    "inf-zo-hfl-eta": plain(
        "validate", "algorithm.name=zo_hfl", "algorithm.eta=inf", names=("algorithm.eta",)
    ),
    "inf-speed-distribution": plain("validate", "system.speed=.inf", names=("system.speed",)),
    "nan-nested-sigma": plain(
        "validate", "system.latency.sigma=.nan", names=("system.latency.sigma",)
    ),
    "nan-participation": plain(
        "validate",
        "algorithm.clients_per_round=null",
        "algorithm.participation=.nan",
        names=("algorithm.participation",),
    ),
    # config values: contradictions and impossible shapes
    "participation-and-clients-per-round": plain(
        "run",
        "algorithm.participation=0.5",
        "algorithm.clients_per_round=5",
        names=("algorithm.participation", "clients_per_round"),
    ),
    "participation-over-a-job-count": lambda tmp: (
        ["validate", str(REPO / "jobs" / "default.yaml"), *sets("algorithm.participation=0.2")],
        ("algorithm.participation", "clients_per_round=null"),
    ),
    "mlp-without-hidden-layers": plain(
        "run", "model.name=mlp", "model.hidden=[]", names=("model.hidden",)
    ),
    "zero-start-timeout": plain(
        "validate", "engine.start_timeout=0", names=("engine.start_timeout",)
    ),
    "run-id-with-slash": plain("run", "run.run_id=a/b", names=("run.run_id",)),
    "bad-pool-setting": plain("validate", "engine.pool=sometimes", names=("engine.pool",)),
    # a Ray to join where nothing listens: said at once (ray.init would wait a minute)
    "nothing-at-address": plain("run", "engine.address=127.0.0.1:1", names=("engine.address", "127.0.0.1:1")),
    "pool-nothing-at-address": lambda tmp: (["pool", "status", "--address", "127.0.0.1:1"], ("--address", "127.0.0.1:1")),
    "server-as-client-without-data": plain(
        "run",
        "algorithm.server_as_client=true",
        names=("algorithm.server_as_client", "data.server_fraction"),
    ),
    # robustness (the round pipeline's `robust:` section)
    "br-ffgg-with-the-plain-mean": plain("run", "algorithm.name=br_ffgg", "robust.aggregator={name: mean}",
                                         names=("robust.aggregator", "ffgg")),
    "ffgg-aggregator-under-its-old-key": plain(
        "run", "algorithm.name=br_ffgg", "algorithm.aggregator={name: median}", names=("algorithm.aggregator", "robust.aggregator")
    ),
    "label-flip-without-labels": plain(
        "run", "algorithm.name=br_ffgg", "data.dataset=ffgg_quadratic", "partition.method=natural",
        "robust.aggregator.name=median", "robust.attack={name: label_flip, count: 1}", names=("robust.attack.name", "labels"),
    ),
    "half-the-clients-byzantine": plain(
        "run", "partition.num_clients=10", "robust.aggregator.name=median", "robust.attack={name: sign_flip, count: 5}",
        names=("robust.attack.count", "5 Byzantine of 10"),
    ),
    # files
    "missing-job-file": missing_job,
    "job-is-a-directory": job_is_a_directory,
    "bad-yaml": job_case("algorithm: {name: fedavg\nrun:\n  rounds: [1\n", "{job}", "YAML"),
    "job-not-a-mapping": job_case("- run\n- data\n", "{job}", "mapping"),
    "unknown-section": job_case("training:\n  lr: 0.1\n", "training", "allowed sections"),
    "missing-data-dir": missing_data_dir,
    "empty-data-dir": empty_data_dir,
    # device traces
    "trace-non-numeric-speed": trace_case(
        "speed.csv", "client,speed\n0,1e9\n1,fast\n", "speed", "line 3"
    ),
    "trace-without-client-column": trace_case("noclient.csv", "id,speed\n0,1e9\n", "client"),
    "trace-negative-bandwidth": trace_case("bw.csv", "client,up_bandwidth\n0,-5\n", "up_bandwidth"),
    "trace-client-out-of-range": trace_case(
        "range.csv", "client,speed\n0,1e9\n100,1e9\n", "client 100"
    ),
    "trace-interval-backwards": trace_case(
        "avail.csv",
        "client,available_from,available_to\n0,0,10\n1,50,20\n",
        "available_to",
        "line 3",
    ),
    "trace-misspelt-column": trace_case("typo.csv", "client,sped\n0,1e9\n", "'sped'"),
    "trace-empty-file": trace_case("empty.csv", "", "cannot read"),
    "trace-ragged-row": trace_case("ragged.csv", "client,speed\n0,1e9\n1,1e9,7\n", "cannot read"),
    "trace-dropout-above-one": trace_case("drop.csv", "client,dropout\n0,1.5\n", "dropout"),
    "trace-not-csv-or-parquet": trace_case("trace.txt", "client,speed\n0,1\n", ".csv or .parquet"),
}


def assert_one_line(rc: int | None, err: str, names: tuple[str, ...]) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert lines[0].startswith("rayfl: error: "), lines[0]
    for name in names:
        assert name in lines[0], f"{name!r} not named in: {lines[0]}"


@pytest.mark.parametrize("case", list(NO_RAY), ids=list(NO_RAY))
def test_mistake_before_ray(case, tmp_path, capfd, monkeypatch):
    """Config, file, data and trace mistakes: found before Ray starts, and Ray never does."""
    import ray

    monkeypatch.chdir(tmp_path)  # a `run` that got through would write here, not in the repo
    argv, names = NO_RAY[case](tmp_path)
    was = ray.is_initialized()
    rc = main(argv)
    assert_one_line(rc, capfd.readouterr().err, names)
    assert ray.is_initialized() == was


def tiny(tmp: Path, *overrides: str) -> list[str]:
    """`rayfl run` of a small job writing under `tmp`."""
    return [
        "run",
        "--quiet",
        *sets(
            "run.rounds=1", "partition.num_clients=10", f"output.dir={tmp / 'results'}", *overrides
        ),
    ]


ON_RAY: dict[str, tuple[list[str], str]] = {
    "one-host-per-client": (
        ["partition.num_clients=100", "engine.clients_per_host=1"],
        "engine.clients_per_host",
    ),
    "host-larger-than-any-node": (["engine.num_cpus_per_host=4"], "engine.num_cpus_per_host"),
    "gpu-share-without-gpu": (["engine.num_gpus_per_host=0.5"], "engine.num_gpus_per_host"),
    "gpu-hosts-without-gpu": (
        ["engine.num_hosts=2", "engine.num_gpus_per_host=0.5"],
        "engine.num_gpus_per_host",
    ),
}


@pytest.mark.parametrize("case", list(ON_RAY), ids=list(ON_RAY))
def test_resource_mistake_on_a_running_ray(case, ray_local, tmp_path, capfd):
    """Requests the session's 2-CPU, GPU-less Ray can never place: refused before any host
    starts and before a run directory is created."""
    overrides, key = ON_RAY[case]
    rc = main(tiny(tmp_path, *overrides))
    assert_one_line(rc, capfd.readouterr().err, (key,))
    assert not (tmp_path / "results").exists()


def test_hosts_that_cannot_start_in_time(ray_local, tmp_path, capfd):
    """The request fits the cluster but its CPUs are taken: a bounded wait, then one line that
    names what was asked and what is free, and the pending hosts are gone."""

    @ray_local.remote(num_cpus=2)
    class Hog:
        def ready(self) -> bool:
            return True

    hog = Hog.remote()
    ray_local.get(hog.ready.remote())
    try:
        # fresh hosts: pooled ones (the session's test pool) reserve no CPU, so nothing would wait
        rc = main(tiny(tmp_path, "engine.num_hosts=2", "engine.start_timeout=2", "engine.pool=off"))
    finally:
        ray_local.kill(hog)
    assert_one_line(rc, capfd.readouterr().err, ("engine.start_timeout", "0 of 2 hosts", "0 CPUs"))
    for _ in range(100):  # the killed hosts never take the CPUs the hog gave back
        if ray_local.available_resources().get("CPU", 0.0) == 2.0:
            break
        time.sleep(0.1)
    assert ray_local.available_resources().get("CPU", 0.0) == 2.0


@dataclass
class Finished:
    returncode: int | None  # None: killed at CASE_SECONDS
    stderr: str


def start_cli(cwd: Path, argv: list[str], ray_tmp: Path | None = None) -> subprocess.Popen:
    """`python -m rayfl.cli` starting its own local Ray (in `ray_tmp` if given), in its own
    process group (so a hung one is killed with its raylet). RAY_AUTH_MODE=token is the mode
    Ray picks anyway; naming it keeps Ray's notice about picking it off stderr."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    if ray_tmp is not None:
        env["RAY_TMPDIR"] = str(ray_tmp)
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "rayfl.cli", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen) -> Finished:
    try:
        _, err = proc.communicate(timeout=CASE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return Finished(None, f"still running after {CASE_SECONDS}s\n{err}")
    return Finished(proc.returncode, err)


BEFORE_LOCAL_RAY = {
    "64-hosts-on-2-cpus": (
        ["partition.num_clients=100", "engine.num_hosts=64"],
        "engine.num_hosts",
    ),
    "cuda-without-gpu": (["engine.device=cuda"], "engine.device"),
    "a-4-cpu-host-on-2-cpus": (["engine.num_cpus_per_host=4"], "engine.num_cpus_per_host"),
}


def left_running(ray_tmp: Path) -> list[str]:
    """The processes still running with this RAY_TMPDIR: a `rayfl run` process's own and every
    Ray process it started (workers and agents rename themselves; their environment stays)."""
    import psutil

    left = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get("RAY_TMPDIR") == str(ray_tmp):
                left.append(f"{proc.info['pid']} {proc.info['name']}")
        except psutil.Error:
            continue
    return left


@pytest.fixture(scope="module")
def before_local_ray(ray_local, tmp_path_factory) -> dict[str, tuple[Finished, list[str]]]:
    """Runs that would start their own local Ray, each in a fresh process with its own
    RAY_TMPDIR, side by side: BEFORE_LOCAL_RAY's, and a run reusing the run id of a tiny run
    made first on the session's Ray. Returns each one's outcome and what was left running
    with its RAY_TMPDIR the moment it exited."""
    tmp = tmp_path_factory.mktemp("before_local_ray")
    reuse = tiny(tmp / "reuse", "run.run_id=fixed")
    assert main(reuse) == 0
    cases = {name: (tmp / name, tiny(tmp / name, *o)) for name, (o, _) in BEFORE_LOCAL_RAY.items()}
    cases["run-id-again"] = (tmp / "reuse", reuse)
    procs = {}
    for name, (cwd, argv) in cases.items():
        (ray_tmp := tmp / f"ray-{name}").mkdir()
        procs[name] = (start_cli(cwd, argv, ray_tmp), ray_tmp)
    outcomes = {}
    for name, (proc, ray_tmp) in procs.items():
        outcomes[name] = (finish(proc), left_running(ray_tmp))
    return outcomes


@pytest.mark.parametrize("case", list(BEFORE_LOCAL_RAY), ids=list(BEFORE_LOCAL_RAY))
def test_resource_mistake_is_said_before_any_host_and_leaves_nothing_running(case, before_local_ray):
    """The machine's CPUs and GPUs are known before the run joins the Ray it started beside
    its config (rayfl.engine.local_ray): one line, and by the time the run's process exits
    that Ray is gone, with everything it started."""
    result, left = before_local_ray[case]
    assert_one_line(result.returncode, result.stderr, (BEFORE_LOCAL_RAY[case][1],))
    assert left == []


def test_reused_run_id(before_local_ray):
    """Found before Ray starts: one line, with both ways out (the writer's own check, for runs
    on a Ray already running such as a sweep's trials, is tests/test_results.py's)."""
    again, left = before_local_ray["run-id-again"]
    assert left == []
    assert_one_line(
        again.returncode, again.stderr, ("run.run_id", "fixed", "output.overwrite=true")
    )
