"""Asynchronous FFGG (Alg. 3) on a tiny quadratic: every applied update equals a float64 hand
computation rebuilt from the `clients` table (who finished, at which model version it was
dispatched, its task key), the dispatch draws are the seeded uniform ones, and the run is
identical on 1 and 2 hosts.

    theta^{r+1} = theta^r - gamma Delta_j,  Delta_j = grad_theta f_j(theta^{v_j}, w^tau),  d = r - v_j
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rayfl.algorithms.async_ffgg import AsyncFFGGConfig, step_size
from rayfl.algorithms.ffgg import Split
from rayfl.algorithms.finetune import SplitSpec
from rayfl.config import ConfigError, load_config
from rayfl.papers.ffgg.quadratic import QuadraticOracle, QuadraticShape, client_design, factors
from rayfl.results import load
from rayfl.rng import numpy_rng
from rayfl.runner import run_experiment

SEED, STEPS, K = 5, 8, 3
SHAPE = QuadraticShape(clients=4, n=10, d_theta=3, d_w=2)
DT, DW = SHAPE.d_theta, SHAPE.d_w
TAU, W_LR, GAMMA = 2, 0.07, 0.05


def grad(d: np.ndarray, theta: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.concatenate([theta, w, [1.0]])
    g = d.T @ (d @ z)
    return g[:DT], g[DT : DT + DW]


def hand_delta(client: int, key: int, theta: np.ndarray) -> np.ndarray:
    d = client_design(SHAPE, SEED, client)
    w = numpy_rng(SEED, "ffgg.w_init", key, client).standard_normal(DW)
    for _ in range(TAU):
        w = w - W_LR * grad(d, theta, w)[1]
    return grad(d, theta, w)[0]


def async_run(results_dir, run_id: str, *extra: str):
    cfg = load_config(None, [
        "data.dataset=ffgg_quadratic", f"data.n={SHAPE.n}", f"data.d_theta={DT}",
        f"data.d_w={DW}", "partition.method=natural", f"partition.num_clients={SHAPE.clients}",
        "algorithm.name=async_ffgg", "algorithm.clients_per_round=null", "algorithm.participation=1.0",
        f"algorithm.concurrency={K}", "algorithm.solver=gd", f"algorithm.tau={TAU}",
        f"algorithm.w_lr={W_LR}", f"algorithm.server_lr={GAMMA}", f"run.seed={SEED}", f"run.rounds={STEPS}",
        "system.speed={dist: lognormal, value: 1.0e+5, sigma: 1.0}", "system.latency=0.01",
        f"output.dir={results_dir}", f"run.run_id={run_id}", *extra,
    ])
    return load(run_experiment(cfg).run_dir)


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("async_ffgg")
    return {h: async_run(out, f"h{h}", f"engine.num_hosts={h}", "engine.num_cpus_per_host=0.5") for h in (1, 2)}


def test_each_update_equals_the_hand_computation(runs):
    res = runs[1]
    rounds = res.rounds.sort_values("round").reset_index(drop=True)
    used = res.clients[res.clients["outcome"] == "ok"].sort_values(["finish_time", "task"]).reset_index(drop=True)
    assert len(used) == STEPS
    o = QuadraticOracle.from_factors(factors(SHAPE, SEED), DT)
    thetas = [np.zeros(DT)]  # theta^v: the model version v a job downloaded
    for r in range(STEPS):
        job = used.iloc[r]
        v = int(job["version"])
        assert int(job["staleness"]) == r - v and int(rounds["staleness"].iloc[r]) == r - v
        thetas.append(thetas[-1] - GAMMA * hand_delta(int(job["client"]), int(job["round"]), thetas[v]))
        assert rounds["F_norm"].iloc[r] == pytest.approx(np.linalg.norm(o.operator(thetas[-1])), rel=1e-9)
    assert (used["staleness"] > 0).any()  # the run really was asynchronous


def test_dispatch_draws_are_uniform_over_all_clients(runs):
    clients = runs[1].clients.sort_values("task")
    draws = [int(numpy_rng(SEED, "async_ffgg.sample", k).choice(SHAPE.clients)) for k in range(clients["task"].max() + 1)]
    # task t is the t-th draw: K initial jobs, then one new job per applied update (a job still
    # in flight when the run ends is never logged, so the table may skip a task id)
    assert clients["client"].tolist() == [draws[t] for t in clients["task"]]
    assert clients["task"].is_unique and clients["task"].max() < len(clients) + K


def test_each_new_job_starts_from_the_freshest_theta(runs):
    # dispatch_model new (Alg. 3 line 6): K jobs from theta^0, then after update r one job from
    # theta^{r+1}, so task t (t >= K) downloaded version t - K + 1
    tasks = runs[1].clients.sort_values("task")
    expect = [0 if t < K else t - K + 1 for t in tasks["task"]]
    assert tasks["version"].tolist() == expect


def test_async_ffgg_is_identical_on_1_and_2_hosts(runs):
    a, b = runs[1], runs[2]
    assert b.clients["host"].nunique() == 2
    drop = ["wall_time", "host", "run_id"]
    pd.testing.assert_frame_equal(a.rounds.drop(columns=drop, errors="ignore").reset_index(drop=True),
                                  b.rounds.drop(columns=drop, errors="ignore").reset_index(drop=True))
    cols = [c for c in a.clients.columns if c not in drop]
    pd.testing.assert_frame_equal(a.clients[cols].sort_values("task").reset_index(drop=True),
                                  b.clients[cols].sort_values("task").reset_index(drop=True))


def test_step_rules():
    o = QuadraticOracle.from_factors(factors(SHAPE, SEED), DT)
    split = Split(SplitSpec("quadratic"), np.zeros(DT), o)
    theory = AsyncFFGGConfig(concurrency=4, step_rule="theory", tau_max=8)
    assert step_size(theory, split, 1.0, 3) == pytest.approx(1.0 / (2 * o.L * np.sqrt(2 * 4 * 8)))
    adaptive = AsyncFFGGConfig(concurrency=4, step_rule="delay_adaptive")
    assert step_size(adaptive, split, 0.2, 2) == pytest.approx(0.2)
    assert step_size(adaptive, split, 0.2, 10) == pytest.approx(0.2 * 4 / 10)


@pytest.mark.parametrize(
    "override,key",
    [
        ("algorithm.concurrency=0", "algorithm.concurrency"),
        ("algorithm.step_rule=theory", "algorithm.tau_max"),
        ("algorithm.max_staleness=-1", "algorithm.max_staleness"),
        ("algorithm.dispatch=random", "algorithm.dispatch"),
        ("robust.attack={name: sign_flip, count: 1}", "robust"),  # no upload to aggregate: the pipeline refuses it
    ],
)
def test_bad_async_config(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=async_ffgg", override])
    assert e.value.key == key
