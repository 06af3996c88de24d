"""The Synthetic(alpha, beta) federated dataset of LEAF / FedProx (Li et al., MLSys 2020).

Client k draws u_k ~ N(0, alpha) and B_k ~ N(0, beta); its model W_k ~ N(u_k, 1) [C x d] and
b_k ~ N(u_k, 1) [C]; its feature mean v_k ~ N(B_k, 1) [d]; samples x ~ N(v_k, diag(j^-1.2))
and y = argmax(W_k x + b_k). Alpha controls how much the client models differ, beta how much
their inputs do. As in the reference code, the second argument of N(., .) is a standard
deviation. Each client has its own random stream, so client k's data does not depend on how
many clients are generated. `iid` gives FedProx's Synthetic-IID instead: every client
shares one W, b ~ N(0, 1) and x ~ N(0, diag(j^-1.2)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.config import ConfigError, DataConfig, PartitionConfig
from rayfl.rng import numpy_rng


@dataclass
class SyntheticConfig(DataConfig):
    """LEAF / FedProx Synthetic(`alpha`, `beta`) (or Synthetic-IID with `iid: true`):
    `features`-dimensional inputs, `classes` labels, one device per client (partition.num_clients
    of them with `partition.method: natural`), each with floor(lognormal(`size_mu`,
    `size_sigma`)) + `min_client_samples` samples, at most `max_client_samples`; the last
    `test_fraction` of each device's samples are its test set.

    `lazy: true` generates the population on demand (rayfl.data.lazy): hosts make a client's
    rows from its own seeded stream when it runs, so memory follows the clients of a round, not
    the population; the global test set is the held-out rows of the first `eval_clients`."""

    dataset: str = "synthetic"
    # How much the client models differ: u_k ~ N(0, alpha) (>= 0).
    alpha: float = 1.0
    # How much the client inputs differ: B_k ~ N(0, beta) (>= 0).
    beta: float = 1.0
    # FedProx's Synthetic-IID instead: one shared model and input law for every client.
    iid: bool = False
    # Input dimensions (> 0).
    features: int = 60
    # Labels (>= 2).
    classes: int = 10
    # mu of each device's size floor(lognormal(mu, sigma)) + min_client_samples.
    size_mu: float = 4.0
    # sigma of the device-size lognormal.
    size_sigma: float = 2.0
    # The smallest device's samples (>= 2: one train, one test).
    min_client_samples: int = 50
    # The cap on a device's samples (>= min_client_samples).
    max_client_samples: int = 2000
    # Generate the population on demand on the hosts, so memory follows a round's clients (needs
    # partition.method natural and server_fraction 0).
    lazy: bool = False
    # lazy only: the global test set is the held-out rows of the first this many clients (> 0).
    eval_clients: int = 1000

    def validate(self) -> None:
        super().validate()
        if self.alpha < 0 or self.beta < 0:
            raise ConfigError("data.alpha", "alpha and beta must be >= 0")
        for key in ("features", "eval_clients"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}", f"must be > 0, got {getattr(self, key)}")
        if self.classes < 2:
            raise ConfigError("data.classes", "must be >= 2")
        if self.min_client_samples < 2:
            raise ConfigError("data.min_client_samples", "each client needs >= 2 samples (one train, one test)")
        if self.max_client_samples < self.min_client_samples:
            raise ConfigError("data.max_client_samples", "must be >= data.min_client_samples")
        if self.max_samples is not None:
            raise ConfigError("data.max_samples", "Synthetic(alpha, beta) is sized per client: use data.max_client_samples")
        if self.lazy and self.server_fraction > 0:
            raise ConfigError("data.lazy", "a lazy population has no server share: set data.server_fraction: 0")

    def has_own_clients(self) -> bool:
        return True

    def planned_clients(self, partition: PartitionConfig) -> int | None:
        return partition.num_clients  # generated: exactly that many

    def splittable(self) -> bool:
        return not self.lazy  # a lazy population has no pool to split

    def check_partition(self, partition: PartitionConfig) -> None:
        if self.lazy and not partition.keeps_dataset_clients:
            raise ConfigError("data.lazy", f"a lazy population needs partition.method natural, not {partition.method!r}")
        super().check_partition(partition)

    def generated_by_rayfl(self) -> bool:
        return not self.lazy


def load_synthetic(cfg: SyntheticConfig, seed: int, num_clients: int | None = None):
    """`num_clients` devices as a train / test pool whose rows know their device (`groups`):
    kept as the clients with `natural`, pooled and split by any other partitioner. A lazy
    population is a LazyFederatedDataset (rows made on the hosts)."""

    if num_clients is None:
        raise ConfigError("partition.num_clients", "Synthetic(alpha, beta) needs a number of clients to generate")
    if cfg.lazy:
        from rayfl.data.lazy import LazyFederatedDataset

        return LazyFederatedDataset(cfg, num_clients, seed)
    gen = generate_synthetic(cfg, num_clients, seed)
    return clients_as_pool(gen.x, gen.y, gen.sizes, cfg.test_fraction, cfg.classes, f"synthetic({cfg.alpha:g},{cfg.beta:g})")


def clients_as_pool(x: np.ndarray, y: np.ndarray, sizes: np.ndarray, test_fraction: float, classes: int,
                    name: str) -> tuple[Any, Any]:
    """Generated clients' rows (contiguous per client, `sizes` each) as (train, test) pools
    whose rows know their client: the last `split_clients` rows of each client are its test
    rows."""
    from rayfl.data.datasets import ArrayDataset

    n_train, _ = split_clients(sizes, test_fraction)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    is_test = (np.arange(len(y)) - offsets[owner]) >= n_train[owner]
    clients = len(sizes)
    return (
        ArrayDataset(x[~is_test], y[~is_test], classes, name, groups=owner[~is_test], num_groups=clients),
        ArrayDataset(x[is_test], y[is_test], classes, name, groups=owner[is_test], num_groups=clients),
    )


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
    raw = rng.lognormal(cfg.size_mu, cfg.size_sigma)
    # Cap before the int conversion: a heavy lognormal tail can exceed the int64 range.
    return int(min(np.floor(raw) + cfg.min_client_samples, cfg.max_client_samples))


def generate_synthetic(cfg: DataConfig, num_clients: int, seed: int) -> SyntheticClients:
    """Generate `num_clients` Synthetic(alpha, beta) clients with their own sizes."""
    if cfg.min_client_samples < 2:
        raise ConfigError(
            "data.min_client_samples", "must be >= 2 so every client has a train and a test sample"
        )
    d, c = cfg.features, cfg.classes
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
    d, c = cfg.features, cfg.classes
    u = rng.normal(0.0, cfg.alpha)
    b_mean = rng.normal(0.0, cfg.beta)
    w = rng.normal(u, 1.0, size=(c, d))
    b = rng.normal(u, 1.0, size=c)
    v = rng.normal(b_mean, 1.0, size=d)
    if cfg.iid:  # FedProx's Synthetic-IID: one model, one input distribution
        w, b, v = w_iid, b_iid, np.zeros(d)
    x = v + rng.standard_normal((n, d)) * std
    # softmax is monotone, so argmax(softmax(z)) == argmax(z).
    return x.astype(np.float32), np.argmax(x @ w.T + b, axis=1).astype(np.int64)


def split_clients(sizes: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-client (train, test) counts: round(test_fraction * n) test samples, at least one
    of each. Samples within a client are i.i.d., so the last n_test rows can be the test part."""
    n_test = np.clip(np.round(test_fraction * sizes).astype(np.int64), 1, sizes - 1)
    return sizes - n_test, n_test
