"""The round pipeline in real runs on Ray: every algorithm that declares an upload goes through
it, privacy, compression and robust aggregation give the same tables on 1 and 2 hosts and after
SIGTERM + resume, and their columns say what happened (epsilon, encoded bytes, byzantine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_resume import assert_same_tables, comparable, job, sigterm_after

from rayfl.algorithms.catalog import BUILTIN
from rayfl.config import ConfigError, algorithm_config_class
from rayfl.engine.runlog import RunInterrupted
from rayfl.pipeline.accounting import epsilon
from rayfl.pipeline.compression import CompressionConfig, encoded_nbytes
from rayfl.pipeline.server import mechanism
from rayfl.results import load
from rayfl.runner import resume_experiment, run_experiment

FEDBUFF = ["algorithm.name=fedbuff", "algorithm.concurrency=6", "algorithm.buffer_size=3", "run.rounds=9"]
FFGG_NET = ["model.name=mlp", "model.hidden=[16]", "algorithm.tau=2"]  # theta: the hidden layer (output is personal)
PIPELINES = {
    "dp": ["privacy.mode=central", "privacy.noise_multiplier=1.2", "privacy.clip=0.5", "privacy.delta=1e-3"],
    "dp-local": ["privacy.mode=local", "privacy.noise_multiplier=1.5", "privacy.clip=0.5", "privacy.delta=1e-3"],
    "dp-adaptive": ["privacy.mode=central", "privacy.noise_multiplier=1.2", "privacy.clip=0.5", "privacy.adaptive=true",
                    "privacy.clip_count_stddev=1.0", "privacy.sampling=fixed"],
    "topk-ef": ["compression.name=topk", "compression.ratio=0.05"],
    "qsgd": ["compression.name=qsgd", "compression.levels=4"],
    "median-signflip": ["robust.aggregator.name=median", "robust.attack.name=sign_flip", "robust.attack.count=2"],
    "scaffold-trimmed-alie": ["algorithm.name=scaffold", "robust.aggregator.name=trimmed_mean", "robust.aggregator.trim=1",
                              "robust.attack.name=alie", "robust.attack.count=2"],
    "fedbuff-median-signflip": [*FEDBUFF, "robust.aggregator.name=median", "robust.attack.name=sign_flip",
                                "robust.attack.count=2"],
    "fedbuff-topk-ef": [*FEDBUFF, "compression.name=topk", "compression.ratio=0.05"],
    "br-ffgg-cc-alie": ["algorithm.name=br_ffgg", "algorithm.clients_per_round=null", *FFGG_NET,
                        "robust.aggregator={name: centered_clipping, tau: 0.5, bucket_size: 2}",
                        "robust.attack.name=alie", "robust.attack.count=2"],
}


def same_across_layouts(a, b) -> None:
    """Identical tables, but for which host ran a task (and wall time)."""
    for table in ("rounds", "clients", "evals"):
        x, y = (comparable(getattr(r, table)).drop(columns=["host"], errors="ignore") for r in (a, b))
        pd.testing.assert_frame_equal(x, y, check_like=True)


def run(results_dir: Path, run_id: str, *extra: str):
    return load(run_experiment(job(results_dir, run_id, *extra)).run_dir)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_one_and_two_hosts_give_identical_tables(ray_local, results_dir, name):
    one = run(results_dir, f"{name}-1", *PIPELINES[name], "engine.num_hosts=1", "engine.num_cpus_per_host=1")
    two = run(results_dir, f"{name}-2", *PIPELINES[name])
    same_across_layouts(one, two)
    assert two.clients["host"].nunique() == 2
    assert np.isfinite(two.rounds["train_loss"]).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp-adaptive", "dp-local", "topk-ef", "median-signflip", "fedbuff-median-signflip", "br-ffgg-cc-alie"])
def test_sigterm_then_resume_equals_the_uninterrupted_run(ray_local, results_dir, name):
    extra = [*PIPELINES[name], "algorithm.name=scaffold"] if name == "topk-ef" else PIPELINES[name]
    whole = run(results_dir, f"{name}-whole", *extra)
    with pytest.raises(RunInterrupted):
        run_experiment(job(results_dir, f"{name}-stopped", *extra), on_start=sigterm_after(4))
    resumed = load(resume_experiment(results_dir / "default" / f"{name}-stopped").run_dir)
    assert_same_tables(whole, resumed)


def test_dp_rounds_record_epsilon_clip_and_noise(ray_local, results_dir):
    cfg = job(results_dir, "dp", *PIPELINES["dp"])
    res = load(run_experiment(cfg).run_dir)
    rounds = res.rounds.sort_values("round")
    m = mechanism(cfg, 12, 1.2)
    assert m.sampling == "poisson" and m.rate == pytest.approx(5 / 12)
    expected = [epsilon(m, r + 1, 1e-3, "rdp") for r in rounds["round"]]
    np.testing.assert_allclose(rounds["epsilon"], expected, rtol=1e-12)
    assert (rounds["dp_clip"] == 0.5).all()
    np.testing.assert_allclose(rounds["dp_noise_std"], 1.2 * 0.5, rtol=1e-12)
    train = res.clients[(res.clients["phase"] == "train") & (res.clients["outcome"] == "ok")]
    assert train["update_norm"].notna().all() and set(train["clipped"]) <= {True, False}
    assert res.manifests["pipeline.planned_epsilon"].iloc[0] == pytest.approx(expected[-1], rel=1e-9)


def test_local_dp_epsilon_follows_the_most_asked_client(ray_local, results_dir):
    """Under local DP each round's epsilon is that of the client asked for the most uploads so
    far (every train task the clients table logs, dropped or late included), counted here
    from the table by hand; the planned epsilon assumes a client asked every round."""
    cfg = job(results_dir, "dp-local", *PIPELINES["dp-local"], "system.dropout=0.2")
    res = load(run_experiment(cfg).run_dir)
    rounds = res.rounds.sort_values("round")
    train = res.clients[res.clients["phase"] == "train"]
    assert (train["outcome"] != "ok").any()  # a dropped client's round still counts
    asked: dict[int, int] = {}
    most = []
    for r in rounds["round"]:
        for c in set(train[train["round"] == r]["client"]):
            asked[c] = asked.get(c, 0) + 1
        most.append(max(asked.values()))
    m = mechanism(cfg, 12, 1.5)
    assert m.sampling == "local" and most[-1] < len(most)  # below the every-round count
    assert rounds["dp_most_uploads"].tolist() == most
    np.testing.assert_allclose(rounds["epsilon"], [epsilon(m, k, 1e-3, "rdp") for k in most], rtol=1e-12)
    assert res.manifests["pipeline.planned_epsilon"].iloc[0] == pytest.approx(epsilon(m, len(most), 1e-3, "rdp"),
                                                                              rel=1e-9)


def test_compressed_uploads_are_charged_their_encoded_size(ray_local, results_dir):
    res = run(results_dir, "topk", *PIPELINES["topk-ef"])
    d = int(res.manifests["num_params"].iloc[0])
    expected = encoded_nbytes(d, 4, CompressionConfig(name="topk", ratio=0.05)) + 8  # + the float loss
    train = res.clients[res.clients["phase"] == "train"]
    assert (train["bytes_up"] == expected).all()
    dense = run(results_dir, "dense", "compression.name=none")
    assert (dense.clients[dense.clients["phase"] == "train"]["bytes_up"] == 4 * d + 8).all()


def test_robust_runs_tag_the_byzantine_clients_and_do_not_preaggregate(ray_local, results_dir):
    res = run(results_dir, "robust", *PIPELINES["median-signflip"])
    tagged = res.clients.groupby("client")["byzantine"].first()
    chosen = json.loads(res.manifests["pipeline.byzantine"].iloc[0])
    assert len(chosen) == 2 and tagged.any()
    assert sorted(tagged[tagged].index) == sorted(set(chosen) & set(tagged.index))


UPLOADING = sorted(name for name, _, config, _ in BUILTIN if algorithm_config_class(name).uploads)


def test_the_pipeline_covers_the_model_shaped_algorithms():
    assert {"fedavg", "fedprox", "scaffold", "ditto", "fedavg_adapt", "fedbuff", "ffgg", "local_ffgg", "br_ffgg"} <= set(UPLOADING)


@pytest.mark.parametrize("name", UPLOADING)
def test_every_algorithm_declaring_uploads_sends_them_through_the_pipeline(ray_local, results_dir, name, tmp_path):
    """An algorithm that declares `uploads` but never hands them to fed.call(keep=...) and
    fed.weighted_sum would silently skip privacy: its bytes would stay dense."""
    extra = ["partition.client_test=proportional"] if name in ("ditto", "fedavg_adapt") else []
    extra += FEDBUFF[1:] if name == "fedbuff" else []
    extra += FFGG_NET if "ffgg" in name else []
    extra += ["algorithm.clients_per_round=null", "robust.aggregator.name=median"] if name == "br_ffgg" else []
    res = run(results_dir, name, f"algorithm.name={name}", "run.rounds=2", "compression.name=sign", *extra)
    d = int(res.manifests["num_params"].iloc[0])
    train = res.clients[(res.clients["phase"] == "train")]
    assert len(train) and (train["bytes_up"] < 4 * d).all()


def test_algorithms_without_a_sum_to_transform_refuse_the_pipeline():
    from rayfl.config import load_config

    with pytest.raises(ConfigError, match="no sum for central noise or a robust rule"):
        load_config(None, ["algorithm.name=fedasync", "robust.aggregator.name=median"])
    with pytest.raises(ConfigError, match="declares no model-shaped upload"):
        load_config(None, ["algorithm.name=local_finetune", "compression.name=topk", "compression.ratio=0.1"])
    load_config(None, ["algorithm.name=fedbuff", "privacy.mode=central", "privacy.noise_multiplier=1"])


def test_a_deadline_budgets_compressed_uploads_by_their_encoded_size(ray_local, results_dir):
    """Under a deadline with partial work, the time left for computing is the deadline less
    the transfers: a compressed upload leaves more of it, so clients take more local steps."""
    slow = ["system.policy=deadline", "system.late_policy=partial", "system.deadline=0.2",
            "system.up_bandwidth=2.0e+4", "system.speed=1.0e+7", "algorithm.local_steps=50"]
    dense = run(results_dir, "dense-deadline", *slow)
    sparse = run(results_dir, "topk-deadline", *slow, "compression.name=topk", "compression.ratio=0.01")
    steps = [r.clients[r.clients["phase"] == "train"]["local_steps"].mean() for r in (dense, sparse)]
    assert steps[1] > 2 * steps[0]


def test_label_flipping_clients_train_on_flipped_labels_and_nobody_else_does(ray_local, results_dir):
    """Round 0 starts from the same model: honest clients' local losses equal the attack-free
    run's, the Byzantine ones' differ (they train on c -> num_classes - 1 - c)."""
    clean = run(results_dir, "clean", "run.rounds=1")
    flipped = run(results_dir, "flipped", "run.rounds=1", "robust.attack.name=label_flip", "robust.attack.count=3")
    bad = set(json.loads(flipped.manifests["pipeline.byzantine"].iloc[0]))
    a, b = (r.clients[r.clients["phase"] == "train"].set_index("client")["local_loss"] for r in (clean, flipped))
    honest = [c for c in a.index if c not in bad]
    attackers = [c for c in a.index if c in bad]
    assert honest and attackers
    assert (a[honest] == b[honest]).all() and (a[attackers] != b[attackers]).all()


def test_a_run_over_its_privacy_budget_is_refused_before_anything_starts(tmp_path):
    """`rayfl validate` and `rayfl run` both exit 2 in one line naming privacy.max_epsilon, and
    the refused run leaves no run directory behind."""
    import subprocess
    import sys

    rayfl = str(Path(sys.executable).parent / "rayfl")
    over = ["--set", "privacy.mode=central", "--set", "privacy.noise_multiplier=0.7", "--set", "privacy.max_epsilon=1.0",
            "--set", f"output.dir={tmp_path / 'out'}"]
    for command in ("validate", "run"):
        done = subprocess.run([rayfl, command, *over], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        errors = [line for line in done.stderr.splitlines() if "error" in line]  # `run` first describes the data
        assert len(errors) == 1 and errors[0].startswith("rayfl: error: privacy.max_epsilon: 50 rounds")
    assert not (tmp_path / "out").exists()
