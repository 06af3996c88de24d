"""`rayfl sweep`: a grid x seeds of real rayfl runs on warm slots (ASHA: Ray Tune trials)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rayfl.cli import main
from rayfl.config import ConfigError
from rayfl.sweep import build_spec, run_id_for, run_sweep

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "jobs" / "digits_fedavg.yaml"
# A tiny trial: 6 clients, 3 rounds, one half-CPU host, so four trials fit on 2 CPUs at once.
TINY = [
    "run.rounds=3", "run.eval_every=1", "partition.num_clients=6", "algorithm.clients_per_round=3",
    "engine.num_hosts=1", "engine.num_cpus_per_host=0.5", "output.checkpoint_every=1",
]


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def run_files(run_dir: Path) -> dict[str, int]:
    """Every file of a run with its modification time in ns (a re-run would change them)."""
    return {str(p.relative_to(run_dir)): p.stat().st_mtime_ns for p in sorted(run_dir.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------- without Ray


def test_run_ids_are_deterministic_and_safe() -> None:
    assert run_id_for({"algorithm.lr": 0.1, "partition.alpha": 1.0}, 0) == "lr=0.1,alpha=1,s0"
    assert run_id_for({"algorithm.lr": 0.1, "model.lr": 0.2}, 3) == "algorithm.lr=0.1,model.lr=0.2,s3"
    assert "/" not in run_id_for({"data.data_dir": "/a/b"}, 1)


def test_sweep_block_and_flags_merge() -> None:
    spec = build_spec({"grid": {"algorithm.lr": [0.01, 0.1]}, "seeds": [0, 1], "name": "x"},
                      ["partition.alpha=0.1,1"], seeds="2", max_concurrent=2)
    assert spec.grid == {"algorithm.lr": [0.01, 0.1], "partition.alpha": [0.1, 1]}
    assert spec.seeds == [2] and spec.name == "x" and spec.max_concurrent == 2
    with pytest.raises(ConfigError, match=r"^sweep\.bogus: unknown key"):
        build_spec({"bogus": 1})
    with pytest.raises(ConfigError, match=r"^sweep\.seeds"):
        build_spec(None, seeds="0,-1")
    with pytest.raises(ConfigError, match=r"^sweep\.grid\.run\.seed"):
        build_spec(None, ["run.seed=1,2"])


def test_bad_grid_value_fails_in_one_line_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    code = main(["sweep", str(DIGITS), "--grid", "algorithm.lr=0.1,-1", "--set", f"output.dir={out}"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("rayfl: error: algorithm.lr:") and "\n" not in err and "lr=-1" in err
    assert not out.exists()  # nothing started, not even Ray or a sweep directory


def test_run_on_a_sweep_job_runs_its_base_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "sweep.yaml"
    job.write_text(yaml.safe_dump({**yaml.safe_load(DIGITS.read_text()),
                                   "sweep": {"grid": {"algorithm.lr": [0.01, 0.1]}, "seeds": [0, 1]}}))
    assert main(["validate", str(job)]) == 0
    captured = capsys.readouterr()
    assert "use `rayfl sweep" in captured.err
    assert yaml.safe_load(captured.out)["algorithm"]["lr"] == 0.1  # the base job's value


def test_trials_get_absolute_local_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune runs every trial in its own working directory, so a job's relative data directory
    (`data.data_dir: data`) and `model.init_from` are resolved where the sweep starts."""
    from rayfl.sweep import plan_trials, read_job

    (tmp_path / "data").mkdir()
    (tmp_path / "x0.npy").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    base, _ = read_job(DIGITS)
    overrides = ["data.data_dir=data", "model.init_from=x0.npy", "output.dir=/tmp/unused"]
    trials = plan_trials(base, overrides, build_spec(None, ["algorithm.lr=0.1,0.2"]), "/tmp/unused", "paths")
    for t in trials:
        assert t.raw["data"]["data_dir"] == str(tmp_path / "data")
        assert t.raw["model"]["init_from"] == str(tmp_path / "x0.npy")
    home = plan_trials(base, ["data.data_dir=~/.rayfl/data"], build_spec(None, ["algorithm.lr=0.1"]), "/tmp/u", "p")
    assert home[0].raw["data"]["data_dir"] == "~/.rayfl/data"  # already absolute: left as written


