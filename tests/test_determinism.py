"""Results do not depend on where clients run: the same MLP run (autograd path) on one host and
on several, under the deadline and over-selection policies with heterogeneous speeds (so some
clients really are late or truncated), and with one actor per client, gives identical `rounds`
and `clients` tables and the same final test accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl.config import load_config
from rayfl.results import Results, load
from rayfl.runner import run_experiment

# wall-clock and layout columns: the only ones allowed to differ between placements
LAYOUT_COLUMNS = ["wall_time", "host", "run_id", "experiment"]
ROUNDS = 3


def mlp_run(results_dir: Path, run_id: str, *extra: str) -> Results:
    cfg = load_config(None, [
        "data.dataset=digits", "partition.method=dirichlet", "partition.alpha=0.5",
        "model.name=mlp", "model.hidden=[16, 8]", "algorithm.name=fedavg", "algorithm.lr=0.1",
        "algorithm.batch_size=16", f"run.rounds={ROUNDS}",
        # a heavy spread of device speeds: compute dominates and durations differ 10x and more
        "system.speed={dist: lognormal, value: 2.0e6, sigma: 1.0}",
        f"output.dir={results_dir}", f"run.run_id={run_id}", *extra,
    ])
    assert cfg.model.name == "mlp"
    return load(run_experiment(cfg).run_dir)


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in LAYOUT_COLUMNS if c in df.columns]).reset_index(drop=True)


def final_test_accuracy(res: Results) -> float:
    evals = res.evals[(res.evals["client"] == -1) & (res.evals["split"] == "test")].sort_values("round")
    assert evals["round"].iloc[-1] == ROUNDS - 1
    return float(evals["test_accuracy"].iloc[-1])


def assert_same_results(a: Results, b: Results) -> None:
    assert len(a.rounds) == ROUNDS and len(a.clients) > 0
    pd.testing.assert_frame_equal(comparable(a.rounds), comparable(b.rounds))
    pd.testing.assert_frame_equal(comparable(a.clients), comparable(b.clients))
    assert final_test_accuracy(a) == final_test_accuracy(b)


def hosts_used(res: Results) -> int:
    return int(res.clients["host"].nunique())


CASES = {
    "deadline-drop": ["system.policy=deadline", "system.deadline=0.3", "system.late_policy=drop"],
    "deadline-partial": ["system.policy=deadline", "system.deadline=0.3", "system.late_policy=partial"],
    "over-selection": ["system.policy=over_selection", "system.over_selection=0.5"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_mlp_policies_are_identical_on_1_and_3_hosts(ray_local, results_dir, case):
    extra = ["partition.num_clients=12", "algorithm.clients_per_round=6", *CASES[case]]
    runs = {
        hosts: mlp_run(results_dir, f"{case}-h{hosts}", *extra, f"engine.num_hosts={hosts}", "engine.num_cpus_per_host=0.5")
        for hosts in (1, 3)
    }
    assert hosts_used(runs[1]) == 1 and hosts_used(runs[3]) == 3
    assert_same_results(runs[1], runs[3])
    clients = runs[1].clients
    outcome = clients["outcome"]
    if case == "deadline-drop":  # some clients missed the deadline and were left out
        assert (outcome == "late").any() and (outcome == "ok").any()
        assert not clients["truncated"].any()
    elif case == "deadline-partial":  # some stopped local work early and still counted
        truncated = clients[clients["truncated"]]
        assert len(truncated) > 0 and (truncated["outcome"] == "ok").all()
        full_epoch = np.ceil(truncated["num_samples"] / 16)  # local_epochs 1, batch_size 16
        assert (truncated["local_steps"] < full_epoch).all()
        assert (clients["finish_time"] - clients["dispatch_time"] <= 0.3 + 1e-9).all()
    else:  # 9 selected per round (ceil(1.5 * 6)), the first 6 to finish kept, the rest cut as late
        per_round = clients.groupby("round")["outcome"].value_counts().unstack(fill_value=0)
        assert per_round["ok"].tolist() == [6] * ROUNDS and per_round["late"].tolist() == [3] * ROUNDS


def test_one_actor_per_client_matches_one_host(ray_local, results_dir):
    extra = ["partition.num_clients=4", "algorithm.clients_per_round=3", "system.policy=deadline",
             "system.deadline=0.3", "system.late_policy=partial"]
    packed = mlp_run(results_dir, "packed", *extra, "engine.num_hosts=1", "engine.num_cpus_per_host=0.5")
    # engine.balance off: each client on its own actor (balanced, the same results: tests/test_balance.py)
    spread = mlp_run(results_dir, "per-client", *extra, "engine.clients_per_host=1", "engine.num_cpus_per_host=0.25",
                     "engine.balance=off")
    assert hosts_used(packed) == 1
    assert (spread.clients["host"] == spread.clients["client"]).all()  # actor i hosts client i
    assert packed.clients["truncated"].any()  # the deadline bit: partial work is placement-independent too
    assert_same_results(packed, spread)
