"""`local_sgd`'s module path (parameters bound to the flat vector, `loss.backward()`) against a
float64 hand computation and against autograd through the flat vector (`functional_logits`).

The bound path is what every first-order client runs on a non-linear model, so a stale
gradient (not zeroed between steps), a wrong view or a model left bound to a client's vector
after the call must fail here."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.config import section_config
from rayfl.engine.context import ClientContext
from rayfl.models import build_model
from rayfl.models.params import bound_to, can_bind, functional_logits, get_flat
from rayfl.rng import numpy_rng
from rayfl.zo.lower_level import epoch_indices

SEED, ROUND, CLIENT = 5, 2, 7
N, F_IN, C, HIDDEN = 9, 4, 3, 5


def context(model: torch.nn.Module) -> ClientContext:
    rng = np.random.default_rng(1)
    x = torch.tensor(rng.normal(size=(N, F_IN)), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, C, size=N), dtype=torch.int64)
    return ClientContext(id=CLIENT, round=ROUND, seed=SEED, model=model, device=torch.device("cpu"),
                         x=x, y=y, test_x=None, test_y=None, state={})


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(section_config("model", name="mlp", hidden=[HIDDEN]), (F_IN,), C)


def hand_sgd(model, start, x, y, lr, batch, epochs, wd, mu, center, corr, offset=None):
    """The same local SGD in float64 numpy with a hand-derived MLP gradient; with `offset` the
    step at in-call step t is lr / (t + offset)."""
    sizes = [(HIDDEN, F_IN), (HIDDEN,), (C, HIDDEN), (C,)]
    w = start.astype(np.float64).copy()
    xs, ys = x.numpy().astype(np.float64), y.numpy()
    losses = []
    for t, idx in enumerate(epoch_indices(numpy_rng(SEED, "batches", ROUND, CLIENT), N, batch, epochs)):
        idx = idx.numpy()
        parts, o = [], 0
        for s in sizes:
            n = int(np.prod(s))
            parts.append(w[o:o + n].reshape(s))
            o += n
        w1, b1, w2, b2 = parts
        xb, yb = xs[idx], ys[idx]
        z = xb @ w1.T + b1
        h = np.maximum(z, 0)
        logits = h @ w2.T + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        losses.append(-np.log(p[np.arange(len(yb)), yb]).mean())
        d = p.copy()
        d[np.arange(len(yb)), yb] -= 1
        d /= len(yb)
        g2, gb2 = d.T @ h, d.sum(0)
        dz = (d @ w2) * (z > 0)
        g1, gb1 = dz.T @ xb, dz.sum(0)
        g = np.concatenate([g1.ravel(), gb1, g2.ravel(), gb2])
        g = g + wd * w + mu * (w - center) + corr
        w = w - (lr if offset is None else lr / (t + offset)) * g
    return w, float(np.mean(losses))


def test_bound_module_sgd_matches_a_hand_computation_with_every_term():
    model = mlp()
    start = get_flat(model)
    ctx = context(model)
    rng = np.random.default_rng(3)
    center = torch.tensor(rng.normal(size=start.shape), dtype=torch.float32)
    corr = torch.tensor(rng.normal(size=start.shape) * 0.1, dtype=torch.float32)
    lr, wd, mu = 0.3, 0.01, 0.5
    got, loss = local_sgd(ctx, start, lr, LocalSchedule(4, 2, None), weight_decay=wd, prox_mu=mu,
                          prox_center=center, correction=corr)
    want, want_loss = hand_sgd(model, start.numpy(), ctx.x, ctx.y, lr, 4, 2, wd, mu,
                               center.numpy().astype(np.float64), corr.numpy().astype(np.float64))
    assert ctx.work.steps == 6  # 9 samples, batch 4: 3 steps per epoch, 2 epochs
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    assert abs(loss - want_loss) < 1e-5
    assert np.abs(want - start.numpy()).max() > 1e-2  # it moved


def test_plain_sgd_with_a_decaying_step_matches_a_hand_computation():
    """FedAvg's client (no extra term) takes `_plain_sgd`: each step's own lr / (t + offset),
    every step charged, the model restored."""
    model = mlp()
    own = [p.detach().clone() for p in model.parameters()]
    start = get_flat(model)
    ctx = context(model)
    zero = np.zeros(start.shape)
    got, loss = local_sgd(ctx, start, 0.9, LocalSchedule(4, 2, None, 2.0))
    want, want_loss = hand_sgd(model, start.numpy(), ctx.x, ctx.y, 0.9, 4, 2, 0.0, 0.0, zero, zero, offset=2.0)
    assert ctx.work.steps == 6
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    assert abs(loss - want_loss) < 1e-5
    constant, _ = hand_sgd(model, start.numpy(), ctx.x, ctx.y, 0.9, 4, 2, 0.0, 0.0, zero, zero)
    assert np.abs(constant - want).max() > 1e-2  # the decay matters here
    for p, before in zip(model.parameters(), own, strict=True):
        assert torch.equal(p.detach(), before) and p.grad is None


def test_bound_path_equals_autograd_through_the_flat_vector_and_restores_the_model():
    model = mlp()
    own = [p.detach().clone() for p in model.parameters()]
    start = get_flat(model) + 0.1
    ctx = context(model)
    got, loss = local_sgd(ctx, start, 0.2, LocalSchedule(3, 1, None))
    # the flat-vector autograd path, step by step
    w = start.clone()
    losses = []
    for idx in epoch_indices(numpy_rng(SEED, "batches", ROUND, CLIENT), N, 3, 1):
        v = w.detach().requires_grad_(True)
        out = F.cross_entropy(functional_logits(model, v, ctx.x[idx]), ctx.y[idx])
        (g,) = torch.autograd.grad(out, v)
        w = w - 0.2 * g
        losses.append(out.item())
    np.testing.assert_allclose(got.numpy(), w.numpy(), rtol=1e-6, atol=1e-7)
    assert loss == float(np.mean(losses))
    for p, before in zip(model.parameters(), own, strict=True):  # the host's model is untouched
        assert torch.equal(p.detach(), before) and p.grad is None
    assert got.data_ptr() not in {p.data_ptr() for p in model.parameters()}


def test_bound_to_views_the_vector_and_frozen_or_mistyped_models_do_not_bind():
    model = mlp()
    vec = torch.arange(float(get_flat(model).numel()))
    grad = torch.zeros_like(vec)
    with bound_to(model, vec, grad) as m:
        vec.add_(1.0)  # an update of the vector moves the model
        assert float(next(m.parameters()).detach().reshape(-1)[0]) == 1.0
        m(torch.ones(2, F_IN)).sum().backward()
        assert grad.abs().sum() > 0
    assert can_bind(model, vec)
    assert not can_bind(model, vec.double())
    next(model.parameters()).requires_grad_(False)
    assert not can_bind(model, vec)
