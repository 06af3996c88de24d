"""FFGG's synthetic quadratic (Example 1, Sec. 3.1-3.2):

    f_m(theta, w) = 1/2 ||H_m theta - b_m||^2 + 1/2 ||A_m theta + B_m w - y_m||^2

with H_m, A_m in R^{n x d_theta}, B_m in R^{n x d_w} drawn uniform on [0, 1] and divided by
their second dimension (Sec. 3.1), and *planted* right-hand sides (the paper does not say how
b_m and y_m are drawn; these are the authors' public Byzantine notebook's): theta_true ~ N(0, I), b_m = H_m theta_true, y_m = A_m theta_true
+ B_m v_m, v_m ~ N(0, I), so Assumption 2 holds (every client reaches loss 0 at theta_true).

Why a square factor: with z = (theta, w, 1) the loss is 1/2 ||D_m z||^2 for the stacked
design D_m = [[H_m, 0, -b_m], [A_m, B_m, -y_m]] (2n x (d_theta + d_w + 1)). Any R_m with
R_m^T R_m = D_m^T D_m gives ||D_m z|| = ||R_m z|| for every z, so the d_theta + d_w + 1 rows
of R_m are an exact, lossless stand-in for the 2n rows of D_m: every loss and gradient a
client computes is the paper's, at 1/130 of the memory (what makes 32 x 20,000 rows cheap to
ship through Ray). The rows are a client's training data (`data.dataset: ffgg_quadratic`),
kept in float64 so the runs can reach the exact solution.

The closed forms the server uses to *measure* (never to train): w_m*(theta) minimizes over w,
F_m(theta) = Q_m theta - r_m with Q_m the Schur complement of the w-block of K_m = R_m^T R_m,
theta* solves (sum Q_m) theta = sum r_m, L = max_m lambda_max(Q_m), L_w = max_m
lambda_max(B_m^T B_m), L_f = max_m lambda_max of the (theta, w) block of K_m.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from rayfl.config import ConfigError, DataConfig, PartitionConfig
from rayfl.rng import numpy_rng

DATASET = "ffgg_quadratic"


@dataclass(frozen=True)
class QuadraticShape:
    clients: int = 32
    n: int = 10_000
    d_theta: int = 100
    d_w: int = 50
    planted: bool = True

    @property
    def width(self) -> int:
        """Columns of a client's factor: theta, w and the constant 1."""
        return self.d_theta + self.d_w + 1


def client_design(shape: QuadraticShape, seed: int, client: int) -> np.ndarray:
    """D_m = [[H, 0, -b], [A, B, -y]] of one client, from its own seeded stream.

    Non-planted (`planted: false`): b_m, y_m uniform on [0, 1] (no common root, A2 fails)."""
    rng = numpy_rng(seed, "ffgg.quadratic", -1, client)
    n, dt, dw = shape.n, shape.d_theta, shape.d_w
    h = rng.random((n, dt)) / dt
    a = rng.random((n, dt)) / dt
    b_mat = rng.random((n, dw)) / dw
    if shape.planted:
        theta_true = numpy_rng(seed, "ffgg.quadratic.theta_true").standard_normal(dt)
        v = rng.standard_normal(dw)
        b, y = h @ theta_true, a @ theta_true + b_mat @ v
    else:
        b, y = rng.random(n), rng.random(n)
    top = np.hstack([h, np.zeros((n, dw)), -b[:, None]])
    bottom = np.hstack([a, b_mat, -y[:, None]])
    return np.vstack([top, bottom])


def client_factor(shape: QuadraticShape, seed: int, client: int) -> np.ndarray:
    """R_m with R_m^T R_m = D_m^T D_m: the client's data, (width x width) float64. Computed as
    Lambda^(1/2) V^T from the eigendecomposition of the Gram matrix (10x faster than a QR of
    D_m; the Gram is PSD and singular in the planted case, which rules out Cholesky)."""
    d = client_design(shape, seed, client)
    lam, vec = np.linalg.eigh(d.T @ d)
    return np.sqrt(np.clip(lam, 0.0, None))[:, None] * vec.T


