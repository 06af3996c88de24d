"""Naturally federated datasets as a `FederatedDataset`: the dataset's own users are the
clients (EMNIST writers, GLDv2 photographers, StackOverflow users), each with its own train and
test samples, so `partition.method` and `partition.num_clients` play no part.

Client selection (FFGG's App. E.2.1-E.2.3): keep users with at least `data.min_client_train`
training and `data.min_client_test` test samples; then, with `data.max_clients`, a seeded
subsample of that many (sorted by id, so a given seed always picks the same users); each keeps
at most `data.max_client_train` training samples (its first ones, as TFF orders them).
Client k of the result is the k-th kept user in id order."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayfl.config import ConfigError, DataConfig
from rayfl.data import gldv2, tff
from rayfl.data.errors import DatasetError
from rayfl.data.sources import data_root
from rayfl.rng import numpy_rng


@dataclass
class NaturalDataConfig(DataConfig):
    """A naturally federated dataset read from TFF's files under `data_dir/<dataset>/`: keep
    users with at least `min_client_train` training and `min_client_test` test samples, then a
    seeded subsample of `max_clients` of them (null: all); each keeps at most `max_client_train`
    training samples (its first ones, as TFF orders them; null: all)."""

    # Keep only users with at least this many training samples (>= 0).
    min_client_train: int = 0
    # Keep only users with at least this many test samples (>= 0).
    min_client_test: int = 0
    # A seeded subsample of this many of the kept users (> 0); null: all.
    max_clients: int | None = None
    # Each user keeps at most this many training samples, its first as TFF orders them (> 0); null:
    # all.
    max_client_train: int | None = None

    def validate(self) -> None:
        super().validate()
        for key in ("min_client_train", "min_client_test"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}", f"must be >= 0, got {getattr(self, key)}")
        for key in ("max_clients", "max_client_train"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}", f"must be > 0, got {getattr(self, key)}")

    def has_own_clients(self) -> bool:
        return True

    def splittable(self) -> bool:
        return False


@dataclass
class StackOverflowConfig(NaturalDataConfig):
    """TFF's StackOverflow next-word prediction: the `vocab_size` most frequent words,
    sequences of `seq_len` tokens (FFGG's Table 1 uses 10,000 and 20)."""

    dataset: str = "stackoverflow"
    # The most frequent words kept as the vocabulary (> 0); others are out-of-vocabulary.
    vocab_size: int = 10000
    # Tokens per sequence (> 0).
    seq_len: int = 20

    def validate(self) -> None:
        super().validate()
        for key in ("vocab_size", "seq_len"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}", f"must be > 0, got {getattr(self, key)}")


@dataclass
class GLDv2Config(NaturalDataConfig):
    """Google Landmarks v2 (the federated split by photographer): images resized to
    `image_size`, `test_fraction` of each user's images as its test set."""

    dataset: str = "gldv2"
    # The side images are resized to, in pixels (> 0).
    image_size: int = 224

    def validate(self) -> None:
        super().validate()
        if self.image_size <= 0:
            raise ConfigError("data.image_size", f"must be > 0, got {self.image_size}")


def load_natural(data: NaturalDataConfig, seed: int):
    """The FederatedDataset of a naturally federated `data.dataset` (its registered loader)."""
    from rayfl.registry import DATASETS

    return DATASETS.get(data.dataset).load()(data, seed)


def load_emnist(data: NaturalDataConfig, seed: int):
    """TFF's federated EMNIST-62: its writers are the clients."""
    return _emnist(data_root(data.data_dir) / data.dataset, data, seed)


def load_stackoverflow(data: StackOverflowConfig, seed: int):
    """TFF's StackOverflow: its users are the clients."""
    return _stackoverflow(data_root(data.data_dir) / data.dataset, data, seed)


def load_gldv2(data: GLDv2Config, seed: int):
    """GLDv2's federated split: its photographers are the clients."""
    return _gldv2(data_root(data.data_dir) / data.dataset, data, seed)


def select_clients(counts: dict[str, tuple[int, int]], data: DataConfig, seed: int) -> list[str]:
    """The kept user ids, sorted: both counts above the minimums, then the seeded subsample."""
    keep = sorted(c for c, (n_train, n_test) in counts.items() if n_train >= data.min_client_train and n_test >= data.min_client_test)
    if not keep:
        raise DatasetError(
            f"{data.dataset}: no user has >= {data.min_client_train} train and >= {data.min_client_test} test samples"
        )
    if data.max_clients is not None and data.max_clients < len(keep):
        pick = numpy_rng(seed, "data.clients").choice(len(keep), data.max_clients, replace=False)
        keep = [keep[i] for i in np.sort(pick)]
    return keep


def _h5_counts(path: Path, feature: str) -> dict[str, int]:
    import h5py

    with h5py.File(tff.require(path), "r") as f:
        ex = f["examples"]
        return {c: int(ex[c][feature].shape[0]) for c in ex}


def _pair_counts(train: dict[str, int], test: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {c: (n, test.get(c, 0)) for c, n in train.items()}


def _emnist(root: Path, data: DataConfig, seed: int):
    files = {s: root / f for s, f in tff.EMNIST_FILES.items()}
    counts = _pair_counts(_h5_counts(files["train"], "label"), _h5_counts(files["test"], "label"))
    users = select_clients(counts, data, seed)
    train = tff.read_features(files["train"], users, ("pixels", "label"))
    test = tff.read_features(files["test"], users, ("pixels", "label"))
    parts = [(*_cap(*tff.emnist_client(train[u]), data.max_client_train), *tff.emnist_client(test[u])) for u in users]
    return assemble("emnist", 62, parts)


def _stackoverflow(root: Path, data: DataConfig, seed: int):
    files = {s: root / f for s, f in tff.SO_FILES.items()}
    vocab = tff.read_word_counts(root / tff.SO_WORD_COUNT, data.vocab_size)
    counts = _pair_counts(_h5_counts(files["train"], "tokens"), _h5_counts(files["test"], "tokens"))
    users = select_clients(counts, data, seed)
    train = tff.read_features(files["train"], users, ("tokens",))
    test = tff.read_features(files["test"], users, ("tokens",))
    parts = []
    for u in users:
        tr = train[u]["tokens"][: data.max_client_train] if data.max_client_train else train[u]["tokens"]
        te = test[u].get("tokens", [])
        parts.append((*tff.encode_sentences(tr, vocab, data.seq_len), *tff.encode_sentences(te, vocab, data.seq_len)))
    num_classes = tff.lm_num_classes(len(vocab))
    return assemble("stackoverflow", num_classes, parts, tff.lm_excluded_targets(num_classes))


def _gldv2(root: Path, data: DataConfig, seed: int):
    users_all = gldv2.read_split(root / gldv2.SPLIT_FILE)
    splits: dict[str, tuple[list[tuple[str, int]], list[tuple[str, int]]]] = {}
    for u, items in users_all.items():
        n_test = int(np.floor(data.test_fraction * len(items)))  # an odd user's extra image trains
        perm = numpy_rng(seed, "data.gldv2_split", _stable_id(u)).permutation(len(items))
        splits[u] = ([items[i] for i in sorted(perm[n_test:])], [items[i] for i in sorted(perm[:n_test])])
    users = select_clients({u: (len(a), len(b)) for u, (a, b) in splits.items()}, data, seed)
    classes = sorted({c for u in users for part in splits[u] for _, c in part})
    label = {c: i for i, c in enumerate(classes)}
    parts = []
    for u in users:
        tr, te = splits[u]
        tr = tr[: data.max_client_train] if data.max_client_train else tr
        parts.append(
            (
                gldv2.load_images(root, [i for i, _ in tr], data.image_size),
                np.array([label[c] for _, c in tr], dtype=np.int64),
                gldv2.load_images(root, [i for i, _ in te], data.image_size),
                np.array([label[c] for _, c in te], dtype=np.int64),
            )
        )
    return assemble("gldv2", max(len(classes), 2), parts)


def _cap(x: np.ndarray, y: np.ndarray, cap: int | None) -> tuple[np.ndarray, np.ndarray]:
    return (x[:cap], y[:cap]) if cap else (x, y)


def _stable_id(user: str) -> int:
    """A user's split stream key that does not depend on Python's string hashing."""
    return zlib.crc32(user.encode("utf-8"))


def assemble(name: str, num_classes: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
             excluded_targets: tuple[int, ...] = ()):
    """Concatenate per-client (train x, train y, test x, test y) into one FederatedDataset."""
    from rayfl.data.federated import FederatedDataset

    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x = np.concatenate([p[2] for p in parts])
    test_y = np.concatenate([p[3] for p in parts])
    return FederatedDataset(
        name=name,
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in train_x.shape[1:]),
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        client_train=_ranges([len(p[1]) for p in parts]),
        client_test=_ranges([len(p[3]) for p in parts]),
        excluded_targets=tuple(excluded_targets),
    )


def _ranges(sizes: list[int]) -> list[np.ndarray]:
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [np.arange(starts[k], starts[k + 1], dtype=np.int64) for k in range(len(sizes))]