def test_grid_times_seeds_plans_every_combination_once() -> None:
    """Two grid keys of two values times two seeds: eight trials, each with its own settings,
    seed, config and run id (the Ray test below runs a smaller product: four trials, as many as
    fit on 2 CPUs at once)."""
    from rayfl.sweep import plan_trials, read_job

    base, _ = read_job(DIGITS)
    spec = build_spec(None, ["algorithm.lr=0.05,0.1", "partition.alpha=0.5,1"], seeds="0,1")
    trials = plan_trials(base, [*TINY, "output.dir=/tmp/unused"], spec, "/tmp/unused", "grid")
    combos = {(t.settings["algorithm.lr"], t.settings["partition.alpha"], t.seed) for t in trials}
    assert combos == {(lr, a, s) for lr in (0.05, 0.1) for a in (0.5, 1) for s in (0, 1)} and len(trials) == 8
    for t in trials:
        assert (t.raw["algorithm"]["lr"], t.raw["partition"]["alpha"], t.raw["run"]["seed"]) == (
            t.settings["algorithm.lr"], t.settings["partition.alpha"], t.seed)
    assert len({t.run_id for t in trials}) == 8


def test_sweep_digits_job_validates() -> None:
    base, block = __import__("rayfl.sweep", fromlist=["read_job"]).read_job(REPO / "jobs" / "sweep_digits.yaml")
    spec = build_spec(block)
    assert set(spec.grid) >= {"algorithm.name", "algorithm.lr"} and len(spec.seeds or []) == 3


# ---------------------------------------------------------------------------- on warm slots


def test_grid_times_seeds_runs_side_by_side_on_warm_slots(ray_local, tmp_path: Path) -> None:
    out = tmp_path / "results"
    outcome = run_sweep(
        DIGITS, [*TINY, f"output.dir={out}"], ["algorithm.lr=0.05,0.1", "partition.alpha=0.5"],
        seeds="0,1", name="grid", max_concurrent=2, verbose=0,
    )
    assert outcome.errors == [] and not outcome.restored
    sweep_dir = out / "grid"
    assert len(outcome.trials) == 4  # a 2 x 1 grid x 2 seeds (the full product is planned without Ray above)
    assert all(s == "completed" for s in outcome.statuses.values()), outcome.statuses
    groups, hosts = set(), set()
    for t in outcome.trials:
        m = manifest(sweep_dir / t.run_id)
        cfg = m["config"]
        assert (cfg["algorithm"]["lr"], cfg["partition"]["alpha"], m["seed"]) == (
            t.settings["algorithm.lr"], t.settings["partition.alpha"], t.seed)
        assert t.run_id == run_id_for(t.settings, t.seed) and m["run_id"] == t.run_id
        assert m["experiment"] == "grid" and m["sweep"]["settings"] == t.settings
        groups.add(m["sweep"]["placement_group"])  # the slot's group, which reserves the trial's CPUs
        pooled = [h.get("pool") for h in m["placement"]["hosts"]]
        assert all(name and name.startswith("rayfl-sweep-") for name in pooled), pooled  # the sweep's warm hosts
        hosts.update(pooled)
    # 2 slots, each with its worker and warm host, both given a trial at once: side by side
    assert None not in groups and len(groups) == len(hosts) == 2

    import rayfl.results

    r = rayfl.results.load(sweep_dir)
    assert sorted(r.manifests.run_id) == sorted(t.run_id for t in outcome.trials)
    assert r.rounds.groupby("run_id").size().eq(3).all()


