"""ComFedL (arXiv 2106.11264, Alg. 1) checked against its definitions on tiny problems.

The model is a bias-free linear softmax regression on 3 features x 3 classes (d = 9), so every
quantity is recomputed in float64 numpy: the minibatch CE L_B and its gradient, the literal
local step w <- w - lr exp(L_B/gamma)/gamma grad L_B, the normalised step
w <- w - lr exp((L_B - c_s)/gamma) grad L_B with c_s = gamma log mean_j exp(L_j(w_s)/gamma),
and the server's uniform mean. The Ray-backed run (module fixture) is checked round by round
against that hand computation and on 1 vs 2 hosts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from rayfl.algorithms.client_eval import client_eval, summarize
from rayfl.algorithms.comfedl import (
    ComFedLConfig,
    ComposedLoss,
    comfedl_client,
    comfedl_probe,
    lse_shift,
    outer_weight,
    robust_weights,
)
from rayfl.algorithms.fedavg import fedavg_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.config import ConfigError, load_config
from rayfl.data import FederatedDataset
from rayfl.engine import ClientContext
from rayfl.models import build_model
from rayfl.models.params import functional_logits, get_flat
from rayfl.results import load
from rayfl.rng import derive_seed, numpy_rng
from rayfl.runner import run_experiment
from rayfl.zo.lower_level import minibatch_indices

F_IN, C = 3, 3
D = F_IN * C


# ---------------------------------------------------------------- float64 references


def ce(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean CE of the bias-free linear model W [C, F] (row-major) and its gradient."""
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    z = x @ np.asarray(w, np.float64).reshape(C, -1).T
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p = np.exp(logp)
    rows = np.arange(len(y))
    p[rows, y] -= 1.0
    return float(-logp[rows, y].mean()), (p.T @ x).ravel() / len(y)


def hand_client(w0, x, y, batches, lr, gamma, weighting, shift):
    """tau local steps of Alg. 1 (DRFL) in float64 on the given index batches."""
    w = np.asarray(w0, np.float64).copy()
    for idx in batches:
        loss, grad = ce(w, x[idx], y[idx])
        g = math.exp(loss / gamma) / gamma if weighting == "literal" else math.exp((loss - shift) / gamma)
        w = w - lr * g * grad
    return w


def context(x, y, cid=0, rnd=0, seed=0, model=None, test=None):
    model = model if model is not None else nn.Sequential(nn.Flatten(), nn.Linear(F_IN, C, bias=False))
    tx, ty = (torch.as_tensor(test[0]), torch.as_tensor(test[1])) if test is not None else (None, None)
    return ClientContext(id=cid, round=rnd, seed=seed, model=model, device=torch.device("cpu"),
                         x=torch.as_tensor(x), y=torch.as_tensor(y), test_x=tx, test_y=ty, state={})


def client_kwargs(**over):
    kw = dict(lr=0.3, steps=3, batch_size=4, outer_batch_size=4, gamma=0.5, outer="exp", weighting="normalized",
              shift=0.0, clamp=30.0, objective="loss", inner_lr=0.05, second_order=True)
    kw.update(over)
    return kw


def toy(n=7, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, F_IN)).astype(np.float32), rng.integers(0, C, n).astype(np.int64), \
        rng.normal(size=D).astype(np.float32)


# ---------------------------------------------------------------- Lemma 1


