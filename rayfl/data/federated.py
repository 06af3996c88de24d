"""The federated view of a dataset: global arrays plus per-client (and server) index sets.

Clients hold indices, not copies, so the engine can ship the arrays once through the object
store and hand each host just the index arrays of its clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.config import ConfigError, DataConfig, PartitionConfig
from rayfl.data.datasets import ArrayDataset
from rayfl.data.errors import DatasetError
from rayfl.data.partition import (
    equal_test_split,
    groups_from_owner,
    partition_indices,
    proportional_test_split,
    split_server,
)
from rayfl.data.rows import select
from rayfl.rng import numpy_rng

if TYPE_CHECKING:
    from rayfl.data.mapped import MappedArrays


@dataclass
class FederatedDataset:
    """Train / test arrays and who owns which rows. Index arrays are sorted int64."""

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    train_x: np.ndarray  # or a rayfl.data.rows.FileRows, which the hosts read (data.read_on_hosts)
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    client_train: list[np.ndarray]
    client_test: list[np.ndarray] | None = None
    server_train: np.ndarray | None = None
    # the file the row arrays are views of (a dataset cache entry), so hosts on this machine
    # can map it rather than receive a copy (rayfl.engine.hosts)
    mapped: MappedArrays | None = field(default=None, repr=False, compare=False)
    # built from the run's config (a resumed run builds it again), not handed in from Python
    from_config: bool = field(default=False, repr=False, compare=False)
    # labels metrics do not count (a language model's OOV / BOS / EOS tokens)
    excluded_targets: tuple[int, ...] = ()

    def __getstate__(self) -> dict:
        # pickled, the arrays travel as data; the file they were mapped from may not be there
        return {**self.__dict__, "mapped": None}

    @property
    def num_clients(self) -> int:
        """Clients that hold training rows (one index array each)."""
        return len(self.client_train)

    def client_sizes(self) -> np.ndarray:
        """Training samples per client."""
        return np.array([len(i) for i in self.client_train], dtype=np.int64)

    def empty_clients(self) -> np.ndarray:
        """Ids of clients without training samples (never sampled to train)."""
        return np.flatnonzero(self.client_sizes() == 0)

    @property
    def num_trainable(self) -> int:
        """Clients holding at least one training sample."""
        return self.num_clients - len(self.empty_clients())

    def class_matrix(self, split: str = "train") -> np.ndarray:
        """[num_clients, num_classes] label counts of each client's train or test set."""
        if split == "train":
            parts, labels = self.client_train, self.train_y
        elif split == "test":
            if self.client_test is None:
                raise ValueError("this dataset has no per-client test sets (partition.client_test is 'none')")
            parts, labels = self.client_test, self.test_y
        else:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return _count_matrix(parts, labels, self.num_classes)

    def summary(self) -> str:
        """A few human-readable lines for logs and `rayfl partition`."""
        sizes = self.client_sizes()
        lines = [
            f"{self.name}: {self.num_clients} clients, {self.num_classes} classes, input shape {self.input_shape}",
            f"client train sizes: min {sizes.min()} / median {np.median(sizes):g} / max {sizes.max()} "
            f"(total {sizes.sum()})",
            f"server train: {0 if self.server_train is None else len(self.server_train)}; "
            f"global test: {len(self.test_y)}",
        ]
        empty = self.empty_clients()
        if len(empty):
            shown = ", ".join(str(c) for c in empty[:20]) + (", ..." if len(empty) > 20 else "")
            lines.append(f"empty clients: {len(empty)} hold no training sample and are never sampled to train ({shown})")
        if self.client_test is not None:
            t = np.array([len(i) for i in self.client_test])
            lines.append(f"client test sizes: min {t.min()} / median {np.median(t):g} / max {t.max()} (total {t.sum()})")
        return "\n".join(lines)

    def check(self) -> None:
        """Raise ValueError unless every index set is sorted, in range and disjoint."""
        _check_disjoint(
            self.client_train + ([self.server_train] if self.server_train is not None else []),
            len(self.train_y),
            "train",
        )
        if self.client_test is not None:
            _check_disjoint(self.client_test, len(self.test_y), "test")


