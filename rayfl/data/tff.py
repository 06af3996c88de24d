"""Readers for TensorFlow Federated's HDF5 files (no TensorFlow needed): federated EMNIST
(one client per writer) and StackOverflow (one client per user).

TFF's `HDF5ClientData` layout: group `examples`, one subgroup per client id, one dataset per
feature, all of the client's samples along axis 0.

- EMNIST-62 (`fed_emnist_train.h5`, `fed_emnist_test.h5`): `pixels` float32 [n, 28, 28] in
  [0, 1], `label` int [n] in 0..61 (digits, then upper-, then lower-case letters).
- StackOverflow (`stackoverflow_train.h5`, `stackoverflow_test.h5`, plus the word counts
  `stackoverflow.word_count`, one `word count` line per word, most frequent first): `tokens`,
  byte strings of space-separated words (also `title`, `tags`, ... which we do not read).

StackOverflow next-word prediction follows TFF's / Pillutla et al.'s preprocessing: the
vocabulary is the `vocab_size` most frequent words; ids are 0 = padding, 1..V the words, V+1 =
out-of-vocabulary, V+2 = beginning, V+3 = end of sentence. A sentence becomes
[BOS] + words + [EOS], cut to seq_len + 1 ids and padded; the input is its first seq_len ids,
the target the last seq_len, with padding targets set to -100 (ignored by cross-entropy).
FFGG's metric (App. E.2.1) ignores OOV, BOS and EOS targets too: `lm_excluded_targets`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rayfl.data.errors import DatasetError

EMNIST_FILES = {"train": "fed_emnist_train.h5", "test": "fed_emnist_test.h5"}
SO_FILES = {"train": "stackoverflow_train.h5", "test": "stackoverflow_test.h5"}
SO_WORD_COUNT = "stackoverflow.word_count"
IGNORE = -100
PAD = 0


def h5_clients(path: Path) -> list[str]:
    """The client ids of a TFF HDF5 file, sorted (the order every client list uses)."""
    import h5py

    with h5py.File(require(path), "r") as f:
        return sorted(f["examples"].keys())


def read_features(path: Path, clients: Iterable[str], features: tuple[str, ...]) -> dict[str, dict[str, np.ndarray]]:
    """{client: {feature: array}} for the given clients of a TFF HDF5 file."""
    import h5py

    out = {}
    with h5py.File(require(path), "r") as f:
        examples = f["examples"]
        for c in clients:
            if c not in examples:
                out[c] = {}
                continue
            try:
                out[c] = {feat: examples[c][feat][()] for feat in features}
            except KeyError as e:
                raise DatasetError(f"{path}: client {c} has no feature {e}; not a TFF file of this dataset") from e
    return out


def emnist_client(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 [n, 1, 28, 28], y int64 [n]) of one EMNIST writer."""
    if not arrays:
        return np.zeros((0, 1, 28, 28), np.float32), np.zeros(0, np.int64)
    x = np.asarray(arrays["pixels"], dtype=np.float32)
    y = np.asarray(arrays["label"], dtype=np.int64).reshape(-1)
    if x.ndim != 3 or len(x) != len(y):
        raise DatasetError(f"EMNIST pixels have shape {x.shape} and labels {y.shape}; expected [n, 28, 28] and [n]")
    if y.size and (y.min() < 0 or y.max() > 61):
        raise DatasetError(f"EMNIST labels must be in 0..61, found {y.min()}..{y.max()}")
    return x[:, None], y


def read_word_counts(path: Path, vocab_size: int) -> dict[str, int]:
    """word -> id (1..vocab_size) for the `vocab_size` first (most frequent) words."""
    vocab: dict[str, int] = {}
    with open(require(path), encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise DatasetError(f"{path}: expected 'word count' lines, got {line.strip()!r}")
            vocab[parts[0]] = len(vocab) + 1
            if len(vocab) == vocab_size:
                break
    return vocab


def lm_num_classes(vocab_size: int) -> int:
    """Vocabulary plus padding, OOV, BOS and EOS."""
    return vocab_size + 4


def lm_excluded_targets(num_classes: int) -> tuple[int, ...]:
    """The OOV, BOS and EOS ids a next-word accuracy ignores (padding is -100 already)."""
    v = num_classes - 4
    return (v + 1, v + 2, v + 3)


def encode_sentences(sentences: Iterable[bytes | str], vocab: dict[str, int], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(x int64 [n, seq_len], y int64 [n, seq_len]) next-word pairs (see the module docstring)."""
    v = len(vocab)
    oov, bos, eos = v + 1, v + 2, v + 3
    rows = []
    for s in sentences:
        text = s.decode("utf-8") if isinstance(s, bytes) else str(s)
        ids = ([bos] + [vocab.get(w, oov) for w in text.split()] + [eos])[: seq_len + 1]
        rows.append(ids + [PAD] * (seq_len + 1 - len(ids)))
    seq = np.array(rows, dtype=np.int64).reshape(-1, seq_len + 1)
    x, y = seq[:, :-1].copy(), seq[:, 1:].copy()
    y[y == PAD] = IGNORE
    return x, y


def require(path: Path) -> Path:
    if not path.is_file():
        raise DatasetError(
            f"missing {path}. Place TFF's file there (rayfl does not download it), or set data.data_dir "
            f"to a directory whose {path.parent.name}/ subdirectory holds it."
        )
    return path