def test_lemma1_log_sum_exp_value_and_softmax_maximiser():
    """max_{r in simplex} sum r_i f_i - gamma KL(r || 1/n) = gamma log mean exp(f/gamma), attained
    at r* = softmax(f/gamma); no random simplex point does better, and r* beats its neighbours."""
    rng = np.random.default_rng(0)
    for gamma in (0.2, 1.0, 5.0):
        f = rng.uniform(0.0, 3.0, size=10)

        def value(r, f=f, gamma=gamma):
            r = np.asarray(r, np.float64)
            return float(r @ f - gamma * np.sum(np.where(r > 0, r * np.log(10 * np.where(r > 0, r, 1)), 0.0)))

        r_star = robust_weights(f, gamma)
        np.testing.assert_allclose(r_star, np.exp(f / gamma) / np.exp(f / gamma).sum(), rtol=1e-12)
        lse = gamma * math.log(np.mean(np.exp(f / gamma)))
        assert value(r_star) == pytest.approx(lse, rel=1e-12, abs=1e-12)
        assert lse_shift(f, gamma) == pytest.approx(lse, rel=1e-12)
        others = rng.dirichlet(np.ones(10), size=4000)
        assert max(value(r) for r in others) < lse
        for _ in range(20):  # a small step along the simplex from r* lowers the value
            d = rng.normal(size=10)
            d -= d.mean()
            assert value(r_star + 1e-3 * d / np.abs(d).max() * r_star.min()) <= value(r_star) + 1e-15
    assert lse_shift(np.array([1000.0, 1000.0]), 0.1) == pytest.approx(1000.0)  # stable, no overflow


# ---------------------------------------------------------------- the compositional gradient


@pytest.mark.parametrize(("model_kind", "weighting"), [("linear", "literal"), ("linear", "normalized"), ("mlp", "normalized")])
def test_plug_in_gradient_equals_autograd_of_the_composed_objective(model_kind, weighting):
    """u = g'(L_B) grad L_B (what a client steps along) equals torch autograd of g(L_B(w)) in
    float64: exp(L_B/gamma) literally, gamma exp((L_B - c)/gamma) normalised; the linear model
    goes through the closed-form kernel, the MLP through vmap(grad)."""
    torch.manual_seed(0)
    if model_kind == "linear":
        model = nn.Sequential(nn.Flatten(), nn.Linear(F_IN, C, bias=True))
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(F_IN, 5), nn.Tanh(), nn.Linear(5, C))
    x, y, _ = toy(9, seed=1)
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ctx = context(x, y, model=model)
    gamma, shift = 0.4, 0.7
    batch = torch.tensor([0, 2, 3, 5, 8])
    q, grad = ComposedLoss(ctx, "loss", 0.05, True)(w, batch, None)
    u = outer_weight(q, "exp", gamma, weighting, shift) * grad.double()

    m64 = nn.Sequential(*[m for m in model]).double()
    v = w.double().clone().requires_grad_(True)
    loss = nn.functional.cross_entropy(functional_logits(m64, v, torch.as_tensor(x[batch.numpy()]).double()),
                                       torch.as_tensor(y[batch.numpy()]))
    obj = torch.exp(loss / gamma) if weighting == "literal" else gamma * torch.exp((loss - shift) / gamma)
    (ref,) = torch.autograd.grad(obj, v)
    assert q == pytest.approx(float(loss.detach()), rel=1e-5)
    np.testing.assert_allclose(u.numpy(), ref.numpy(), rtol=2e-5, atol=1e-7)
    assert outer_weight(q, "identity", gamma, weighting, shift) == 1.0


# ---------------------------------------------------------------- one client, by hand


@pytest.mark.parametrize("weighting", ["normalized", "literal"])
def test_client_steps_match_hand_computation(weighting):
    """Three minibatch steps (b = 4 of 7 rows, the `batches` stream) against float64: a flipped
    sign, a dropped 1/gamma (literal) or a dropped shift (normalised) is far outside rtol."""
    x, y, w0 = toy()
    ctx = context(x, y, cid=2, rnd=5, seed=3)
    out = comfedl_client(ctx, w0, **client_kwargs(weighting=weighting, shift=0.9))
    batches = minibatch_indices(numpy_rng(3, "batches", 5, 2), 7, 4, 3).numpy()
    hand = hand_client(w0, x, y, batches, 0.3, 0.5, weighting, 0.9)
    np.testing.assert_allclose(w0 + out["delta"].numpy(), hand, rtol=1e-5, atol=1e-6)
    assert np.abs(hand - w0).max() > 1e-2  # the steps really move w
    assert ctx.work.steps == 3 and ctx.work.backward_samples == 12


