"""Data users already have: .npz, Parquet and CSV files written in their real formats, read
through the config and `build_federated_dataset` with every kind of partitioner, checked value
by value against what was written; every user mistake is one ConfigError line naming the key
or the file; a 1,000,000-row Parquet table is read in batches with a bounded driver memory."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from PIL import Image
from test_remote_storage import BUCKET, s3_endpoint  # noqa: F401 (the moto S3 server fixture)

from rayfl.config import ConfigError, load_config
from rayfl.data import build_federated_dataset, tables
from rayfl.data.datasets import ArrayDataset, as_pool
from rayfl.data.tables import class_names, load_parquet

REPO = Path(__file__).resolve().parents[1]
D = 4  # features per row

# --------------------------------------------------------------------------- helpers


def features(n: int, start: int = 0) -> np.ndarray:
    """Row i holds [i, i + 0.25, i + 0.5, i + 0.75]: its first value says which row it is."""
    rows = np.arange(start, start + n, dtype=np.float32)[:, None]
    return rows + np.arange(D, dtype=np.float32) / D


def list_table(n: int, labels=None, writers=None, start: int = 0) -> pa.Table:
    """`features` as a fixed-size list column, labels i % 3 (or given), writers w{i % 4}."""
    x = features(n, start)
    cols = {"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), D),
            "label": pa.array(np.arange(n) % 3 if labels is None else labels)}
    cols["writer"] = pa.array([f"w{i % 4}" for i in range(start, start + n)] if writers is None else writers)
    return pa.table(cols)


def write_parquet(path: Path, table: pa.Table, row_group_size: int = 7) -> Path:
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def cfg_of(dataset: str, path: Path | str, *extra: str, method: str = "iid", clients: int | None = 3):
    overrides = [f"data.dataset={dataset}", f"data.path={path}", f"partition.method={method}",
                 f"partition.num_clients={'null' if clients is None else clients}",
                 "algorithm.clients_per_round=1"]
    if method == "dirichlet":
        overrides.append("partition.min_size=1")
    return load_config(None, [*overrides, *extra])


def pq_cfg(path: Path | str, *extra: str, **kw):
    """A parquet config reading the `list_table` layout's list column."""
    return cfg_of("parquet", path, "data.features_column=features", *extra, **kw)


def build(cfg):
    return build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)


def row_ids(x: np.ndarray) -> np.ndarray:
    """Which written row each sample is (its first value)."""
    return x.reshape(len(x), -1)[:, 0].astype(np.int64)


def one_line_error(cfg_or_overrides, match: str, *, build_it: bool = True) -> str:
    """The ConfigError a config (or its loading) raises: one line, matching `match`."""
    with pytest.raises(ConfigError) as err:
        cfg = cfg_or_overrides() if callable(cfg_or_overrides) else cfg_or_overrides
        if build_it:
            build(cfg)
    text = str(err.value)
    assert "\n" not in text, text
    assert match in text, text
    return text


def assert_rows_once(fd, n: int) -> np.ndarray:
    """Train + test hold every written row exactly once; returns the train rows' ids."""
    train, test = row_ids(fd.train_x), row_ids(fd.test_x)
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(n))
    return train


# --------------------------------------------------------------------------- parquet


def test_parquet_rows_labels_and_iid_clients_are_what_was_written(tmp_path):
    n = 50
    path = write_parquet(tmp_path / "t.parquet", list_table(n))
    fd = build(pq_cfg(path))
    train = assert_rows_once(fd, n)
    assert fd.train_x.dtype == np.float32 and fd.input_shape == (D,)
    np.testing.assert_array_equal(fd.train_x, features(n)[train])  # the very values written
    np.testing.assert_array_equal(fd.train_y, train % 3)
    np.testing.assert_array_equal(fd.test_y, row_ids(fd.test_x) % 3)
    assert np.all(np.diff(train) > 0)  # file order kept
    assert fd.num_classes == 3 and fd.name == "t"
    assert all(a.flags.writeable for a in (fd.train_x, fd.train_y, fd.test_x, fd.test_y))  # torch wants them so
    assert sorted(np.concatenate(fd.client_train).tolist()) == list(range(len(train)))