def test_trials_sharing_a_warm_host_equal_their_runs_alone(ray_local, tmp_path: Path) -> None:
    """One slot, so every trial leases the host the one before it used: SCAFFOLD's second seed
    after its first (whose control variates the host held), FedAvg after SCAFFOLD. Each equals
    the same run done alone on fresh hosts."""
    from test_resume import assert_same_tables

    import rayfl.results
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    out = tmp_path / "results"
    outcome = run_sweep(DIGITS, [*TINY, f"output.dir={out}", "algorithm.lr=0.1"], ["algorithm.name=scaffold,fedavg"],
                        seeds="0,1", name="shared", max_concurrent=1, verbose=0)
    assert outcome.errors == [] and set(outcome.statuses.values()) == {"completed"}
    pools = {t.run_id: manifest(out / "shared" / t.run_id)["placement"]["hosts"][0]["pool"] for t in outcome.trials}
    assert len(set(pools.values())) == 1, pools  # one warm host served all four
    for name, seed in (("scaffold", 1), ("fedavg", 0)):
        run_id = run_id_for({"algorithm.name": name}, seed)
        alone = run_experiment(load_config(DIGITS, [*TINY, f"output.dir={out}", "algorithm.lr=0.1", f"algorithm.name={name}",
                                                    f"run.seed={seed}", "run.experiment=alone", f"run.run_id={run_id}",
                                                    "engine.pool=off"]))
        assert_same_tables(rayfl.results.load(alone.run_dir), rayfl.results.load(out / "shared" / run_id))