def test_normalised_equals_literal_with_lr_scaled_by_gamma_over_z():
    """rayfl's normalised step (not in the paper): exp((L - c)/gamma) = (gamma / Z) exp(L/gamma)/gamma
    with Z = exp(c/gamma), for a whole round, so normalised(lr) = literal(lr gamma / Z); the same lr differs."""
    x, y, w0 = toy()
    gamma, lr = 0.5, 0.3
    probe = comfedl_probe(context(x, y), w0, "loss", 0.05, True, 4, 4)["probe"]
    assert probe == pytest.approx(ce(w0, x, y)[0], rel=1e-6)
    shift = lse_shift(np.array([probe, probe + 0.4, probe - 0.2]), gamma)
    z = math.exp(shift / gamma)
    norm = comfedl_client(context(x, y), w0, **client_kwargs(lr=lr, gamma=gamma, shift=shift))["delta"].numpy()
    lit = comfedl_client(context(x, y), w0, **client_kwargs(lr=lr * gamma / z, gamma=gamma, weighting="literal"))
    np.testing.assert_allclose(norm, lit["delta"].numpy(), rtol=1e-5, atol=1e-7)
    same_lr = comfedl_client(context(x, y), w0, **client_kwargs(lr=lr, gamma=gamma, weighting="literal"))
    assert np.abs(same_lr["delta"].numpy() - norm).max() > 1e-2
    # the literal factor at ln 10 and gamma = 0.1 is ~1e11 (gamma of ComFedL Sec. 5.3); normalised clamps
    assert outer_weight(math.log(10), "exp", 0.1, "literal") == pytest.approx(10**10 / 0.1 * 1.0, rel=1e-9)
    assert outer_weight(1e6, "exp", 0.1, "literal") == math.inf
    assert outer_weight(100.0, "exp", 0.1, "normalized", shift=0.0, clamp=30.0) == pytest.approx(math.exp(30.0))


def test_identity_outer_reproduces_fedavg_local_sgd_bit_for_bit():
    """With g = identity (`outer: identity`) ComFedL walks FedAvg's minibatches with FedAvg's steps."""
    x, y, w0 = toy()
    a = comfedl_client(context(x, y, cid=1, rnd=2), w0, **client_kwargs(outer="identity"))
    b = fedavg_client(context(x, y, cid=1, rnd=2), w0, 0.3, LocalSchedule(4, None, 3))
    assert torch.equal(a["delta"], b["delta"]) and a["outer_weight"] == 1.0


def test_client_eval_and_summary():
    """Accuracy on train and validation from the definitions; worst = min accuracy, max loss;
    a client without a validation split only counts for train."""
    x, y, w0 = toy()
    tx, ty = x[:4] + 0.5, y[:4]
    out = client_eval(context(x, y, test=(tx, ty)), w0)
    pred = (x.astype(np.float64) @ w0.reshape(C, F_IN).T.astype(np.float64)).argmax(1)
    assert out["train_accuracy"] == pytest.approx(np.mean(pred == y))
    assert out["val_loss"] == pytest.approx(ce(w0, tx, ty)[0], rel=1e-5)
    no_val = client_eval(context(x, y), w0)
    assert set(no_val) == {"train_loss", "train_accuracy"}
    s = summarize({0: out, 1: no_val, 2: {**out, "train_accuracy": 0.1, "train_loss": 9.0}})
    assert s["worst_train_accuracy"] == 0.1 and s["worst_train_loss"] == 9.0
    assert s["avg_train_accuracy"] == pytest.approx((2 * out["train_accuracy"] + 0.1) / 3)
    assert s["avg_val_accuracy"] == pytest.approx(out["val_accuracy"])
    adapted = client_eval(context(x, y, test=(tx, ty)), w0, adapt_steps=1, adapt_lr=0.5, adapt_batch_size=64)
    w1 = w0 - 0.5 * ce(w0, x, y)[1]  # one full-batch step
    assert adapted["val_loss"] == pytest.approx(ce(w1, tx, ty)[0], rel=1e-5)


