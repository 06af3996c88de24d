"""FedRZO's first-order baselines of App. D.1 (Fig. 3): FedMSPP and Scaffnew on
the softplus-smoothed network, checked one step at a time against float64 hand computations,
plus the train-softplus / evaluate-ReLU model switch and a short run of each on Ray.

The tiny problem: `relu1` with 3 inputs, 2 hidden units, 2 classes (n = 14) and activation
softplus_beta(t) = ln(1 + e^{beta t}) / beta, mean cross-entropy on 5 rows + lam/2 ||x||^2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.algorithms.fedmspp import BATCH_PURPOSE, fedmspp_client
from rayfl.algorithms.scaffnew import ScaffnewConfig, coin_steps, scaffnew_client
from rayfl.config import ConfigError, load_config, section_config
from rayfl.engine import ClientContext
from rayfl.models import build_model
from rayfl.results import load
from rayfl.rng import numpy_rng
from rayfl.runner import run_experiment

F_IN, HID, C, BETA = 3, 2, 2, 2.0
N = F_IN * HID + HID + HID * C + C
SEED, ROUND = 5, 2


def softplus_net(w: np.ndarray, x: np.ndarray, y: np.ndarray, lam: float) -> tuple[float, np.ndarray]:
    """Loss and gradient (backpropagated by hand) of CE(softplus(x W1^T + b1) W2^T + b2)."""
    w, x = np.asarray(w, np.float64), np.asarray(x, np.float64)
    w1, b1, w2, b2 = split(w)
    z1 = x @ w1.T + b1
    a = np.log1p(np.exp(BETA * z1)) / BETA
    z = a @ w2.T + b2
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    rows, b = np.arange(len(y)), len(y)
    p = np.exp(logp)
    p[rows, y] -= 1.0
    dz = p / b
    dz1 = (dz @ w2) / (1.0 + np.exp(-BETA * z1))
    grad = np.concatenate([(dz1.T @ x).ravel(), dz1.sum(0), (dz.T @ a).ravel(), dz.sum(0)]) + lam * w
    return float(-logp[rows, y].mean()) + 0.5 * lam * float(w @ w), grad


def split(w: np.ndarray) -> tuple[np.ndarray, ...]:
    """(W1 [HID, F_IN], b1, W2 [C, HID], b2): the flat vector in nn.Sequential's order."""
    cuts = np.cumsum([HID * F_IN, HID, C * HID])
    w1, b1, w2, b2 = np.split(w, cuts)
    return w1.reshape(HID, F_IN), b1, w2.reshape(C, HID), b2


def tiny():
    rng = np.random.default_rng(1)
    return rng.normal(size=(5, F_IN)).astype(np.float32), np.array([1, 0, 1, 1, 0]), rng.normal(size=N).astype(np.float32)


def context(client: int, data_x, data_y, state=None, round: int = ROUND) -> ClientContext:
    model = build_model(section_config("model", name="relu1", hidden=[HID], activation="softplus", softplus_beta=BETA,
                                    eval_activation="relu"), (F_IN,), C)
    return ClientContext(id=client, round=round, seed=SEED, model=model, device=torch.device("cpu"),
                         x=torch.from_numpy(data_x), y=torch.from_numpy(data_y), test_x=None, test_y=None,
                         state={} if state is None else state)


def test_fedmspp_inner_steps_on_one_minibatch_with_the_prox_pull():
    """Three inner steps x <- x - lr (grad f(x; B) + (x - x_r) / gamma_p) on ONE minibatch B of 3
    of the 5 rows, drawn from (seed, 'fedmspp.batch', r, i). A flipped prox sign, a dropped prox
    term, or a fresh minibatch per step each give a point far outside the tolerance."""
    data_x, data_y, x0 = tiny()
    lr, prox_lr, lam, steps = 0.3, 0.5, 0.01, 3
    out = fedmspp_client(context(1, data_x, data_y), x0, steps, lr, prox_lr, 3, lam)
    idx = numpy_rng(SEED, BATCH_PURPOSE, ROUND, 1).choice(5, size=3, replace=False)
    anchor = x0.astype(np.float64)

    def hand(sign: float = 1.0, prox: bool = True, fixed: bool = True) -> np.ndarray:
        x = anchor.copy()
        for t in range(steps):
            rows = idx if fixed else np.roll(np.arange(5), t)[:3]
            g = softplus_net(x, data_x[rows], data_y[rows], lam)[1]
            x = x - lr * (g + (sign * (x - anchor) / prox_lr if prox else 0.0))
        return x

    good = hand()
    np.testing.assert_allclose(x0 + out["delta"], good, rtol=1e-5, atol=1e-6)
    assert out["loss"] == pytest.approx(softplus_net(anchor, data_x[idx], data_y[idx], lam)[0], rel=1e-5)
    for bad in (hand(sign=-1.0), hand(prox=False), hand(fixed=False)):
        assert np.abs(bad - good).max() > 1e-3


