"""The naturally federated datasets of FFGG's Table 1, read from tiny files written in the real
formats: TFF's HDF5 (EMNIST writers, StackOverflow users + word counts) and GLDv2's federated
CSV + JPEG tree. Clients are the dataset's own users, filtered and subsampled as configured."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from rayfl.config import ConfigError, section_config
from rayfl.data.errors import DatasetError
from rayfl.data.federated import build_federated_dataset
from rayfl.data.natural import load_natural
from rayfl.data.tff import encode_sentences, lm_excluded_targets, read_word_counts


def write_tff(path, clients: dict[str, dict[str, np.ndarray]]) -> None:
    """TFF's HDF5ClientData layout: /examples/<client>/<feature>."""
    with h5py.File(path, "w") as f:
        ex = f.create_group("examples")
        for c, feats in clients.items():
            g = ex.create_group(c)
            for k, v in feats.items():
                g.create_dataset(k, data=v)


def emnist_writer(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"pixels": rng.random((n, 28, 28), dtype=np.float32), "label": rng.integers(0, 62, n).astype(np.int32)}


@pytest.fixture(scope="module")
def emnist_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "emnist").mkdir()
    train = {"f0003_41": emnist_writer(5, 1), "f0001_12": emnist_writer(3, 2), "f0002_07": emnist_writer(1, 3)}
    test = {"f0003_41": emnist_writer(2, 4), "f0001_12": emnist_writer(1, 5)}  # f0002 has no test data
    write_tff(root / "emnist" / "fed_emnist_train.h5", train)
    write_tff(root / "emnist" / "fed_emnist_test.h5", test)
    return root, train, test


def test_emnist_writers_become_clients_in_id_order(emnist_dir):
    root, train, test = emnist_dir
    fd = load_natural(section_config("data", dataset="emnist", data_dir=str(root), min_client_test=1), seed=0)
    assert fd.num_clients == 2 and fd.num_classes == 62 and fd.input_shape == (1, 28, 28)
    for k, writer in enumerate(["f0001_12", "f0003_41"]):  # sorted ids; f0002_07 dropped (no test)
        assert np.array_equal(fd.train_x[fd.client_train[k]][:, 0], train[writer]["pixels"])
        assert np.array_equal(fd.train_y[fd.client_train[k]], train[writer]["label"])
        assert np.array_equal(fd.test_y[fd.client_test[k]], test[writer]["label"])
    assert fd.train_x.dtype == np.float32 and fd.train_y.dtype == np.int64


def test_emnist_minimums_cap_and_subsample(emnist_dir):
    root, train, _ = emnist_dir
    fd = load_natural(section_config("data", dataset="emnist", data_dir=str(root), min_client_train=4), seed=0)
    assert fd.num_clients == 1 and len(fd.client_train[0]) == 5  # only f0003_41 has >= 4
    capped = load_natural(section_config("data", dataset="emnist", data_dir=str(root), max_client_train=2), seed=0)
    assert [len(c) for c in capped.client_train] == [2, 1, 2]
    assert np.array_equal(capped.train_y[capped.client_train[2]], train["f0003_41"]["label"][:2])
    picks = {tuple(load_natural(section_config("data", dataset="emnist", data_dir=str(root), max_clients=2), seed=s).train_y) for s in range(6)}
    assert len(picks) > 1  # the subsample depends on the seed ...
    again = load_natural(section_config("data", dataset="emnist", data_dir=str(root), max_clients=2), seed=3)
    assert np.array_equal(again.train_y, load_natural(section_config("data", dataset="emnist", data_dir=str(root), max_clients=2), seed=3).train_y)


def test_emnist_through_build_federated_dataset(emnist_dir):
    root, _, _ = emnist_dir
    fd = build_federated_dataset(section_config("data", dataset="emnist", data_dir=str(root)), section_config("partition", method="natural"), seed=0)
    assert fd.num_clients == 3 and fd.client_test is not None and len(fd.client_test[1]) == 0


def test_missing_tff_file_names_the_path(tmp_path):
    with pytest.raises(DatasetError, match="fed_emnist_train.h5"):
        load_natural(section_config("data", dataset="emnist", data_dir=str(tmp_path)), seed=0)


# ---------------------------------------------------------------- StackOverflow


def test_sentence_encoding_follows_tff():
    vocab = {"the": 1, "cat": 2, "sat": 3}  # V = 3: OOV 4, BOS 5, EOS 6
    x, y = encode_sentences([b"the cat sat", "the dog", b"cat cat cat cat cat"], vocab, seq_len=4)
    assert x.tolist() == [[5, 1, 2, 3], [5, 1, 4, 6], [5, 2, 2, 2]]
    assert y.tolist() == [[1, 2, 3, 6], [1, 4, 6, -100], [2, 2, 2, 2]]
    assert lm_excluded_targets(3 + 4) == (4, 5, 6)