@pytest.mark.slow
def test_a_sweep_stopped_by_sigterm_resumes_to_the_uninterrupted_tables(ray_local, tmp_path: Path) -> None:
    """`rayfl sweep` gets SIGTERM while its second trial runs: that trial checkpoints after its
    round (or, still starting, stops at once), the third never starts and the sweep exits 130;
    the same command finishes it, every trial equal to its run alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from test_resume import assert_same_tables

    import rayfl.results
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    out = tmp_path / "results"
    job = [*TINY, "run.rounds=40", "run.eval_every=10", "output.checkpoint_every=5"]
    sets = [a for o in [*job, f"output.dir={out}"] for a in ("--set", o)]
    cmd = [str(Path(sys.executable).parent / "rayfl"), "sweep", str(DIGITS), *sets, "--grid", "algorithm.lr=0.05,0.1,0.2",
           "--seeds", "0", "--name", "stop", "--max-concurrent", "1"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    second = out / "stop" / run_id_for({"algorithm.lr": 0.1}, 0) / "manifest.json"
    deadline = time.monotonic() + 120
    while not second.is_file() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)  # the second trial's run has begun: stop the sweep mid-run
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr[-2000:]
    statuses = {m["run_id"]: m["status"] for m in map(manifest, (out / "stop").glob("*,s0"))}
    assert statuses == {"lr=0.05,s0": "completed", "lr=0.1,s0": "interrupted"}, statuses
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("completed\t") == 3, again.stderr[-2000:]
    for lr in (0.05, 0.1, 0.2):  # completed before the stop, stopped mid-run, never started before it
        run_id = run_id_for({"algorithm.lr": lr}, 0)
        alone = run_experiment(load_config(DIGITS, [*job, f"output.dir={out}", f"algorithm.lr={lr}", "run.seed=0",
                                                    "run.experiment=alone", f"run.run_id={run_id}"]))
        assert_same_tables(rayfl.results.load(alone.run_dir), rayfl.results.load(out / "stop" / run_id))


def test_interrupted_sweep_resumes_without_rerunning_finished_trials(ray_local, tmp_path: Path) -> None:
    out = tmp_path / "results"
    args = dict(overrides=[*TINY, f"output.dir={out}"], grid=["algorithm.lr=0.05,0.1"], seeds="0",
                name="resume", max_concurrent=1, verbose=0)
    sweep_dir = out / "resume"
    sweep_dir.mkdir(parents=True)
    blocker = sweep_dir / "lr=0.1,s0"
    blocker.write_text("a file where the run directory goes: the trial's first attempt fails")

    first = run_sweep(DIGITS, **args)
    assert len(first.errors) == 1 and "lr=0.1,s0" in first.errors[0]
    assert first.statuses == {"lr=0.05,s0": "completed", "lr=0.1,s0": None}
    done = sweep_dir / "lr=0.05,s0"
    before = run_files(done)

    blocker.unlink()
    second = run_sweep(DIGITS, **args)
    assert second.restored and second.errors == []
    assert second.statuses == {"lr=0.05,s0": "completed", "lr=0.1,s0": "completed"}
    assert run_files(done) == before  # the finished trial was not run again
    assert manifest(sweep_dir / "lr=0.1,s0")["config"]["algorithm"]["lr"] == 0.1

    # The same name with another grid is refused instead of resuming the wrong sweep.
    with pytest.raises(ConfigError, match=r"^sweep\.name: .*already exists"):
        run_sweep(DIGITS, **{**args, "grid": ["algorithm.lr=0.2"]})


@pytest.mark.slow
def test_asha_stops_poor_trials_and_their_runs_end_cleanly(ray_local, tmp_path: Path) -> None:
    out = tmp_path / "results"
    outcome = run_sweep(
        DIGITS, [*TINY, "run.rounds=5", f"output.dir={out}"], ["algorithm.lr=0.3,0.0001"],
        seeds="0", name="asha", scheduler="asha", max_concurrent=1, verbose=0,
    )
    assert outcome.errors == []
    statuses = outcome.statuses
    assert statuses["lr=0.3,s0"] == "completed"  # the first trial sets the bar at every rung
    stopped = [r for r, s in statuses.items() if s != "completed"]
    assert stopped, statuses
    for run_id in stopped:
        m = manifest(out / "asha" / run_id)
        assert m["status"] == "interrupted" and m["sweep_stopped"]
        assert m["last_round"] < 4 and (out / "asha" / run_id / "checkpoint.npz").is_file()


def test_a_trial_with_a_checkpointed_run_resumes_it(ray_local, tmp_path: Path) -> None:
    """A trial whose run stopped after a checkpoint (a killed sweep, a retried trial) continues
    from that checkpoint instead of starting over, and ends with the uninterrupted run's tables."""
    from test_resume import assert_same_tables, sigterm_after

    import rayfl.results
    from rayfl.config import load_config
    from rayfl.engine.runlog import RunInterrupted
    from rayfl.runner import run_experiment

    out = tmp_path / "results"
    common = [*TINY, f"output.dir={out}", "algorithm.lr=0.1", "run.seed=0"]
    trial_id = run_id_for({"algorithm.lr": 0.1}, 0)
    with pytest.raises(RunInterrupted):  # the trial's run, stopped after round 0's checkpoint
        run_experiment(load_config(DIGITS, [*common, "run.experiment=ckpt", f"run.run_id={trial_id}"]),
                       on_start=sigterm_after(0))
    trial_dir = out / "ckpt" / trial_id
    assert manifest(trial_dir)["status"] == "interrupted"

    outcome = run_sweep(DIGITS, [*TINY, f"output.dir={out}"], ["algorithm.lr=0.1"], seeds="0",
                        name="ckpt", verbose=0)
    assert outcome.errors == [] and outcome.statuses == {trial_id: "completed"}
    m = manifest(trial_dir)
    assert len(m["resumed_at"]) == 1  # resumed from its checkpoint, not re-run with overwrite
    whole = run_experiment(load_config(DIGITS, [*common, "run.experiment=whole", "run.run_id=whole"]))
    assert_same_tables(rayfl.results.load(whole.run_dir), rayfl.results.load(trial_dir))


DYING = '''
import os

from rayfl.algorithms.fedavg import FedAvg


class Dies(FedAvg):
    """FedAvg whose driver process exits as the run starts: a trial worker that dies."""

    def init(self):
        os._exit(3)
'''


def test_a_trial_whose_worker_dies_fails_alone(ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial that kills its worker process is reported as failed in one line; the other slot's
    trial completes and the sweep ends."""
    (tmp_path / "dying.py").write_text(DYING)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "results"
    outcome = run_sweep(DIGITS, [*TINY, f"output.dir={out}"], ["algorithm.name=dying:Dies,fedavg"], seeds="0",
                        name="dies", max_concurrent=2, verbose=0)
    assert outcome.statuses["name=fedavg,s0"] == "completed", outcome.statuses
    (error,) = outcome.errors
    assert error.startswith("name=dying_Dies,s0: its trial worker died"), error