def build_federated_dataset(data: DataConfig, partition: PartitionConfig, seed: int) -> FederatedDataset:
    """Load or generate `data.dataset` through its registry entry, carve out the server's share
    and split the rest across clients with `partition.method`, all from seeded streams of `seed`
    (`data.seed` instead, when set). A dataset with its own clients keeps them under `natural`."""
    from rayfl.data.datasets import as_pool

    seed = data.seed if data.seed is not None else seed  # data.seed pins the split
    loaded = load_entry(data, seed, partition.num_clients)
    if hasattr(loaded, "client_train"):  # the dataset made its clients itself
        if not partition.keeps_dataset_clients:
            raise ConfigError("partition.method", f"{data.dataset!r} comes with its own clients; use partition.method: natural")
        if getattr(loaded, "source", None) is not None:  # a lazy population: no rows here to check
            return loaded
        fd = loaded
    else:
        train, test = as_pool(loaded, data, seed)
        if partition.keeps_dataset_clients:
            fd = _natural_from_pool(train, test, data, partition, seed)
        else:
            fd = _build_from_pool(train.name, train.num_classes, train.x, train.y, test.x, test.y, data, partition, seed)
    fd.check()
    return fd


def load_entry(data: DataConfig, seed: int, num_clients: int | None) -> Any:
    """What the dataset's registered loader returns for this config: `loader(data, seed,
    **data.kwargs)`, with `num_clients=` for a loader that generates its own clients (one that
    takes that parameter). A loader that raises is a one-line error naming data.dataset."""
    from rayfl.registry import DATASETS

    load = DATASETS.get(data.dataset).load()
    kwargs = dict(getattr(data, "kwargs", {}))
    if _takes_num_clients(load):
        kwargs["num_clients"] = num_clients
    try:
        return load(data, seed, **kwargs)
    except (ConfigError, DatasetError):
        raise
    except Exception as e:
        raise ConfigError("data.dataset", f"loading {data.dataset!r} failed: {type(e).__name__}: {' '.join(str(e).split())}") from e


def generates_clients(data: DataConfig) -> bool:
    """Whether the dataset's loader generates a number of clients (takes `num_clients`, like
    synthetic), so it has no pool without a partition's client count."""
    from rayfl.registry import DATASETS

    return _takes_num_clients(DATASETS.get(data.dataset).load())


def _takes_num_clients(load: Any) -> bool:
    import inspect

    try:
        return "num_clients" in inspect.signature(load).parameters
    except (TypeError, ValueError):
        return False


def _natural_from_pool(train: ArrayDataset, test: ArrayDataset, data: DataConfig, partition: PartitionConfig, seed: int) -> FederatedDataset:
    """The pool's own clients (`groups`): each keeps its train rows, its test rows are its test
    set, and with `server_fraction` each hands floor(fraction * n_k) random train rows to the
    server, so the server's share is spread over all clients and nobody is left empty."""
    if train.groups is None:
        raise ConfigError("partition.method", f"'natural' keeps a dataset's own clients; {data.dataset!r} has none here "
                          "(a file dataset gets them from data.client_column)")
    count = train.num_groups if train.num_groups is not None else 1 + int(max(
        train.groups.max(initial=-1), -1 if test.groups is None else test.groups.max(initial=-1)))
    # the same seeded choice of clients for the train and the test rows
    client_train = partition_indices(train.y, partition, numpy_rng(seed, "partition"), train.groups, count)
    client_test = None
    if test.groups is not None:
        client_test = partition_indices(test.y, partition, numpy_rng(seed, "partition"), test.groups, count)
    server = None
    if data.server_fraction > 0:
        owner = np.full(len(train), -1, dtype=np.int64)
        for k, idx in enumerate(client_train):
            owner[idx] = k
        kept = owner >= 0
        n_train = np.array([len(i) for i in client_train], dtype=np.int64)
        mask = np.zeros(len(owner), dtype=bool)
        mask[kept] = _natural_server_mask(owner[kept], n_train, data.server_fraction, numpy_rng(seed, "data.server"))
        client_train = groups_from_owner(np.where(mask, -1, owner), len(client_train))
        server = np.flatnonzero(mask).astype(np.int64)
    return _compact(FederatedDataset(
        name=train.name,
        num_classes=train.num_classes,
        input_shape=train.input_shape,
        train_x=train.x,
        train_y=train.y,
        test_x=test.x,
        test_y=test.y,
        client_train=client_train,
        client_test=client_test,
        server_train=server,
    ))