def test_maml_objective_path_steps_along_the_second_order_gradient():
    """objective: maml uses ComFedL-B's maml_objective; one step must be
    w - lr g'(q) grad_w CE(query; w - alpha grad CE(support; w)) with the Hessian term, which a
    float64 autograd reference computes independently (first order differs)."""
    pytest.importorskip("rayfl.algorithms.maml")
    x, y, w0 = toy(9, seed=4)
    kw = client_kwargs(objective="maml", steps=1, batch_size=4, outer_batch_size=5, inner_lr=0.4, gamma=1.0,
                       weighting="literal", lr=0.2)
    out = comfedl_client(context(x, y, cid=0, rnd=1), w0, **kw)
    inner = minibatch_indices(numpy_rng(0, "batches", 1, 0), 9, 4, 1).numpy()[0]
    outer = minibatch_indices(numpy_rng(0, "batches.tilde", 1, 0), 9, 5, 1).numpy()[0]

    def q_of(v, create_graph=True):
        xs, xq = torch.as_tensor(x[inner]).double(), torch.as_tensor(x[outer]).double()
        loss_in = nn.functional.cross_entropy(xs @ v.view(C, F_IN).T, torch.as_tensor(y[inner]))
        (g,) = torch.autograd.grad(loss_in, v, create_graph=create_graph)
        return nn.functional.cross_entropy(xq @ (v - 0.4 * g).view(C, F_IN).T, torch.as_tensor(y[outer]))

    v = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    q = q_of(v)
    (grad,) = torch.autograd.grad(q, v)
    hand = w0 - 0.2 * math.exp(q.item()) * grad.numpy()
    np.testing.assert_allclose(w0 + out["delta"].numpy(), hand, rtol=1e-4, atol=1e-6)
    first = comfedl_client(context(x, y, cid=0, rnd=1), w0, **{**kw, "second_order": False})
    assert np.abs(first["delta"].numpy() - out["delta"].numpy()).max() > 1e-6


