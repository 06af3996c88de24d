"""Centralised datasets: the train / test pool before any client split.

`load_pool` reads a dataset, then applies `data.source`, `data.split`, `data.max_samples` and
`data.test_fraction` with seeded draws, so every run with the same seed sees the same pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfl.config import DataConfig
from rayfl.data.errors import DatasetError
from rayfl.data.sources import data_root, load_official
from rayfl.rng import numpy_rng

__all__ = ["ArrayDataset", "DatasetError", "load_pool", "split_train_test"]

NUM_CLASSES = {"digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10}


@dataclass
class ArrayDataset:
    """Samples as float32 [N, *input_shape] (images in [0, 1]) with int64 labels [N]."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])


def load_pool(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, test) of a non-synthetic dataset, before any server / client split."""
    name = cfg.dataset
    if name == "synthetic":
        raise DatasetError(
            "synthetic data is generated per client; use rayfl.data.build_federated_dataset for it"
        )
    if name not in NUM_CLASSES:
        raise DatasetError(f"unknown dataset {name!r}; known: {sorted(NUM_CLASSES)} and 'synthetic'")
    if name == "digits":
        x, y = _load_digits()
        return _pooled(x, y, cfg, seed, name)
    splits = ("test",) if cfg.source == "test_only" else ("train", "test")
    arrays = load_official(name, data_root(cfg.data_dir), splits, cfg.download)
    if cfg.source == "test_only" or cfg.split == "pooled":
        x = np.concatenate([arrays[s].x for s in splits])
        y = np.concatenate([arrays[s].y for s in splits])
        return _pooled(x, y, cfg, seed, name)
    train, test = arrays["train"], arrays["test"]
    keep_train, keep_test = _official_subsample(len(train.y), len(test.y), cfg.max_samples, seed)
    k = NUM_CLASSES[name]
    return (
        ArrayDataset(_take(train.x, keep_train), _take(train.y, keep_train), k, name),
        ArrayDataset(_take(test.x, keep_test), _take(test.y, keep_test), k, name),
    )


def split_train_test(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) index arrays of a seeded random split with at least one sample each."""
    if n < 2:
        raise DatasetError(f"cannot split {n} sample(s) into a train and a test set")
    n_test = min(max(int(round(test_fraction * n)), 1), n - 1)
    perm = rng.permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _pooled(x: np.ndarray, y: np.ndarray, cfg: DataConfig, seed: int, name: str) -> tuple[ArrayDataset, ArrayDataset]:
    """Subsample (data.max_samples), then split with data.test_fraction."""
    if cfg.max_samples is not None and cfg.max_samples < len(y):
        keep = np.sort(numpy_rng(seed, "data.subsample").choice(len(y), cfg.max_samples, replace=False))
        x, y = x[keep], y[keep]
    train, test = split_train_test(len(y), cfg.test_fraction, numpy_rng(seed, "data.split"))
    k = NUM_CLASSES[name]
    return ArrayDataset(x[train], y[train], k, name), ArrayDataset(x[test], y[test], k, name)


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


def _take(a: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
    return a if idx is None else a[idx]


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 UCI digits (pixel values 0..16), no download needed."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]
    return x, np.asarray(bunch.target, dtype=np.int64)
