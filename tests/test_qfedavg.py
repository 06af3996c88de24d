"""q-FedAvg (Li et al., ICLR 2020, Alg. 2) against a float64 hand computation: the client's
(Delta_k, h_k) and the server step w - sum Delta_k / sum h_k, alone and over two real rounds
on 1 and 2 hosts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from rayfl.algorithms.local import LocalSchedule
from rayfl.algorithms.qfedavg import qfedavg_client, qfedavg_step
from rayfl.config import ConfigError, load_config
from rayfl.data import FederatedDataset
from rayfl.engine import ClientContext
from rayfl.models import build_model
from rayfl.models.params import get_flat
from rayfl.results import load
from rayfl.rng import derive_seed
from rayfl.runner import run_experiment

F_IN, C = 3, 3


def ce(w, x, y):
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    z = x @ np.asarray(w, np.float64).reshape(C, -1).T
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p = np.exp(logp)
    p[np.arange(len(y)), y] -= 1.0
    return float(-logp[np.arange(len(y)), y].mean()), (p.T @ x).ravel() / len(y)


def hand_client(w0, x, y, lr, q, steps):
    """(Delta_k, h_k) with L = 1/lr from full-batch local SGD."""
    w0 = np.asarray(w0, np.float64)
    f = ce(w0, x, y)[0]
    w = w0.copy()
    for _ in range(steps):
        w = w - lr * ce(w, x, y)[1]
    dw = (w0 - w) / lr
    return f**q * dw, q * f ** (q - 1) * dw @ dw + f**q / lr


def context(x, y):
    return ClientContext(id=0, round=0, seed=0, model=nn.Sequential(nn.Flatten(), nn.Linear(F_IN, C, bias=False)),
                         device=torch.device("cpu"), x=torch.as_tensor(x), y=torch.as_tensor(y), test_x=None,
                         test_y=None, state={})


@pytest.mark.parametrize("q", [0.2, 1.0, 0.0])
def test_client_sends_delta_and_h_by_hand(q):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, F_IN)).astype(np.float32), rng.integers(0, C, 6)
    w0 = rng.normal(size=F_IN * C).astype(np.float32)
    out = qfedavg_client(context(x, y), w0, lr=0.3, q=q, schedule=LocalSchedule(64, None, 3))
    delta, h = hand_client(w0, x, y, 0.3, q, 3)
    np.testing.assert_allclose(out["delta_q"], delta, rtol=1e-5, atol=1e-6)
    assert out["h"] == pytest.approx(h, rel=1e-5)
    assert out["f"] == pytest.approx(ce(w0, x, y)[0], rel=1e-6)


def test_server_step():
    x = np.array([1.0, -2.0], np.float32)
    got = qfedavg_step(x, np.array([0.5, 1.0]) + np.array([1.5, -3.0]), np.array([2.0, 2.0]))
    np.testing.assert_allclose(got, [0.5, -1.5], rtol=1e-7)


def test_configs_name_their_mistakes():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=qfedavg", "algorithm.q=-0.5"])
    assert e.value.key == "algorithm.q"


SEED, LR, TAU, Q, ROUNDS = 6, 0.4, 2, 0.5, 2


def tiny_dataset() -> FederatedDataset:
    rng = np.random.default_rng(13)
    return FederatedDataset(
        name="tiny", num_classes=C, input_shape=(F_IN,),
        train_x=rng.normal(size=(16, F_IN)).astype(np.float32), train_y=rng.integers(0, C, 16).astype(np.int64),
        test_x=rng.normal(size=(6, F_IN)).astype(np.float32), test_y=rng.integers(0, C, 6).astype(np.int64),
        client_train=[np.arange(0, 4), np.arange(4, 12), np.arange(12, 16)],
    )


def cfg_for(out, run_id, *extra):
    return load_config(None, [
        "data.dataset=digits", "partition.method=iid", "partition.num_clients=3", "model.bias=false",
        f"run.rounds={ROUNDS}", "run.eval_every=1", f"run.seed={SEED}", f"output.dir={out}", f"run.run_id={run_id}",
        "algorithm.name=qfedavg", "algorithm.clients_per_round=3", f"algorithm.local_steps={TAU}",
        "algorithm.batch_size=64", f"algorithm.lr={LR}", f"algorithm.q={Q}", *extra,
    ])


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("qfedavg") / "results"
    ds = tiny_dataset()
    one = load(run_experiment(cfg_for(out, "one", "engine.num_hosts=1"), dataset=ds).run_dir)
    two = load(run_experiment(cfg_for(out, "two", "engine.num_hosts=2", "engine.num_cpus_per_host=0.5"), dataset=ds).run_dir)
    return ds, one, two


def test_two_rounds_match_hand_computation_on_one_and_two_hosts(runs):
    ds, one, two = runs
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(SEED, "model.init"))
        w = get_flat(build_model(cfg_for("u", "x").model, (F_IN,), C)).numpy().astype(np.float64)
    hand = []
    for _ in range(ROUNDS):
        outs = [hand_client(w, ds.train_x[i], ds.train_y[i], LR, Q, TAU) for i in ds.client_train]
        w = w - sum(d for d, _ in outs) / sum(h for _, h in outs)
        hand.append(ce(w, ds.test_x, ds.test_y)[0])
    logged = one.rounds.sort_values("round")
    np.testing.assert_allclose(logged["test_loss"].to_numpy(), hand, rtol=1e-5)
    cols = ["round", "test_loss", "test_accuracy", "train_loss", "avg_train_accuracy", "worst_train_accuracy"]
    pd.testing.assert_frame_equal(logged[cols].reset_index(drop=True),
                                  two.rounds.sort_values("round")[cols].reset_index(drop=True))
    assert two.clients["host"].nunique() == 2
