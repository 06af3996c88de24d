"""Zeroth-order building blocks: sphere directions, the two-point estimator, projections,
H_{i,r} schedules, the lower-level solver and the closed-form CE gradient (ZO-HFL spec, sec. 6)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rayfl.algorithms.kernels import CrossEntropyGrad
from rayfl.config import ConfigError
from rayfl.engine.context import ClientContext
from rayfl.models.params import functional_logits
from rayfl.zo import (
    ConstraintConfig,
    StepsSchedule,
    direction_seed,
    local_steps,
    minibatch_indices,
    project,
    projected_sgd,
    quadratic_penalty,
    quadratic_penalty_difference,
    sample_sphere,
    smoothed_gradient,
    sphere_from_seed,
    step_size,
    total_steps,
    two_point_estimate,
)
from rayfl.zo.lower_level import epoch_indices

# ---------------------------------------------------------------- sphere


def test_sphere_directions_are_unit_and_isotropic():
    d, n = 8, 40_000
    v = sample_sphere(np.random.default_rng(0), d, n)
    assert v.shape == (n, d)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-12)
    second_moment = v.T @ v / n  # E[v v^T] = I / d
    np.testing.assert_allclose(second_moment, np.eye(d) / d, atol=0.004)
    assert np.abs(v.mean(axis=0)).max() < 0.01


def test_direction_is_a_pure_function_of_seed_round_client():
    a = sphere_from_seed(direction_seed(7, 3, 2), 7840)
    assert a.dtype == np.float64 and abs(np.linalg.norm(a) - 1.0) < 1e-12
    np.testing.assert_array_equal(a, sphere_from_seed(direction_seed(7, 3, 2), 7840))
    for other in (direction_seed(7, 3, 1), direction_seed(7, 4, 2), direction_seed(8, 3, 2)):
        assert abs(a @ sphere_from_seed(other, 7840)) < 0.1  # independent directions: nearly orthogonal


# ---------------------------------------------------------------- estimator


def test_two_point_estimate_matches_gradient_as_eta_shrinks():
    """Lemma 7(i): E[(d/2eta)(h(x+eta v) - h(x-eta v)) v] = grad h^eta(x) -> grad h(x)."""
    a = np.array([1.0, -2.0, 0.5, 3.0, -1.0])

    def h(x: np.ndarray) -> float:
        return float(np.sum(np.sin(x) * a) + 0.5 * x @ x + x[0] * x[1])

    def grad(x: np.ndarray) -> np.ndarray:
        g = np.cos(x) * a + x
        g[0] += x[1]
        g[1] += x[0]
        return g

    x = np.array([0.3, -0.7, 1.1, 0.0, 2.0])
    errors = []
    for eta in (1.0, 0.05):
        est = smoothed_gradient(h, x, eta, np.random.default_rng(1), samples=40_000)
        errors.append(np.linalg.norm(est - grad(x)) / np.linalg.norm(grad(x)))
    assert errors[1] < 0.025  # what is left is Monte-Carlo error, ~ sqrt(d / samples)
    assert errors[0] > 2 * errors[1]  # at eta = 1 the smoothing bias dominates


def test_two_point_estimate_scale_and_validation():
    v = np.zeros(4)
    v[2] = 1.0
    np.testing.assert_allclose(two_point_estimate(1.5, 0.5, v, 0.1), [0, 0, 20.0, 0])  # d/2eta = 20
    with pytest.raises(ValueError):
        two_point_estimate(1.0, 0.0, v, 0.0)


def test_quadratic_penalty_difference_is_the_factored_form():
    rng = np.random.default_rng(2)
    x, yp, ym = rng.normal(size=(3, 50))
    v = sample_sphere(rng, 50)
    direct = quadratic_penalty(x + 0.1 * v, yp, 2.0) - quadratic_penalty(x - 0.1 * v, ym, 2.0)
    assert quadratic_penalty_difference(x, v, 0.1, yp, ym, 2.0) == pytest.approx(direct, rel=1e-10)


def test_quadratic_penalty_identity_expectation():
    """Lemma 7(i) with f2 = lam/2 ||x - y||^2: with y+ = y- = y the estimate is d lam v v^T (x - y),
    whose mean is lam (x - y)."""
    rng = np.random.default_rng(3)
    d, lam, eta, n = 6, 0.7, 0.1, 40_000
    x, y = rng.normal(size=(2, d))
    g = np.array([two_point_estimate(quadratic_penalty_difference(x, v, eta, y, y, lam), 0.0, v, eta)
                  for v in sample_sphere(rng, d, n)])
    v0 = sample_sphere(np.random.default_rng(4), d)  # draw by draw: d lam v v^T (x - y)
    g0 = two_point_estimate(quadratic_penalty_difference(x, v0, eta, y, y, lam), 0.0, v0, eta)
    np.testing.assert_allclose(g0, d * lam * v0 * (v0 @ (x - y)), rtol=1e-9)
    np.testing.assert_allclose(g.mean(axis=0), lam * (x - y), atol=0.03 * lam * np.linalg.norm(x - y))


# ---------------------------------------------------------------- projections


def test_ball_projection_is_feasible_idempotent_and_keeps_inside_points():
    cfg = ConstraintConfig(kind="ball", radius=0.5)
    gen = torch.Generator().manual_seed(0)
    center = torch.randn(4, 30, generator=gen)
    y = center + torch.randn(4, 30, generator=gen)  # all far outside
    p = project(y, center, cfg)
    assert torch.all(torch.linalg.vector_norm(p - center, dim=1) <= 0.5 + 1e-6)
    torch.testing.assert_close(project(p, center, cfg), p)
    inside = center + 0.01 * torch.randn(4, 30, generator=gen)
    torch.testing.assert_close(project(inside, center, cfg), inside)
    # the projection is the closest feasible point along the ray from the centre
    direction = (y - center) / torch.linalg.vector_norm(y - center, dim=1, keepdim=True)
    torch.testing.assert_close(p, center + 0.5 * direction)


def test_box_and_orthant_projection_and_config_checks():
    y = torch.tensor([[-1.0, 0.5, 3.0]])
    torch.testing.assert_close(project(y, y, ConstraintConfig(kind="box", low=0.0)), torch.tensor([[0.0, 0.5, 3.0]]))
    torch.testing.assert_close(project(y, y, ConstraintConfig(kind="box", low=-0.5, high=1.0)), torch.tensor([[-0.5, 0.5, 1.0]]))
    assert project(y, y, ConstraintConfig()) is y
    with pytest.raises(ConfigError, match="box"):
        ConstraintConfig(kind="box").validate_as("algorithm.constraint")
    with pytest.raises(ConfigError, match="radius"):
        ConstraintConfig(kind="ball", radius=0.0).validate_as("algorithm.constraint")
    assert ConstraintConfig(kind="ball", client_radius=[1.0, 2.0]).radius_of(1) == 2.0


# ---------------------------------------------------------------- schedules


def test_sqrt_schedule_matches_its_values_up_to_r_500():
    """Thm 1(ii) and Sec. IV (i): H_r = ceil(tau sqrt(r + 1)), tabulated for R = 500."""
    table = {5: (5, 8, 16, 50, 112, 37_562), 20: (20, 29, 64, 200, 448, 149_507), 50: (50, 71, 159, 500, 1_119, 373_474)}
    for tau, (h0, h1, h9, h99, h499, total) in table.items():
        s = StepsSchedule(kind="sqrt", tau=tau)
        assert [local_steps(s, 3, r, seed=0) for r in (0, 1, 9, 99, 499)] == [h0, h1, h9, h99, h499]
        assert total_steps(s, 3, 500) == total
    assert total_steps(StepsSchedule(tau=20, multiplier=2), 0, 500) == 299_014
    assert total_steps(StepsSchedule(tau=20), 0, 500) <= 2 * 20 / 3 * 501**1.5  # Thm 1(iv)


def test_schedule_kinds_stragglers_and_per_client_tau(tmp_path):
    assert local_steps(StepsSchedule(kind="constant", tau=7), 0, 40, 0) == 7
    s = StepsSchedule(kind="sqrt", client_tau=[1.0, 5.0])
    assert [local_steps(s, c, 3, 0) for c in (0, 1)] == [2, 10]
    stragglers = StepsSchedule(kind="constant", tau=4, straggler_prob=0.3)
    h = np.array([[local_steps(stragglers, c, r, seed=1) for r in range(200)] for c in range(5)])
    assert set(np.unique(h)) == {0, 4} and 0.22 < np.mean(h == 0) < 0.38
    np.testing.assert_array_equal(h, [[local_steps(stragglers, c, r, seed=1) for r in range(200)] for c in range(5)])
    table = tmp_path / "steps.csv"
    table.write_text("client,round,steps\n0,-1,3\n0,2,0\n")
    t = StepsSchedule(kind="table", table=str(table))
    t.validate_as("algorithm.local_schedule")
    assert [local_steps(t, 0, r, 0) for r in range(4)] == [3, 3, 0, 3]
    with pytest.raises(KeyError):
        local_steps(t, 1, 0, 0)
    f = StepsSchedule(kind="function", function="builtins:max")
    assert local_steps(f, 2, 5, 0) == 5
    with pytest.raises(ConfigError, match="cannot import"):
        StepsSchedule(kind="function", function="rayfl:no_such_fn").validate_as("algorithm.local_schedule")


def test_local_step_size_restarts_every_call():
    assert [step_size(0.1, t, 1.0) for t in range(3)] == pytest.approx([0.1, 0.05, 0.1 / 3])
    assert step_size(0.1, 9, None) == 0.1
    seen: list[float] = []

    def record(y: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1), torch.ones_like(y)  # gradient 1: y moves by exactly the step size

    for _ in range(2):  # two calls: each starts again at 0.1
        y, _, done = projected_sgd(torch.zeros(1, 1), torch.zeros(1, 1), steps=3, lr=0.1, lr_offset=1.0, mu=0.0,
                                   constraint=ConstraintConfig(), data_grad=record)
        seen.append(-float(y))
        assert done == 3
    assert seen == pytest.approx([0.1 + 0.05 + 0.1 / 3] * 2)


# ---------------------------------------------------------------- lower level


def test_projected_sgd_solves_a_strongly_convex_problem_in_the_ball():
    """argmin_y 1/2||y - a||^2 + mu/2 ||y - x||^2 over ||y - x|| <= r: with a far away the
    solution sits on the boundary towards a; H = 0 returns the start."""
    x = torch.zeros(1, 3)
    a = torch.tensor([[3.0, 4.0, 0.0]])
    grad = lambda y, t: (torch.zeros(1), y - a)  # noqa: E731
    ball = ConstraintConfig(kind="ball", radius=1.0)
    y, _, _ = projected_sgd(x.clone(), x, steps=2000, lr=0.5, lr_offset=1.0, mu=0.1, constraint=ball, data_grad=grad)
    torch.testing.assert_close(y, torch.tensor([[0.6, 0.8, 0.0]]), atol=1e-3, rtol=0)
    y0, loss, done = projected_sgd(a, x, steps=0, lr=0.5, lr_offset=1.0, mu=0.1, constraint=ball, data_grad=grad)
    torch.testing.assert_close(y0, a)
    assert done == 0 and math.isnan(loss)


def _context(n: int = 50, seed: int = 3) -> ClientContext:
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4, bias=False))
    return ClientContext(id=1, round=2, seed=seed, model=model, device=torch.device("cpu"),
                         x=torch.randn(n, 3, 4, generator=gen), y=torch.randint(0, 4, (n,), generator=gen),
                         test_x=None, test_y=None, state={})


def test_minibatch_indices_follow_the_context_batches():
    ctx = _context(50)
    for batch_size, steps in ((16, 9), (64, 3), (7, 20)):
        ref = [yb for _, yb in ctx.batches(batch_size, steps=steps, purpose="p")]
        got = minibatch_indices(ctx.rng("p"), 50, batch_size, steps)
        assert [torch.equal(ctx.y[i], r) for i, r in zip(got, ref, strict=True)] == [True] * steps
    ref = [yb for _, yb in ctx.batches(16, epochs=2, purpose="q")]
    got = epoch_indices(ctx.rng("q"), 50, 16, 2)
    assert len(got) == len(ref) == 8 and all(torch.equal(ctx.y[i], r) for i, r in zip(got, ref, strict=True))


@pytest.mark.parametrize("bias", [False, True])
def test_closed_form_ce_gradient_matches_autograd(bias):
    gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4, bias=bias))
    d = sum(p.numel() for p in model.parameters())
    w = torch.randn(3, d, generator=gen)
    x, y = torch.randn(5, 3, 4, generator=gen), torch.randint(0, 4, (5,), generator=gen)
    xk, yk = torch.randn(3, 5, 3, 4, generator=gen), torch.randint(0, 4, (3, 5), generator=gen)
    linear = CrossEntropyGrad(model)
    general = CrossEntropyGrad(nn.Sequential(*model, nn.Identity()))  # not recognised: torch.func path
    assert linear.linear is not None and general.linear is None
    loss, grad = linear(w, *linear.prepare(x, y))
    loss_k, grad_k = linear(w, xk.reshape(3, 5, 12), F.one_hot(yk, 4).float(), shared=False)  # one batch per row
    for j in range(3):
        for xs, ys, l_, g_ in ((x, y, loss, grad), (xk[j], yk[j], loss_k, grad_k)):
            v = w[j].clone().requires_grad_(True)
            ref = F.cross_entropy(functional_logits(model, v, xs), ys)
            (ref_grad,) = torch.autograd.grad(ref, v)
            torch.testing.assert_close(l_[j], ref.detach())
            torch.testing.assert_close(g_[j], ref_grad, atol=1e-6, rtol=1e-5)
    loss_g, grad_g = general(w, x, y)
    torch.testing.assert_close(loss_g, loss)
    torch.testing.assert_close(grad_g, grad, atol=1e-6, rtol=1e-5)
