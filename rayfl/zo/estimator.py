"""The two-point zeroth-order gradient estimator of spherical smoothing.

For h^eta(x) = E_{u ~ Unif(ball)}[h(x + eta u)], Lemma 7(i) of ZO-HFL (arXiv 2504.01839) gives

    grad h^eta(x) = (d / 2 eta) E_{v ~ Unif(sphere)}[(h(x + eta v) - h(x - eta v)) v],

so one draw of v and two function values give an unbiased estimate of the smoothed gradient.
(The paper's display of grad f_2^eta omits the d / 2 eta factor; Lemma 7 has it.) The factor is
d / 2 eta = 39,200 for a 7,840-parameter model at eta = 0.1, which is why every difference here
is formed in float64, and for the quadratic penalty in the factored form of spec section 2.4.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rayfl.zo.sphere import sample_sphere


def two_point_estimate(f_plus: float, f_minus: float, v: np.ndarray, eta: float) -> np.ndarray:
    """(d / 2 eta) (f(x + eta v) - f(x - eta v)) v in float64, d = len(v)."""
    if not eta > 0:
        raise ValueError(f"the smoothing radius eta must be > 0, got {eta}")
    v = np.asarray(v, dtype=np.float64)
    return (v.size / (2.0 * eta)) * (float(f_plus) - float(f_minus)) * v


def quadratic_penalty(x: np.ndarray, y: np.ndarray, lam: float) -> float:
    """f2(x, y) = lam / 2 ||x - y||^2, summed in float64."""
    e = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    return 0.5 * lam * float(e @ e)


def quadratic_penalty_difference(
    x: np.ndarray, v: np.ndarray, eta: float, y_plus: np.ndarray, y_minus: np.ndarray, lam: float
) -> float:
    """f2(x + eta v, y+) - f2(x - eta v, y-) = lam/2 (e+ - e-)^T (e+ + e-), e+- = x +- eta v - y+-.

    The factored form never subtracts two large, nearly equal norms (spec section 2.4)."""
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    e_plus = x + eta * v - np.asarray(y_plus, dtype=np.float64)
    e_minus = x - eta * v - np.asarray(y_minus, dtype=np.float64)
    return 0.5 * lam * float((e_plus - e_minus) @ (e_plus + e_minus))


def smoothed_gradient(
    h: Callable[[np.ndarray], float], x: np.ndarray, eta: float, rng: np.random.Generator, samples: int
) -> np.ndarray:
    """Monte-Carlo mean of `samples` two-point estimates of grad h^eta(x) (for tests and toys)."""
    x = np.asarray(x, dtype=np.float64)
    total = np.zeros_like(x)
    for v in sample_sphere(rng, x.size, samples):
        total += two_point_estimate(h(x + eta * v), h(x - eta * v), v, eta)
    return total / samples
