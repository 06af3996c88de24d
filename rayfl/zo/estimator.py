"""The two-point zeroth-order gradient estimator of spherical smoothing.

For h^eta(x) = E_{u ~ Unif(ball)}[h(x + eta u)], Lemma 7(i) of ZO-HFL (arXiv 2504.01839) gives

    grad h^eta(x) = (d / 2 eta) E_{v ~ Unif(sphere)}[(h(x + eta v) - h(x - eta v)) v],

so one draw of v and two function values give an unbiased estimate of the smoothed gradient.
(The paper's display of grad f_2^eta omits the d / 2 eta factor; Lemma 7 has it.) The factor is
d / 2 eta = 39,200 for a 7,840-parameter model at eta = 0.1, which is why every difference here
is formed in float64, and for the quadratic penalty in a factored form
(`quadratic_penalty_difference`).

FedRZO (Qiu, Shanbhag, Yousefian, NeurIPS 2023, Sec. 3 and Lemma 1(i)) samples v uniform on the
sphere of radius eta; its formula was lost in the text rayfl was built from, and rayfl uses the
one-sided form (`forward_difference_estimate`), which fits the "||v|| = eta" of its Lemma 3 proof:

    g = (n / eta) (h(x + v) - h(x)) v / ||v|| = (n / eta^2) (h(x + v) - h(x)) v,

unbiased for grad h^eta(x) because E[h(x) v] = 0.
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


def forward_difference_estimate(f_shifted: float, f_here: float, v: np.ndarray, eta: float) -> np.ndarray:
    """(n / eta^2) (f(x + v) - f(x)) v in float64, n = len(v), for v on the sphere of radius
    eta (FedRZO's estimator; note v is the *scaled* direction, ||v|| = eta)."""
    if not eta > 0:
        raise ValueError(f"the smoothing radius eta must be > 0, got {eta}")
    v = np.asarray(v, dtype=np.float64)
    return (v.size / eta**2) * (float(f_shifted) - float(f_here)) * v


def quadratic_penalty(x: np.ndarray, y: np.ndarray, lam: float) -> float:
    """f2(x, y) = lam / 2 ||x - y||^2, summed in float64."""
    e = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    return 0.5 * lam * float(e @ e)


def quadratic_penalty_difference(
    x: np.ndarray, v: np.ndarray, eta: float, y_plus: np.ndarray, y_minus: np.ndarray, lam: float
) -> float:
    """f2(x + eta v, y+) - f2(x - eta v, y-) = lam/2 (e+ - e-)^T (e+ + e-), e+- = x +- eta v - y+-.

    The factored form never subtracts two large, nearly equal norms."""
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    e_plus = x + eta * v - np.asarray(y_plus, dtype=np.float64)
    e_minus = x - eta * v - np.asarray(y_minus, dtype=np.float64)
    return 0.5 * lam * float((e_plus - e_minus) @ (e_plus + e_minus))


def smoothed_gradient(
    h: Callable[[np.ndarray], float],
    x: np.ndarray,
    eta: float,
    rng: np.random.Generator,
    samples: int,
    form: str = "central",
) -> np.ndarray:
    """Monte-Carlo mean of `samples` two-point estimates of grad h^eta(x) (for tests and toys):
    the central form of ZO-HFL, or FedRZO's one-sided `forward` form."""
    x = np.asarray(x, dtype=np.float64)
    total = np.zeros_like(x)
    h_x = h(x) if form == "forward" else 0.0
    for v in sample_sphere(rng, x.size, samples):
        if form == "forward":
            total += forward_difference_estimate(h(x + eta * v), h_x, eta * v, eta)
        else:
            total += two_point_estimate(h(x + eta * v), h(x - eta * v), v, eta)
    return total / samples
