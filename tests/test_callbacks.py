"""Callbacks: early stopping at the round a hand-made metric sequence dictates, the best-model
checkpoint, budgets, a user's callback by import path from a package outside the repository,
callbacks handed to `rayfl.run`, TensorBoard from a real run, and their state across a resume."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_resume import assert_same_tables, sigterm_after

import rayfl
from rayfl.callbacks.base import Callback, RunInfo
from rayfl.callbacks.stopping import EarlyStopping, EarlyStoppingConfig
from rayfl.config import ConfigError, load_config
from rayfl.engine.runlog import RunInterrupted
from rayfl.results import load
from rayfl.runner import resume_experiment, run_experiment

INFO = RunInfo(run_id="r", run_dir=None, config={})
# rounds 0..9 of a made-up accuracy; with patience 3 and min_delta 0.005 the run must stop at
# round 7: best 0.31 at round 4, then 0.2, 0.3, 0.31 (not above 0.315) are three misses
SEQUENCE = [0.1, 0.3, 0.25, 0.3, 0.31, 0.2, 0.3, 0.31, 0.5, 0.6]


def stops_at(cb: Callback, rows: list[dict[str, Any]]) -> int | None:
    for row in rows:
        if cb.on_round(row, INFO) is not None:
            return row["round"]
    return None


def test_early_stopping_stops_where_the_hand_made_sequence_says():
    rows = [{"round": r, "test_accuracy": v} for r, v in enumerate(SEQUENCE)]
    cb = EarlyStopping(EarlyStoppingConfig(metric="test_accuracy", patience=3, min_delta=0.005))
    assert stops_at(cb, rows) == 7
    assert cb.watch.best == 0.31 and cb.watch.best_round == 4


def test_early_stopping_counts_only_rows_with_the_metric_and_minimises_losses():
    rows = [{"round": 0, "test_loss": 1.0}, {"round": 1, "train_loss": 9.0}, {"round": 2, "test_loss": 0.9},
            {"round": 3, "train_loss": 9.0}, {"round": 4, "test_loss": 0.95}, {"round": 5, "test_loss": 0.91}]
    cb = EarlyStopping(EarlyStoppingConfig(metric="test_loss", mode="min", patience=2))
    assert stops_at(cb, rows) == 5


def test_a_metric_that_is_not_a_column_fails_at_the_first_evaluation():
    cb = EarlyStopping(EarlyStoppingConfig(metric="test_acc", patience=2))
    assert cb.on_round({"round": 0, "train_loss": 1.0}, INFO) is None
    with pytest.raises(ConfigError, match="'test_acc' is not a rounds column"):
        cb.on_round({"round": 1, "train_loss": 1.0, "test_accuracy": 0.5}, INFO)


@pytest.mark.parametrize("item, key", [
    ({"name": "early_stopping", "patience": 0}, "callbacks[0].patience"),
    ({"name": "early_stopping", "mode": "up"}, "callbacks[0].mode"),
    ({"name": "budget"}, "callbacks[0].sim_time"),
    ({"name": "nonesuch"}, "callbacks[0].name"),
    ({"name": "early_stopping", "patiense": 3}, "callbacks[0].patiense"),
])
def test_bad_callback_settings_fail_in_one_line(item, key):
    from rayfl.config import config_from_dict

    with pytest.raises(ConfigError) as err:
        config_from_dict({"callbacks": [item]})
    assert err.value.key == key


# ---------------------------------------------------------------- a user's package


PACKAGE = {
    "cbpkg/__init__.py": "",
    "cbpkg/seqalg.py": '''
        """An algorithm that logs a made-up metric sequence and keeps x = round as its model."""
        from dataclasses import dataclass

        import numpy as np


        @dataclass
        class State:
            x: np.ndarray


        def run_seq(fed, cfg, run):
            values = cfg.kwargs["values"]
            s = fed.track(State(x=np.zeros(3, dtype=np.float32)))
            for r in fed.rounds(run.rounds):
                s.x = np.full(3, r, dtype=np.float32)
                fed.log_round(r, fake=float(values[r]))
            return {"final_params": s.x}
    ''',
    "cbpkg/cbs.py": '''
        """A user's callback, registered by nothing but its import path."""
        import rayfl


        class StopAt(rayfl.Callback):
            def __init__(self, round):
                self.round = round
                self.seen = []

            def on_round(self, row, run):
                self.seen.append(row["round"])
                return f"asked to stop at {self.round}" if row["round"] == self.round else None

            def state_dict(self):
                return {"seen": list(self.seen)}

            def load_state_dict(self, state):
                self.seen = list(state["seen"])
    ''',
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "pkg"
    for name, text in PACKAGE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.chdir(root)
    return root


def seq_job(results_dir: Path, run_id: str, callbacks: list[dict[str, Any]], rounds: int = 10):
    from rayfl.config import config_from_dict

    return config_from_dict({
        "algorithm": {"name": "cbpkg.seqalg:run_seq", "kwargs": {"values": SEQUENCE}, "clients_per_round": 4},
        "run": {"rounds": rounds, "run_id": run_id}, "partition": {"num_clients": 4},
        "engine": {"num_hosts": 1}, "output": {"dir": str(results_dir), "checkpoint_every": 3},
        "callbacks": callbacks,
    })


def test_early_stopping_ends_a_real_run_at_the_dictated_round(ray_local, results_dir, package):
    cfg = seq_job(results_dir, "es", [{"name": "early_stopping", "metric": "fake", "patience": 3, "min_delta": 0.005},
                                      {"name": "best_checkpoint", "metric": "fake"}])
    out = run_experiment(cfg)
    res = load(out.run_dir)
    assert list(res.rounds.sort_values("round")["round"]) == list(range(8))
    manifest = res.manifests.iloc[0]
    assert manifest["status"] == "completed" and manifest["stopped_early.round"] == 7
    assert "did not improve for 3 evaluations" in out.summary["stopped_early"]["reason"]
    best = np.load(Path(out.run_dir) / "best_model.npz")
    assert int(best["round"]) == 4 and float(best["value"]) == 0.31
    np.testing.assert_array_equal(best["params"], np.full(3, 4, dtype=np.float32))


def test_early_stopping_state_survives_sigterm_and_resume(ray_local, results_dir, package):
    es = [{"name": "early_stopping", "metric": "fake", "patience": 3, "min_delta": 0.005}]
    whole = load(run_experiment(seq_job(results_dir, "whole", es)).run_dir)
    with pytest.raises(RunInterrupted):
        run_experiment(seq_job(results_dir, "cut", es), on_start=sigterm_after(5))  # mid-patience: 1 miss so far
    resumed = load(resume_experiment(results_dir / "default" / "cut").run_dir)
    assert resumed.rounds["round"].max() == 7
    assert_same_tables(whole, resumed)


def test_a_users_callback_by_import_path_and_one_handed_to_rayfl_run(ray_local, results_dir, package):
    seen: list[int] = []

    class Watch(rayfl.Callback):
        def on_round(self, row, run):
            seen.append(row["round"])

    cfg = seq_job(results_dir, "user", [{"name": "cbpkg.cbs:StopAt", "kwargs": {"round": 2}}])
    run = rayfl.run(cfg, callbacks=[Watch()])
    assert list(run.rounds["round"]) == [0, 1, 2] and seen == [0, 1, 2]


def test_budget_stops_at_the_first_round_past_the_simulated_time(ray_local, results_dir):
    cfg = load_config(None, ["partition.num_clients=6", "algorithm.clients_per_round=3", "run.rounds=20",
                             "engine.num_hosts=1", f"output.dir={results_dir}", "run.run_id=budget"])
    from rayfl.config import build_callbacks

    cfg.callbacks = build_callbacks([{"name": "budget", "sim_time": 0.5}])
    rounds = load(run_experiment(cfg).run_dir).rounds.sort_values("round")
    assert rounds["sim_time"].iloc[-1] >= 0.5 and (rounds["sim_time"].iloc[:-1] < 0.5).all()
    assert len(rounds) < 20


def test_tensorboard_from_a_real_run_holds_every_rounds_metrics(ray_local, results_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rayfl.config import build_callbacks

    cfg = load_config(None, ["partition.num_clients=6", "algorithm.clients_per_round=3", "run.rounds=4", "run.eval_every=2",
                             "engine.num_hosts=1", f"output.dir={results_dir}", "run.run_id=tb"])
    cfg.callbacks = build_callbacks([{"name": "tensorboard"}])
    out = run_experiment(cfg)
    acc = EventAccumulator(str(Path(out.run_dir) / "tensorboard"))
    acc.Reload()
    rounds = load(out.run_dir).rounds.sort_values("round")
    loss = acc.Scalars("rounds/train_loss")
    assert [e.step for e in loss] == list(rounds["round"])
    np.testing.assert_allclose([e.value for e in loss], rounds["train_loss"], rtol=1e-6)
    assert [e.step for e in acc.Scalars("rounds/test_accuracy")] == [1, 3]
