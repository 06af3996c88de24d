"""Client state commits only when the server accepts the task; non-finite answers are never
applied; empty clients are never sampled. On a real local Ray, under every round policy."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.config import ModelConfig, load_config
from rayfl.data import build_federated_dataset
from rayfl.engine import ClientContext
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.tasks import NONFINITE, NonFiniteUpdateError, nonfinite_keys
from rayfl.results import load
from rayfl.runner import run_experiment

# ---------------------------------------------------------------- the host's transactions


def bump(ctx: ClientContext) -> dict[str, Any]:
    """Changes its state both by assignment and in place (the copy must absorb both)."""
    v = ctx.state.setdefault("v", torch.zeros(2))
    v += 1.0
    ctx.state["calls"] = ctx.state.get("calls", 0) + 1
    return {"calls": ctx.state["calls"], "v": v.clone()}


def tiny_host() -> ClientHostImpl:
    x = np.zeros((6, 2), dtype=np.float32)
    arrays = {"train_x": x, "train_y": np.zeros(6, dtype=np.int64), "test_x": x[:1], "test_y": np.zeros(1, dtype=np.int64)}
    return ClientHostImpl(0, arrays, {0: np.arange(3), 1: np.arange(3, 6)}, None, ModelConfig(), (2,), 2, seed=0)


def test_staged_state_commits_only_when_accepted():
    host = tiny_host()
    (rec,) = host.run(bump, [0], 0, {}, task_ids={0: 10})
    assert rec["values"]["calls"] == 1
    assert host.states[0] == {}  # staged, not committed: an in-place += did not leak either
    (rec,) = host.run(bump, [0], 1, {}, task_ids={0: 11}, settle={10: False})
    assert rec["values"]["calls"] == 1  # task 10 was discarded before task 11 ran
    (rec,) = host.run(bump, [0], 2, {}, task_ids={0: 12}, settle={11: True})
    assert rec["values"]["calls"] == 2 and np.allclose(rec["values"]["v"], 2.0)
    assert host.states[0]["calls"] == 1 and torch.equal(host.states[0]["v"], torch.ones(2))
    host.settle({12: True, 99: True})  # an unknown task id is ignored
    assert host.states[0]["calls"] == 2 and host.staged == {}
    assert host.get_state([0, 1], "calls") == {0: 2, 1: None}


def test_nonfinite_keys_ignore_an_unmeasured_loss():
    assert nonfinite_keys({"delta": np.array([1.0, np.nan]), "loss": 0.3}, 5) == ["delta"]
    assert nonfinite_keys({"delta": np.ones(2), "loss": float("inf")}, 5) == ["loss"]
    assert nonfinite_keys({"delta": np.ones(2), "loss": float("nan")}, 0) == []  # no step, no loss
    assert nonfinite_keys({"delta": np.ones(2), "loss": float("nan")}, 3) == ["loss"]
    assert nonfinite_keys({"parts": [np.ones(1), {"y": np.array([np.inf])}], "n": 3}, 1) == ["parts[1].y"]


# ---------------------------------------------------------------- SCAFFOLD's invariant


def synthetic_cfg(results_dir, *extra: str):
    return load_config(
        None,
        [
            "partition.num_clients=12",
            "algorithm.clients_per_round=6",
            "algorithm.local_epochs=null",
            "algorithm.local_steps=4",
            "algorithm.batch_size=8",
            "run.rounds=6",
            "run.eval_every=6",
            "system.speed={dist: lognormal, value: 2.0e+6, sigma: 1.0}",
            f"output.dir={results_dir}",
            "engine.num_hosts=2",
            "engine.num_cpus_per_host=0.5",
            *extra,
        ],
    )


def control_invariant_checker(gaps: list[float]):
    """on_start hook: after every round, compare the server's c with the mean of all N c_i
    (clients never accepted have c_i = 0), reading the committed states on the hosts."""

    def on_start(run_dir, fed) -> None:
        log_round = fed.log_round

        def checked(round: int, **metrics: Any) -> None:
            fed.flush_decisions()
            states = fed.client_state(list(range(fed.num_clients)), "control")
            c_i = [np.zeros(fed.num_params) if s is None else np.asarray(s, dtype=np.float64) for s in states.values()]
            gaps.append(float(np.max(np.abs(fed.server_state.control - np.mean(c_i, axis=0)))))
            log_round(round, **metrics)

        fed.log_round = checked

    return on_start


POLICIES = {
    "deadline_drop": ["system.policy=deadline", "system.deadline=0.1", "system.late_policy=drop"],
    "dropout": ["system.dropout=0.2"],
    "over_selection": ["system.policy=over_selection", "system.over_selection=0.5"],
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_scaffold_control_is_mean_of_client_controls(ray_local, results_dir, policy):
    cfg = synthetic_cfg(results_dir, "algorithm.name=scaffold", "algorithm.lr=0.05", f"run.run_id=inv-{policy}", *POLICIES[policy])
    gaps: list[float] = []
    out = run_experiment(cfg, on_start=control_invariant_checker(gaps))
    clients = load(out.run_dir).clients
    refused = (clients["outcome"] != "ok").sum()
    assert refused > 0 and (clients["outcome"] == "ok").sum() > 0, clients["outcome"].value_counts()
    assert len(gaps) == cfg.run.rounds
    assert max(gaps) < 1e-6, gaps


# ---------------------------------------------------------------- async: stale tasks commit nothing


def count_accepted(ctx: ClientContext, x: np.ndarray) -> dict[str, Any]:
    """A stateful async client: counts in its state the tasks the server accepted."""
    ctx.state["accepted"] = ctx.state.get("accepted", 0) + 1
    ctx.work.gradient_step(ctx.num_samples)
    return {"delta": np.zeros_like(x), "loss": 0.0}


def test_async_stale_and_dropped_tasks_leave_state_untouched(ray_local, results_dir):
    cfg = synthetic_cfg(
        results_dir, "algorithm.name=fedbuff", "algorithm.concurrency=6", "algorithm.max_staleness=1",
        "system.dropout=0.1", "run.run_id=async-state",
    )
    import sys

    from ray import cloudpickle

    from rayfl.engine import Federation

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hosts cannot import tests/
    dataset = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    fed = Federation(cfg, dataset)  # FedBuff's engine path, driven by a short loop with a stateful client
    try:
        pool = fed.async_pool()
        x = np.zeros(3, dtype=np.float32)
        outcomes: dict[int, list[str]] = {}
        picks = 0
        for _ in range(60):
            while len(pool) < cfg.algorithm.concurrency:
                c = fed.population.sample_idle(pool.busy_clients, key=picks)
                picks += 1
                pool.submit(c, count_accepted, x=x, min_backward_samples=int(fed.client_sizes[c]))
            res = pool.next(max_staleness=cfg.algorithm.max_staleness)
            outcomes.setdefault(res.client, []).append(res.outcome)
            if res.ok:
                fed.advance_version()
        pool.drain()
        fed.flush_decisions()
        accepted = fed.client_state(list(range(fed.num_clients)), "accepted")
    finally:
        fed.shutdown()
    seen = [o for v in outcomes.values() for o in v]
    assert "stale" in seen and "dropped" in seen, seen
    for client in range(fed.num_clients):
        assert (accepted[client] or 0) == outcomes.get(client, []).count("ok"), (client, outcomes.get(client))


# ---------------------------------------------------------------- non-finite answers


def digits_full(results_dir, *extra: str):
    return load_config(
        None,
        [
            "data.dataset=digits", "partition.method=iid", "partition.num_clients=10",
            "algorithm.clients_per_round=10", "algorithm.batch_size=16", "algorithm.lr=0.1",
            "run.rounds=3", f"output.dir={results_dir}", "engine.num_hosts=2", "engine.num_cpus_per_host=0.5",
            *extra,
        ],
    )


def with_poisoned_client(cfg, client: int):
    ds = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    ds = copy.copy(ds)
    ds.train_x = ds.train_x.copy()
    ds.train_x[ds.client_train[client]] = np.nan
    return ds


@pytest.mark.slow
def test_nan_client_is_dropped_and_the_model_equals_the_run_without_it(ray_local, results_dir):
    cfg = digits_full(results_dir, "run.run_id=nan")
    poisoned = run_experiment(cfg, dataset=with_poisoned_client(cfg, 3))
    without = digits_full(results_dir, "run.run_id=without")
    ds = build_federated_dataset(without.data, without.partition, without.run.seed)
    ds.client_train = list(ds.client_train)
    ds.client_train[3] = np.zeros(0, dtype=np.int64)  # an empty client: never sampled
    clean = run_experiment(without, dataset=ds)

    a, b = load(poisoned.run_dir), load(clean.run_dir)
    assert a.manifests["status"].iloc[0] == "completed"
    bad = a.clients[a.clients["client"] == 3]
    assert len(bad) == 3 and (bad["outcome"] == NONFINITE).all()
    assert (a.rounds["clients_nonfinite"] == 1).all() and (a.rounds["num_updates"] == 9).all()
    assert 3 not in set(b.clients["client"])
    cols = ["round", "test_loss", "test_accuracy"]
    pd.testing.assert_frame_equal(a.evals[cols].reset_index(drop=True), b.evals[cols].reset_index(drop=True))
    assert np.isfinite(a.rounds["train_loss"]).all()


def test_nonfinite_fail_stops_the_run_and_keeps_the_rows(ray_local, results_dir):
    cfg = digits_full(results_dir, "run.run_id=nanfail", "algorithm.nonfinite=fail")
    with pytest.raises(NonFiniteUpdateError, match="client 3"):
        run_experiment(cfg, dataset=with_poisoned_client(cfg, 3))
    res = load(results_dir / "default" / "nanfail")
    assert res.manifests["status"].iloc[0] == "failed"
    assert (res.clients.loc[res.clients["client"] == 3, "outcome"] == NONFINITE).all()


# ---------------------------------------------------------------- empty clients


def test_empty_clients_are_reported_and_never_sampled(ray_local, results_dir):
    cfg = load_config(
        None,
        [
            "data.dataset=digits", "partition.method=dirichlet", "partition.num_clients=60",
            "partition.alpha=0.05", "partition.min_size=0", "algorithm.clients_per_round=20",
            "run.rounds=3", "run.run_id=empty", f"output.dir={results_dir}",
        ],
    )
    ds = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    empty = set(ds.empty_clients().tolist())
    assert empty, "this split is expected to leave some clients empty"
    assert f"empty clients: {len(empty)}" in ds.summary()
    res = load(run_experiment(cfg, dataset=ds).run_dir)
    assert not empty & set(res.clients["client"])
    assert res.rounds["num_updates"].eq(20).all()
    assert np.isfinite(res.rounds["train_loss"]).all() and np.isfinite(res.evals["test_loss"]).all()
    assert res.manifests["dataset.empty_clients"].iloc[0] is not None
