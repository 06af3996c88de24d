"""`engine.vectorize` end to end on a convnet: `auto` (the default), `on` and `off` log the
same client tasks, and the same mode on 1 and 2 hosts logs the same bits.

LEAF's FEMNIST CNN (narrowed) on FEMNIST-shaped writers, FedAvg and SCAFFOLD, under a
deadline with partial work so that clients are truncated mid-epoch."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rayfl.config import load_config
from rayfl.results import load
from rayfl.runner import run_experiment

LAYOUT = ["wall_time", "host", "run_id", "experiment"]
FLOAT = ["local_loss", "train_loss", "test_loss", "test_accuracy"]  # model results: equal to tolerance only
BASE = ["data.dataset=lookalike", "data.like=femnist", "data.max_client_samples=30", "partition.method=natural",
        "partition.num_clients=8", "model.name=femnist_cnn", "model.channels=[2,3]", "model.dense=8",
        "algorithm.clients_per_round=6", "algorithm.batch_size=8", "algorithm.lr=0.05",
        "system.speed={dist: lognormal, value: 2.0e+6, sigma: 1.0}", "system.policy=deadline",
        "system.deadline=1.0", "system.late_policy=partial", "run.rounds=2", "output.log_clients=true"]


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("modes")
    variants = {f"{alg}-{mode}-{hosts}": [f"algorithm.name={alg}", f"engine.vectorize={mode}", f"engine.num_hosts={hosts}"]
                for alg in ("fedavg", "scaffold") for mode, hosts in (("auto", 1), ("auto", 2), ("on", 1), ("on", 2), ("off", 2))}
    return {name: load(run_experiment(load_config(None, [*BASE, *extra, f"output.dir={out}", f"run.run_id={name}"])).run_dir)
            for name, extra in variants.items()}


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in ("round", "client") if c in df.columns]
    return df.drop(columns=[c for c in LAYOUT if c in df.columns]).sort_values(keys).reset_index(drop=True)


@pytest.mark.parametrize("alg", ["fedavg", "scaffold"])
def test_auto_on_and_off_log_the_same_client_tasks(runs, alg):
    off = comparable(runs[f"{alg}-off-2"].clients)
    assert off["truncated"].any() and (off["local_steps"] > 0).any()
    exact = [c for c in off.columns if c not in FLOAT]
    for mode in ("auto", "on"):
        mine = comparable(runs[f"{alg}-{mode}-2"].clients)
        pd.testing.assert_frame_equal(off[exact], mine[exact])
        np.testing.assert_allclose(mine["local_loss"].to_numpy(float), off["local_loss"].to_numpy(float), rtol=1e-4)
    # on a CPU `auto` runs convnets' clients one after another: the loop's very bits
    pd.testing.assert_frame_equal(off, comparable(runs[f"{alg}-auto-2"].clients))


@pytest.mark.parametrize("alg", ["fedavg", "scaffold"])
@pytest.mark.parametrize("mode", ["auto", "on"])
def test_one_and_two_hosts_log_identical_bits(runs, alg, mode):
    one, two = runs[f"{alg}-{mode}-1"], runs[f"{alg}-{mode}-2"]
    assert two.clients["host"].nunique() == 2
    pd.testing.assert_frame_equal(comparable(one.clients), comparable(two.clients))
    pd.testing.assert_frame_equal(comparable(one.rounds), comparable(two.rounds))
