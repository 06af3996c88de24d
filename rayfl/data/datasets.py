"""Centralised datasets: the train / test pool before any client split.

A pool dataset's loader returns its samples as an `ArrayDataset` (rayfl splits off a test set)
or a `(train, test)` pair; `load_pool` applies `data.max_samples` and `data.test_fraction` with
seeded draws, so every run with the same seed sees the same pool. This module holds the
built-in pools: scikit-learn's digits and the official MNIST / Fashion-MNIST / CIFAR-10 files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rayfl.config import ConfigError, DataConfig
from rayfl.data.errors import DatasetError
from rayfl.data.rows import is_file_rows, select
from rayfl.data.sources import (
    CIFAR_ARCHIVE,
    IDX_FILES,
    data_root,
    load_cifar10_files,
    load_idx_dataset,
)
from rayfl.rng import numpy_rng

__all__ = ["ArrayDataset", "DatasetError", "load_pool", "split_train_test"]


@dataclass
class ArrayDataset:
    """Samples [N, *input_shape] (float32 images in [0, 1], or tokens) with int64 labels [N]
    in [0, num_classes). `groups`, when the data have their own clients, is each sample's
    client as a code in [0, num_groups) (a writer, a user, a generated device): what
    `partition.method: natural` keeps."""

    x: np.ndarray  # or a rayfl.data.rows.FileRows: rows of Parquet files not read yet
    y: np.ndarray
    num_classes: int
    name: str
    groups: np.ndarray | None = None
    num_groups: int | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape, without the batch dimension."""
        return tuple(int(d) for d in self.x.shape[1:])

    def take(self, idx: np.ndarray | None) -> ArrayDataset:
        """The samples at `idx` (all when None), groups kept."""
        if idx is None:
            return self
        groups = None if self.groups is None else self.groups[idx]
        return ArrayDataset(select(self.x, idx), self.y[idx], self.num_classes, self.name, groups, self.num_groups)


@dataclass
class OfficialConfig(DataConfig):
    """An image dataset with an official train / test split (MNIST, Fashion-MNIST, CIFAR-10),
    read from `data_dir/<dataset>/` (downloaded there when `download` and the network allow).
    `source: test_only` reads only the official test files (e.g. MNIST's 10,000 test images,
    `t10k-images-idx3-ubyte.gz` and `t10k-labels-idx1-ubyte.gz`) and splits them like a pool;
    `split: pooled` pools train and test and re-splits with `test_fraction` (ZO-HFL's 90/10),
    `official` keeps the dataset's own test set. `max_samples` caps train + test (keeping their
    ratio with an official split)."""

    # Which official files are read: full (train and test) or test_only (only the test files, split
    # like a pool: e.g. MNIST's 10,000 test images offline).
    source: Literal["full", "test_only"] = "full"
    # official keeps the dataset's own test set; pooled pools train and test and re-splits with
    # test_fraction (ZO-HFL's 90/10).
    split: Literal["official", "pooled"] = "official"

    def validate(self) -> None:
        super().validate()
        root = data_root(self.data_dir)
        if not self.download and not root.is_dir():
            raise ConfigError(
                "data.data_dir",
                f"directory {root} does not exist (and data.download is false): {self.dataset} needs "
                f"{', '.join(self.files_needed())} in {root / self.dataset}; point data.data_dir (or the "
                "RAYFL_DATA_DIR environment variable) at a directory holding them, or set data.download: true",
            )

    def files_needed(self) -> list[str]:
        """The official files this config reads, as the error for a missing copy names them."""
        splits = ("test",) if self.source == "test_only" else ("train", "test")
        if self.dataset == "cifar10":
            return [CIFAR_ARCHIVE]
        return [f"{stem}.gz" for s in splits for stem in IDX_FILES[s]]


def load_idx_images(cfg: OfficialConfig, seed: int) -> ArrayDataset | tuple[ArrayDataset, ArrayDataset]:
    """MNIST or Fashion-MNIST from the official IDX files in `data_dir/<dataset>/`."""
    return _official(cfg, lambda root, splits: load_idx_dataset(cfg.dataset, root / cfg.dataset, splits, cfg.download))


def load_cifar10(cfg: OfficialConfig, seed: int) -> ArrayDataset | tuple[ArrayDataset, ArrayDataset]:
    """CIFAR-10 from the official python batches in `data_dir/cifar10/`."""
    return _official(cfg, lambda root, splits: load_cifar10_files(root / "cifar10", splits, cfg.download))


def _official(cfg: OfficialConfig, read: Callable[[Path, tuple[str, ...]], dict]) -> ArrayDataset | tuple[ArrayDataset, ArrayDataset]:
    """The dataset's official files: (train, test), or one pool with test_only / pooled."""
    splits = ("test",) if cfg.source == "test_only" else ("train", "test")
    arrays = read(data_root(cfg.data_dir), splits)
    name, k = cfg.dataset, 10
    if cfg.source == "test_only" or cfg.split == "pooled":
        x = np.concatenate([arrays[s].x for s in splits])
        y = np.concatenate([arrays[s].y for s in splits])
        return ArrayDataset(x, y, k, name)
    return ArrayDataset(arrays["train"].x, arrays["train"].y, k, name), ArrayDataset(arrays["test"].x, arrays["test"].y, k, name)


