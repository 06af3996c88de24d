"""Checkpoint / resume: a run stopped by SIGTERM or killed by SIGKILL and resumed from its last
checkpoint ends with exactly the tables of a run that was never interrupted (wall-clock columns
aside): no row missing, none doubled, every metric equal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rayfl.config import load_config
from rayfl.engine.checkpoint import load_checkpoint
from rayfl.engine.runlog import RunInterrupted
from rayfl.results import load
from rayfl.results.storage import Location
from rayfl.runner import resume_experiment, run_experiment

WALL = ["wall_time", "run_id", "experiment"]
BIN = Path(sys.executable).parent


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in ("round", "phase", "client", "split") if c in df.columns]
    out = df.drop(columns=[c for c in WALL if c in df.columns]).sort_values(keys, kind="stable")
    return out.reset_index(drop=True)


def assert_same_tables(a: Any, b: Any) -> None:
    for table in ("rounds", "clients", "evals"):
        pd.testing.assert_frame_equal(comparable(getattr(a, table)), comparable(getattr(b, table)), check_like=True)


def job(results_dir: Path, run_id: str, *extra: str):
    return load_config(
        None,
        [
            "partition.num_clients=12",
            "algorithm.clients_per_round=5",
            "algorithm.local_epochs=null",
            "algorithm.local_steps=3",
            "algorithm.batch_size=8",
            "run.rounds=7",
            "run.eval_every=2",
            "system.speed={dist: lognormal, value: 2.0e+6, sigma: 1.0}",
            "system.dropout=0.1",
            "output.checkpoint_every=3",
            f"output.dir={results_dir}",
            f"run.run_id={run_id}",
            "engine.num_hosts=2",
            "engine.num_cpus_per_host=0.5",
            *extra,
        ],
    )


def sigterm_after(round_: int):
    """on_start hook: a real SIGTERM to this process right after round `round_` is logged."""

    def on_start(run_dir, fed) -> None:
        log_round = fed.log_round

        def log_then_signal(r: int, **metrics: Any) -> None:
            if r == round_:
                os.kill(os.getpid(), signal.SIGTERM)
            log_round(r, **metrics)

        fed.log_round = log_then_signal

    return on_start


ALGORITHMS = {
    # with the `server:` section's Adam: its moments travel with the checkpoint
    "scaffold": ["algorithm.name=scaffold", "algorithm.lr=0.05", "server.optimizer=adam", "server.lr=0.01"],
    "fedbuff": ["algorithm.name=fedbuff", "algorithm.concurrency=6", "algorithm.buffer_size=3", "run.rounds=9"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_sigterm_then_resume_equals_the_uninterrupted_run(ray_local, results_dir, name):
    whole = load(run_experiment(job(results_dir, f"{name}-whole", *ALGORITHMS[name])).run_dir)
    cfg = job(results_dir, f"{name}-stopped", *ALGORITHMS[name])
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, on_start=sigterm_after(4))  # between periodic checkpoints (3, 6)
    run_dir = results_dir / "default" / f"{name}-stopped"
    stopped = load(run_dir)
    assert stopped.manifests["status"].iloc[0] == "interrupted"
    assert stopped.rounds["round"].max() == 4
    ckpt = load_checkpoint(Location.parse(run_dir))
    assert ckpt is not None and ckpt.round == 4
    if name == "fedbuff":
        assert ckpt.pools and len(ckpt.pools[0]["tasks"]) == 5  # in flight at the stop (6 less the last arrival)
    else:
        assert ckpt.client_states  # SCAFFOLD's c_i travel with the checkpoint
        assert ckpt.driver["server_optimizer"].steps == 5  # and the server's Adam moments
        # the rounds table's ledger: clients sampled again replace their state, never add to it
        ok = whole.clients[whole.clients["outcome"] == "ok"]
        have = [ok[ok["round"] <= r]["client"].nunique() for r in range(7)]
        assert whole.rounds["clients_with_state"].tolist() == have and have[-1] < len(ok)
        per_client = whole.rounds["client_state_bytes"] / whole.rounds["clients_with_state"]
        assert per_client.nunique() == 1  # one model-sized c_i each
    resumed = load(resume_experiment(run_dir).run_dir)
    assert resumed.manifests["status"].iloc[0] == "completed"
    assert_same_tables(whole, resumed)


def crash_after_round_4(run_dir, fed) -> None:
    """on_start hook: the run raises right after round 4 is logged (a crash between checkpoints)."""
    log_round = fed.log_round

    def log_then_crash(r: int, **metrics: Any) -> None:
        log_round(r, **metrics)
        if r == 4:
            raise RuntimeError("simulated crash after round 4")

    fed.log_round = log_then_crash


def test_resume_drops_rows_written_after_the_checkpoint(ray_local, results_dir):
    """A crash between checkpoints leaves rows the checkpoint does not name; resuming removes
    them and writes them again, so nothing is doubled."""
    cfg = job(results_dir, "crash", "algorithm.name=scaffold", "output.checkpoint_every=2")
    whole = load(run_experiment(job(results_dir, "crash-whole", "algorithm.name=scaffold", "output.checkpoint_every=2")).run_dir)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_experiment(cfg, on_start=crash_after_round_4)
    run_dir = results_dir / "default" / "crash"
    assert load(run_dir).rounds["round"].max() == 4  # round 4 was flushed, its checkpoint is round 3
    assert load_checkpoint(Location.parse(run_dir)).round == 3
    assert_same_tables(whole, load(resume_experiment(run_dir).run_dir))


def test_a_damaged_checkpoint_falls_back_to_the_one_before(ray_local, results_dir, caplog, tmp_path):
    """Half of checkpoint.npz (an interrupted copy): resume says so in one line, continues from
    checkpoint.prev.npz (round 1) and ends with the uninterrupted run's tables. With that one
    damaged too, `rayfl resume` exits 2 with one line naming the run's checkpoint."""
    import shutil

    from test_cli_runs import env_with_venv

    every_2 = ["algorithm.name=scaffold", "output.checkpoint_every=2"]
    whole = load(run_experiment(job(results_dir, "damaged-whole", *every_2)).run_dir)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_experiment(job(results_dir, "damaged", *every_2), on_start=crash_after_round_4)
    run_dir = results_dir / "default" / "damaged"
    both = results_dir / "default" / "both-damaged"
    shutil.copytree(run_dir, both)
    for path in (run_dir / "checkpoint.npz", both / "checkpoint.npz", both / "checkpoint.prev.npz"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    with caplog.at_level("WARNING", logger="rayfl.engine.checkpoint"):
        resumed = load(resume_experiment(run_dir).run_dir)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "rayfl.engine.checkpoint"]
    assert "checkpoint.npz is damaged" in warning and "using checkpoint.prev.npz (round 1)" in warning, warning
    assert_same_tables(whole, resumed)

    done = subprocess.run([str(BIN / "rayfl"), "resume", "--quiet", str(both)], env=env_with_venv(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert str(both / "checkpoint.npz") in line and "no checkpoint of this run can be read" in line, line


@pytest.mark.slow
def test_sigkilled_run_resumes_from_its_last_checkpoint(ray_local, results_dir, tmp_path):
    """SIGKILL the `rayfl run` process tree mid-run; `rayfl resume` finishes it."""
    from ray_head import kill_tree
    from test_cli_runs import env_with_venv

    common = [
        "--set", "algorithm.name=scaffold", "--set", "partition.num_clients=20", "--set", "run.rounds=20",
        "--set", "output.checkpoint_every=4", "--set", f"output.dir={results_dir}",
    ]
    # The reference run goes in-process on the session's Ray (one Ray start fewer); the killed
    # run and its resume are real `rayfl` processes.
    whole = run_experiment(load_config(None, [c for c in common if c != "--set"] + ["run.run_id=whole"]))
    proc = subprocess.Popen([str(BIN / "rayfl"), "run", "--quiet", *common, "--set", "run.run_id=killed"],
                            env=env_with_venv(), cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = results_dir / "default" / "killed"
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            ckpt = load_checkpoint(Location.parse(run_dir)) if (run_dir / "checkpoint.npz").exists() else None
            if ckpt is not None and ckpt.round >= 7:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.1)
        else:
            pytest.fail("no checkpoint in time")
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=30)
    assert load(run_dir).manifests["status"].iloc[0] == "running"
    resumed = subprocess.run([str(BIN / "rayfl"), "resume", "--quiet", str(run_dir)],
                             env=env_with_venv(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_tables(load(whole.run_dir), load(run_dir))


def test_reopened_writer_keeps_the_checkpointed_parts_and_drops_the_rest(tmp_path):
    from rayfl.results import RunWriter

    w = RunWriter(tmp_path, "exp", "run", {"seed": 0})
    for r in range(5):
        w.append("rounds", {"round": r, "loss": 1.0 / (r + 1), **({"extra": "x"} if r == 1 else {})})
        w.flush()
    position = {"rounds": 3, "clients": 0, "evals": 0}
    w2 = RunWriter.reopen(tmp_path / "exp" / "run", position)
    assert sorted(p.name for p in (tmp_path / "exp" / "run" / "rounds").glob("*.parquet")) == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert w2.part_counts() == position
    w2.append("rounds", {"round": 3, "loss": 0.25})
    w2.close("completed")
    rounds = load(tmp_path / "exp" / "run").rounds
    assert rounds["round"].tolist() == [0, 1, 2, 3] and "extra" in rounds.columns
    assert load(tmp_path / "exp" / "run").manifests["status"].iloc[0] == "completed"