def test_parquet_split_is_the_one_as_pool_draws_from_the_whole_table(tmp_path):
    """Reading rows straight into train / test gives exactly rayfl's own split of the pool."""
    n = 200
    path = write_parquet(tmp_path / "t.parquet", list_table(n), row_group_size=13)
    for extra in ([], ["data.max_samples=57"], ["data.test_fraction=0.35", "run.seed=4"]):
        cfg = pq_cfg(path, *extra)
        train, test = load_parquet(cfg.data, cfg.run.seed)
        whole = ArrayDataset(features(n), np.arange(n) % 3, 3, "t")
        want_train, want_test = as_pool(whole, cfg.data, cfg.run.seed)
        np.testing.assert_array_equal(train.x, want_train.x)
        np.testing.assert_array_equal(test.x, want_test.x)
        np.testing.assert_array_equal(train.y, want_train.y)


def test_parquet_natural_clients_are_exactly_their_writers_rows(tmp_path):
    n = 60
    writers = [f"user-{'bca'[i % 3]}{i % 5}" for i in range(n)]
    path = write_parquet(tmp_path / "t.parquet", list_table(n, writers=writers))
    fd = build(pq_cfg(path, "data.client_column=writer", method="natural", clients=None))
    names = sorted(set(writers))  # client k is the k-th writer in sorted order
    assert fd.num_clients == len(names) == 15
    train, test = row_ids(fd.train_x), row_ids(fd.test_x)
    for k, name in enumerate(names):
        mine = {i for i in range(n) if writers[i] == name}
        got = set(train[fd.client_train[k]]) | set(test[fd.client_test[k]])
        assert got == mine, (k, name)


def test_parquet_dirichlet_keeps_every_row_and_its_label(tmp_path):
    n = 90
    path = write_parquet(tmp_path / "t.parquet", list_table(n))
    fd = build(pq_cfg(path, "partition.alpha=0.3", method="dirichlet", clients=4))
    train = assert_rows_once(fd, n)
    np.testing.assert_array_equal(fd.train_y, train % 3)
    assert sorted(np.concatenate(fd.client_train).tolist()) == list(range(len(train)))
    again = build(pq_cfg(path, "partition.alpha=0.3", method="dirichlet", clients=4))
    for a, b in zip(fd.client_train, again.client_train, strict=True):  # same file and seed: same partition
        np.testing.assert_array_equal(a, b)


def test_string_labels_are_coded_in_sorted_order(tmp_path):
    n = 30
    labels = ["dog", "cat", "ant", "cat", "dog", "emu"] * 5
    path = write_parquet(tmp_path / "t.parquet", list_table(n, labels=labels))
    cfg = pq_cfg(path)
    fd = build(cfg)
    code = {"ant": 0, "cat": 1, "dog": 2, "emu": 3}
    np.testing.assert_array_equal(fd.train_y, [code[labels[i]] for i in row_ids(fd.train_x)])
    np.testing.assert_array_equal(fd.test_y, [code[labels[i]] for i in row_ids(fd.test_x)])
    assert fd.num_classes == 4
    assert class_names(cfg.data) == ["ant", "cat", "dog", "emu"]
    assert class_names(pq_cfg(write_parquet(tmp_path / "i.parquet", list_table(n))).data) is None


def test_parquet_test_path_is_the_test_split(tmp_path):
    train_path = write_parquet(tmp_path / "train.parquet", list_table(40))
    test_path = write_parquet(tmp_path / "test.parquet", list_table(9, start=100, labels=["b", "a", "c"] * 3))
    # string labels in the test file only: the whole label column is coded over both files
    train_path = write_parquet(tmp_path / "train.parquet", list_table(40, labels=[["a", "b", "c"][i % 3] for i in range(40)]))
    fd = build(pq_cfg(train_path, f"data.test_path={test_path}"))
    np.testing.assert_array_equal(row_ids(fd.train_x), np.arange(40))
    np.testing.assert_array_equal(row_ids(fd.test_x), np.arange(100, 109))
    np.testing.assert_array_equal(fd.test_y, [1, 0, 2] * 3)
    np.testing.assert_array_equal(fd.train_y, np.arange(40) % 3)


