"""Reports over seeds (mean ± std, how many seeds, bands) and the async task window."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.image import imread

from rayfl.report import write_report
from rayfl.results import RunWriter, load
from rayfl.results.plots import is_asynchronous, metric_frame, plot_curves, plot_task_window
from rayfl.results.seeds import aggregate_curves, seed_groups, seed_table


def write_run(root, run_id: str, lr: float, seed: int, accuracies: list[float], sim_step: float = 1.0) -> None:
    config = {"run": {"seed": seed, "run_id": run_id}, "algorithm": {"name": "fedavg", "lr": lr},
              "output": {"dir": str(root)}, "engine": {"num_hosts": 1 + seed}}
    with RunWriter(root, "exp", run_id, {"config": config}) as w:
        for r, acc in enumerate(accuracies):
            w.append("rounds", {"round": r, "sim_time": (r + 1) * sim_step, "train_loss": 1.0 - acc})
            w.append("evals", {"round": r, "client": -1, "test_accuracy": acc, "sim_time": (r + 1) * sim_step})


@pytest.fixture
def runs(tmp_path):
    write_run(tmp_path, "a0", 0.1, 0, [0.2, 0.4, 0.6])
    write_run(tmp_path, "a1", 0.1, 1, [0.4, 0.6, 0.7])
    write_run(tmp_path, "a2", 0.1, 2, [0.3, 0.5, 0.8], sim_step=2.0)
    write_run(tmp_path, "b0", 0.01, 0, [0.1, 0.2, 0.3])
    return tmp_path


def test_runs_differing_only_by_seed_form_one_setting(runs):
    groups = seed_groups(load(runs)).set_index("run_id")
    assert groups.loc["a0", "setting"] == groups.loc["a2", "setting"] != groups.loc["b0", "setting"]
    assert groups.loc["a0", "setting"] == "fedavg, lr=0.1"  # seed, run id, engine, output ignored
    assert sorted(groups["seed"].tolist()) == [0, 0, 1, 2]


def test_curves_are_averaged_over_seeds_with_their_std(runs):
    res = load(runs)
    curves = aggregate_curves(metric_frame(res, "test_accuracy"), seed_groups(res), "test_accuracy")
    a = curves[curves["setting"] == "fedavg, lr=0.1"].sort_values("round")
    assert a["n"].tolist() == [3, 3, 3]
    np.testing.assert_allclose(a["mean"], [0.3, 0.5, 0.7])
    np.testing.assert_allclose(a["std"], [0.1, 0.1, 0.1])  # ddof = 1
    b = curves[curves["setting"] == "fedavg, lr=0.01"]
    assert b["n"].tolist() == [1, 1, 1] and (b["std"] == 0).all()


def test_curves_on_simulated_time_are_interpolated_onto_the_common_range(runs):
    res = load(runs)
    frame = metric_frame(res, "test_accuracy", x="sim_time")
    curves = aggregate_curves(frame, seed_groups(res), "test_accuracy", x="sim_time")
    a = curves[curves["setting"] == "fedavg, lr=0.1"]
    assert a["sim_time"].min() == 2.0 and a["sim_time"].max() == 3.0  # where all three have values
    at3 = a[a["sim_time"] == 3.0]["mean"].item()
    assert at3 == pytest.approx((0.6 + 0.7 + 0.4) / 3)  # a2 at t = 3 lies between its rounds 0 and 1


def test_seed_table_and_report(runs, tmp_path):
    res = load(runs)
    table = seed_table(res, metric_frame(res, "test_accuracy"), "test_accuracy").set_index("setting")
    assert table.loc["fedavg, lr=0.1", "seeds"] == 3
    assert table.loc["fedavg, lr=0.1", "final_test_accuracy_mean"] == pytest.approx(0.7)
    assert table.loc["fedavg, lr=0.1", "final_test_accuracy_std"] == pytest.approx(0.1)
    assert table.loc["fedavg, lr=0.01", "final_test_accuracy_std"] == 0.0
    lines = write_report(runs, tmp_path / "out")
    assert "over seeds (mean ± std):" in lines
    png = plot_curves(res, "test_accuracy", path=tmp_path / "acc.png")
    assert imread(png).shape[0] > 100


def test_async_runs_get_a_window_of_tasks_in_flight(tmp_path):
    rng = np.random.default_rng(0)
    with RunWriter(tmp_path, "exp", "async", {"config": {"algorithm": {"name": "fedbuff"}}}) as w:
        for task in range(200):  # async: each task its own round key, dispatched one after another
            start = task * 0.1
            w.append("clients", {"round": task, "task": task, "client": int(rng.integers(50)), "dispatch_time": start,
                                 "finish_time": start + float(rng.uniform(0.5, 5)), "staleness": int(rng.integers(4)),
                                 "outcome": "stale" if task % 17 == 0 else "ok"})
        w.append("evals", {"round": 9, "client": -1, "test_accuracy": 0.5, "sim_time": 9.0})
    with RunWriter(tmp_path, "exp", "sync", {"config": {"algorithm": {"name": "fedavg"}}}) as w:
        for r in range(3):
            for c in range(5):
                w.append("clients", {"round": r, "client": c, "dispatch_time": float(r), "finish_time": r + 0.5, "outcome": "ok"})
        w.append("evals", {"round": 2, "client": -1, "test_accuracy": 0.5, "sim_time": 2.0})
    res = load(tmp_path)
    assert is_asynchronous(res, "async") and not is_asynchronous(res, "sync")
    png = plot_task_window(res, "async", path=tmp_path / "window.png", max_tasks=40)
    assert imread(png).shape[0] > 100
    lines = write_report(tmp_path, tmp_path / "out")
    assert any("timeline_exp_async.png" in line for line in lines)


def test_a_key_one_setting_lacks_stays_out_of_its_label():
    """An MLP's `hidden` varies between settings; a linear model has none (NaN in the joined
    manifests): its label says nothing about it, unless that makes two labels equal."""
    import numpy as np
    import pandas as pd

    from rayfl.results.load import Results

    empty = pd.DataFrame()
    manifests = pd.DataFrame({
        "experiment": ["e"] * 4, "run_id": ["a", "b", "c", "d"], "run.seed": [0, 0, 0, 1],
        "algorithm.name": ["fedavg"] * 4, "model.name": ["mlp", "mlp", "linear", "linear"],
        "model.hidden": ["[32]", "[64]", np.nan, np.nan],
    })
    labels = seed_groups(Results(empty, empty, empty, manifests)).set_index("run_id")["setting"]
    assert labels["a"] == "fedavg, name=mlp, hidden=[32]" and labels["b"] == "fedavg, name=mlp, hidden=[64]"
    assert labels["c"] == labels["d"] == "fedavg, name=linear"
