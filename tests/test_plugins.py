"""A user's own algorithm, model and dataset, in a package outside the repository, get what
rayfl's built-ins get: validation of their own keys, `rayfl run` by import path, SIGTERM then
`rayfl resume` equal to an uninterrupted run, identical tables for 1 and 2 hosts, `rayfl
sweep` over their own key, installation as entry points, `ray job submit --working-dir`, and
one-line errors when a host cannot import them.

The package is the one docs/guides/extending.md writes (FedNova, a LeNet-style CNN, FEMNIST
from Parquet, a partitioner), taken from the guide's own code blocks.

The commands that stop before Ray (validation, mistakes) run in this process, through
`rayfl.cli.main` (a `rayfl` process spends seconds importing torch and starting a Ray head)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from guide_blocks import environment
from ray_head import ray_head, submit
from test_resume import assert_same_tables

from rayfl.results import load

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUN_TIMEOUT = 300


def write_guide_package(where: Path) -> Path:
    """The guide's files (myfl/, job.yaml, make_data.py, pyproject.toml) written to `where`,
    and its data made (scripts/write_guide_package.py); returns `where`."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from write_guide_package import write_package
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return write_package(where)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_guide_package(tmp_path_factory.mktemp("userpkg"))


def rayfl(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rayfl"), *args], cwd=cwd, env=env or environment(), capture_output=True,
                          text=True, timeout=timeout)


def sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def run_ok(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = rayfl(*args, cwd=cwd, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


# ---------------------------------------------------------------------------- validation


def in_process(package: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
               *args: str) -> tuple[int, str, str]:
    """`rayfl ARGS` run in `package` by this process's `rayfl.cli.main`: (exit status, stdout,
    stderr). What it imports and adds to sys.path goes with the test."""
    from test_public_api import forget_myfl

    from rayfl.cli import main

    forget_myfl(monkeypatch)
    monkeypatch.chdir(package)
    rc = main(list(args))
    out, err = capfd.readouterr()
    return rc, out, err


def test_validate_shows_the_user_entries_keys(package: Path, monkeypatch: pytest.MonkeyPatch,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, err = in_process(package, monkeypatch, capfd, "validate", "job.yaml")
    assert rc == 0, err
    import yaml

    cfg = yaml.safe_load(out)
    assert cfg["algorithm"]["name"] == "myfl.fednova:FedNova" and cfg["algorithm"]["server_lr"] == 1.0
    assert {"conv1": 4, "conv2": 8, "hidden": 32}.items() <= cfg["model"].items()
    assert cfg["data"]["path"] == "femnist.parquet" and "alpha" not in cfg["data"]


@pytest.mark.parametrize(("override", "names"), [
    ("algorithm.server_lr=-1", ("algorithm.server_lr", "must be > 0")),
    ("algorithm.server_lrr=1", ("algorithm.server_lrr", "myfl.fednova:FedNova", "server_lr")),
    ("model.conv3=8", ("model.conv3", "conv1")),
])
def test_a_bad_user_key_exits_2_in_one_line(package: Path, override: str, names: tuple[str, ...],
                                             monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    rc, _, err = in_process(package, monkeypatch, capfd, "run", "job.yaml", "--set", override)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("rayfl: error: ") and all(n in lines[0] for n in names), lines[0]


# ---------------------------------------------------------------------------- FedNova's step


def guide_module(package: Path, monkeypatch: pytest.MonkeyPatch, name: str):
    """One of the guide's modules, imported from this test's copy of the package."""
    import importlib

    from test_public_api import forget_myfl

    forget_myfl(monkeypatch)
    monkeypatch.syspath_prepend(str(package))
    return importlib.import_module(f"myfl.{name}")


def answers(deltas: dict[int, tuple[list[float], int, int]]) -> list[SimpleNamespace]:
    """Accepted answers: client -> (delta, local steps, samples)."""
    return [SimpleNamespace(client=c, local_steps=t, num_samples=n, values={"delta": np.array(d, np.float32)})
            for c, (d, t, n) in sorted(deltas.items())]


def test_fednova_server_step_matches_a_hand_computation(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rayfl import ModelState
    from rayfl.driver import Round, Uploads
    from rayfl.driver.rounds import normalized

    fednova = guide_module(package, monkeypatch, "fednova")
    alg = fednova.FedNova.__new__(fednova.FedNova)
    alg.cfg = fednova.FedNovaConfig(clients_per_round=3, server_lr=0.5)
    x0 = np.array([1.0, -2.0], dtype=np.float32)
    # client: (y_i - x, tau_i, n_i). Client 2 did no step: its weight is 0.
    results = answers({0: ([0.4, 0.2], 2, 10), 1: ([-0.3, 0.9], 6, 30), 2: ([5.0, 5.0], 0, 50)})
    rnd = Round(0, [0, 1, 2], 1)
    w = normalized(alg.weights(None, "delta", results, rnd), alg.weighting_of("delta") != "sum")
    np.testing.assert_allclose(w, [0.25 / 2, 0.75 / 6, 0.0])
    summed = sum(wi * r.values["delta"].astype(np.float64) for r, wi in zip(results, w, strict=True))
    out = alg.server_update(ModelState(x=x0), Uploads.of({"delta": summed}, results), rnd)
    # by hand: p = (1/4, 3/4), tau = (2, 6), tau_eff = 0.5 + 4.5 = 5
    # x + 0.5 * 5 * (1/4 * [0.4, 0.2] / 2 + 3/4 * [-0.3, 0.9] / 6) = x + 2.5 * [0.0125, 0.1375]
    np.testing.assert_allclose(out.x, [1.0 + 2.5 * 0.0125, -2.0 + 2.5 * 0.1375], rtol=1e-6)


def test_fedavgm_and_feddyn_server_steps_match_hand_computations(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FedAvgM: v1 = d1, v2 = beta v1 + d2, x2 = x0 + lr (v1 + v2); FedDyn: h = -alpha |P|/m d,
    x = x0 + d - h / alpha."""
    from rayfl.driver import Round, Uploads

    fedavgm = guide_module(package, monkeypatch, "fedavgm")
    alg = fedavgm.FedAvgM.__new__(fedavgm.FedAvgM)
    alg.cfg = fedavgm.FedAvgMConfig(beta=0.5, server_lr=2.0)
    x0, d1, d2 = np.array([1.0, 0.0], np.float32), np.array([0.1, -0.2]), np.array([0.3, 0.4])
    rnd = Round(0, [], 2)
    s1 = alg.server_update(fedavgm.MomentumState(x=x0), Uploads.of({"delta": d1}), rnd)
    s2 = alg.server_update(s1, Uploads.of({"delta": d2}), rnd)
    np.testing.assert_allclose(s2.velocity, 0.5 * d1 + d2)
    np.testing.assert_allclose(s2.x, x0 + 2.0 * d1 + 2.0 * (0.5 * d1 + d2), rtol=1e-6)
    # the built-in `server_optimizer: {name: momentum}` takes the same steps, bit for bit
    from rayfl.algorithms.fedavg import FedAvg, FedAvgConfig
    from rayfl.algorithms.server_opt import ModelState, ServerOptimizerConfig

    builtin = FedAvg.__new__(FedAvg)
    builtin.cfg = FedAvgConfig(server_lr=2.0, server_optimizer=ServerOptimizerConfig(name="momentum", beta1=0.5))
    b2 = builtin.server_update(builtin.server_update(ModelState(x=x0), Uploads.of({"delta": d1}), rnd),
                               Uploads.of({"delta": d2}), rnd)
    np.testing.assert_array_equal(b2.x, s2.x)

    feddyn = guide_module(package, monkeypatch, "feddyn")
    dyn = feddyn.FedDyn.__new__(feddyn.FedDyn)
    dyn.cfg, dyn.fed = feddyn.FedDynConfig(alpha=0.1), SimpleNamespace(num_clients=10)
    uploads = Uploads.of({"delta": d1}, answers({3: ([0.0, 0.0], 1, 5), 7: ([0.0, 0.0], 1, 5)}))
    out = dyn.server_update(feddyn.FedDynState(x=x0, h=np.array([0.01, 0.02])), uploads, rnd)
    h = np.array([0.01, 0.02]) - 0.1 * 2 / 10 * d1
    np.testing.assert_allclose(out.h, h)
    np.testing.assert_allclose(out.x, x0 + d1 - h / 0.1, rtol=1e-6)


# ---------------------------------------------------------------------------- runs


def table_without_hosts(res):
    """The run's tables with the host column gone (which host ran a client differs by design)."""
    res.clients = res.clients.drop(columns=["host"])
    return res


@pytest.mark.slow
def test_one_host_equals_two_killed_hosts_stopped_by_sigterm_and_resumed(package: Path) -> None:
    """The user's FedNova gets what a built-in gets, in one comparison: a run on 1 host equals
    the same run on 2 hosts that are killed mid-run (replaced by hosts that import the user's
    package again and replay its tasks), stopped by SIGTERM after round 4 (exit 130, status
    "interrupted") and resumed from another directory (the manifest says where myfl is). Two
    hosts without failures or a stop add no case: a difference shows in this run."""
    from test_host_failures import comparable

    out = package / "hosts"
    common = sets("run.rounds=8", "output.checkpoint_every=3", f"output.dir={out}", "engine.num_cpus_per_host=0.5",
                  "engine.max_restarts=10", "engine.preaggregate=on")
    run_ok("run", "job.yaml", "--quiet", *common, *sets("engine.num_hosts=1", "run.run_id=one"), cwd=package)
    run_dir = out / "fednova_femnist" / "stopped"
    stop = subprocess.run([str(BIN / "python"), "-c", SIGTERM_AT_ROUND.format(round=4), "job.yaml", *common,
                           *sets("engine.num_hosts=2", "run.run_id=stopped", "engine.kill_host_every=15")],
                          cwd=package, env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert stop.returncode == 130, stop.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["plugins"]["roots"] == [str(package)]
    assert load(run_dir).rounds["round"].max() == 4
    other = package.parent / f"{package.name}-elsewhere"
    other.mkdir(exist_ok=True)
    run_ok("resume", str(run_dir), "--quiet", cwd=other)
    one, hurt = (load(out / "fednova_femnist" / r) for r in ("one", "stopped"))
    assert len(one.rounds) == 8 and np.isfinite(one.rounds.test_accuracy).all()
    assert one.rounds["host_failures"].sum() == 0 and hurt.rounds["host_failures"].sum() >= 2
    assert hurt.clients["rerun"].any() and set(hurt.clients["host"]) == {0, 1}
    for table in ("rounds", "clients", "evals"):
        pd.testing.assert_frame_equal(comparable(getattr(one, table)).drop(columns=["host"], errors="ignore"),
                                      comparable(getattr(hurt, table)).drop(columns=["host"], errors="ignore"),
                                      check_like=True)


ASYNC_FEDAVGM = ("algorithm.name=myfl.fedavgm:FedAvgM", "algorithm.beta=0.5", "asynchrony.enabled=true",
                 "asynchrony.concurrency=6", "asynchrony.buffer_size=3", "run.rounds=8", "run.eval_every=4",
                 "system.speed={dist: lognormal, value: 2.0e+7, sigma: 1.0}", "system.dropout=0.1",
                 "engine.num_cpus_per_host=0.5", "engine.max_restarts=10", "output.checkpoint_every=3")


@pytest.mark.slow
def test_the_users_fedavgm_runs_asynchronously_like_a_built_in(package: Path) -> None:
    """The guide's FedAvgM under the asynchronous driver: 1 host, and 2 hosts that are killed
    in a run stopped by SIGTERM and resumed, give the same tables."""
    from test_host_failures import comparable

    out = package / "async"
    common = sets(*ASYNC_FEDAVGM, f"output.dir={out}")
    run_ok("run", "job.yaml", "--quiet", *common, *sets("engine.num_hosts=1", "run.run_id=one"), cwd=package)
    run_dir = out / "fednova_femnist" / "stopped"
    stop = subprocess.run([str(BIN / "python"), "-c", SIGTERM_AT_ROUND.format(round=4), "job.yaml", *common,
                           *sets("engine.num_hosts=2", "run.run_id=stopped", "engine.kill_host_every=10")],
                          cwd=package, env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert stop.returncode == 130, stop.stderr[-3000:]
    assert load(run_dir).rounds["round"].max() == 4
    run_ok("resume", str(run_dir), "--quiet", cwd=package)
    one, resumed = (load(out / "fednova_femnist" / r) for r in ("one", "stopped"))
    assert resumed.rounds["host_failures"].sum() >= 1 and len(one.rounds) == 8 and one.rounds["staleness_mean"].max() > 0
    for table in ("rounds", "clients", "evals"):
        pd.testing.assert_frame_equal(comparable(getattr(one, table)), comparable(getattr(resumed, table)), check_like=True)


# `rayfl run` in a process that sends itself SIGTERM right after a given round is logged
SIGTERM_AT_ROUND = """
import os, signal, sys
from rayfl.engine.federation import Federation
log_round = Federation.log_round
def log_then_stop(self, r, **metrics):
    if r == {round}:
        os.kill(os.getpid(), signal.SIGTERM)
    log_round(self, r, **metrics)
Federation.log_round = log_then_stop
from rayfl.cli import main
sys.exit(main(["run", "--quiet", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_resume_says_in_one_line_when_the_package_is_gone(package: Path, tmp_path: Path) -> None:
    moved = tmp_path / "pkg"
    shutil.copytree(package, moved, ignore=shutil.ignore_patterns("results", "hosts", "resume", "sweeps", "site"))
    out = tmp_path / "results"
    run_ok("run", "job.yaml", "--quiet", *sets("run.rounds=2", f"output.dir={out}", "run.run_id=r",
                                               "output.checkpoint_every=1"), cwd=moved)
    run_dir = out / "fednova_femnist" / "r"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["status"] = "interrupted"  # as if stopped: resumable
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(moved / "myfl")
    done = rayfl("resume", str(run_dir), cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "myfl" in lines[0] and "cannot import" in lines[0], lines[0]


@pytest.mark.slow
def test_sweep_over_the_user_algorithms_own_key(package: Path) -> None:
    """Two trials of the user's FedNova on one slot: the second leases the warm host the first
    loaded the user's module into, and equals its run done alone."""
    out = package / "sweeps"
    common = ("run.rounds=2", f"output.dir={out}", "engine.num_hosts=1", "engine.num_cpus_per_host=0.5")
    done = run_ok("sweep", "job.yaml", "--grid", "algorithm.server_lr=0.5,1.0", "--name", "fednova_lr",
                  "--max-concurrent", "1", *sets(*common), cwd=package)
    assert done.count("completed\t") == 2, done[-2000:]
    res = load(out / "fednova_lr")
    assert sorted(res.manifests["algorithm.server_lr"]) == [0.5, 1.0]
    assert len(res.rounds) == 4
    pools = {json.loads((out / "fednova_lr" / r / "manifest.json").read_text())["placement"]["hosts"][0].get("pool")
             for r in ("server_lr=0.5,s0", "server_lr=1,s0")}
    assert len(pools) == 1 and None not in pools, pools  # one warm host served both trials
    run_ok("run", "job.yaml", "--quiet", *sets(*common, "algorithm.server_lr=1.0", "run.experiment=alone",
                                                "run.run_id=alone"), cwd=package)
    assert_same_tables(load(out / "alone" / "alone"), load(out / "fednova_lr" / "server_lr=1,s0"))


@pytest.mark.slow
def test_the_package_installed_with_entry_points(package: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(package)], check=True, timeout=300, capture_output=True)
    env = environment()
    env["PYTHONPATH"] = str(site)  # an installed package, not a directory rayfl finds by itself
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = run_ok("list", "algorithms", cwd=elsewhere, env=env)
    assert "fednova" in listed and "entry point of myfl" in listed
    job = elsewhere / "job.yaml"
    job.write_text((package / "job.yaml").read_text()
                   .replace('"myfl.fednova:FedNova"', "fednova").replace('"myfl.cnn:lenet"', "lenet")
                   .replace("path: femnist.parquet", f"path: {package / 'femnist.parquet'}"))
    run_ok("run", "job.yaml", "--quiet", *sets("run.rounds=2", f"output.dir={tmp_path / 'results'}", "run.run_id=ep"),
           cwd=elsewhere, env=env)
    res = load(tmp_path / "results" / "fednova_femnist" / "ep")
    assert res.manifests["status"].tolist() == ["completed"] and len(res.rounds) == 2
    manifest = json.loads((tmp_path / "results" / "fednova_femnist" / "ep" / "manifest.json").read_text())
    assert manifest["plugins"]["names"]["algorithm.name"] == "fednova"


@pytest.mark.slow
def test_a_host_that_cannot_import_the_user_code_fails_the_run_in_one_line(tmp_path: Path) -> None:
    """The package exists where the driver runs only (as on a cluster whose nodes lack it):
    every host says so at start, and the run stops with one line naming the path and node."""
    script = tmp_path / "driver.py"
    script.write_text(
        "import sys, types\n"
        "ghost = types.ModuleType('ghostpkg')\n"
        "ghost.__file__ = '/nonexistent/ghostpkg/__init__.py'\n"
        "exec('from torch import nn\\n"
        "def net(input_shape, num_classes):\\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\\n', ghost.__dict__)\n"
        "sys.modules['ghostpkg'] = ghost\n"
        "import rayfl\n"
        "try:\n"
        "    rayfl.run({'data': {'dataset': 'digits'}, 'partition': {'method': 'iid', 'num_clients': 4},\n"
        "               'model': {'name': 'ghostpkg:net'}, 'run': {'rounds': 1}, 'algorithm': {'clients_per_round': 2},\n"
        "               'engine': {'num_hosts': 1, 'pool': 'off'}, 'output': {'dir': 'results'}})\n"
        "except rayfl.ConfigError as e:\n"
        "    print('ERROR', e)\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment(), capture_output=True,
                          text=True, timeout=RUN_TIMEOUT)
    line = next((x for x in done.stdout.splitlines() if x.startswith("ERROR")), None)
    assert line is not None, (done.stdout + done.stderr)[-3000:]
    assert "model.name" in line and "ghostpkg:net" in line and "on node" in line and "host 0" in line, line


@pytest.mark.slow
def test_ray_job_submit_runs_a_builtin_and_the_users_package_from_the_working_dir(package: Path, tmp_path: Path) -> None:
    """`ray job submit --working-dir` to a real `ray start --head`, as users do: one job runs a
    built-in job and the user's FedNova, whose package is only in the working dir. With an
    absolute output.dir their Parquet lands there and is read back here; a relative one would
    land in Ray's temporary copy of the working directory, and the driver says so. Joining the
    head from here without its token is one line saying how to get it."""
    env = environment()
    work = tmp_path / "job"
    shutil.copytree(package / "myfl", work / "myfl")
    for name in ("job.yaml", "femnist.parquet"):
        shutil.copy(package / name, work / name)
    (work / "tiny.yaml").write_text(
        "run: {experiment: submitted, rounds: 3}\n"
        "data: {dataset: digits}\n"
        "partition: {method: iid, num_clients: 8}\n"
        "algorithm: {name: fedavg, clients_per_round: 4}\n"
    )
    out = tmp_path / "results"
    # after the runs, ask the runner (in the same job environment) about a relative output.dir
    probe = "from rayfl.runner import relative_output_in_job_warning as w; print(w('results'))"
    runs = (f"rayfl run tiny.yaml --quiet --set output.dir={out} && "
            f"rayfl run job.yaml --quiet --set run.rounds=2 --set output.dir={out} && python -c \"{probe}\"")
    with ray_head(tmp_path, env) as address:
        done = submit(address, work, ["sh", "-c", runs], env, tmp_path, timeout=RUN_TIMEOUT)
        tokenless = {k: v for k, v in env.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
        tokenless["HOME"] = str(tmp_path)  # no ~/.ray/auth_token of this machine's user either
        joined = subprocess.run([str(BIN / "rayfl"), "run", "tiny.yaml", "--quiet", "--address", env["RAYFL_TEST_GCS"],
                                 "--set", f"output.dir={tmp_path / 'refused'}"], cwd=work, env=tokenless,
                                capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "succeeded" in done.stdout, (done.stdout + done.stderr)[-4000:]
    # Ray's own client logs its retries (gcs_client.cc) before giving up; rayfl's is the one line after them
    lines = [line for line in joined.stderr.splitlines() if line.strip() and "gcs_client.cc" not in line]
    assert joined.returncode == 2 and len(lines) == 1, joined.stderr[-3000:]
    assert lines[0].startswith("rayfl: error: engine.address: cannot join"), lines[0]
    assert "ray get-auth-token" in lines[0] and "RAY_AUTH_MODE=token" in lines[0], lines[0]
    builtin, users = load(out / "submitted"), load(out / "fednova_femnist")
    assert builtin.manifests["status"].tolist() == ["completed"] and len(builtin.rounds) == 3
    assert users.manifests["status"].tolist() == ["completed"] and len(users.rounds) == 2
    assert users.manifests["algorithm.name"].tolist() == ["myfl.fednova:FedNova"]
    assert pd.read_parquet(next(out.glob("fednova_femnist/*/clients"))).shape[0] == 12
    assert [p.name for p in work.rglob("*.parquet")] == ["femnist.parquet"]  # no results in the working dir
    # the absolute runs were not warned about; the relative probe was, naming Ray's copy
    warnings = [line for line in done.stdout.splitlines() if "rayfl: output.dir=" in line]
    assert len(warnings) == 1, done.stdout[-4000:]
    assert "is relative inside Ray job raysubmit_" in warnings[0]
    assert str(work) not in warnings[0] and "working_dir_files" in warnings[0]
    assert "temporary copy of --working-dir" in warnings[0]


def test_import_path_resolution_reports_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rayfl.config import ConfigError, load_config

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^algorithm\.name: cannot import 'nopkg\.mod:thing': .*nopkg.*looked"):
        load_config(None, ["algorithm.name=nopkg.mod:thing"])


# ---------------------------------------------------------------------------- user mistakes

BAD_MODULE = '''
import numpy as np
from torch import nn

import rayfl
from rayfl.algorithms.fedavg import FedAvg

NOT_CALLABLE = 3


def one_class(cfg, seed):
    return rayfl.ArrayDataset(np.zeros((10, 4), np.float32), np.zeros(10, np.int64), 1, "one_class")


def with_buffers(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.BatchNorm1d(64), nn.Linear(64, num_classes))


def fixed_inputs(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(21, 8), nn.Linear(8, num_classes))


def three_scores(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 3))


def broken_client(ctx, **payload):
    return _cannot_train(ctx)


def _cannot_train(ctx):
    raise ValueError(f"client {ctx.id} cannot train")


class Broken(FedAvg):
    """FedAvg whose client function raises on every host."""

    client = staticmethod(broken_client)


def three_parts(labels, num_clients, cfg, rng):
    return np.array_split(np.arange(len(labels)), 3)


def raises(labels, num_clients, cfg, rng):
    raise RuntimeError("my partitioner is broken")
'''

# (sections of job.yaml replaced, overrides, what the one line names)
MISTAKES = {
    "path-does-not-import": ({}, ["algorithm.name=nopkg.mod:thing"], ("algorithm.name", "nopkg.mod:thing", "No module named")),
    "path-without-attr": ({}, ["model.name='myfl.cnn:'"], ("model.name", "not an import path")),
    "attr-missing": ({}, ["model.name=myfl.cnn:nothing"], ("model.name", "has no attribute 'nothing'")),
    "a-model-as-algorithm": ({}, ["algorithm.name=myfl.cnn:lenet"], ("algorithm.name", "registered as a model")),
    "a-config-class-as-algorithm": ({}, ["algorithm.name=myfl.fednova:FedNovaConfig"], ("algorithm.name", "is a class")),
    "not-callable": ({"data": {"dataset": "badmod:NOT_CALLABLE"}}, [], ("data.dataset", "int is not callable")),
    "model-factory-raises": ({"data": {"dataset": "synthetic", "features": 12}, "partition": {"method": "natural", "num_clients": 10}},
                             [], ("model.name", "myfl.cnn:lenet", "inputs (12,)", "ValueError")),
    "model-with-buffers": ({"model": {"name": "badmod:with_buffers"}}, [], ("model.name", "has buffers", "running_mean")),
    "model-wrong-input-size": ({"data": {"dataset": "synthetic", "features": 12}, "partition": {"method": "natural", "num_clients": 10},
                                "model": {"name": "badmod:fixed_inputs"}}, [],
                               ("model.name", "badmod:fixed_inputs", "does not take the data's inputs", "(12,)",
                                "10 classes", "mat1 and mat2")),
    "model-wrong-output-size": ({"data": {"dataset": "synthetic", "features": 12}, "partition": {"method": "natural", "num_clients": 10},
                                 "model": {"name": "badmod:three_scores"}}, [],
                                ("model.name", "badmod:three_scores", "(2, 3)", "not one score per class", "10 classes")),
    "parquet-without-label": ({}, ["data.path=nolabel.parquet"], ("data.dataset", "myfl.femnist:femnist", "label")),
    "dataset-with-one-class": ({"data": {"dataset": "badmod:one_class"}, "partition": {"method": "iid", "num_clients": 2}},
                               ["algorithm.clients_per_round=2"], ("data.dataset", "1 class")),
    "natural-without-own-clients": ({"data": {"dataset": "digits"}}, [], ("partition.method", "'natural'", "digits")),
    "partitioner-wrong-parts": ({"data": {"dataset": "digits"}, "partition": {"method": "badmod:three_parts", "num_clients": 8}},
                                [], ("partition.method", "3 parts for 8 clients")),
    "partitioner-raises": ({"data": {"dataset": "digits"}, "partition": {"method": "badmod:raises", "num_clients": 8}},
                           [], ("partition.method", "my partitioner is broken")),
}


def test_an_exception_in_the_users_client_is_a_short_block(package: Path, ray_local, monkeypatch: pytest.MonkeyPatch,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """The user's client function raises on a host: exit 1, the error with its client and round,
    the user's own two frames, and the path of the whole traceback, which holds Ray's and
    rayfl's frames too."""
    from test_public_api import forget_myfl

    from rayfl.cli import main

    (package / "badmod.py").write_text(BAD_MODULE)
    forget_myfl(monkeypatch)
    monkeypatch.chdir(package)
    out = package / "broken"
    rc = main(["run", "job.yaml", "--quiet", *sets("algorithm.name=badmod:Broken", "run.rounds=2", "engine.num_hosts=1",
                                                    f"output.dir={out}", "run.run_id=broken")])
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and "Traceback" not in err, err
    assert lines[0].startswith("rayfl: error in your code: ValueError: client ") and "cannot train" in lines[0], lines[0]
    assert "round 0" in lines[0] and "client" in lines[0].split("(")[-1], lines[0]
    frames = [line for line in lines if line.lstrip().startswith("File ")]
    assert len(frames) == 2 and all("badmod.py" in f for f in frames), err  # the user's frames only
    run_dir = next(out.glob("*/broken"))
    assert lines[-1] == f"rayfl: the full traceback is in {run_dir / 'error.log'}", lines[-1]
    full = (run_dir / "error.log").read_text()
    assert "badmod.py" in full and "rayfl/engine" in full and len(full.splitlines()) > len(lines)
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("case", list(MISTAKES), ids=list(MISTAKES))
def test_user_code_mistakes_exit_2_in_one_line_before_ray(package: Path, case: str, monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq
    import ray
    import yaml

    from rayfl.cli import main

    (package / "badmod.py").write_text(BAD_MODULE)
    pq.write_table(pq.read_table(package / "femnist.parquet").drop(["label"]), package / "nolabel.parquet")
    replaced, overrides, names = MISTAKES[case]
    job = {**yaml.safe_load((package / "job.yaml").read_text()), **replaced}
    (package / f"{case}.yaml").write_text(yaml.safe_dump(job))
    from test_public_api import forget_myfl

    forget_myfl(monkeypatch)  # what this run imports and adds to sys.path goes with the test
    monkeypatch.chdir(package)
    was = ray.is_initialized()
    rc = main(["run", f"{case}.yaml", "--quiet", *sets(*overrides, f"output.dir={package / 'mistakes'}")])
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("rayfl: error: ") and all(n in lines[0] for n in names), lines[0]
    assert ray.is_initialized() == was  # found before Ray started
    assert not (package / "mistakes").exists()  # and before any run directory


@pytest.mark.slow
def test_the_round_pipeline_applies_to_the_users_algorithm(package: Path) -> None:
    """FedNova declares `uploads`: compression with error feedback (client state) and central
    DP apply to it as to a built-in, the same on 1 host as on 2 hosts killed mid-run (2 hosts
    without failures add no case: a difference between host counts shows in the killed run).
    Both stages in one run: each one's own mark is checked below."""
    from test_host_failures import comparable

    out = package / "pipeline"
    common = sets(f"output.dir={out}", "engine.num_cpus_per_host=0.5", "engine.max_restarts=10",
                  "compression.name=topk", "compression.ratio=0.05",
                  "privacy.mode=central", "privacy.noise_multiplier=1.0", "privacy.clip=0.5")
    run_ok("run", "job.yaml", "--quiet", *common, *sets("engine.num_hosts=1", "run.run_id=one"), cwd=package)
    run_ok("run", "job.yaml", "--quiet", *common, *sets("engine.num_hosts=2", "run.run_id=killed", "engine.kill_host_every=12"),
           cwd=package)
    one, hurt = (load(out / "fednova_femnist" / r) for r in ("one", "killed"))
    assert hurt.rounds["host_failures"].sum() >= 1 and hurt.clients["host"].nunique() > 1
    for table in ("rounds", "clients", "evals"):
        pd.testing.assert_frame_equal(comparable(getattr(one, table)).drop(columns=["host"], errors="ignore"),
                                      comparable(getattr(hurt, table)).drop(columns=["host"], errors="ignore"),
                                      check_like=True)
    train = hurt.clients[hurt.clients["phase"] == "train"]
    d = int(hurt.manifests["num_params"].iloc[0])
    assert (train["bytes_up"] < d).all()  # a twentieth of the coordinates, 8 bytes each
    assert hurt.rounds["epsilon"].is_monotonic_increasing and train["update_norm"].notna().all()