def load_digits(cfg: DataConfig, seed: int) -> ArrayDataset:
    """scikit-learn's bundled 8x8 UCI digits (1,797 images, pixel values scaled to [0, 1]), no
    download needed."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]
    return ArrayDataset(x, np.asarray(bunch.target, dtype=np.int64), 10, "digits")


def load_pool(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, test) of a pool dataset, before any server / client split: its loader's samples,
    subsampled to `data.max_samples` and split with `data.test_fraction` unless it has its own
    test set."""
    from rayfl.data.federated import generates_clients, load_entry

    if generates_clients(cfg):
        raise DatasetError(f"{cfg.dataset!r} is generated per client, not a pool: use rayfl.data.build_federated_dataset for it")
    loaded = load_entry(cfg, seed, None)
    if not isinstance(loaded, (ArrayDataset, tuple)):
        raise DatasetError(f"{cfg.dataset!r} has its own clients, not a pool: use rayfl.data.build_federated_dataset for it")
    return as_pool(loaded, cfg, seed)


def as_pool(loaded: Any, cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """A loader's answer as a checked (train, test) pair: one ArrayDataset is subsampled to
    `max_samples` then split with `test_fraction`; a pair keeps its split, `max_samples`
    capping both together with their ratio kept (`pool_rows`)."""
    if isinstance(loaded, ArrayDataset):
        pool = check_samples(loaded, cfg.dataset, "samples")
        train, test = pool_rows(len(pool), None, cfg, seed)
        return pool.take(train), pool.take(test)
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and all(isinstance(a, ArrayDataset) for a in loaded)):
        raise ConfigError("data.dataset", f"{cfg.dataset!r} returned a {type(loaded).__name__}; a loader returns an "
                          "ArrayDataset, a (train, test) pair of them or a FederatedDataset")
    train, test = check_samples(loaded[0], cfg.dataset, "train"), check_samples(loaded[1], cfg.dataset, "test")
    if train.input_shape != test.input_shape or train.num_classes != test.num_classes:
        raise ConfigError("data.dataset", f"{cfg.dataset!r}: train and test differ in input shape or classes "
                          f"({train.input_shape} / {test.input_shape}, {train.num_classes} / {test.num_classes})")
    keep_train, keep_test = pool_rows(len(train), len(test), cfg, seed)
    return train.take(keep_train), test.take(keep_test)


def pool_rows(n_train: int, n_test: int | None, cfg: DataConfig, seed: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Which rows become the train and the test set (sorted ids; None: every row of that
    split), from the row counts alone: one pool (`n_test` None) is subsampled to
    `max_samples`, then split with `test_fraction`; an own split keeps its ratio under
    `max_samples`. A table read straight into these rows (rayfl.data.tables) equals the pool
    `as_pool` makes of the same samples."""
    if n_test is not None:
        return _official_subsample(n_train, n_test, cfg.max_samples, seed)
    keep = None
    if cfg.max_samples is not None and cfg.max_samples < n_train:
        keep = np.sort(numpy_rng(seed, "data.subsample").choice(n_train, cfg.max_samples, replace=False))
    train, test = split_train_test(n_train if keep is None else len(keep), cfg.test_fraction, numpy_rng(seed, "data.split"))
    return (train, test) if keep is None else (keep[train], keep[test])


def check_samples(d: ArrayDataset, name: str, what: str) -> ArrayDataset:
    """One line naming the dataset for samples rayfl cannot train on; float64 inputs become
    float32 (what the models compute in). Rows left in their files (FileRows) stay unread."""
    x, y = (d.x if is_file_rows(d.x) else np.asarray(d.x)), np.asarray(d.y)
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise ConfigError("data.dataset", f"{name!r}: {what} x must be [N, ...] and y [N], got {x.shape} and {y.shape}")
    if d.num_classes < 2:
        raise ConfigError("data.dataset", f"{name!r} has {d.num_classes} class; classification needs at least 2")
    if not np.issubdtype(y.dtype, np.integer):
        raise ConfigError("data.dataset", f"{name!r}: {what} labels must be integers, got {y.dtype}")
    if len(y) and (y.min() < 0 or y.max() >= d.num_classes):
        raise ConfigError("data.dataset", f"{name!r}: {what} labels must be in [0, {d.num_classes}), got [{y.min()}, {y.max()}]")
    if x.dtype == np.float64:
        x = x.astype(np.float32)
    groups = d.groups
    if groups is not None:
        groups = np.asarray(groups, dtype=np.int64)
        if groups.shape != y.shape:
            raise ConfigError("data.dataset", f"{name!r}: {what} groups must be [N] like the labels, got {groups.shape}")
    return ArrayDataset(x, y.astype(np.int64, copy=False), int(d.num_classes), d.name, groups, d.num_groups)


def split_train_test(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) index arrays of a seeded random split with at least one sample each."""
    if n < 2:
        raise DatasetError(f"cannot split {n} sample(s) into a train and a test set")
    n_test = min(max(int(round(test_fraction * n)), 1), n - 1)
    perm = rng.permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _official_subsample(
    n_train: int, n_test: int, max_samples: int | None, seed: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """With an official split, data.max_samples caps train + test together and keeps their
    ratio, so a quick run still has a proportionate test set. None means keep all."""
    total = n_train + n_test
    if max_samples is None or max_samples >= total:
        return None, None
    if max_samples < 2:
        raise DatasetError(f"data.max_samples={max_samples} leaves no room for both a train and a test sample")
    k_train = min(max(int(round(max_samples * n_train / total)), 1), max_samples - 1)
    rng = numpy_rng(seed, "data.subsample")
    keep_train = np.sort(rng.choice(n_train, k_train, replace=False))
    keep_test = np.sort(rng.choice(n_test, min(max_samples - k_train, n_test), replace=False))
    return keep_train, keep_test
