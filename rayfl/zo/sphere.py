"""Random directions uniform on the unit sphere S^{d-1}, reproducible from a seed.

ZO-HFL (Qiu, Kim, Yousefian, arXiv 2504.01839, Alg. 1 line 3 and Remark 2) draws v_{i,r}
uniformly on the unit sphere of R^d, with d the flattened parameter count. A normalised standard
Gaussian is exactly uniform on the sphere. The direction is a pure function of one integer seed
derived from (run seed, purpose, round, client), so the server can send that seed instead of
the d floats and the client rebuilds the same vector bit for bit.
"""

from __future__ import annotations

import numpy as np

from rayfl.rng import derive_seed

DIRECTION_PURPOSE = "zo.direction"


def direction_seed(seed: int, round: int, client: int, purpose: str = DIRECTION_PURPOSE) -> int:
    """The seed of v_{client, round}: one stream per (run seed, purpose, round, client)."""
    return derive_seed(seed, purpose, round, client)


def step_direction_seed(seed: int, round: int, client: int, step: int, purpose: str = DIRECTION_PURPOSE) -> int:
    """The seed of a direction drawn afresh at every local step (FedRZO_nn's v_{i,k}): one
    stream per (run seed, purpose, round, client, step)."""
    return derive_seed(seed, f"{purpose}.step{int(step)}", round, client)


def sphere_from_seed(seed: int, d: int) -> np.ndarray:
    """The float64 unit vector of R^d that `seed` stands for (same bits on every machine)."""
    return sample_sphere(np.random.default_rng(seed), d)


def sample_sphere(rng: np.random.Generator, d: int, size: int | None = None) -> np.ndarray:
    """`size` (or one, when None) float64 vectors uniform on the unit sphere of R^d."""
    if d < 1:
        raise ValueError(f"the sphere needs dimension d >= 1, got {d}")
    z = rng.standard_normal(d if size is None else (size, d))
    norm = np.linalg.norm(z, axis=-1, keepdims=True)
    while np.any(norm == 0):  # probability zero, but never divide by it
        z = rng.standard_normal(z.shape)
        norm = np.linalg.norm(z, axis=-1, keepdims=True)
    return z / norm
