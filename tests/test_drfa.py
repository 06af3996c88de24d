"""DRFA / DRFL (Deng et al. 2020, Alg. 1; ComFedL's robust baseline) against float64 hand
computations: the simplex projection, the lambda ascent step, a client's tau steps with the
t' snapshot, and two real rounds of the (FedTorch-style) weighted variant on 1 and 2 hosts."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from rayfl.algorithms.drfa import (
    DRFAConfig,
    drfa_client,
    drfa_loss,
    lambda_step,
    project_simplex,
    training_clients,
)
from rayfl.config import ConfigError, load_config
from rayfl.data import FederatedDataset
from rayfl.engine import ClientContext
from rayfl.models import build_model
from rayfl.models.params import get_flat
from rayfl.results import load
from rayfl.rng import derive_seed, numpy_rng
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


def context(x, y, cid=0, rnd=0, seed=0):
    return ClientContext(id=cid, round=rnd, seed=seed, model=nn.Sequential(nn.Flatten(), nn.Linear(F_IN, C, bias=False)),
                         device=torch.device("cpu"), x=torch.as_tensor(x), y=torch.as_tensor(y), test_x=None,
                         test_y=None, state={})


def test_simplex_projection_by_hand_and_optimality():
    np.testing.assert_allclose(project_simplex(np.array([0.6, 0.3, -0.2])), [0.65, 0.35, 0.0], atol=1e-12)
    np.testing.assert_allclose(project_simplex(np.array([0.5, 0.5, 0.5])), [1 / 3] * 3, atol=1e-12)
    np.testing.assert_allclose(project_simplex(np.array([0.2, 0.7, 0.1])), [0.2, 0.7, 0.1], atol=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.normal(size=6)
        p = project_simplex(v)
        assert p.min() >= 0 and p.sum() == pytest.approx(1.0)
        others = rng.dirichlet(np.ones(6), size=500)
        assert np.linalg.norm(others - v, axis=1).min() >= np.linalg.norm(p - v) - 1e-12


def test_lambda_step_is_projected_ascent_on_scaled_losses():
    """lambda + lr tau (n/m) f_i on the reporting clients, projected; floor then renormalise."""
    lam = np.array([0.7, 0.1, 0.1, 0.1])
    got = lambda_step(lam, {1: 2.0, 3: 0.5}, n=4, m=2, lr=0.1, tau=3, floor=0.0)
    np.testing.assert_allclose(got, project_simplex(lam + 0.1 * 3 * 2 * np.array([0.0, 2.0, 0.0, 0.5])), atol=1e-12)
    np.testing.assert_allclose(got, [0.2, 0.8, 0.0, 0.0], atol=1e-12)  # by hand: [0.7, 1.3, 0.1, 0.4] - 0.5
    floored = lambda_step(lam, {1: 2.0, 3: 0.5}, n=4, m=2, lr=0.1, tau=3, floor=0.01)
    np.testing.assert_allclose(floored, np.array([0.2, 0.8, 0.01, 0.01]) / 1.02, atol=1e-12)


def test_client_runs_tau_steps_and_keeps_the_t_prime_snapshot():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(6, F_IN)).astype(np.float32), rng.integers(0, C, 6)
    w0 = rng.normal(size=F_IN * C).astype(np.float32)
    out = drfa_client(context(x, y), w0, lr=0.5, steps=4, batch_size=64, snapshot=2)  # full batch
    w, snaps = w0.astype(np.float64), []
    for _ in range(4):
        w = w - 0.5 * ce(w, x, y)[1]
        snaps.append(w)
    np.testing.assert_allclose(w0 + out["delta"].numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w0 + out["snapshot"].numpy(), snaps[1], rtol=1e-5, atol=1e-6)
    assert np.abs(snaps[1] - snaps[2]).max() > 1e-3
    assert drfa_loss(context(x, y), w0, batch_size=64)["f"] == pytest.approx(ce(w0, x, y)[0], rel=1e-6)


def test_sampling_variant_draws_by_lambda_and_counts_repeats():
    fed = SimpleNamespace(num_clients=4, seed=3)
    cfg = DRFAConfig(variant="sampling", clients_per_round=50)
    lam = np.array([0.0, 0.5, 0.25, 0.25])
    ids, w = training_clients(fed, cfg, lam, r=0)
    assert 0 not in ids and w.sum() == pytest.approx(1.0)
    draws = numpy_rng(3, "drfa.sample", 0).choice(4, size=50, replace=True, p=lam)
    np.testing.assert_allclose(w, np.bincount(draws, minlength=4)[ids] / 50)


def test_configs_name_their_mistakes():
    for override, key in [("algorithm.weight_lr=-1", "algorithm.weight_lr"),
                          ("algorithm.weight_lr_decay=0", "algorithm.weight_lr_decay"),
                          ("algorithm.weight_floor=1", "algorithm.weight_floor"),
                          ("algorithm.variant=both", "algorithm.variant"),
                          ("algorithm.local_steps=0", "algorithm.local_steps")]:
        with pytest.raises(ConfigError) as e:
            load_config(None, ["algorithm.name=drfa", override])
        assert e.value.key == key


# ---------------------------------------------------------------- two real rounds


SEED, LR, TAU, WLR, ROUNDS = 4, 0.5, 3, 0.08, 2


def tiny_dataset() -> FederatedDataset:
    rng = np.random.default_rng(12)
    return FederatedDataset(
        name="tiny", num_classes=C, input_shape=(F_IN,),
        train_x=rng.normal(size=(18, F_IN)).astype(np.float32), train_y=rng.integers(0, C, 18).astype(np.int64),
        test_x=rng.normal(size=(6, F_IN)).astype(np.float32), test_y=rng.integers(0, C, 6).astype(np.int64),
        client_train=[np.arange(0, 3), np.arange(3, 13), np.arange(13, 18)],
    )


def cfg_for(out, run_id, *extra):
    return load_config(None, [
        "data.dataset=digits", "partition.method=iid", "partition.num_clients=3", "model.bias=false",
        f"run.rounds={ROUNDS}", "run.eval_every=1", f"run.seed={SEED}", f"output.dir={out}", f"run.run_id={run_id}",
        "algorithm.name=drfa", "algorithm.clients_per_round=3", f"algorithm.local_steps={TAU}",
        "algorithm.batch_size=64", f"algorithm.lr={LR}", f"algorithm.weight_lr={WLR}", *extra,
    ])


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("drfa") / "results"
    ds = tiny_dataset()
    one = load(run_experiment(cfg_for(out, "one", "engine.num_hosts=1"), dataset=ds).run_dir)
    two = load(run_experiment(cfg_for(out, "two", "engine.num_hosts=2", "engine.num_cpus_per_host=0.5"), dataset=ds).run_dir)
    return ds, one, two


def test_two_rounds_match_hand_computation_on_one_and_two_hosts(runs):
    """Round s: full-batch tau steps per client, x_{s+1} = sum lambda_i w_i, w' = sum lambda_i
    w_i^{(t')}, lambda <- max(Proj(lambda + 0.08 * 0.9^s * tau * f(w')), 1e-3) renormalised;
    lambda_0 = n_i / N. The round-1 model depends on lambda_1, so a flipped ascent sign or a
    dropped tau moves the logged test loss."""
    ds, one, two = runs
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(SEED, "model.init"))
        x = get_flat(build_model(cfg_for("u", "x").model, (F_IN,), C)).numpy().astype(np.float64)
    parts = [(ds.train_x[i], ds.train_y[i]) for i in ds.client_train]
    lam = ds.client_sizes() / ds.client_sizes().sum()

    def rounds(lam, sign=1.0, tau_factor=TAU):
        w, losses = x.copy(), []
        for r in range(ROUNDS):
            t_snap = int(numpy_rng(SEED, "drfa.snapshot", r).integers(1, TAU + 1))
            finals, snaps = [], []
            for xc, yc in parts:
                wc = w.copy()
                for t in range(TAU):
                    wc = wc - LR * ce(wc, xc, yc)[1]
                    if t + 1 == t_snap:
                        snaps.append(wc)
                finals.append(wc)
            w = np.average(finals, axis=0, weights=lam)
            w_snap = np.average(snaps, axis=0, weights=lam)
            f = np.array([ce(w_snap, xc, yc)[0] for xc, yc in parts])
            lam = np.maximum(project_simplex(lam + sign * WLR * 0.9**r * tau_factor * f), 1e-3)
            lam = lam / lam.sum()
            losses.append(ce(w, ds.test_x, ds.test_y)[0])
        return np.array(losses), lam

    hand, lam_end = rounds(lam)
    logged = one.rounds.sort_values("round")
    np.testing.assert_allclose(logged["test_loss"].to_numpy(), hand, rtol=1e-5)
    assert logged["max_client_weight"].iloc[-1] == pytest.approx(lam_end.max(), rel=1e-6)
    for wrong in (rounds(lam, sign=-1.0)[0], rounds(lam, tau_factor=1)[0]):
        assert abs(wrong[1] - hand[1]) > 1e-5
    cols = ["round", "test_loss", "test_accuracy", "max_client_weight", "avg_train_accuracy", "worst_train_accuracy"]
    pd.testing.assert_frame_equal(logged[cols].reset_index(drop=True),
                                  two.rounds.sort_values("round")[cols].reset_index(drop=True))
    assert two.clients["host"].nunique() == 2 and math.isfinite(hand[-1])