def test_word_counts_keep_the_most_frequent(tmp_path):
    p = tmp_path / "stackoverflow.word_count"
    p.write_text("the 900\nto 800\ni 700\n")
    assert read_word_counts(p, 2) == {"the": 1, "to": 2}
    p.write_text("the\n")
    with pytest.raises(DatasetError, match="word count"):
        read_word_counts(p, 2)


def test_stackoverflow_users_become_clients(tmp_path):
    d = tmp_path / "stackoverflow"
    d.mkdir()
    (d / "stackoverflow.word_count").write_text("how 50\nto 40\npython 30\nsort 20\n")
    tok = lambda *s: np.array([t.encode() for t in s], dtype=object)  # noqa: E731
    train = {
        "u2": {"tokens": tok("how to sort", "python", "sort how"), "title": tok("a", "b", "c")},
        "u1": {"tokens": tok("to be or"), "title": tok("t")},
    }
    test = {"u2": {"tokens": tok("how python")}, "u1": {"tokens": tok("sort")}}
    write_tff(d / "stackoverflow_train.h5", train)
    write_tff(d / "stackoverflow_test.h5", test)
    fd = load_natural(section_config("data", dataset="stackoverflow", data_dir=str(tmp_path), vocab_size=3, seq_len=3, min_client_train=2, max_client_train=2), seed=0)
    assert fd.num_clients == 1 and fd.num_classes == 7 and fd.input_shape == (3,)
    # vocab {how 1, to 2, python 3}; OOV 4, BOS 5, EOS 6; u2's first two sentences only
    assert fd.train_x.tolist() == [[5, 1, 2], [5, 3, 6]]
    assert fd.train_y.tolist() == [[1, 2, 4], [3, 6, -100]]
    assert fd.test_x.tolist() == [[5, 1, 3]] and fd.test_y.tolist() == [[1, 3, 6]]


# ---------------------------------------------------------------- GLDv2


def test_gldv2_users_split_half_and_half(tmp_path):
    from PIL import Image

    d = tmp_path / "gldv2"
    rows, colours = ["user_id,image_id,class"], {}
    for user, n, cls in [("alice", 4, 1007), ("bob", 3, 55), ("carol", 1, 55)]:
        for i in range(n):
            image_id = f"{user[0]}{i}f{n}e{cls}"
            rows.append(f"{user},{image_id},{cls}")
            colours[image_id] = (10 * i + 5, 100, 200 if cls == 55 else 0)
            path = d / "train" / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (40, 30), colours[image_id]).save(path, quality=100)
    (d / "federated_train.csv").write_text("\n".join(rows) + "\n")
    cfg = section_config("data", dataset="gldv2", data_dir=str(tmp_path), test_fraction=0.5, min_client_train=1, min_client_test=1, image_size=8)
    fd = load_natural(cfg, seed=0)
    assert fd.num_clients == 2  # carol's single image leaves her no test image
    assert [len(c) for c in fd.client_train] == [2, 2] and [len(c) for c in fd.client_test] == [2, 1]
    assert fd.train_x.dtype == np.uint8 and fd.input_shape == (3, 8, 8)
    assert fd.num_classes == 2  # landmarks 55 -> 0, 1007 -> 1 over the kept users
    assert set(fd.train_y[fd.client_train[0]]) == {1} and set(fd.train_y[fd.client_train[1]]) == {0}
    blue = fd.train_x[fd.client_train[1]][:, 2]  # bob's images are (.., 100, 200)
    assert np.all(np.abs(blue.astype(int) - 200) <= 3)
    with pytest.raises(DatasetError, match="no user"):
        load_natural(section_config("data", dataset="gldv2", data_dir=str(tmp_path), min_client_train=50, image_size=8), seed=0)


@pytest.mark.parametrize(
    "kw,key",
    [
        (dict(dataset="emnist", min_client_train=-1), "data.min_client_train"),
        (dict(dataset="emnist", max_clients=0), "data.max_clients"),
        (dict(dataset="emnist", max_client_train=0), "data.max_client_train"),
        (dict(dataset="stackoverflow", seq_len=0), "data.seq_len"),
        (dict(dataset="stackoverflow", vocab_size=0), "data.vocab_size"),
        (dict(dataset="gldv2", image_size=0), "data.image_size"),
    ],
)
def test_bad_data_values_name_their_field(kw, key):
    with pytest.raises(ConfigError) as e:
        section_config("data", **kw).validate()
    assert e.value.key == key