def test_scaffnew_two_rounds_with_the_control_variate():
    """Round 0: h = 0, H_0 steps x <- x - lr grad f(x), w = x^. Round 1 (broadcast xbar): the
    client first sets h = (p / lr)(xbar - x^_0), then steps x <- x - lr (grad f(x) - h) and
    sends w - xbar, w = x^_1 - (lr / p) h (full batch, so the hand computation is exact). Flipping the
    sign of h in the step, dropping the (lr / p) h in the upload or the h update all fail."""
    data_x, data_y, x0 = tiny()
    lr, p, lam = 0.2, 0.25, 0.01
    state: dict = {}
    out0 = scaffnew_client(context(0, data_x, data_y, state, round=0), x0, 2, lr, p, 64, lam)
    x = x0.astype(np.float64)
    for _ in range(2):
        x = x - lr * softplus_net(x, data_x, data_y, lam)[1]
    np.testing.assert_allclose(x0 + out0["delta"], x, rtol=1e-5, atol=1e-6)
    xhat0 = x
    xbar = (x0 + 0.3).astype(np.float32)  # what the server averaged
    out1 = scaffnew_client(context(0, data_x, data_y, state, round=1), xbar, 3, lr, p, 64, lam)

    def hand(step_sign: float = 1.0, upload: bool = True, update: bool = True) -> np.ndarray:
        h = (p / lr) * (xbar.astype(np.float64) - xhat0) if update else np.zeros(N)
        z = xbar.astype(np.float64)
        for _ in range(3):
            z = z - lr * (softplus_net(z, data_x, data_y, lam)[1] - step_sign * h)
        return z - (lr / p) * h if upload else z

    good = hand()
    np.testing.assert_allclose(xbar + out1["delta"], good, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state["h"].numpy(), (p / lr) * (xbar - xhat0), rtol=1e-5, atol=1e-5)
    for bad in (hand(step_sign=-1.0), hand(upload=False), hand(update=False)):
        assert np.abs(bad - good).max() > 1e-2


def test_scaffnew_coin_is_geometric_and_common():
    """H_r ~ Geometric(p) on {1, 2, ...}, one draw per round for all clients (seeded by round
    only): mean 1/p = 5 within 4 standard errors (sd sqrt(1-p)/p) over 4,000 rounds."""
    draws = np.array([coin_steps(3, r, 0.2) for r in range(4000)])
    assert draws.min() >= 1 and abs(draws.mean() - 5.0) < 4 * np.sqrt(0.8) / 0.2 / np.sqrt(4000)
    assert coin_steps(3, 7, 0.2) == coin_steps(3, 7, 0.2)
    assert ScaffnewConfig(local_steps=4).probability() == 0.25


def test_softplus_network_trains_smooth_and_evaluates_as_relu():
    model = build_model(section_config("model", name="relu1", hidden=[4], activation="softplus", softplus_beta=3.0,
                                    eval_activation="relu"), (3,), 2)
    relu = build_model(section_config("model", name="relu1", hidden=[4]), (3,), 2)
    relu.load_state_dict(model.state_dict())
    x = torch.randn(8, 3)
    hidden = model[1](x)
    torch.testing.assert_close(model[2](hidden), torch.nn.functional.softplus(hidden, beta=3.0))
    model.eval()
    torch.testing.assert_close(model(x), relu(x))


def test_configs_name_their_mistakes():
    with pytest.raises(ConfigError, match="model.softplus_beta"):
        load_config(None, ["model.name=relu1", "model.activation=softplus", "model.softplus_beta=0"])
    with pytest.raises(ConfigError, match="algorithm.p"):
        load_config(None, ["algorithm.name=scaffnew", "algorithm.p=1.5"])
    with pytest.raises(ConfigError, match="algorithm.participation"):
        load_config(None, ["algorithm.name=scaffnew", "algorithm.participation=0.5"])
    with pytest.raises(ConfigError, match="algorithm.prox_lr"):
        load_config(None, ["algorithm.name=fedmspp", "algorithm.prox_lr=0"])
    with pytest.raises(ConfigError, match="algorithm.local_epochs"):
        load_config(None, ["algorithm.name=fedmspp", "algorithm.local_epochs=1", "algorithm.local_steps=null"])


@pytest.mark.parametrize("name", ["fedmspp", "scaffnew"])
def test_baseline_runs_on_ray_and_reports_the_relu_loss(ray_local, tmp_path, name):
    cfg = load_config(None, [
        "data.dataset=digits", "data.test_fraction=0.2", "partition.method=iid", "partition.num_clients=3",
        "model.name=relu1", "model.hidden=[4]", "model.activation=softplus", "model.eval_activation=relu",
        "run.rounds=2", f"output.dir={tmp_path}", f"algorithm.name={name}", "algorithm.local_steps=3",
        "algorithm.lr=0.05", "algorithm.batch_size=16", "engine.num_hosts=1",
    ])
    r = load(run_experiment(cfg).run_dir).rounds.sort_values("round")
    assert r["num_updates"].tolist() == [3, 3]
    assert np.isfinite(r["objective"]).all() and np.isfinite(r["test_loss"]).all()
