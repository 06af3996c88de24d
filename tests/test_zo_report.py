"""`rayfl report` on ZO-HFL runs: the Table I grid next to the paper's numbers, and Fig. 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.config import load_config
from rayfl.papers import paper_table
from rayfl.papers.zo_hfl.report import table1_grid
from rayfl.report import write_report
from rayfl.results import RunWriter, load

JOB = str(Path(__file__).resolve().parents[1] / "jobs" / "zo_hfl" / "table1_{}.yaml")


def fake_run(root: Path, run_id: str, method: str, accuracy: float, *overrides: str, status: str = "completed",
             tau: int = 20, experiment: str = "zohfl_table1") -> None:
    """A finished run as the runner writes it: manifest with the job's config, a few rounds
    (ZO-HFL: with the global loss), the global model's evaluations ending at `accuracy`."""
    cfg = load_config(JOB.format(method), ["data.source=test_only", "run.rounds=3",
                                          f"algorithm.local_schedule.tau={tau}", *overrides])
    writer = RunWriter(root, experiment, run_id, {"config": cfg.to_dict(), "seed": cfg.run.seed})
    for r in range(3):
        row = {"round": r, "sim_time": 2.0 * r, "wall_time": float(r), "train_loss": 1.0 / (r + 1)}
        if method == "zo_hfl":
            row["global_loss"] = 3.0 - r / tau
        writer.append("rounds", row)
        writer.append("evals", {"round": r, "sim_time": 2.0 * r, "wall_time": float(r), "client": -1, "split": "test",
                                "test_accuracy": accuracy - 0.1 * (2 - r)})
    writer.close(status)


def test_paper_reference_table_is_complete():
    paper = paper_table("zo_hfl", "table1")
    assert len(paper) == 36 and set(paper["method"]) == {"fedavg", "fedprox", "scaffold", "zo_hfl"}
    cell = paper[(paper.method == "zo_hfl") & (paper.dataset == "mnist") & (paper.alpha == 0.1) & (paper.beta == 0.1)]
    assert cell["accuracy"].item() == 87.70
    best = paper.loc[paper.groupby(["dataset", "alpha"])["accuracy"].idxmax()]
    assert (best[best.alpha < 1000].method == "zo_hfl").sum() == 5  # "best in five out of six heterogeneous cells"


def test_table1_grid_and_fig2_from_results(tmp_path):
    root = tmp_path / "results"
    fake_run(root, "zo-s0", "zo_hfl", 0.6, "run.seed=0", "partition.alpha=0.1", "algorithm.participation=0.1")
    fake_run(root, "zo-s1", "zo_hfl", 0.8, "run.seed=1", "partition.alpha=0.1", "algorithm.participation=0.1")
    fake_run(root, "avg", "fedavg", 0.5, "partition.alpha=1", "algorithm.participation=0.5", status="interrupted")
    fake_run(root, "avg-srv", "fedavg", 0.9, "partition.alpha=0.1", "algorithm.participation=0.1",
             "algorithm.server_as_client=true", experiment="zohfl_ablations")
    fake_run(root, "zo-lam0", "zo_hfl", 0.4, "partition.alpha=0.1", "algorithm.participation=0.1", "algorithm.lam=0",
             experiment="zohfl_ablations")
    fake_run(root, "zo-tau5", "zo_hfl", 0.3, "partition.alpha=0.1", "algorithm.participation=0.1", tau=5,
             experiment="zohfl_fig2")
    fake_run(root, "other", "fedavg", 0.2, "partition.alpha=0.5", "algorithm.participation=0.1")  # not a Table I cell
    for experiment in ("zohfl_screen_eta", "zohfl_screen_batch"):  # the screen's default, run by two sweeps
        fake_run(root, "s0", "scaffold", 0.85, "run.seed=0", "partition.alpha=0.1", "algorithm.participation=0.1",
                 experiment=experiment)
    fake_run(root, "s1", "scaffold", 0.95, "run.seed=1", "partition.alpha=0.1", "algorithm.participation=0.1",
             experiment="zohfl_screen_eta")
    grid, runs = table1_grid(load(root))
    col = "MNIST* a=0.1 b=10%"
    assert list(grid.columns) == ["MNIST* a=1000 b=90%", "MNIST* a=1 b=50%", col]
    assert grid.loc["ZO-HFL", col] == "70.00±14.14 (87.70)"  # two seeds: 60 and 80
    assert grid.loc["FedAvg", "MNIST* a=1 b=50%"] == "50.00~ (77.33)"  # interrupted: flagged
    assert grid.loc["FedAvg", col] == "- (39.19)"
    assert grid.loc["FedAvg [+server data]", col] == "90.00"  # ablations: no paper number
    assert grid.loc["ZO-HFL [lam=0 (server only)]", col] == "40.00"
    assert grid.loc["SCAFFOLD", col] == "90.00±7.07 (87.36)"  # seeds 0 and 1 once each, not seed 0 twice
    assert "zo-tau5" not in set(runs["run_id"]) and "other" not in set(runs["run_id"])  # tau 5: Fig. 2 only
    lines = write_report(root, tmp_path / "report")
    assert any(line.startswith("ZO-HFL Table I") for line in lines)
    assert (tmp_path / "report" / "zohfl_table1.md").read_text().count("(87.70)") == 1
    assert (tmp_path / "report" / "zohfl_fig2_global_loss.png").stat().st_size > 10_000


def test_report_without_zo_hfl_runs_adds_nothing(tmp_path):
    root = tmp_path / "results"
    fake_run(root, "avg", "fedavg", 0.5, "partition.alpha=0.3")
    lines = write_report(root, tmp_path / "report")
    assert not any("Table I" in line for line in lines)
    assert not (tmp_path / "report" / "zohfl_fig2_global_loss.png").exists()


@pytest.mark.parametrize("method", ["zo_hfl", "fedavg", "fedprox", "scaffold"])
def test_table1_jobs_share_split_partition_and_budget(method):
    cfg = load_config(JOB.format(method), ["data.source=test_only"])
    assert (cfg.data.test_fraction, cfg.data.server_fraction, cfg.partition.num_clients) == (0.1, 0.3, 10)
    assert (cfg.partition.alpha, cfg.algorithm.participation, cfg.run.rounds) == (0.1, 0.1, 500)
    schedule = cfg.algorithm.local_schedule
    assert (schedule.kind, schedule.tau, cfg.algorithm.lr, cfg.algorithm.batch_size) == ("sqrt", 20, 0.1, 64)
    assert cfg.model.name == "linear" and not cfg.model.bias