def test_configs_name_their_mistakes():
    for override, key in [
        ("algorithm.gamma=0", "algorithm.gamma"), ("algorithm.clamp=0", "algorithm.clamp"),
        ("algorithm.outer_batch_size=0", "algorithm.outer_batch_size"), ("algorithm.inner_lr=0", "algorithm.inner_lr"),
        ("algorithm.outer=log", "algorithm.outer"), ("algorithm.weighting=stale", "algorithm.weighting"),
        ("algorithm.objective=hinge", "algorithm.objective"), ("algorithm.average=median", "algorithm.average"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(None, ["algorithm.name=comfedl", override])
        assert e.value.key == key, (override, e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=comfedl", "algorithm.local_steps=null", "algorithm.local_epochs=1"])
    assert e.value.key == "algorithm.local_steps"
    assert isinstance(load_config(None, ["algorithm.name=comfedl"]).algorithm, ComFedLConfig)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["partition.client_test=equal", "partition.client_test_size=0"])
    assert e.value.key == "partition.client_test_size"


# ---------------------------------------------------------------- the server loop on Ray


def tiny_dataset() -> FederatedDataset:
    """3 clients of 5, 8 and 6 rows with 4 validation rows each; 6 global test rows."""
    rng = np.random.default_rng(11)
    n_train, n_test = 19, 12 + 6
    return FederatedDataset(
        name="tiny", num_classes=C, input_shape=(F_IN,),
        train_x=rng.normal(size=(n_train, F_IN)).astype(np.float32), train_y=rng.integers(0, C, n_train).astype(np.int64),
        test_x=rng.normal(size=(n_test, F_IN)).astype(np.float32), test_y=rng.integers(0, C, n_test).astype(np.int64),
        client_train=[np.arange(0, 5), np.arange(5, 13), np.arange(13, 19)],
        client_test=[np.arange(0, 4), np.arange(4, 8), np.arange(8, 12)],
    )


GAMMA, LR, TAU, B, ROUNDS = 0.5, 0.4, 3, 4, 2


def tiny_cfg(out, run_id, *extra):
    return load_config(None, [
        "data.dataset=digits", "partition.method=iid", "partition.num_clients=3", "model.bias=false",
        f"run.rounds={ROUNDS}", "run.eval_every=1", "run.seed=5", f"output.dir={out}", f"run.run_id={run_id}",
        "algorithm.name=comfedl", "algorithm.clients_per_round=3", f"algorithm.local_steps={TAU}",
        f"algorithm.batch_size={B}", f"algorithm.lr={LR}", f"algorithm.gamma={GAMMA}", *extra,
    ])


@pytest.fixture(scope="module")
def two_runs(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("comfedl") / "results"
    ds = tiny_dataset()
    one = load(run_experiment(tiny_cfg(out, "one", "engine.num_hosts=1"), dataset=ds).run_dir)
    two = load(run_experiment(tiny_cfg(out, "two", "engine.num_hosts=2", "engine.num_cpus_per_host=0.5"),
                              dataset=ds).run_dir)
    return ds, one, two


def hand_rounds(ds: FederatedDataset, w0: np.ndarray, sized: bool = False) -> list[np.ndarray]:
    """Alg. 1 with the normalised step: probe L_i(w_s) on all local rows, c_s, tau steps per
    client on its `batches` stream, uniform mean (`sized`: FedAvg's n_i weights instead)."""
    w, out = np.asarray(w0, np.float64), []
    for r in range(ROUNDS):
        parts = [(ds.train_x[i], ds.train_y[i]) for i in ds.client_train]
        shift = GAMMA * math.log(np.mean([math.exp(ce(w, x, y)[0] / GAMMA) for x, y in parts]))
        news = []
        for c, (x, y) in enumerate(parts):
            batches = minibatch_indices(numpy_rng(5, "batches", r, c), len(y), B, TAU).numpy()
            news.append(hand_client(w, x, y, batches, LR, GAMMA, "normalized", shift))
        sizes = ds.client_sizes().astype(np.float64)
        w = np.average(news, axis=0, weights=sizes if sized else None)
        out.append(w)
    return out


def test_real_run_matches_alg1_by_hand_and_logs_client_metrics(two_runs):
    """Each round's logged global test loss is that of the hand-computed w_{s+1}; the evals rows
    hold every client's train / val accuracy, whose mean and min are the logged avg / worst."""
    ds, one, _ = two_runs
    with torch.random.fork_rng(devices=[]):  # Federation.initial_params for run.seed = 5
        torch.manual_seed(derive_seed(5, "model.init"))
        w0 = get_flat(build_model(tiny_cfg("unused", "x").model, (F_IN,), C)).numpy().astype(np.float64)
    hands, sized = hand_rounds(ds, w0), hand_rounds(ds, w0, sized=True)
    rounds = one.rounds.sort_values("round")
    for r, w in enumerate(hands):
        assert rounds["test_loss"].iloc[r] == pytest.approx(ce(w, ds.test_x, ds.test_y)[0], rel=1e-5)
        assert abs(rounds["test_loss"].iloc[r] - ce(sized[r], ds.test_x, ds.test_y)[0]) > 1e-4
    ev = one.evals[(one.evals["round"] == ROUNDS - 1) & (one.evals["client"] >= 0)]
    assert sorted(ev["split"].unique()) == ["train", "val"] and len(ev) == 6
    val = ev[ev["split"] == "val"].sort_values("client")["test_accuracy"].to_numpy()
    hand_val = [np.mean((ds.test_x[i] @ hands[-1].reshape(C, F_IN).T).argmax(1) == ds.test_y[i]) for i in ds.client_test]
    np.testing.assert_allclose(val, hand_val)
    last = rounds.iloc[-1]
    assert last["avg_val_accuracy"] == pytest.approx(np.mean(hand_val))
    assert last["worst_val_accuracy"] == pytest.approx(np.min(hand_val))
    assert set(one.clients["phase"]) == {"probe", "train", "eval"}


def test_one_and_two_hosts_give_identical_results(two_runs):
    _, one, two = two_runs
    cols = [c for c in one.rounds.columns if c not in ("wall_time", "run_id", "experiment")]
    a, b = one.rounds.sort_values("round")[cols].reset_index(drop=True), two.rounds.sort_values("round")[cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    ea = one.evals.sort_values(["round", "client", "split"])[["round", "client", "split", "test_accuracy", "test_loss"]]
    eb = two.evals.sort_values(["round", "client", "split"])[["round", "client", "split", "test_accuracy", "test_loss"]]
    pd.testing.assert_frame_equal(ea.reset_index(drop=True), eb.reset_index(drop=True))
    assert two.clients["host"].nunique() == 2