def _build_from_pool(
    name: str,
    num_classes: int,
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    data: DataConfig,
    partition: PartitionConfig,
    seed: int,
) -> FederatedDataset:
    server, pool = split_server(len(train_y), data.server_fraction, numpy_rng(seed, "data.server"))
    if server is None:  # the pool is every row, so positions in it are the rows (no copies: 8 bytes a row each)
        del pool
        clients = partition_indices(train_y, partition, numpy_rng(seed, "partition"))
    else:
        local = partition_indices(train_y[pool], partition, numpy_rng(seed, "partition"))
        clients = [pool[i] for i in local]  # pool is sorted, so each stays sorted
    client_test = None
    if partition.client_test == "proportional":
        counts = _count_matrix(clients, train_y, num_classes)
        client_test = proportional_test_split(counts, test_y, numpy_rng(seed, "partition.test"))
    elif partition.client_test == "equal":
        client_test = equal_test_split(len(clients), len(test_y), partition.client_test_size, numpy_rng(seed, "partition.test"))
    fd = FederatedDataset(
        name=name,
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in train_x.shape[1:]),
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        client_train=clients,
        client_test=client_test,
        server_train=server,
    )
    return _compact(fd)


def _natural_server_mask(owner: np.ndarray, n_train: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """With natural clients, each client hands floor(fraction * n_k) random train rows to the
    server, so the server's share is spread over all clients and nobody is left empty."""
    mask = np.zeros(len(owner), dtype=bool)
    if fraction <= 0:
        return mask
    take = np.floor(fraction * n_train).astype(np.int64)
    order = np.lexsort((rng.random(len(owner)), owner))  # random order within each client
    starts = np.concatenate([[0], np.cumsum(n_train)])
    rank = np.empty(len(owner), dtype=np.int64)
    rank[order] = np.arange(len(owner)) - starts[owner[order]]
    mask[rank < take[owner]] = True
    return mask


def _compact(fd: FederatedDataset) -> FederatedDataset:
    """Drop training rows nobody owns (e.g. quantity_skew uses 5,180 of 60,000) and remap
    indices, so the engine never ships unused data."""
    n = len(fd.train_y)
    owned = np.zeros(n, dtype=bool)  # a mask, not np.unique: a 1,000,000-row table's unique took 56 MB
    for idx in fd.client_train + ([fd.server_train] if fd.server_train is not None else []):
        owned[idx] = True
    used = np.flatnonzero(owned)
    if len(used) == n:
        return fd

    def remap(idx: np.ndarray) -> np.ndarray:
        return np.searchsorted(used, idx).astype(np.int64)

    fd.train_x, fd.train_y = select(fd.train_x, used), fd.train_y[used]  # rows still in their files stay there
    fd.client_train = [remap(i) for i in fd.client_train]
    if fd.server_train is not None:
        fd.server_train = remap(fd.server_train)
    return fd


def _count_matrix(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    m = len(parts)
    if m == 0:
        return np.zeros((0, num_classes), dtype=np.int64)
    owner = np.repeat(np.arange(m), [len(p) for p in parts])
    flat = np.concatenate(parts).astype(np.int64)
    return np.bincount(owner * num_classes + labels[flat], minlength=m * num_classes).reshape(m, num_classes)


def _check_disjoint(parts: list[np.ndarray], n: int, what: str) -> None:
    for k, p in enumerate(parts):
        if p.dtype != np.int64 or p.ndim != 1:
            raise ValueError(f"{what} index set {k} must be a 1-D int64 array, got {p.dtype} {p.shape}")
        if len(p) and (p[0] < 0 or p[-1] >= n or np.any(np.diff(p) <= 0)):
            raise ValueError(f"{what} index set {k} is not sorted, unique and within [0, {n})")
    if parts and n and np.bincount(np.concatenate(parts), minlength=n).max(initial=0) > 1:
        raise ValueError(f"{what} index sets overlap")
