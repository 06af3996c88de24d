"""Partitioners, the server / client-test splits, the federated view and its plots."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl.config import ConfigError, DataConfig, section_config
from rayfl.data import FederatedDataset, build_federated_dataset, load_pool
from rayfl.data.partition import (
    dominant_class_counts,
    largest_remainder,
    partition_indices,
    proportional_test_split,
    split_server,
)
from rayfl.data.plot import format_class_matrix, plot_partition
from rayfl.registry import PARTITIONERS, register_partitioner
from rayfl.rng import numpy_rng


def balanced_labels(per_class: int, num_classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def assert_partition(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    """Every part is a sorted, unique int64 array within [0, n) and no index is in two parts."""
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0)
        assert len(p) == 0 or (p[0] >= 0 and p[-1] < n)
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat)


def split(method: str, labels: np.ndarray, seed: int = 0, **params) -> list[np.ndarray]:
    cfg = section_config("partition", method=method, **params)
    return partition_indices(labels, cfg, numpy_rng(seed, "partition"))


def counts(parts: list[np.ndarray], labels: np.ndarray, num_classes: int = 10) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def mean_label_entropy(parts: list[np.ndarray], labels: np.ndarray) -> float:
    c = counts(parts, labels).astype(float)
    p = c / c.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return float(h.mean())


# --------------------------------------------------------------------------- schemes


def test_iid_is_a_near_equal_cover():
    labels = balanced_labels(101)
    parts = split("iid", labels, num_clients=7)
    assert_partition(parts, len(labels), 7)
    sizes = [len(p) for p in parts]
    assert sum(sizes) == len(labels) and max(sizes) - min(sizes) <= 1


def test_dirichlet_honours_min_size_and_alpha_controls_skew():
    labels = balanced_labels(300)
    skewed = split("dirichlet", labels, num_clients=20, alpha=0.1, min_size=15)
    flat = split("dirichlet", labels, num_clients=20, alpha=100.0, min_size=15)
    for parts in (skewed, flat):
        assert_partition(parts, len(labels), 20)
        assert min(len(p) for p in parts) >= 15
        assert sum(len(p) for p in parts) == len(labels)  # Dirichlet uses the whole pool
    assert mean_label_entropy(skewed, labels) < 0.6 * mean_label_entropy(flat, labels)
    assert mean_label_entropy(flat, labels) > 0.95 * np.log(10)


def test_dirichlet_impossible_min_size_names_the_keys():
    labels = balanced_labels(5)
    with pytest.raises(ConfigError, match="partition.min_size") as err:
        split("dirichlet", labels, num_clients=10, min_size=6)
    assert err.value.key == "partition.min_size"
    # Feasible in count, but with two classes and a tiny alpha at most about two clients get
    # data in any draw: a clear error after the tries, not a hang.
    with pytest.raises(ConfigError, match=r"alpha=0\.001.*partition\.min_size"):
        split("dirichlet", balanced_labels(100, num_classes=2), num_clients=10, alpha=0.001, min_size=15)


def test_quantity_skew_sizes_are_exact():
    labels = balanced_labels(600)
    parts = split("quantity_skew", labels, num_clients=10, big_client_size=5000, small_client_size=20)
    assert_partition(parts, len(labels), 10)
    sizes = sorted(len(p) for p in parts)
    assert sizes == [20] * 9 + [5000]
    big = int(np.argmax([len(p) for p in parts]))
    # IID labels: the big client sees every class in roughly equal measure.
    assert counts(parts, labels)[big].min() > 400
    bigs = {int(np.argmax([len(p) for p in split("quantity_skew", labels, seed=s, num_clients=10)]))
            for s in range(12)}
    assert len(bigs) > 1  # the big client is chosen at random


def test_quantity_skew_too_small_pool_names_the_keys():
    with pytest.raises(ConfigError, match=r"partition\.big_client_size.*partition\.small_client_size.*5180.*1000"):
        split("quantity_skew", balanced_labels(100), num_clients=10, big_client_size=5000, small_client_size=20)


def test_dominant_class_fractions_are_exact():
    labels = balanced_labels(500)
    parts = split("dominant_class", labels, num_clients=10, rho=0.28, samples_per_client=400)
    assert_partition(parts, len(labels), 10)
    c = counts(parts, labels)
    own = round(0.28 * 400)  # 112; the other 288 split 32 each over 9 classes
    for i in range(10):
        assert c[i].sum() == 400
        assert c[i, i] == own
        assert np.all(np.delete(c[i], i) == 32)


def test_dominant_class_spreads_remainder_and_wraps_classes():
    labels = balanced_labels(300, num_classes=4)
    parts = split("dominant_class", labels, num_clients=6, rho=0.5, samples_per_client=101)
    c = counts(parts, labels, num_classes=4)
    for i in range(6):
        dominant = i % 4
        assert c[i].sum() == 101 and c[i, dominant] == 51  # round(50.5) rounds half up
        assert sorted(np.delete(c[i], dominant).tolist()) == [16, 17, 17]
    # Default size: the pool divided by the number of clients.
    parts = split("dominant_class", balanced_labels(100), num_clients=10, rho=0.1)
    assert [len(p) for p in parts] == [100] * 10
    assert np.all(counts(parts, balanced_labels(100)) == 10)  # rho = 1/C is IID


def test_dominant_class_counts_sum_and_running_out():
    m = dominant_class_counts(10, 10, 5000, 0.28)
    assert np.all(m.sum(axis=1) == 5000) and np.all(np.diag(m) == 1400)
    assert np.all(m.sum(axis=0) == 5000)  # ComFedL CIFAR: exactly the 5,000 images per class
    with pytest.raises(ConfigError, match=r"class \d has 50 samples.*partition\.samples_per_client"):
        split("dominant_class", balanced_labels(50), num_clients=10, rho=0.9, samples_per_client=60)


def test_shards_give_each_client_its_shards():
    labels = balanced_labels(60)
    parts = split("shards", labels, num_clients=30, shards_per_client=2)
    assert_partition(parts, len(labels), 30)
    assert all(len(p) == 20 for p in parts)  # 600 samples in 60 shards of 10, two each
    # Shards of 10 within classes of 60: each client sees at most 2 classes.
    assert (counts(parts, labels) > 0).sum(axis=1).max() <= 2
    assert sum(len(p) for p in parts) == len(labels)
    with pytest.raises(ConfigError, match="partition.shards_per_client"):
        split("shards", balanced_labels(1), num_clients=10, shards_per_client=2)


def test_same_seed_same_partition():
    labels = balanced_labels(100)
    own = {"quantity_skew": {"big_client_size": 200, "small_client_size": 10}, "dominant_class": {"samples_per_client": 50}}
    for method in ("iid", "dirichlet", "quantity_skew", "dominant_class", "shards"):
        params = {"num_clients": 8, **own.get(method, {})}
        a, b = split(method, labels, 3, **params), split(method, labels, 3, **params)
        c = split(method, labels, 4, **params)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), method
        assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True)), method
        # The registered function itself (not just the dispatcher) returns sorted int64 parts.
        direct = PARTITIONERS.get(method).load()(labels, 8, section_config("partition", method=method, **params),
                                                 numpy_rng(3, "partition"))
        assert_partition(direct, len(labels), 8)


def test_dispatch_rejects_natural_and_unknown_and_accepts_registered():
    labels = balanced_labels(10)
    with pytest.raises(ConfigError, match="natural"):
        split("natural", labels)
    with pytest.raises(ConfigError, match="unknown partitioner 'nope'"):
        split("nope", labels)

    def halves(labels, num_clients, params, rng):
        return [np.arange(len(labels))[k::num_clients][::-1] for k in range(num_clients)]

    register_partitioner("halves", halves)
    try:
        parts = split("halves", labels, num_clients=2)
    finally:
        PARTITIONERS.unregister("halves")
    assert_partition(parts, len(labels), 2)  # dispatch sorts and casts to int64


# --------------------------------------------------------------------------- server and test splits


def test_server_split_is_disjoint_and_sized():
    server, pool = split_server(1000, 0.3, numpy_rng(0, "data.server"))
    assert server is not None and len(server) == 300 and len(pool) == 700
    assert np.array_equal(np.sort(np.concatenate([server, pool])), np.arange(1000))
    assert np.all(np.diff(server) > 0) and np.all(np.diff(pool) > 0)
    none, everything = split_server(10, 0.0, numpy_rng(0, "data.server"))
    assert none is None and np.array_equal(everything, np.arange(10))


def test_largest_remainder_is_exact():
    assert largest_remainder(np.array([1.0, 1.0, 1.0]), 10).tolist() == [4, 3, 3]
    assert largest_remainder(np.array([0.0, 5.0, 0.0]), 7).tolist() == [0, 7, 0]
    rng = np.random.default_rng(0)
    for _ in range(20):
        w = rng.random(13)
        total = int(rng.integers(0, 500))
        got = largest_remainder(w, total)
        assert got.sum() == total and np.all(np.abs(got - w / w.sum() * total) < 1)


def test_proportional_test_split_follows_train_mix():
    train = np.array([[30, 0, 0], [10, 10, 0], [0, 40, 0]])
    test_labels = np.random.default_rng(1).permutation(np.repeat([0, 1, 2], [40, 50, 7]))
    parts = proportional_test_split(train, test_labels, numpy_rng(0, "partition.test"))
    assert_partition(parts, len(test_labels), 3)
    c = counts(parts, test_labels, num_classes=3)
    assert c.tolist() == [[30, 0, 0], [10, 10, 0], [0, 40, 0]]
    # Class 2 has no training client, so its test samples stay unassigned.
    assert sum(len(p) for p in parts) == 90


# --------------------------------------------------------------------------- federated dataset


def digits(**data) -> DataConfig:
    return section_config("data", dataset="digits", **data)


def test_federated_digits_with_server_share():
    data = digits(test_fraction=0.1, server_fraction=0.3)
    fd = build_federated_dataset(data, section_config("partition", method="dirichlet", num_clients=10, alpha=0.5), seed=0)
    n_train = 1797 - round(0.1 * 1797)
    assert len(fd.train_y) == n_train and len(fd.test_y) == round(0.1 * 1797)
    assert fd.server_train is not None and len(fd.server_train) == round(0.3 * n_train)
    assert_partition([*fd.client_train, fd.server_train], n_train, 11)
    assert fd.client_sizes().sum() + len(fd.server_train) == n_train
    assert fd.input_shape == (1, 8, 8) and fd.num_clients == 10 and fd.client_test is None
    assert np.array_equal(fd.class_matrix().sum(axis=1), fd.client_sizes())
    summary = fd.summary()
    assert "10 clients" in summary and f"server train: {len(fd.server_train)}" in summary
    with pytest.raises(ValueError, match="client_test"):
        fd.class_matrix("test")


def test_federated_is_reproducible():
    part = section_config("partition", method="shards", num_clients=10)
    a, b = (build_federated_dataset(digits(server_fraction=0.2), part, seed=4) for _ in range(2))
    c = build_federated_dataset(digits(server_fraction=0.2), part, seed=5)
    assert np.array_equal(a.train_x, b.train_x) and np.array_equal(a.server_train, b.server_train)
    assert all(np.array_equal(x, y) for x, y in zip(a.client_train, b.client_train, strict=True))
    assert not np.array_equal(a.server_train, c.server_train)


def test_federated_drops_unowned_rows():
    part = section_config("partition", method="quantity_skew", num_clients=5, big_client_size=100, small_client_size=10)
    fd = build_federated_dataset(digits(), part, seed=0)
    assert len(fd.train_y) == 140  # only the owned rows are kept, indices remapped
    assert_partition(fd.client_train, 140, 5)
    assert sorted(fd.client_sizes().tolist()) == [10, 10, 10, 10, 100]
    full_train, _ = load_pool(digits(), seed=0)
    # The kept rows are genuine rows of the pool, in pool order.
    rows = {r.tobytes() for r in full_train.x}
    assert all(r.tobytes() in rows for r in fd.train_x)


def test_federated_proportional_client_test():
    part = section_config("partition", method="dominant_class", num_clients=10, rho=0.5, samples_per_client=80,
                           client_test="proportional")
    fd = build_federated_dataset(digits(test_fraction=0.3), part, seed=0)
    assert fd.client_test is not None
    assert_partition(fd.client_test, len(fd.test_y), 10)
    test_counts = fd.class_matrix("test")
    # Each client's dominant class is also the largest class of its test set.
    assert np.array_equal(test_counts.argmax(axis=1), np.arange(10))
    assert test_counts.sum() == len(fd.test_y)


def test_natural_needs_synthetic():
    with pytest.raises(ConfigError, match="natural"):
        build_federated_dataset(digits(), section_config("partition", method="natural"), seed=0)


def test_check_catches_overlap():
    fd = build_federated_dataset(digits(), section_config("partition", method="iid", num_clients=4), seed=0)
    fd.check()
    fd.client_train[1] = np.sort(np.concatenate([fd.client_train[1], fd.client_train[0][:1]]))
    with pytest.raises(ValueError, match="overlap"):
        fd.check()


# --------------------------------------------------------------------------- text table and plot


def _fd(num_clients: int, **data) -> FederatedDataset:
    part = section_config("partition", method="dirichlet", num_clients=num_clients, alpha=1.0, min_size=1)
    return build_federated_dataset(digits(**data), part, seed=0)


def test_format_class_matrix_small_and_elided():
    fd = _fd(5, server_fraction=0.2)
    text = format_class_matrix(fd)
    lines = text.splitlines()
    assert lines[0].split() == ["client", "size", *map(str, range(10))]
    assert len(lines) == 1 + 5 + 2  # header, clients, server, total
    row = lines[3].split()
    assert row[0] == "2" and int(row[1]) == fd.client_sizes()[2]
    assert [int(v) for v in row[2:]] == fd.class_matrix()[2].tolist()
    assert lines[-2].split()[0] == "server" and lines[-1].split()[0] == "total"
    big = format_class_matrix(_fd(100, test_fraction=0.1)).splitlines()
    assert len(big) == 1 + 40 + 1 + 1
    assert "60 more clients" in big[21]
    assert big[-2].split()[0] == "99"


def test_plot_partition_writes_png(tmp_path):
    for m in (8, 150):
        out = plot_partition(_fd(m, test_fraction=0.1), tmp_path / f"sub/partition-{m}.png")
        assert out.is_file() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
