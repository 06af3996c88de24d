"""A Synthetic(alpha, beta) population generated on demand (`data.lazy: true`).

The eager dataset (rayfl.data.synthetic) materialises every client's rows on the driver and
ships them to the hosts: memory grows with the population (5.5 GB at 100,000 clients). Here
nothing per client exists until a round touches it: client k's size is a function of (seed, k)
(rayfl.rng.client_normals) and its rows come from its own stream (seed, 'synthetic.lazy',
client=k), so any host makes any client's data from (seed, k) and a population of a billion
costs what a thousand do. Sizes follow the eager generator's law, floor(lognormal(mu, sigma)) +
min capped at max, drawn per client by a counter-based hash rather than from one stream, so a
lazy population is a different draw of the same distribution than the eager one with the same
seed: a dataset mode of its own, not a faster path to the same numbers.

The global test set (evaluated on the driver) is the held-out rows of the first
`data.eval_clients` clients, an unbiased sample since clients are i.i.d. in k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayfl.config import DataConfig
from rayfl.data.synthetic import draw_client, split_clients
from rayfl.rng import client_normals, numpy_rng

# A lazy population counts its training rows for the run's manifest only up to this size: the
# count is O(population), seconds at 10^8 before the first round.
COUNTED_UP_TO = 10_000_000


def lazy_sizes(cfg: DataConfig, clients: np.ndarray, seed: int) -> np.ndarray:
    """The sample counts (train + test) of `clients`: floor(lognormal(mu, sigma)) + min, capped
    at max, each from (seed, client) alone."""
    raw = np.exp(cfg.size_mu + cfg.size_sigma * client_normals(seed, "synthetic.lazy.sizes", clients))
    return np.minimum(np.floor(raw) + cfg.min_client_samples, cfg.max_client_samples).astype(np.int64)


@dataclass(frozen=True)
class LazySizes:
    """Training samples per client of a lazy population, indexable by an id or an id array like
    the eager dataset's size array, made on demand (O(1) a client, nothing stored)."""

    cfg: DataConfig
    seed: int
    num_clients: int

    def __len__(self) -> int:
        return self.num_clients

    def __getitem__(self, clients: int | np.ndarray) -> np.ndarray | np.int64:
        ids = np.asarray(clients, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_clients):
            raise IndexError(f"client ids must lie in [0, {self.num_clients})")
        n_train, _ = split_clients(lazy_sizes(self.cfg, ids.reshape(-1), self.seed), self.cfg.test_fraction)
        return n_train.reshape(ids.shape) if ids.ndim else n_train[0]

    def total(self, chunk: int = 1 << 22) -> int:
        """Every client's training samples summed, in chunks (O(population))."""
        return int(sum(int(self[np.arange(i, min(i + chunk, self.num_clients))].sum())
                       for i in range(0, self.num_clients, chunk)))


@dataclass
class LazySynthetic:
    """What a host needs to make any client's rows: the data config and the seed."""

    cfg: DataConfig
    seed: int
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
        return {"cfg": self.cfg, "seed": self.seed, "_shared": None}

    def client_arrays(self, client: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Client `client`'s (train_x, train_y, test_x, test_y): its last n_test rows are its
        test set, as in the eager dataset's natural split."""
        n = int(lazy_sizes(self.cfg, np.array([client]), self.seed)[0])
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
        self.source = LazySynthetic(data, seed)
        self._sizes = LazySizes(data, seed, num_clients)
        self.name = f"synthetic_lazy({data.alpha:g},{data.beta:g})"
        self.num_classes = data.classes
        self.input_shape = (data.features,)
        self.train_x = np.zeros((0, data.features), dtype=np.float32)
        self.train_y = np.zeros(0, dtype=np.int64)
        # copies of each client's held-out rows (views would keep every client's whole draw alive)
        evals = [tuple(a.copy() for a in self.source.client_arrays(k)[2:]) for k in range(min(num_clients, data.eval_clients))]
        self.test_x = np.concatenate([x for x, _ in evals])
        self.test_y = np.concatenate([y for _, y in evals])
        self.client_train = None  # no index sets: see `source`
        self.client_test = None
        self.server_train = None

    @property
    def num_clients(self) -> int:
        return self._sizes.num_clients

    @property
    def num_trainable(self) -> int:
        """Every client: each holds at least one training sample (min_client_samples >= 2)."""
        return self.num_clients

    @property
    def train_samples(self) -> int | None:
        """The population's training samples (None above COUNTED_UP_TO clients)."""
        return self._sizes.total() if self.num_clients <= COUNTED_UP_TO else None

    def client_sizes(self) -> LazySizes:
        """Training samples per client (>= 1 each: min_client_samples >= 2), made on demand."""
        return self._sizes

    def empty_clients(self) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)

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
        shown = min(self.num_clients, 100_000)
        s = self._sizes[np.arange(shown)]
        total = self.train_samples
        return "\n".join([
            f"{self.name}: {self.num_clients} clients generated on demand, {self.num_classes} classes, input shape {self.input_shape}",
            f"client train sizes{'' if shown == self.num_clients else f' (first {shown})'}: min {s.min()} / median "
            f"{np.median(s):g} / max {s.max()}" + (f" (total {total})" if total is not None else ""),
            f"global test: {len(self.test_y)} rows from the first {min(self.num_clients, self.source.cfg.eval_clients)} clients",
        ])

    def check(self) -> None:
        """Nothing to check: a lazy population has no index sets."""


class ClientIds:
    """The ids a host holds, as a set without per-client objects, in place of the eager host's
    {client: index array} dict: a range (a contiguous block, O(1) whatever its length) or
    sorted ids (membership by binary search)."""

    def __init__(self, ids: range | np.ndarray):
        self.range = ids if isinstance(ids, range) else None
        self.ids = None
        if self.range is None:
            self.ids = np.asarray(ids, dtype=np.int64)
            if len(self.ids) > 1 and np.any(np.diff(self.ids) <= 0):
                self.ids = np.unique(self.ids)

    def __contains__(self, cid: object) -> bool:
        if self.range is not None:
            return int(cid) in self.range  # type: ignore[call-overload]
        i = int(np.searchsorted(self.ids, cid))  # type: ignore[call-overload,arg-type]
        return i < len(self.ids) and self.ids[i] == cid  # type: ignore[arg-type,index]

    def __iter__(self):
        return iter(self.range) if self.range is not None else (int(c) for c in self.ids)  # type: ignore[union-attr]

    def __len__(self) -> int:
        return len(self.range if self.range is not None else self.ids)  # type: ignore[arg-type]
