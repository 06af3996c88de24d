"""Offline stand-ins for the FL literature's benchmark data, in their real shapes and sizes:
LEAF's FEMNIST (28x28 grayscale, 62 classes, one client per writer), CIFAR-10 (32x32 RGB,
10 classes) and LEAF's Shakespeare (80-character sequences, next-character labels over 80
symbols). What a benchmark of the networks these papers train needs is the arithmetic of
their shapes, not the pictures: these are generated from the seed, without a download, so
`rayfl bench femnist-cnn` runs on a machine with no network.

Images are class prototypes (a coarse random pattern per class, upsampled) plus per-sample
noise, so a convnet learns them; text follows one shared bigram chain with a per-client start
distribution, and the label is the chain's next character. Client k's samples come from its
own stream, so they do not depend on how many clients are generated. With
`partition.method: natural` each generated client is one federated client (a writer, a
role); any other partitioner pools them and splits the pool (CIFAR-10 with Dirichlet)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rayfl.config import ConfigError, DataConfig, PartitionConfig
from rayfl.rng import numpy_rng

# per `like`: input shape, classes, and the client-size law (lognormal mu, sigma; min; max)
SHAPES: dict[str, tuple[tuple[int, ...], int, tuple[float, float, int, int]]] = {
    # FEMNIST's 3,550 writers hold about 226 samples each: mean exp(5.27 + 0.5^2 / 2) = 220
    "femnist": ((1, 28, 28), 62, (5.27, 0.5, 10, 1000)),
    # CIFAR-10's 50,000 training images as 100 equal shares before a Dirichlet split
    "cifar10": ((3, 32, 32), 10, (0.0, 0.0, 500, 500)),
    # LEAF's roles hold thousands of lines; about 100 each keeps a round of 10 clients to seconds
    "shakespeare": ((80,), 80, (4.48, 0.5, 10, 500)),
}


@dataclass
class LookalikeConfig(DataConfig):
    """Data shaped like `like` (femnist, cifar10 or shakespeare), generated offline from the
    seed: partition.num_clients clients of floor(lognormal(`size_mu`, `size_sigma`)) +
    `min_client_samples` samples, at most `max_client_samples` (each None: `like`'s own law);
    the last `test_fraction` of each client's samples are its test set."""

    dataset: str = "lookalike"
    # The benchmark whose shapes are generated: femnist (28x28 grayscale, 62 classes), cifar10
    # (32x32 RGB, 10 classes) or shakespeare (80-character sequences, 80 symbols).
    like: Literal["femnist", "cifar10", "shakespeare"] = "femnist"
    # mu of each client's size floor(lognormal(mu, sigma)) + min_client_samples; null: like's own
    # law.
    size_mu: float | None = None
    # sigma of the client-size lognormal (>= 0); null: like's own law.
    size_sigma: float | None = None
    # The smallest client's samples (>= 2: one train, one test); null: like's own law.
    min_client_samples: int | None = None
    # The cap on a client's samples (>= min_client_samples); null: like's own law.
    max_client_samples: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.like not in SHAPES:
            raise ConfigError("data.like", f"must be one of {sorted(SHAPES)}, got {self.like!r}")
        mu, sigma, low, high = self.size_law()
        if sigma < 0:
            raise ConfigError("data.size_sigma", f"must be >= 0, got {sigma}")
        if low < 2:
            raise ConfigError("data.min_client_samples", "each client needs >= 2 samples (one train, one test)")
        if high < low:
            raise ConfigError("data.max_client_samples", "must be >= data.min_client_samples")
        if self.max_samples is not None:
            raise ConfigError("data.max_samples", "lookalike data are sized per client: use data.max_client_samples")

    def size_law(self) -> tuple[float, float, int, int]:
        """(mu, sigma, min, max) of the client sizes: the keys set, else `like`'s defaults."""
        default = SHAPES[self.like][2]
        given = (self.size_mu, self.size_sigma, self.min_client_samples, self.max_client_samples)
        mu, sigma, low, high = (d if g is None else g for g, d in zip(given, default, strict=True))
        return float(mu), float(sigma), int(low), int(high)

    def has_own_clients(self) -> bool:
        return True

    def planned_clients(self, partition: PartitionConfig) -> int | None:
        return partition.num_clients

    def generated_by_rayfl(self) -> bool:
        return True


def load_lookalike(cfg: LookalikeConfig, seed: int, num_clients: int | None = None):
    """`num_clients` generated clients as a train / test pool whose rows know their client."""
    if num_clients is None:
        raise ConfigError("partition.num_clients", "lookalike data need a number of clients to generate")
    shape, classes, _ = SHAPES[cfg.like]
    mu, sigma, low, high = cfg.size_law()
    sizes = np.empty(num_clients, dtype=np.int64)
    for k in range(num_clients):
        raw = numpy_rng(seed, "lookalike.size", client=k).lognormal(mu, sigma)
        sizes[k] = int(min(np.floor(raw) + low, high))
    dtype = np.int64 if cfg.like == "shakespeare" else np.float32
    draw = _text if cfg.like == "shakespeare" else _images
    shared = draw_shared(cfg.like, shape, classes, seed)

    def client(k: int, x: np.ndarray, y: np.ndarray) -> None:
        draw(numpy_rng(seed, "lookalike", client=k), shared, x, y)

    return split_as_drawn(client, sizes, shape, dtype, cfg.test_fraction, classes, f"lookalike({cfg.like})")


def split_as_drawn(draw: Callable[[int, np.ndarray, np.ndarray], None], sizes: np.ndarray, shape: tuple[int, ...],
                   dtype: type, test_fraction: float, classes: int, name: str) -> tuple[Any, Any]:
    """The (train, test) pools of clients drawn one at a time (`draw(k, x, y)` fills client k's
    rows), each client's last rows its test rows (rayfl.data.synthetic.split_clients), as
    `clients_as_pool` splits a pool of them all. Each client is drawn into a buffer of its own
    and copied into its place, so the build holds the two pools and one client, not the pool
    twice over (FEMNIST's 3,500 writers: 2.5 GB of images)."""
    from rayfl.data.datasets import ArrayDataset
    from rayfl.data.synthetic import split_clients

    n_train, n_test = split_clients(sizes, test_fraction)
    train = np.empty((int(n_train.sum()), *shape), dtype=dtype), np.empty(int(n_train.sum()), dtype=np.int64)
    test = np.empty((int(n_test.sum()), *shape), dtype=dtype), np.empty(int(n_test.sum()), dtype=np.int64)
    buffer = np.empty((int(sizes.max(initial=0)), *shape), dtype=dtype), np.empty(int(sizes.max(initial=0)), dtype=np.int64)
    at_train = at_test = 0
    for k, (n, t) in enumerate(zip(sizes.tolist(), n_train.tolist(), strict=True)):
        x, y = buffer[0][:n], buffer[1][:n]
        draw(k, x, y)
        for (px, py), rows, at in ((train, slice(0, t), at_train), (test, slice(t, n), at_test)):
            px[at:at + rows.stop - rows.start] = x[rows]
            py[at:at + rows.stop - rows.start] = y[rows]
        at_train, at_test = at_train + t, at_test + n - t
    clients = len(sizes)
    owners = np.arange(clients)
    return (ArrayDataset(*train, classes, name, groups=np.repeat(owners, n_train), num_groups=clients),
            ArrayDataset(*test, classes, name, groups=np.repeat(owners, n_test), num_groups=clients))


def draw_shared(like: str, shape: tuple[int, ...], classes: int, seed: int) -> np.ndarray:
    """What all clients share: image class prototypes [classes, *shape] (a 7x7 or 8x8 random
    pattern per class and channel, upsampled by 4), or the text's bigram chain as cumulative
    probabilities [80, 80]."""
    rng = numpy_rng(seed, "lookalike.shared")
    if like == "shakespeare":
        probs = rng.dirichlet(np.full(classes, 0.3), size=classes)
        return np.cumsum(probs, axis=1)
    c, h, w = shape
    coarse = rng.random((classes, c, h // 4, w // 4))
    return coarse.repeat(4, axis=2).repeat(4, axis=3).astype(np.float32)


def _images(rng: np.random.Generator, prototypes: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """n images in [0, 1]: 0.6 * the class prototype + 0.4 * uniform noise, uniform classes."""
    y[:] = rng.integers(0, len(prototypes), size=len(y))
    rng.random(x.shape, dtype=np.float32, out=x)
    x *= np.float32(0.4)
    x += np.float32(0.6) * prototypes[y]


def _text(rng: np.random.Generator, chain: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """n sequences of the bigram chain from a client-specific start distribution, each
    labelled with the chain's next character."""
    n, length = x.shape
    vocab = chain.shape[0]
    start = np.cumsum(rng.dirichlet(np.full(vocab, 0.5)))
    prev = np.minimum(np.searchsorted(start, rng.random(n)), vocab - 1)
    for t in range(length + 1):
        if t:
            prev = np.minimum((rng.random(n)[:, None] > chain[prev]).sum(axis=1), vocab - 1)
        if t < length:
            x[:, t] = prev
        else:
            y[:] = prev
