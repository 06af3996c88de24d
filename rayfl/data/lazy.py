"""A Synthetic(alpha, beta) population generated on demand (`data.lazy: true`).

The eager dataset (rayfl.data.synthetic) materialises every client's rows on the driver and
ships them to the hosts: memory grows with the population (5.5 GB at 100,000 clients). Here
nothing per client exists until a host runs it: client k's rows come from its own stream
(seed, 'synthetic.lazy', client=k), so any host makes any client's data from three numbers
(seed, k, its size) and memory follows the clients of a round, not the population.

The only population-sized state is one int64 array of client sizes, drawn vectorised from
one stream (seed, 'synthetic.lazy.sizes') with the eager generator's size law; drawing each
size from the client's own stream, as the eager generator does, would cost ~40 us a client
(40 s at a million) before the first round. So a lazy population is a different draw of the
same distribution than the eager one with the same seed: a new dataset mode, not a faster
path to the same numbers.

The global test set (evaluated on the driver) is the held-out rows of the first
`data.eval_clients` clients, an unbiased sample since clients are i.i.d. in k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayfl.config import DataConfig
from rayfl.data.synthetic import draw_client, split_clients
from rayfl.rng import numpy_rng


def lazy_sizes(cfg: DataConfig, num_clients: int, seed: int) -> np.ndarray:
    """Every client's sample count: floor(lognormal(mu, sigma)) + min, capped at max."""
    raw = numpy_rng(seed, "synthetic.lazy.sizes").lognormal(cfg.size_mu, cfg.size_sigma, size=num_clients)
    return np.minimum(np.floor(raw) + cfg.min_client_samples, cfg.max_client_samples).astype(np.int64)


@dataclass
class LazySynthetic:
    """What a host needs to make any client's rows: the data config, the seed and the sizes
    (shipped once through the object store, read zero-copy)."""

    cfg: DataConfig
    seed: int
    sizes: np.ndarray  # int64 [K]: samples per client, train + test
    _shared: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def _constants(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The feature scales and Synthetic-IID's shared model, made once per process."""
        if self._shared is None:
            d, c = self.cfg.features, self.cfg.classes
            std = np.power(np.arange(1, d + 1, dtype=np.float64), -1.2 / 2)
            shared = numpy_rng(self.seed, "synthetic.iid")
            self._shared = (std, shared.normal(0.0, 1.0, size=(c, d)), shared.normal(0.0, 1.0, size=c))
        return self._shared

    def __getstate__(self) -> dict:
        return {"cfg": self.cfg, "seed": self.seed, "sizes": self.sizes, "_shared": None}

    def client_arrays(self, client: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Client `client`'s (train_x, train_y, test_x, test_y): its last n_test rows are its
        test set, as in the eager dataset's natural split."""
        n = int(self.sizes[client])
        std, w_iid, b_iid = self._constants()
        x, y = draw_client(numpy_rng(self.seed, "synthetic.lazy", client=int(client)), self.cfg, n, std, w_iid, b_iid)
        n_train = n - min(max(round(self.cfg.test_fraction * n), 1), n - 1)  # split_clients, for one
        return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


class LazyFederatedDataset:
    """The driver's view of a lazy population: the FederatedDataset attributes the engine reads,
    with `source` in place of row arrays and index sets (hosts make rows from it on demand).
    `train_x` / `train_y` hold no rows; `train_samples` counts the population's."""

    from_config = True  # made from the run's config alone

    def __init__(self, data: DataConfig, num_clients: int, seed: int):
        self.source = LazySynthetic(data, seed, lazy_sizes(data, num_clients, seed))
        self.name = f"synthetic_lazy({data.alpha:g},{data.beta:g})"
        self.num_classes = data.classes
        self.input_shape = (data.features,)
        n_train, _ = split_clients(self.source.sizes, data.test_fraction)
        self._train_sizes = n_train
        self.train_x = np.zeros((0, data.features), dtype=np.float32)
        self.train_y = np.zeros(0, dtype=np.int64)
        evals = [self.source.client_arrays(k)[2:] for k in range(min(num_clients, data.eval_clients))]
        self.test_x = np.concatenate([x for x, _ in evals])
        self.test_y = np.concatenate([y for _, y in evals])
        self.client_train = None  # no index sets: see `source`
        self.client_test = None
        self.server_train = None

    @property
    def num_clients(self) -> int:
        return len(self._train_sizes)

    @property
    def train_samples(self) -> int:
        return int(self._train_sizes.sum())

    def client_sizes(self) -> np.ndarray:
        """Training samples per client (>= 1 each: min_client_samples >= 2)."""
        return self._train_sizes

    def empty_clients(self) -> np.ndarray:
        return np.flatnonzero(self._train_sizes == 0)

    def class_matrix(self, split: str = "train") -> np.ndarray:
        """[num_clients, num_classes] label counts, generating every client once (slow for a
        large population, and only `rayfl partition` asks)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        col = 1 if split == "train" else 3
        out = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        for k in range(self.num_clients):
            out[k] = np.bincount(self.source.client_arrays(k)[col], minlength=self.num_classes)
        return out

    def summary(self) -> str:
        s = self._train_sizes
        return "\n".join([
            f"{self.name}: {self.num_clients} clients generated on demand, {self.num_classes} classes, input shape {self.input_shape}",
            f"client train sizes: min {s.min()} / median {np.median(s):g} / max {s.max()} (total {s.sum()})",
            f"global test: {len(self.test_y)} rows from the first {min(self.num_clients, self.source.cfg.eval_clients)} clients",
        ])

    def check(self) -> None:
        """Nothing to check: a lazy population has no index sets."""


class ClientIds:
    """The sorted ids a host holds, as a set without per-client objects (membership by binary
    search), in place of the eager host's {client: index array} dict."""

    def __init__(self, ids: np.ndarray):
        self.ids = np.asarray(ids, dtype=np.int64)
        if len(self.ids) > 1 and np.any(np.diff(self.ids) <= 0):
            self.ids = np.unique(self.ids)

    def __contains__(self, cid: object) -> bool:
        i = int(np.searchsorted(self.ids, cid))  # type: ignore[call-overload]
        return i < len(self.ids) and self.ids[i] == cid

    def __iter__(self):
        return (int(c) for c in self.ids)

    def __len__(self) -> int:
        return len(self.ids)
