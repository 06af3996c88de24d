"""The one-step MAML objective and the test-time adaptation (rayfl/algorithms/maml.py).

f(w) = l_Q(w - alpha grad l_S(w)); its gradient is (I - alpha H_S(w)) grad l_Q(w'). Checked
against central finite differences of f itself (float64, a tiny tanh MLP, where the Hessian
term is not negligible), and against a closed-form float64 computation on the linear softmax
model, whose CE Hessian is known: H = (1/B) sum_n (diag(p_n) - p_n p_n^T) kron x_n x_n^T.
The first-order variant must differ from the second-order one by exactly -alpha H_S g_Q."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.algorithms.maml import adapt, maml_gradient, maml_objective

F_IN, C = 3, 3
D = F_IN * C


def ce_grad_hess(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean CE of the bias-free linear model W [C, F] (row-major flat, as nn.Linear's weight),
    its gradient and its Hessian, in float64."""
    z = x @ w.reshape(C, F_IN).T
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(p[rows, y]).mean())
    r = p.copy()
    r[rows, y] -= 1.0
    grad = (r.T @ x).ravel() / len(y)
    hess = sum(np.kron(np.diag(pn) - np.outer(pn, pn), np.outer(xn, xn)) for pn, xn in zip(p, x, strict=True)) / len(y)
    return loss, grad, hess


def linear64() -> nn.Module:
    return nn.Sequential(nn.Linear(F_IN, C, bias=False)).double()


def problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=D)
    xs, xq = rng.normal(size=(5, F_IN)), rng.normal(size=(4, F_IN))
    ys, yq = rng.integers(0, C, 5), rng.integers(0, C, 4)
    return w, xs, ys, xq, yq


def tensors(*arrays):
    return [torch.tensor(a) for a in arrays]


@pytest.mark.parametrize("alpha", [0.7, 0.05])
def test_second_and_first_order_gradients_equal_the_closed_form(alpha):
    """SO = (I - alpha H_S(w)) g_Q and FO = g_Q, with w' = w - alpha g_S(w), g_Q = grad l_Q(w');
    SO - FO is exactly the Hessian term -alpha H_S g_Q (and is not small here)."""
    w, xs, ys, xq, yq = problem()
    _, g_s, h_s = ce_grad_hess(w, xs, ys)
    w_prime = w - alpha * g_s
    loss_q, g_q, _ = ce_grad_hess(w_prime, xq, yq)
    hand_so = g_q - alpha * h_s @ g_q
    model = linear64()
    tw, txs, tys, txq, tyq = tensors(w, xs, ys, xq, yq)
    loss, so = maml_gradient(model, tw, (txs, tys), (txq, tyq), alpha, second_order=True)
    _, fo = maml_gradient(model, tw, (txs, tys), (txq, tyq), alpha, second_order=False)
    assert loss.item() == pytest.approx(loss_q, rel=1e-12)
    np.testing.assert_allclose(so.numpy(), hand_so, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(fo.numpy(), g_q, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose((so - fo).numpy(), -alpha * h_s @ g_q, rtol=1e-9, atol=1e-13)
    assert np.abs(alpha * h_s @ g_q).max() > 1e-4 * alpha  # the term the first order drops is there


def test_second_order_gradient_matches_finite_differences():
    """A 3-2-3 tanh MLP with bias in float64: autograd of maml_objective equals the central
    difference of its value (eps 1e-6) to 1e-7; the first-order gradient does not."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(F_IN, 2), nn.Tanh(), nn.Linear(2, C)).double()
    d = sum(p.numel() for p in model.parameters())
    rng = np.random.default_rng(1)
    w = torch.tensor(rng.normal(size=d))
    xs, xq = torch.tensor(rng.normal(size=(6, F_IN))), torch.tensor(rng.normal(size=(5, F_IN)))
    ys, yq = torch.tensor(rng.integers(0, C, 6)), torch.tensor(rng.integers(0, C, 5))
    alpha = 0.5

    def f(v: torch.Tensor) -> float:
        return maml_objective(model, v.clone().requires_grad_(True), (xs, ys), (xq, yq), alpha).item()

    eps = 1e-6
    fd = np.array([(f(w + eps * e) - f(w - eps * e)) / (2 * eps) for e in torch.eye(d, dtype=torch.float64)])
    _, so = maml_gradient(model, w, (xs, ys), (xq, yq), alpha, second_order=True)
    _, fo = maml_gradient(model, w, (xs, ys), (xq, yq), alpha, second_order=False)
    np.testing.assert_allclose(so.numpy(), fd, rtol=1e-6, atol=1e-8)
    assert np.abs(fo.numpy() - fd).max() > 1e-3


def test_objective_needs_a_differentiable_vector():
    w, xs, ys, xq, yq = problem()
    tw, txs, tys, txq, tyq = tensors(w, xs, ys, xq, yq)
    with pytest.raises(ValueError, match="require grad"):
        maml_objective(linear64(), tw, (txs, tys), (txq, tyq), 0.1)


def test_adapt_takes_full_batch_sgd_steps_and_leaves_params_alone():
    """Two steps of w <- w - 0.3 grad l(w) on (x, y); the input vector is unchanged."""
    w, xs, ys, _, _ = problem(2)
    hand = w.copy()
    for _ in range(2):
        hand = hand - 0.3 * ce_grad_hess(hand, xs, ys)[1]
    tw = torch.tensor(w)
    got = adapt(linear64(), tw, torch.tensor(xs), torch.tensor(ys), 0.3, steps=2)
    np.testing.assert_allclose(got.numpy(), hand, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(tw.numpy(), w)
    assert not got.requires_grad