def factors(shape: QuadraticShape, seed: int, cache_dir: Path | None = None) -> list[np.ndarray]:
    """Every client's factor; with `cache_dir`, read from / saved to one .npy per (shape, seed)
    there, since the full-size instance takes ~30 s to draw on a small machine."""
    path = None
    if cache_dir is not None:
        s = shape
        path = cache_dir / f"M{s.clients}_n{s.n}_t{s.d_theta}_w{s.d_w}_p{int(s.planted)}_seed{seed}.npy"
        if path.is_file():
            return list(np.load(path))
    rows = [client_factor(shape, seed, m) for m in range(shape.clients)]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, np.stack(rows))
        tmp.replace(path)
    return rows


@dataclass
class QuadraticOracle:
    """Exact quantities of the quadratic from the clients' factors, for metrics and step sizes.
    `grams[m]` is K_m = R_m^T R_m; blocks t (theta), w, c (constant)."""

    grams: list[np.ndarray]
    d_theta: int
    d_w: int

    @classmethod
    def from_factors(cls, rows: list[np.ndarray], d_theta: int) -> QuadraticOracle:
        grams = [r.T.astype(np.float64) @ r.astype(np.float64) for r in rows]
        return cls(grams, d_theta, grams[0].shape[0] - d_theta - 1)

    def _blocks(self, k: np.ndarray) -> tuple[np.ndarray, ...]:
        t, w = slice(0, self.d_theta), slice(self.d_theta, self.d_theta + self.d_w)
        c = self.d_theta + self.d_w
        return k[t, t], k[t, w], k[w, w], k[t, c], k[w, c]

    @cached_property
    def operators(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(Q_m, r_m) with F_m(theta) = Q_m theta - r_m (exact w_m*)."""
        out = []
        for k in self.grams:
            ktt, ktw, kww, kt, kw = self._blocks(k)
            sol = np.linalg.solve(kww, np.column_stack([ktw.T, kw]))
            q = ktt - ktw @ sol[:, :-1]
            r = -(kt - ktw @ sol[:, -1])
            out.append(((q + q.T) / 2, r))
        return out

    @cached_property
    def q_mean(self) -> np.ndarray:
        return np.mean([q for q, _ in self.operators], axis=0)

    @cached_property
    def r_mean(self) -> np.ndarray:
        return np.mean([r for _, r in self.operators], axis=0)

    @cached_property
    def theta_star(self) -> np.ndarray:
        return np.linalg.solve(self.q_mean, self.r_mean)

    def operator(self, theta: np.ndarray) -> np.ndarray:
        """F(theta) = (1/M) sum_m F_m(theta)."""
        return self.q_mean @ np.asarray(theta, np.float64) - self.r_mean

    def client_operator(self, m: int, theta: np.ndarray) -> np.ndarray:
        q, r = self.operators[m]
        return q @ np.asarray(theta, np.float64) - r

    def w_star(self, m: int, theta: np.ndarray) -> np.ndarray:
        _, ktw, kww, _, kw = self._blocks(self.grams[m])
        return -np.linalg.solve(kww, ktw.T @ np.asarray(theta, np.float64) + kw)

    def personalized_loss(self, theta: np.ndarray) -> float:
        """(1/M) sum_m min_w f_m(theta, w): the loss after exact fine-tuning."""
        total = 0.0
        for m, k in enumerate(self.grams):
            z = np.concatenate([theta, self.w_star(m, theta), [1.0]])
            total += 0.5 * float(z @ k @ z)
        return total / len(self.grams)

    def metrics(self, theta: np.ndarray) -> dict[str, float]:
        f = self.operator(theta)
        return {
            "F_norm": float(np.linalg.norm(f)),
            "dist_sq": float(np.sum((np.asarray(theta, np.float64) - self.theta_star) ** 2)),
        }

    @cached_property
    def L(self) -> float:
        """max_m lambda_max(Q_m): the smallest L with every F_m (1/L)-cocoercive (Assumption 1, eq. (4))."""
        return max(float(np.linalg.eigvalsh(q)[-1]) for q, _ in self.operators)

    @cached_property
    def L_w(self) -> float:
        """max_m lambda_max(B_m^T B_m): smoothness in w (gamma_w = 1 / L_w)."""
        return max(float(np.linalg.eigvalsh(self._blocks(k)[2])[-1]) for k in self.grams)

    @cached_property
    def L_f(self) -> float:
        """max_m lambda_max of the joint (theta, w) Hessian: the baselines' smoothness."""
        p = self.d_theta + self.d_w
        return max(float(np.linalg.eigvalsh(k[:p, :p])[-1]) for k in self.grams)


def oracle_from_dataset(dataset: object, d_theta: int) -> QuadraticOracle:
    """The oracle of a `ffgg_quadratic` FederatedDataset (the server's measuring view)."""
    x = dataset.train_x  # type: ignore[attr-defined]
    rows = [x[idx] for idx in dataset.client_train]  # type: ignore[attr-defined]
    return QuadraticOracle.from_factors(rows, d_theta)


@dataclass
class QuadraticConfig(DataConfig):
    """FFGG's synthetic quadratic (Example 1; rayfl.papers.ffgg.quadratic): one client per
    partition.num_clients, each with `n` rows per block, `d_theta` global and `d_w` personal
    coordinates; `planted` plants a common minimiser. Its metric is ||F(theta)||, so there is
    no test set."""

    dataset: str = DATASET
    # Rows per block of each client's quadratic (> 0).
    n: int = 10_000
    # Global coordinates theta (> 0).
    d_theta: int = 100
    # Personal coordinates w per client (> 0).
    d_w: int = 50
    # Plant a common minimiser theta_true, so every client reaches loss 0 there (Assumption 2).
    planted: bool = True

    def validate(self) -> None:
        super().validate()
        for key in ("n", "d_theta", "d_w"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}", f"must be > 0, got {getattr(self, key)}")

    def has_own_clients(self) -> bool:
        return True

    def planned_clients(self, partition: PartitionConfig) -> int | None:
        return partition.num_clients  # generated: exactly that many

    def splittable(self) -> bool:
        return False

    def has_labels(self) -> bool:
        return False  # the factors' rows; their labels are placeholders


def shape_from_config(data: QuadraticConfig, num_clients: int) -> QuadraticShape:
    return QuadraticShape(clients=num_clients, n=data.n, d_theta=data.d_theta, d_w=data.d_w, planted=data.planted)


def federated_quadratic(data: QuadraticConfig, seed: int, num_clients: int | None = None):  # -> FederatedDataset
    """`data.dataset: ffgg_quadratic` as a FederatedDataset: client m's training rows are its
    factor R_m (labels unused, all 0); no test set (the metric is ||F(theta)||, see the oracle)."""
    from rayfl.data.federated import FederatedDataset
    from rayfl.data.sources import data_root

    if num_clients is None:
        raise ConfigError("partition.num_clients", "the quadratic needs a number of clients to generate")
    shape = shape_from_config(data, num_clients)
    cache = data_root(data.data_dir) / DATASET if shape.n * shape.clients >= 100_000 else None
    rows = factors(shape, seed, cache)
    w = shape.width
    train_x = np.concatenate(rows).astype(np.float64)
    client_train = [np.arange(m * w, (m + 1) * w, dtype=np.int64) for m in range(shape.clients)]
    return FederatedDataset(
        name=DATASET,
        num_classes=2,
        input_shape=(w,),
        train_x=train_x,
        train_y=np.zeros(len(train_x), dtype=np.int64),
        test_x=np.zeros((0, w), dtype=np.float64),
        test_y=np.zeros(0, dtype=np.int64),
        client_train=client_train,
    )


def is_quadratic(dataset: object) -> bool:
    return getattr(dataset, "name", None) == DATASET
