"""`rayfl report`'s pipeline trade-offs: the numbers behind accuracy-vs-epsilon, -uplink and
-simulated-time (cumulative bytes, lines and references, mean ± std over seeds) on hand-made
tables, and the files a report on real tiny runs writes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rayfl.config import load_config
from rayfl.report import write_report
from rayfl.results import load
from rayfl.results.load import Results
from rayfl.results.tradeoffs import (
    compressed_runs,
    compression_table,
    cumulative_uplink,
    default_target,
    experiments_with,
    markdown_table,
    privacy_lines,
    privacy_table,
    time_to_target,
)
from rayfl.runner import run_experiment

STD2 = float(np.std([0.6, 0.8], ddof=1))


def manifest(experiment: str, run_id: str, seed: int, **config: object) -> dict[str, object]:
    row: dict[str, object] = {"experiment": experiment, "run_id": run_id, "run.seed": seed, "run.run_id": run_id,
                              "run.experiment": experiment, "algorithm.name": "fedavg", "algorithm.lr": 0.1,
                              "algorithm.clients_per_round": 25, "privacy.mode": "off", "privacy.noise_multiplier": None,
                              "compression.name": "none", "output.dir": "/somewhere", "engine.num_hosts": 1 + seed}
    row.update({k.replace("__", "."): v for k, v in config.items()})
    return row


def frames(runs: list[tuple[dict[str, object], list[float], list[float]]], eps_step: float = 0.0) -> Results:
    """Results from (manifest, accuracy per round, sim_time per round) triples; private runs get
    epsilon = eps_step * (round + 1) * z in `rounds`."""
    rounds, evals = [], []
    for m, accuracy, times in runs:
        for r, (acc, t) in enumerate(zip(accuracy, times, strict=True)):
            row = {"experiment": m["experiment"], "run_id": m["run_id"], "round": r, "sim_time": t}
            if m["privacy.mode"] != "off":
                row["epsilon"] = eps_step * (r + 1) * float(m["pipeline.noise_multiplier"])  # type: ignore[arg-type]
            rounds.append(row)
            evals.append({"experiment": m["experiment"], "run_id": m["run_id"], "round": r, "client": -1,
                          "sim_time": t, "test_accuracy": acc})
    return Results(rounds=pd.DataFrame(rounds), clients=pd.DataFrame(columns=["experiment", "run_id", "round"]),
                   evals=pd.DataFrame(evals), manifests=pd.DataFrame([m for m, _, _ in runs]))


# ---------------------------------------------------------------------- uplink bytes


def test_cumulative_uplink_counts_accepted_training_uploads_only():
    clients = pd.DataFrame([
        # round 0: two accepted uploads; a late one and an evaluation task do not count
        {"round": 0, "phase": "train", "outcome": "ok", "bytes_up": 100},
        {"round": 0, "phase": "train", "outcome": "ok", "bytes_up": 100},
        {"round": 0, "phase": "train", "outcome": "late", "bytes_up": 100},
        {"round": 0, "phase": "eval", "outcome": "ok", "bytes_up": 50},
        {"round": 1, "phase": "train", "outcome": "ok", "bytes_up": 30},
        {"round": 1, "phase": "train", "outcome": "dropped", "bytes_up": 30},
    ]).assign(experiment="e", run_id="a")
    other = pd.DataFrame([{"round": 0, "phase": "train", "outcome": "ok", "bytes_up": 7}]).assign(experiment="e", run_id="b")
    rounds = pd.DataFrame({"experiment": "e", "run_id": "a", "round": [0, 1, 2]})  # nothing accepted in round 2
    res = Results(rounds=rounds, clients=pd.concat([clients, other]), evals=pd.DataFrame(columns=["experiment"]),
                  manifests=pd.DataFrame())
    up = cumulative_uplink(res).set_index(["run_id", "round"])["uplink_bytes"]
    assert up.loc["a"].to_dict() == {0: 200.0, 1: 230.0, 2: 230.0}
    assert up.loc["b"].to_dict() == {0: 7.0}


# ---------------------------------------------------------------------- privacy


@pytest.fixture
def private_results() -> Results:
    dp = {"privacy__mode": "central", "pipeline__delta": 1e-3}
    times = [1.0, 2.0, 3.0]
    return frames([
        (manifest("dp", "c25-z1-s0", 0, **dp, privacy__noise_multiplier=1.0, pipeline__noise_multiplier=1.0), [0.1, 0.3, 0.6], times),
        (manifest("dp", "c25-z1-s1", 1, **dp, privacy__noise_multiplier=1.0, pipeline__noise_multiplier=1.0), [0.2, 0.5, 0.8], times),
        (manifest("dp", "c25-z2-s0", 0, **dp, privacy__noise_multiplier=2.0, pipeline__noise_multiplier=2.0), [0.1, 0.2, 0.5], times),
        (manifest("dp", "c100-z1-s0", 0, **dp, privacy__noise_multiplier=1.0, pipeline__noise_multiplier=1.0,
                  algorithm__clients_per_round=100), [0.5, 0.8, 0.9], times),
        # calibrated to a target epsilon: its resolved z (the manifest's pipeline.noise_multiplier) counts
        (manifest("dp", "c25-eps-s0", 0, **dp, privacy__target_epsilon=0.5, pipeline__noise_multiplier=4.0), [0.1, 0.1, 0.4], times),
        # the noise-free reference of cohort 25 (another sweep), and a run that is no one's reference
        (manifest("plain", "c25-s0", 0), [0.5, 0.9, 0.95], times),
        (manifest("plain", "lr-s0", 0, algorithm__lr=0.5), [0.5, 0.6, 0.7], times),
    ], eps_step=0.25)


def test_a_line_is_a_setting_with_its_noise_set_aside_and_references_match_outside_privacy(private_results):
    lines = privacy_lines(private_results).set_index("run_id")
    cohort25 = lines.loc["c25-z1-s0", "line"]
    assert cohort25 == "fedavg, clients_per_round=25"  # seed, noise, run id, engine and output set aside
    assert lines.loc[["c25-z1-s1", "c25-z2-s0", "c25-eps-s0", "c25-s0"], "line"].eq(cohort25).all()
    assert lines.loc["c100-z1-s0", "line"] == "fedavg, clients_per_round=100"
    assert "lr-s0" not in lines.index  # its lr differs: a reference for nobody
    assert lines.loc["c25-eps-s0", "noise_multiplier"] == 4.0 and math.isnan(lines.loc["c25-s0", "noise_multiplier"])


def test_privacy_table_is_mean_and_std_over_seeds_per_noise_level(private_results):
    table = privacy_table(private_results, "test_accuracy")
    c25 = table[table["line"] == "fedavg, clients_per_round=25"]
    assert c25["noise_multiplier"].tolist()[:3] == [4.0, 2.0, 1.0] and c25["private"].tolist() == [True] * 3 + [False]
    z1 = c25[c25["noise_multiplier"] == 1.0].iloc[0]
    assert z1["seeds"] == 2 and z1["epsilon"] == pytest.approx(0.75)  # the last round's: 0.25 * 3 * z
    assert z1["test_accuracy_mean"] == pytest.approx(0.7) and z1["test_accuracy_std"] == pytest.approx(STD2)
    assert z1["delta"] == 1e-3
    ref = c25[~c25["private"]].iloc[0]
    assert ref["epsilon"] == math.inf and ref["test_accuracy_mean"] == pytest.approx(0.95) and ref["test_accuracy_std"] == 0
    c100 = table[table["line"] == "fedavg, clients_per_round=100"]
    assert len(c100) == 1 and c100["test_accuracy_mean"].item() == pytest.approx(0.9)  # no reference ran


# ---------------------------------------------------------------------- compression


def test_compression_table_uplink_and_time_to_target():
    runs = []
    for name, size, step in (("none", 1000, 1.0), ("topk", 10, 0.1)):
        for seed, accuracy in ((0, [0.2, 0.6, 0.7]), (1, [0.4, 0.5, 0.9])):
            runs.append((manifest("c", f"{name}-s{seed}", seed, compression__name=name, compression__ratio=0.01),
                         accuracy, [step * (r + 1) for r in range(3)], size))
    runs.append((manifest("other", "x-s0", 0), [0.1, 0.1, 0.1], [1.0, 2.0, 3.0], 5))  # not a compression experiment
    res = frames([(m, acc, t) for m, acc, t, _ in runs])
    uploads = []
    for m, _, _, size in runs:
        for r in range(3):  # two uploads a round, of `size` bytes for seed 0 and twice that for seed 1
            row = {"experiment": m["experiment"], "run_id": m["run_id"], "round": r, "phase": "train", "outcome": "ok"}
            uploads += [{**row, "bytes_up": size * (1 + int(m["run.seed"]))}] * 2
    res.clients = pd.DataFrame(uploads)
    compared = experiments_with(res, compressed_runs(res.manifests))
    assert set(compared.manifests["experiment"]) == {"c"}
    table, target = compression_table(compared, "test_accuracy")
    assert target == pytest.approx(0.7)  # the best value every run reaches (seed 0: 0.7), to 0.01
    top = table.set_index("setting").loc["topk"]
    assert top["seeds"] == 2 and top["reached_target"] == 2
    # uplink in all: 3 rounds x 2 uploads x 10 bytes (seed 0) or 20 (seed 1)
    assert top["uplink_bytes_mean"] == pytest.approx(90.0) and top["uplink_bytes_std"] == pytest.approx(np.std([60, 120], ddof=1))
    # seed 0 reaches 0.7 at round 2 (t = 0.3), seed 1 at round 2 too (0.9; round 1 has 0.5)
    assert top["sim_time_to_target_mean"] == pytest.approx(0.3) and top["uplink_to_target_mean"] == pytest.approx(90.0)
    assert top["test_accuracy_mean"] == pytest.approx(0.8) and top["test_accuracy_std"] == pytest.approx(STD2)  # 0.7, 0.9
    dense = table.set_index("setting").loc["none"]
    assert dense["sim_time_to_target_mean"] == pytest.approx(3.0)
    late, _ = compression_table(compared, "test_accuracy", target=0.85)
    assert late.set_index("setting").loc["topk", "reached_target"] == 1  # only seed 1 gets there
    assert late.set_index("setting").loc["topk", "sim_time_to_target_mean"] == pytest.approx(0.3)


def test_a_loss_target_is_reached_from_above():
    res = frames([(manifest("c", "a", 0), [0.9, 0.5, 0.35], [1.0, 2.0, 3.0]),
                  (manifest("c", "b", 1), [0.8, 0.3, 0.2], [1.0, 2.0, 3.0])])
    res.evals = res.evals.rename(columns={"test_accuracy": "test_loss"})
    assert default_target(pd.Series([0.35, 0.2]), lower_is_better=True) == pytest.approx(0.35)
    times = time_to_target(res, "test_loss", 0.4).set_index("run_id")["sim_time_to_target"]
    assert times.to_dict() == {"a": 3.0, "b": 2.0}


def test_markdown_table_pairs_mean_and_std():
    table = pd.DataFrame({"setting": ["a"], "seeds": [3], "acc_mean": [0.81234], "acc_std": [0.01],
                          "uplink_bytes_mean": [1234567.0], "uplink_bytes_std": [0.0], "epsilon": [math.inf],
                          "noise_multiplier": [float("nan")]})
    text = markdown_table(table).splitlines()
    assert text[0] == "| setting | seeds | acc | uplink_bytes | epsilon | noise_multiplier |"
    assert text[2] == "| a | 3 | 0.8123 ± 0.0100 | 1,234,567 ± 0 | inf | - |"


# ---------------------------------------------------------------------- a report on real runs


def tiny(root, experiment: str, run_id: str, *extra: str):
    return load_config(None, ["partition.num_clients=12", "algorithm.clients_per_round=4", "algorithm.local_epochs=null",
                              "algorithm.local_steps=2", "algorithm.batch_size=8", "run.rounds=3", "run.eval_every=1",
                              f"output.dir={root}", f"run.experiment={experiment}", f"run.run_id={run_id}",
                              "engine.num_hosts=1", "engine.num_cpus_per_host=1", *extra])


def test_report_on_tiny_runs_writes_the_tradeoff_figures_and_tables(ray_local, tmp_path):
    root = tmp_path / "results"
    dp = ["privacy.mode=central", "privacy.clip=0.5", "privacy.noise_multiplier=1.0"]
    for cfg in (
        tiny(root, "dp", "z1-s0", *dp),
        tiny(root, "dp", "z1-s1", *dp, "run.seed=1"),
        tiny(root, "plain", "s0"),
        tiny(root, "comp", "topk-s0", "compression.name=topk", "compression.ratio=0.05", "algorithm.local_steps=3"),
        tiny(root, "comp", "none-s0", "algorithm.local_steps=3"),  # not the DP line's reference
        tiny(root, "robust", "median-s0", "robust.aggregator.name=median", "robust.attack.name=sign_flip",
             "robust.attack.count=2"),
    ):
        run_experiment(cfg)
    out = tmp_path / "report"
    lines = write_report(root, out)
    names = ("accuracy_vs_epsilon.png", "accuracy_vs_uplink.png", "accuracy_vs_sim_time.png", "tradeoff_privacy.csv",
             "tradeoff_compression.csv", "tradeoff_robust.csv", "tradeoffs.md")
    for name in names:
        assert (out / name).stat().st_size > 0, name
        assert any(line.endswith(name) for line in lines), name
    res = load(root)
    privacy = pd.read_csv(out / "tradeoff_privacy.csv")
    dp_rounds = res.rounds[res.rounds["experiment"] == "dp"].sort_values("round")
    assert privacy.loc[privacy["private"], "epsilon"].item() == pytest.approx(dp_rounds["epsilon"].iloc[-1])
    assert privacy.loc[privacy["private"], "seeds"].item() == 2
    assert privacy.loc[~privacy["private"], "seeds"].item() == 1  # `plain` matches the DP line outside `privacy:`
    compression = pd.read_csv(out / "tradeoff_compression.csv").set_index("setting")
    sent = res.clients[(res.clients["run_id"] == "topk-s0") & (res.clients["phase"] == "train")
                       & (res.clients["outcome"] == "ok")]["bytes_up"].sum()
    assert compression.loc["topk", "uplink_bytes_mean"] == sent
    assert compression.loc["topk", "uplink_bytes_mean"] < compression.loc["none", "uplink_bytes_mean"] / 5
