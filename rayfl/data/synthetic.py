"""The Synthetic(alpha, beta) federated dataset of LEAF / FedProx (Li et al., MLSys 2020).

Client k draws u_k ~ N(0, alpha) and B_k ~ N(0, beta); its model W_k ~ N(u_k, 1) [C x d] and
b_k ~ N(u_k, 1) [C]; its feature mean v_k ~ N(B_k, 1) [d]; samples x ~ N(v_k, diag(j^-1.2))
and y = argmax(W_k x + b_k). Alpha controls how much the client models differ, beta how much
their inputs do. As in the reference code, the second argument of N(., .) is a standard
deviation. Each client has its own random stream, so client k's data does not depend on how
many clients are generated. `synthetic_iid` gives FedProx's Synthetic-IID instead: every client
shares one W, b ~ N(0, 1) and x ~ N(0, diag(j^-1.2)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfl.config import ConfigError, DataConfig
from rayfl.rng import numpy_rng


@dataclass
class SyntheticClients:
    """All clients' samples, contiguous per client: client k owns rows offsets[k]:offsets[k+1]."""

    x: np.ndarray  # float32 [N, d]
    y: np.ndarray  # int64 [N]
    sizes: np.ndarray  # int64 [K]

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)


def client_size(rng: np.random.Generator, cfg: DataConfig) -> int:
    """int(lognormal(mu, sigma)) + min_samples, capped at max_samples."""
    raw = rng.lognormal(cfg.synthetic_size_mu, cfg.synthetic_size_sigma)
    # Cap before the int conversion: a heavy lognormal tail can exceed the int64 range.
    return int(min(np.floor(raw) + cfg.synthetic_min_samples, cfg.synthetic_max_samples))


def generate_synthetic(cfg: DataConfig, num_clients: int, seed: int) -> SyntheticClients:
    """Generate `num_clients` Synthetic(alpha, beta) clients with their own sizes."""
    if cfg.synthetic_min_samples < 2:
        raise ConfigError(
            "data.synthetic_min_samples", "must be >= 2 so every client has a train and a test sample"
        )
    d, c = cfg.synthetic_features, cfg.synthetic_classes
    std = np.power(np.arange(1, d + 1, dtype=np.float64), -1.2 / 2)  # sqrt of the diagonal covariance
    xs, ys, sizes = [], [], np.empty(num_clients, dtype=np.int64)
    shared = numpy_rng(seed, "synthetic.iid")
    w_iid, b_iid = shared.normal(0.0, 1.0, size=(c, d)), shared.normal(0.0, 1.0, size=c)
    for k in range(num_clients):
        rng = numpy_rng(seed, "synthetic", client=k)
        n = client_size(rng, cfg)
        x, y = draw_client(rng, cfg, n, std, w_iid, b_iid)
        xs.append(x)
        ys.append(y)
        sizes[k] = n
    return SyntheticClients(np.concatenate(xs), np.concatenate(ys), sizes)


def draw_client(
    rng: np.random.Generator, cfg: DataConfig, n: int, std: np.ndarray, w_iid: np.ndarray, b_iid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One client's n samples (float32 x, int64 y) from its own stream, after its size was
    drawn: shared by the eager generator and the lazy population (rayfl.data.lazy)."""
    d, c = cfg.synthetic_features, cfg.synthetic_classes
    u = rng.normal(0.0, cfg.synthetic_alpha)
    b_mean = rng.normal(0.0, cfg.synthetic_beta)
    w = rng.normal(u, 1.0, size=(c, d))
    b = rng.normal(u, 1.0, size=c)
    v = rng.normal(b_mean, 1.0, size=d)
    if cfg.synthetic_iid:  # FedProx's Synthetic-IID: one model, one input distribution
        w, b, v = w_iid, b_iid, np.zeros(d)
    x = v + rng.standard_normal((n, d)) * std
    # softmax is monotone, so argmax(softmax(z)) == argmax(z).
    return x.astype(np.float32), np.argmax(x @ w.T + b, axis=1).astype(np.int64)


def split_clients(sizes: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-client (train, test) counts: round(test_fraction * n) test samples, at least one
    of each. Samples within a client are i.i.d., so the last n_test rows can be the test part."""
    n_test = np.clip(np.round(test_fraction * sizes).astype(np.int64), 1, sizes - 1)
    return sizes - n_test, n_test