def test_max_samples_caps_train_and_test_deterministically(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", list_table(100))
    fd = build(pq_cfg(path, "data.max_samples=30"))
    ids = np.concatenate([row_ids(fd.train_x), row_ids(fd.test_x)])
    assert len(ids) == 30 and len(set(ids.tolist())) == 30
    np.testing.assert_array_equal(fd.train_y, row_ids(fd.train_x) % 3)
    again = build(pq_cfg(path, "data.max_samples=30"))
    np.testing.assert_array_equal(again.train_x, fd.train_x)
    other = build(pq_cfg(path, "data.max_samples=30", "run.seed=1"))
    assert not np.array_equal(other.train_x, fd.train_x)
    # with a test file the cap covers both files, keeping their ratio
    test_path = write_parquet(tmp_path / "test.parquet", list_table(50, start=1000))
    both = build(pq_cfg(path, f"data.test_path={test_path}", "data.max_samples=30"))
    assert (len(both.train_y), len(both.test_y)) == (20, 10)
    assert row_ids(both.test_x).min() >= 1000 and row_ids(both.train_x).max() < 100


def test_a_directory_and_a_glob_of_part_files_read_in_file_order(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    for k, start in enumerate((0, 23, 41)):
        write_parquet(parts / f"part-{k}.parquet", list_table({0: 23, 23: 18, 41: 19}[start], start=start), row_group_size=5)
    (parts / "_SUCCESS").write_text("")
    for path in (parts, f"{parts}/part-*.parquet", f"file://{parts}"):
        fd = build(pq_cfg(path, "data.test_fraction=0.1"))
        assert np.all(np.diff(assert_rows_once(fd, 60)) > 0)


def test_numeric_feature_columns_reshaped(tmp_path):
    n = 24
    x = features(n)
    table = pa.table({"label": np.arange(n) % 2, **{f"f{j}": x[:, j] for j in range(D)}, "__index_level_0__": np.arange(n)})
    path = write_parquet(tmp_path / "t.parquet", table)
    fd = build(cfg_of("parquet", path, "data.shape=[1,2,2]"))
    assert fd.input_shape == (1, 2, 2)
    np.testing.assert_array_equal(fd.train_x.reshape(-1, D), x[row_ids(fd.train_x)])
    picked = build(cfg_of("parquet", path, "data.feature_columns=[f3,f1]"))
    ids = np.round(picked.train_x[:, 1]).astype(int)  # f1 = i + 0.25
    np.testing.assert_array_equal(picked.train_x, x[ids][:, [3, 1]])


def test_nested_list_column_keeps_its_dims(tmp_path):
    n = 12
    x = np.arange(n * 6, dtype=np.float64).reshape(n, 2, 3)  # row i: 6i .. 6i+5
    table = pa.table({"pixels": pa.array(x.tolist()), "label": np.arange(n) % 2})
    path = write_parquet(tmp_path / "t.parquet", table)
    fd = build(cfg_of("parquet", path, "data.features_column=pixels"))
    assert fd.input_shape == (2, 3) and fd.train_x.dtype == np.float32
    np.testing.assert_array_equal(fd.train_x, x[(fd.train_x[:, 0, 0] // 6).astype(int)])


def png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def image_rows(n: int, h: int = 3, w: int = 5, rgb: bool = False) -> list[np.ndarray]:
    """Image i: pixel (r, c) = 10 i + 2 r + c (and + 100 in the green, + 150 in the blue channel)."""
    out = []
    for i in range(n):
        base = (10 * i + 2 * np.arange(h)[:, None] + np.arange(w)[None, :]).astype(np.uint8)
        out.append(np.stack([base, base + 100, base + 150], axis=-1) if rgb else base)
    return out


def test_image_column_decodes_to_chw_in_unit_range(tmp_path):
    n = 10
    gray = image_rows(n)
    rgb = image_rows(n, rgb=True)
    table = pa.table({
        "img": pa.array([{"bytes": png(a), "path": None} for a in gray]),  # as Hugging Face writes
        "raw": pa.array([png(a) for a in rgb], type=pa.binary()),
        "label": np.arange(n) % 2,
    })
    path = write_parquet(tmp_path / "t.parquet", table)
    fd = build(cfg_of("parquet", path, "data.image_column=img"))
    assert fd.input_shape == (1, 3, 5)
    ids = np.round(fd.train_x[:, 0, 0, 0] * 255 / 10).astype(int)
    np.testing.assert_allclose(fd.train_x[:, 0], np.stack([gray[i] for i in ids]) / 255, atol=1e-7)
    fd = build(cfg_of("parquet", path, "data.image_column=raw"))
    assert fd.input_shape == (3, 3, 5)
    ids = np.round(fd.train_x[:, 0, 0, 0] * 255 / 10).astype(int)
    for k, i in enumerate(ids):
        np.testing.assert_allclose(fd.train_x[k], rgb[i].transpose(2, 0, 1) / 255, atol=1e-7)


def test_parquet_with_large_labels_and_num_classes(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", list_table(20, labels=np.arange(20) % 2 + 3))
    fd = build(pq_cfg(path))
    assert fd.num_classes == 5 and set(fd.train_y.tolist()) <= {3, 4}  # integer labels are the codes
    assert build(pq_cfg(path, "data.num_classes=10")).num_classes == 10
    one_line_error(pq_cfg(path, "data.num_classes=4"), "data.num_classes: is 4")
    negative = write_parquet(tmp_path / "n.parquet", list_table(20, labels=np.arange(20) % 2 * 2 - 1))
    fd = build(pq_cfg(negative))
    assert fd.num_classes == 2 and set(fd.train_y.tolist()) == {0, 1}


# --------------------------------------------------------------------------- csv


def csv_text(n: int, labels=None, start: int = 0) -> str:
    x = features(n, start)
    lines = ["label,writer," + ",".join(f"f{j}" for j in range(D))]
    for i in range(n):
        label = (start + i) % 3 if labels is None else labels[i]
        lines.append(f"{label},{(start + i) % 12}," + ",".join(f"{v:g}" for v in x[i]))
    return "\n".join(lines) + "\n"


def test_csv_values_iid_natural_and_string_labels(tmp_path):
    n = 45
    path = tmp_path / "t.csv"
    path.write_text(csv_text(n))
    fd = build(cfg_of("csv", path))  # every column but label and writer... the writer is a feature here
    assert fd.input_shape == (D + 1,)
    fd = build(cfg_of("csv", path, "data.client_column=writer", "data.shape=[2,2]"))
    assert fd.input_shape == (2, 2)
    train = assert_rows_once(fd, n)
    np.testing.assert_array_equal(fd.train_x.reshape(-1, D), features(n)[train])
    np.testing.assert_array_equal(fd.train_y, train % 3)
    natural = build(cfg_of("csv", path, "data.client_column=writer", method="natural", clients=None))
    ids_train, ids_test = row_ids(natural.train_x), row_ids(natural.test_x)
    assert natural.num_clients == 12
    for k in range(12):  # writer ids 0..11 are integers: sorted numerically (2 before 10)
        got = set(ids_train[natural.client_train[k]]) | set(ids_test[natural.client_test[k]])
        assert got == {i for i in range(n) if i % 12 == k}
    named = tmp_path / "s.csv"
    named.write_text(csv_text(n, labels=[["zebra", "ant", "mole"][i % 3] for i in range(n)]))
    fd = build(cfg_of("csv", named, "data.client_column=writer"))
    want = {0: 2, 1: 0, 2: 1}  # zebra -> 2, ant -> 0, mole -> 1
    np.testing.assert_array_equal(fd.train_y, [want[i % 3] for i in row_ids(fd.train_x)])


def test_csv_gz_with_test_file_and_dirichlet(tmp_path):
    train = tmp_path / "train.csv.gz"
    train.write_bytes(gzip.compress(csv_text(60).encode()))
    test = tmp_path / "test.csv"
    test.write_text(csv_text(12, start=500))
    fd = build(cfg_of("csv", train, f"data.test_path={test}", "data.client_column=writer", method="dirichlet", clients=3))
    np.testing.assert_array_equal(row_ids(fd.test_x), np.arange(500, 512))
    np.testing.assert_array_equal(fd.test_y, np.arange(500, 512) % 3)
    assert sorted(row_ids(fd.train_x).tolist()) == list(range(60))


def test_csv_labels_that_turn_to_text_late_are_still_one_column(tmp_path, monkeypatch):
    """A label column whose first block is all digits and a later one is not is read as text."""
    n = 40
    labels = ["1"] * 20 + ["2"] * 19 + ["x"]
    path = tmp_path / "t.csv"
    path.write_text(csv_text(n, labels=labels))
    monkeypatch.setattr(tables, "CSV_BLOCK_BYTES", 256)  # many blocks
    fd = build(cfg_of("csv", path, "data.client_column=writer"))
    assert fd.num_classes == 3  # "1" < "2" < "x"
    np.testing.assert_array_equal(fd.train_y, [{"1": 0, "2": 1, "x": 2}[labels[i]] for i in row_ids(fd.train_x)])


# --------------------------------------------------------------------------- npz


def test_npz_arrays_keys_clients_and_test_file(tmp_path):
    n = 30
    x = features(n)
    np.savez(tmp_path / "d.npz", inputs=x.astype(np.float64), target=np.arange(n) % 3, user=np.arange(n) % 4 * 10)
    fd = build(cfg_of("npz", tmp_path / "d.npz", "data.x_key=inputs", "data.y_key=target"))
    train = assert_rows_once(fd, n)
    assert fd.train_x.dtype == np.float32
    np.testing.assert_array_equal(fd.train_y, train % 3)
    natural = build(cfg_of("npz", tmp_path / "d.npz", "data.x_key=inputs", "data.y_key=target",
                           "data.client_key=user", method="natural", clients=None))
    ids_train, ids_test = row_ids(natural.train_x), row_ids(natural.test_x)
    for k in range(4):
        got = set(ids_train[natural.client_train[k]]) | set(ids_test[natural.client_test[k]])
        assert got == {i for i in range(n) if i % 4 == k}
    np.savez(tmp_path / "t.npz", x=features(5, start=70), y=np.array(["b", "a", "b", "c", "a"]))
    np.savez(tmp_path / "tr.npz", x=x, y=np.array(["a", "b", "c"] * 10))
    split = build(cfg_of("npz", tmp_path / "tr.npz", f"data.test_path={tmp_path / 't.npz'}"))
    np.testing.assert_array_equal(row_ids(split.test_x), np.arange(70, 75))
    np.testing.assert_array_equal(split.test_y, [1, 0, 1, 2, 0])
    assert fd.train_y.flags.writeable and split.train_y.flags.writeable and natural.train_y.flags.writeable


def test_npz_uint8_images_scale_to_unit_range(tmp_path):
    x = np.arange(20 * 2 * 3, dtype=np.uint8).reshape(20, 2, 3)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 2)
    fd = build(cfg_of("npz", tmp_path / "d.npz", "data.shape=[1,2,3]"))
    assert fd.input_shape == (1, 2, 3)
    ids = np.round(fd.train_x[:, 0, 0, 0] * 255 / 6).astype(int)
    np.testing.assert_allclose(fd.train_x[:, 0], x[ids] / 255, atol=1e-7)


# --------------------------------------------------------------------------- training


def test_fedavg_trains_on_a_parquet_table_under_dirichlet(ray_local, tmp_path):
    """A few rounds of FedAvg end to end: the table's rows reach the clients and the model."""
    from rayfl.results import load
    from rayfl.runner import run_experiment

    rng = np.random.default_rng(0)
    n = 240
    labels = np.arange(n) % 3
    centers = np.array([[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0]], dtype=np.float32)
    x = centers[labels] + 0.3 * rng.standard_normal((n, D)).astype(np.float32)
    table = pa.table({"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), D),
                      "label": [["a", "b", "c"][i] for i in labels], "writer": np.arange(n) % 6})
    path = write_parquet(tmp_path / "blobs.parquet", table, row_group_size=50)
    cfg = pq_cfg(path, "partition.alpha=0.5", "run.rounds=3", "algorithm.clients_per_round=4",
                 "algorithm.lr=0.5", f"output.dir={tmp_path / 'results'}", method="dirichlet", clients=4)
    res = load(run_experiment(cfg).run_dir)
    rounds = res.rounds.sort_values("round")
    assert rounds["round"].tolist() == [0, 1, 2]
    accuracy = rounds["test_accuracy"].dropna()
    assert len(accuracy) and np.isfinite(accuracy).all() and accuracy.iloc[-1] > 0.5


# --------------------------------------------------------------------------- mistakes


def test_every_mistake_is_one_line_naming_the_key_or_file(tmp_path):
    good = write_parquet(tmp_path / "t.parquet", list_table(20))
    missing = tmp_path / "nope.parquet"
    one_line_error(lambda: pq_cfg(missing), f"data.path: {missing} does not exist", build_it=False)
    one_line_error(lambda: pq_cfg(f"{tmp_path}/x-*.parquet"), "data.path: no file matches", build_it=False)
    one_line_error(lambda: cfg_of("csv", tmp_path / "nope.csv"), "data.path:", build_it=False)
    one_line_error(lambda: cfg_of("npz", tmp_path / "nope.npz"), "data.path:", build_it=False)
    text = one_line_error(pq_cfg(good, "data.label_column=target"), "data.label_column: column 'target' is not in")
    assert str(good) in text and "['features', 'label', 'writer']" in text
    no_label = write_parquet(tmp_path / "nolabel.parquet", list_table(5).drop_columns(["label"]))
    one_line_error(pq_cfg(good, f"data.test_path={no_label}"), f"data.label_column: column 'label' is not in {no_label}")
    one_class = write_parquet(tmp_path / "one.parquet", list_table(20, labels=np.zeros(20, dtype=np.int64)))
    one_line_error(pq_cfg(one_class), "has 1 class")
    one_line_error(pq_cfg(write_parquet(tmp_path / "cat.parquet", list_table(20, labels=["cat"] * 20))), "has 1 class")
    one_line_error(lambda: pq_cfg(good, method="natural", clients=None), "partition.method:", build_it=False)
    one_line_error(pq_cfg(good, "data.client_column=user"), "data.client_column: column 'user' is not in")
    (tmp_path / "bad.parquet").write_text("not parquet")
    one_line_error(pq_cfg(tmp_path / "bad.parquet"), "is not a readable Parquet file")
    one_line_error(pq_cfg(good, "data.shape=[3,3]"), "data.shape: [3, 3] holds 9 values")
    one_line_error(cfg_of("parquet", good, "data.feature_columns=[writer]"), "data.feature_columns: column 'writer'")
    one_line_error(lambda: pq_cfg(good, "data.features_column=features", "data.image_column=features"),
                   "set one of", build_it=False)
    one_line_error(lambda: cfg_of("csv", good, "data.features_column=features"), "data.features_column: a CSV", build_it=False)
    frac = write_parquet(tmp_path / "frac.parquet", list_table(20, labels=np.arange(20) / 3))
    one_line_error(pq_cfg(frac), "data.label_column: column 'label'")
    nulls = write_parquet(tmp_path / "null.parquet", list_table(20, labels=[None] + [1, 2] * 9 + [0]))
    one_line_error(pq_cfg(nulls), "1 missing value")
    ragged = pa.table({"v": pa.array([[1.0, 2.0]] * 9 + [[1.0]]), "label": np.arange(10) % 2})
    one_line_error(cfg_of("parquet", write_parquet(tmp_path / "ragged.parquet", ragged)), "row 9 holds 1")


def test_images_of_different_sizes_are_one_line(tmp_path):
    imgs = image_rows(6) + image_rows(1, h=4, w=5)
    table = pa.table({"img": pa.array([png(a) for a in imgs], type=pa.binary()), "label": np.arange(7) % 2})
    path = write_parquet(tmp_path / "t.parquet", table)
    one_line_error(cfg_of("parquet", path, "data.image_column=img"),
                   "data.image_column: images of column 'img' differ in size: row 6")
    broken = pa.table({"img": pa.array([png(imgs[0]), b"junk"], type=pa.binary()), "label": [0, 1]})
    one_line_error(cfg_of("parquet", write_parquet(tmp_path / "b.parquet", broken), "data.image_column=img"),
                   "row 1 of column 'img'")


def test_csv_and_npz_mistakes(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    path.write_text(csv_text(10).replace("label,", "name,", 1))
    one_line_error(cfg_of("csv", path), "data.label_column: column 'label' is not in")
    texty = tmp_path / "x.csv"
    texty.write_text("label,a,b\n0,1,x\n1,2,y\n")
    one_line_error(cfg_of("csv", texty), "data.feature_columns: column 'b'")
    late = tmp_path / "late.csv"
    late.write_text("label,a\n" + "".join(f"{i % 2},{i}\n" for i in range(30)) + "1,oops\n")
    monkeypatch.setattr(tables, "CSV_BLOCK_BYTES", 64)  # the first block is all numbers
    one_line_error(cfg_of("csv", late), f"data.path: cannot read {late} as CSV")
    holes = tmp_path / "holes.csv"
    holes.write_text("label,a\n0,1\n,2\n1,3\n")
    one_line_error(cfg_of("csv", holes), "data.label_column: column 'label' of")
    one_line_error(cfg_of("csv", holes), "has 1 missing value")
    np.savez(tmp_path / "d.npz", x=features(10), y=np.arange(10) % 2)
    one_line_error(cfg_of("npz", tmp_path / "d.npz", "data.y_key=labels"), "data.y_key: ")
    one_line_error(cfg_of("npz", tmp_path / "d.npz", "data.client_key=user"), "has no array 'user'")
    np.savez(tmp_path / "short.npz", x=features(10), y=np.arange(9) % 2)
    one_line_error(cfg_of("npz", tmp_path / "short.npz"), "data.y_key: array 'y'")


# --------------------------------------------------------------------------- object stores


def test_parquet_part_files_on_s3(s3_endpoint):  # noqa: F811 (the fixture)
    fs = pafs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http")
    prefix = f"{BUCKET}/tables/{uuid.uuid4().hex}"
    for k, start in enumerate((0, 20)):
        with fs.open_output_stream(f"{prefix}/part-{k}.parquet") as f:
            pq.write_table(list_table(20, start=start), f, row_group_size=6)
    uri = f"s3://{prefix}?endpoint_override={s3_endpoint}&scheme=http"
    fd = build(pq_cfg(uri, "data.client_column=writer", method="natural", clients=None))
    assert sorted(np.concatenate([row_ids(fd.train_x), row_ids(fd.test_x)]).tolist()) == list(range(40))
    assert fd.num_clients == 4
    one_line_error(pq_cfg(f"s3://{prefix}/nothing?endpoint_override={s3_endpoint}&scheme=http"), "data.path:")


# --------------------------------------------------------------------------- memory


# A measuring script's own peak memory: its high-water mark (VmHWM) and a reset of it.
RSS_HELPERS = textwrap.dedent("""
    import resource

    def peak_rss():
        # this process's own high-water mark: ru_maxrss would start from the parent's size at fork
        try:
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def reset_peak():
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := the current RSS
        except OSError:
            pass
""")

MEASURE = RSS_HELPERS + textwrap.dedent("""
    import json, sys, tracemalloc
    import psutil
    import pyarrow as pa
    from rayfl.config import load_config
    from rayfl.data import build_federated_dataset
    from rayfl.data.tables import load_parquet

    def config(path):
        # the driver's own reader (data.read_on_hosts leaves large tables' features to the hosts)
        return load_config(None, ["data.dataset=parquet", f"data.path={path}", "data.client_column=writer",
                                  "data.read_on_hosts=off", "partition.method=iid", "partition.num_clients=100",
                                  "algorithm.clients_per_round=10"])

    def run(cfg):
        # (the arrays made, rows)
        if sys.argv[3] == "load":  # the reader alone: the (train, test) pair
            pair = load_parquet(cfg.data, cfg.run.seed)
            return [a for d in pair for a in (d.x, d.y, d.groups)], sum(len(d) for d in pair)
        fd = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
        return [fd.train_x, fd.train_y, fd.test_x, fd.test_y, *fd.client_train], len(fd.train_y) + len(fd.test_y)

    run(config(sys.argv[2]))  # warm up: every module a build imports is imported before measuring
    cfg = config(sys.argv[1])
    reset_peak()
    rss0 = psutil.Process().memory_info().rss
    if sys.argv[4] == "trace":  # numpy's allocations; tracemalloc's own records would blur the RSS
        tracemalloc.start()
    arrays, rows = run(cfg)
    _, peak = tracemalloc.get_traced_memory()
    maxrss = peak_rss()
    print(json.dumps({"rows": rows, "final": sum(a.nbytes for a in arrays), "traced_peak": peak,
                      "rss_peak_extra": maxrss - rss0, "arrow_peak": pa.default_memory_pool().max_memory()}))
""")


def measure(path: Path, small: Path, what: str, how: str) -> dict:
    """Peak memory of reading `path` in a fresh process (`what`: load or build; `how`: trace
    numpy's allocations, or only the RSS)."""
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(small), what, how], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_big_table(path: Path, n: int, feats: int, group: int, seed: int = 0, per_writer: int = 100) -> None:
    """n rows of `feats` float32 features (a fixed-size list), labels i % 10, `per_writer` rows
    a writer, in row groups of `group` rows, written 100,000 rows at a time."""
    schema = pa.schema([("features", pa.list_(pa.float32(), feats)), ("label", pa.int64()), ("writer", pa.int64())])
    rng = np.random.default_rng(seed)
    chunk = min(n, 100_000)
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, n, chunk):
            x = rng.random((chunk, feats), dtype=np.float32)
            writer.write_table(pa.table({
                "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), feats),
                "label": np.arange(start, start + chunk) % 10,
                "writer": np.arange(start, start + chunk) // per_writer,
            }, schema=schema), row_group_size=group)


def test_a_million_row_parquet_table_is_read_in_batches(tmp_path):
    """The driver's peak extra memory stays near the final float32 arrays, well below what
    holding the table (features, labels, writers) twice in Arrow or pandas would take."""
    n, feats = 1_000_000, 20
    path = tmp_path / "big.parquet"
    write_big_table(path, n, feats, group=20_000, per_writer=500)
    first = pq.ParquetFile(path).read_row_group(0)
    small = write_parquet(tmp_path / "small.parquet", first.slice(0, 1000))
    arrow_bytes = n * (feats * 4 + 8 + 8)  # the table in Arrow memory, once
    pandas_bytes = int(first.to_pandas().memory_usage(deep=True).sum() * n / first.num_rows)  # and in pandas
    load, load_rss, built = (measure(path, small, "load", "trace"), measure(path, small, "load", "rss"),
                             measure(path, small, "build", "rss"))
    assert load["rows"] == built["rows"] == n
    mb = 1 << 20
    print(f"\n[parquet memory] rows {n:,} in {pq.ParquetFile(path).num_row_groups} row groups, file "
          f"{path.stat().st_size / mb:.1f} MiB; the table held once: Arrow {arrow_bytes / mb:.1f} MiB, pandas "
          f"{pandas_bytes / mb:.1f} MiB")
    print(f"[parquet memory] reader (train/test pair): final arrays {load['final'] / mb:.1f} MiB, peak numpy "
          f"allocations (tracemalloc) {load['traced_peak'] / mb:.1f} MiB, peak RSS growth {load_rss['rss_peak_extra'] / mb:.1f} MiB, "
          f"Arrow pool peak {load['arrow_peak'] / mb:.1f} MiB")
    print(f"[parquet memory] build_federated_dataset (iid, 100 clients): final arrays {built['final'] / mb:.1f} MiB, "
          f"peak RSS growth {built['rss_peak_extra'] / mb:.1f} MiB, Arrow pool peak {built['arrow_peak'] / mb:.1f} MiB")
    # the reader: its final arrays, the split's index arrays and a batch; Arrow holds a row group or two
    assert load["traced_peak"] < load["final"] + 0.25 * arrow_bytes
    assert load_rss["rss_peak_extra"] < 2 * arrow_bytes
    # Arrow's pool peaked at 7.1-9.2 MiB (a row group or two, by the allocator's mood); the whole
    # file pre-buffered took 111 MiB
    assert load["arrow_peak"] < 0.25 * arrow_bytes and built["arrow_peak"] < 0.25 * arrow_bytes
    # the whole process, partitioner's index arrays (8 bytes a row each) included: less than the
    # table held twice (in Arrow and in pandas, as pd.read_parquet does), let alone the copies after
    assert built["rss_peak_extra"] < arrow_bytes + pandas_bytes
