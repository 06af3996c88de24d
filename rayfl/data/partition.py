"""Partitioners: how a pool of labelled samples is split across clients.

Each partitioner is a pure function of (labels, num_clients, cfg, rng) returning one sorted
int64 index array per client, all disjoint. Its only randomness is `rng`, so a partition is
reproducible from the run seed. They are registered in rayfl.registry.PARTITIONERS, each with
its config class (`partition.alpha` is Dirichlet's), exactly as a user's partitioner would be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rayfl.config import ConfigError, PartitionConfig
from rayfl.registry import PARTITIONERS

DIRICHLET_MAX_TRIES = 1000


def partition_indices(
    labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
    groups: np.ndarray | None = None, num_groups: int | None = None,
) -> list[np.ndarray]:
    """Split `labels`' positions across `cfg.num_clients` clients with the partitioner
    `cfg.method` (`groups`: the pool's own client of each sample as codes below `num_groups`,
    for `natural`). A user's partitioner that returns the wrong number of parts, or overlapping
    or out-of-range indices, is a ConfigError at partition.method."""
    split = PARTITIONERS.get(cfg.method).load()
    extra: dict[str, Any] = dict(getattr(cfg, "kwargs", {}))
    if cfg.keeps_dataset_clients:
        extra.update(groups=groups, num_groups=num_groups)
    labels = np.asarray(labels, dtype=np.int64)
    try:
        parts = split(labels, cfg.num_clients, cfg, rng, **extra)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError("partition.method", f"partitioner {cfg.method!r} failed: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from e
    if not cfg.keeps_dataset_clients and len(parts) != cfg.num_clients:
        raise ConfigError("partition.method", f"partitioner {cfg.method!r} returned {len(parts)} parts for {cfg.num_clients} clients")
    out = [np.sort(np.asarray(p, dtype=np.int64).reshape(-1)) for p in parts]
    owned = np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)  # a sort: np.unique's hash table is ~7x the memory
    if len(owned) and (owned[0] < 0 or owned[-1] >= len(labels)):
        raise ConfigError("partition.method", f"partitioner {cfg.method!r} returned indices outside [0, {len(labels)})")
    if np.any(owned[1:] == owned[:-1]):
        raise ConfigError("partition.method", f"partitioner {cfg.method!r} gave a sample to more than one client")
    return out


def groups_from_owner(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Turn a per-sample owner array (-1 = unassigned) into sorted per-client index arrays."""
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner[owner >= 0], minlength=num_clients)
    start = int(np.count_nonzero(owner < 0))
    bounds = start + np.concatenate([[0], np.cumsum(counts)])
    return [order[bounds[k] : bounds[k + 1]].astype(np.int64) for k in range(num_clients)]


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts proportional to `weights` that sum exactly to `total` (Hamilton's method)."""
    weights = np.asarray(weights, dtype=np.float64)
    s = weights.sum()
    if total == 0 or s <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    quota = weights / s * total
    counts = np.floor(quota).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        # Stable order: ties go to the lower index, so the result is deterministic.
        counts[np.argsort(-(quota - counts), kind="stable")[:short]] += 1
    return counts


def _need_samples(n: int, num_clients: int) -> None:
    if n < num_clients:
        raise ConfigError("partition.num_clients", f"{num_clients} clients but the pool has only {n} samples")


# --------------------------------------------------------------------------- schemes


@dataclass
class NaturalConfig(PartitionConfig):
    """The dataset's own clients: Synthetic(alpha, beta)'s devices, EMNIST's writers, or one
    client per distinct value of a file dataset's `data.client_column` (`num_clients` of them,
    a seeded choice; null keeps all)."""

    method: str = "natural"
    keeps_dataset_clients: ClassVar[bool] = True


@dataclass
class DirichletConfig(PartitionConfig):
    """Each class is split across clients with proportions ~ Dir(`alpha`) (smaller is more
    skewed; 0.1 to 1 is the usual range), redrawn until every client has `min_size` samples."""

    method: str = "dirichlet"
    # The Dirichlet concentration of each class's split across clients (> 0): smaller is more
    # skewed; 0.1-1 is the usual range.
    alpha: float = 0.5
    # The split is redrawn until every client has at least this many samples (>= 0).
    min_size: int = 10

    def validate(self) -> None:
        super().validate()
        if not self.alpha > 0:
            raise ConfigError("partition.alpha", f"Dirichlet concentration must be > 0, got {self.alpha}")
        if self.min_size < 0:
            raise ConfigError("partition.min_size", f"must be >= 0, got {self.min_size}")


@dataclass
class QuantitySkewConfig(PartitionConfig):
    """One random client gets `big_client_size` samples, every other `small_client_size`."""

    method: str = "quantity_skew"
    # Samples of the one random big client (> 0).
    big_client_size: int = 5000
    # Samples of every other client (> 0).
    small_client_size: int = 20

    def validate(self) -> None:
        super().validate()
        for key in ("big_client_size", "small_client_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"partition.{key}", f"must be > 0, got {getattr(self, key)}")


@dataclass
class DominantClassConfig(PartitionConfig):
    """Client i's data is a fraction `rho` of class i mod C, the rest spread over the other
    classes; `samples_per_client` each (null: pool // clients). rho = 1/C is IID."""

    method: str = "dominant_class"
    # The fraction of client i's data from its dominant class i mod C, in [0, 1]; the rest spread
    # over the next classes (1/C is IID).
    rho: float = 0.8
    # Samples per client (> 0); null: pool // clients.
    samples_per_client: int | None = None

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.rho <= 1:
            raise ConfigError("partition.rho", f"must be in [0, 1], got {self.rho}")
        if self.samples_per_client is not None and self.samples_per_client <= 0:
            raise ConfigError("partition.samples_per_client", f"must be > 0, got {self.samples_per_client}")


@dataclass
class ShardsConfig(PartitionConfig):
    """Sort by label, cut into num_clients x `shards_per_client` shards, give each client
    `shards_per_client` random ones (2 is McMahan et al.'s pathological non-IID)."""

    method: str = "shards"
    # Label-sorted shards each client gets (> 0); 2 is McMahan et al.'s pathological non-IID.
    shards_per_client: int = 2

    def validate(self) -> None:
        super().validate()
        if self.shards_per_client <= 0:
            raise ConfigError("partition.shards_per_client", f"must be > 0, got {self.shards_per_client}")


@PARTITIONERS.register("natural", config=NaturalConfig, summary="The dataset's own clients (generated devices, writers, a client column)", origin="built-in")
def natural(labels: np.ndarray, num_clients: int | None, cfg: PartitionConfig, rng: np.random.Generator,
            groups: np.ndarray | None = None, num_groups: int | None = None) -> list[np.ndarray]:
    """One client per group (a generated device, a writer: codes 0..num_groups-1), in code
    order; `num_clients` of them (a seeded choice, kept in order), or all when None."""
    if groups is None:
        raise ConfigError("partition.method", "'natural' keeps a dataset's own clients; this pool has none (set data.client_column)")
    groups = np.asarray(groups, dtype=np.int64)
    count = num_groups if num_groups is not None else (int(groups.max()) + 1 if len(groups) else 0)
    keep = np.arange(count)
    if num_clients is not None and num_clients < count:
        keep = np.sort(rng.choice(count, num_clients, replace=False))
    code = np.full(count, -1, dtype=np.int64)
    code[keep] = np.arange(len(keep))
    return groups_from_owner(code[groups], len(keep))


@PARTITIONERS.register("iid", config=PartitionConfig, summary="IID: a random permutation cut into near-equal parts", origin="built-in")
def iid(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into near-equal parts."""
    _need_samples(len(labels), num_clients)
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


@PARTITIONERS.register("dirichlet", config=DirichletConfig, summary="Label skew: per-class proportions ~ Dir(alpha) (Li et al., ICDE 2022)", origin="built-in")
def dirichlet(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Label skew: each class is split across clients with proportions ~ Dir(alpha), redrawn
    until every client has at least `min_size` samples (Li et al., ICDE'22)."""
    n, m = len(labels), num_clients
    if cfg.min_size * m > n:
        raise ConfigError(
            "partition.min_size", f"{m} clients x min_size {cfg.min_size} exceeds the pool's {n} samples"
        )
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    owner = np.empty(n, dtype=np.int64)
    clients = np.arange(m)
    for _ in range(DIRICHLET_MAX_TRIES):
        for idx in by_class:
            p = rng.dirichlet(np.full(m, cfg.alpha))
            cuts = np.minimum(np.floor(np.cumsum(p) * len(idx)).astype(np.int64), len(idx))
            cuts[-1] = len(idx)  # the cumulative sum may end a rounding error below 1
            counts = np.diff(cuts, prepend=0)
            owner[rng.permutation(idx)] = np.repeat(clients, counts)
        if np.bincount(owner, minlength=m).min() >= cfg.min_size:
            return groups_from_owner(owner, m)
    raise ConfigError(
        "partition.min_size",
        f"no Dirichlet(alpha={cfg.alpha}) draw in {DIRICHLET_MAX_TRIES} tries gave all {m} clients at least "
        f"{cfg.min_size} of the {n} samples; lower partition.min_size, raise partition.alpha or use fewer clients",
    )


@PARTITIONERS.register("quantity_skew", config=QuantitySkewConfig, summary="One big client, the rest small, IID labels (ComFedL's MNIST)", origin="built-in")
def quantity_skew(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """ComFedL's imbalanced MNIST: one random client gets `big_client_size` samples, every
    other client `small_client_size`, all drawn IID without replacement."""
    m = num_clients
    sizes = np.full(m, cfg.small_client_size, dtype=np.int64)
    big = int(rng.integers(m))
    sizes[big] = cfg.big_client_size
    total = int(sizes.sum())
    if total > len(labels):
        raise ConfigError(
            "partition.big_client_size",
            f"partition.big_client_size ({cfg.big_client_size}) + (partition.num_clients - 1) x "
            f"partition.small_client_size ({m - 1} x {cfg.small_client_size}) = {total} exceeds the "
            f"pool's {len(labels)} samples",
        )
    # The big client takes the first block of the shuffled pool, then the others in id order.
    chosen = rng.permutation(len(labels))[:total]
    order = np.concatenate([[big], np.delete(np.arange(m), big)])
    owner = np.full(len(labels), -1, dtype=np.int64)
    owner[chosen] = np.repeat(order, sizes[order])
    return groups_from_owner(owner, m)


def dominant_class_counts(num_clients: int, num_classes: int, n: int, rho: float) -> np.ndarray:
    """[clients, classes] sample counts: client i takes round(rho * n) from class i mod C and
    splits the rest as evenly as possible over the other classes (the remainder goes to the
    classes right after the dominant one), so every client has exactly n samples."""
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    own = int(np.floor(rho * n + 0.5))
    rest = n - own
    others = num_classes - 1
    for i in range(num_clients):
        c = i % num_classes
        counts[i, c] = own
        if others:
            share, extra = divmod(rest, others)
            for j in range(1, num_classes):
                counts[i, (c + j) % num_classes] = share + (1 if j <= extra else 0)
        else:
            counts[i, c] = n
    return counts


@PARTITIONERS.register("dominant_class", config=DominantClassConfig, summary="Client i takes a fraction rho of class i mod C (ComFedL's CIFAR-10)", origin="built-in")
def dominant_class(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """ComFedL's CIFAR-10 label skew: client i's data is a fraction rho of class i mod C
    (rho = 1/C is IID), drawn without replacement."""
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    n = cfg.samples_per_client if cfg.samples_per_client is not None else len(labels) // num_clients
    if n <= 0:
        raise ConfigError("partition.num_clients", f"{num_clients} clients leave no samples each from a pool of {len(labels)}")
    counts = dominant_class_counts(num_clients, num_classes, n, cfg.rho)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    need = counts.sum(axis=0)
    for c in range(num_classes):
        if need[c] > len(by_class[c]):
            size = (
                f"partition.samples_per_client={n}"
                if cfg.samples_per_client is not None
                else f"{n} samples per client (partition.samples_per_client unset: pool // num_clients)"
            )
            raise ConfigError(
                "partition.samples_per_client",
                f"class {c} has {len(by_class[c])} samples but {size} with partition.rho={cfg.rho} and "
                f"partition.num_clients={num_clients} needs {need[c]} of it; lower "
                "partition.samples_per_client, partition.rho or partition.num_clients",
            )
    starts = np.zeros((num_clients + 1, num_classes), dtype=np.int64)
    starts[1:] = np.cumsum(counts, axis=0)
    return [
        np.sort(np.concatenate([by_class[c][starts[i, c] : starts[i + 1, c]] for c in range(num_classes)]))
        for i in range(num_clients)
    ]


@PARTITIONERS.register("shards", config=ShardsConfig, summary="Sorted-label shards, shards_per_client each (McMahan et al. 2017)", origin="built-in")
def shards(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.: sort by label, cut into num_clients x shards_per_client shards, give
    each client shards_per_client random ones."""
    s = cfg.shards_per_client
    total = num_clients * s
    if total > len(labels):
        raise ConfigError(
            "partition.shards_per_client",
            f"partition.num_clients x partition.shards_per_client = {total} shards exceeds the pool's {len(labels)} samples",
        )
    shuffled = rng.permutation(len(labels))  # random order inside each class
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(by_label, total)
    assignment = rng.permutation(total).reshape(num_clients, s)
    return [np.sort(np.concatenate([pieces[j] for j in row])) for row in assignment]


# --------------------------------------------------------------------------- server / test


def split_server(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray | None, np.ndarray]:
    """(server indices or None, remaining pool indices), both sorted: a uniform random
    `fraction` of the training pool goes to the server before clients are partitioned."""
    if fraction <= 0:
        return None, np.arange(n, dtype=np.int64)
    k = int(round(fraction * n))
    perm = rng.permutation(n)
    return np.sort(perm[:k]).astype(np.int64), np.sort(perm[k:]).astype(np.int64)


def proportional_test_split(
    train_counts: np.ndarray, test_labels: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Give each client test samples whose label mix follows its train mix: the test samples
    of class c are shared out in proportion to the clients' train counts of class c. Every
    test sample goes to at most one client (none when no client trains on its class)."""
    m, num_classes = train_counts.shape
    owner = np.full(len(test_labels), -1, dtype=np.int64)
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(test_labels == c))
        counts = largest_remainder(train_counts[:, c], len(idx))
        if counts.sum():
            owner[idx] = np.repeat(np.arange(m), counts)
    return groups_from_owner(owner, m)


def equal_test_split(num_clients: int, n_test: int, size: int | None, rng: np.random.Generator) -> list[np.ndarray]:
    """`size` IID test samples per client (None: n_test // num_clients), disjoint: a validation
    set of the same size for every client, however small its training set."""
    size = n_test // num_clients if size is None else size
    if size * num_clients > n_test:
        raise ConfigError(
            "partition.client_test_size",
            f"{num_clients} clients x {size} test samples exceed the test pool's {n_test}",
        )
    perm = rng.permutation(n_test)[: size * num_clients]
    return [np.sort(perm[k * size : (k + 1) * size]).astype(np.int64) for k in range(num_clients)]
