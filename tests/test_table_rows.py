"""Large Parquet tables read on the hosts (`data.read_on_hosts`, rayfl.data.rows): the driver
holds labels, client ids, index sets and the test split, and each host reads its own clients'
feature rows from the files, only the row groups that hold them. The rows, their order and dtype
are the driver's own reader's, so runs give the same tables with 1 or 2 hosts, under iid and
natural partitions, with server rows and max_samples; a replaced host reads its rows again, a
stopped run resumes, and a 1,000,000-row table trains with the driver's peak memory growth well
below the table's features (the numbers print with -s)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_host_failures import comparable as without_failures
from test_plugins import table_without_hosts
from test_remote_storage import BUCKET
from test_resume import assert_same_tables, sigterm_after
from test_tables import (  # noqa: F401
    REPO,
    RSS_HELPERS,
    D,
    build,
    features,
    list_table,
    pq_cfg,
    s3_endpoint,
    write_big_table,
    write_parquet,
)

from rayfl.config import ConfigError, ModelConfig, load_config
from rayfl.data import tables
from rayfl.data.rows import FileRows, host_rows
from rayfl.data.tables import load_parquet
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.runlog import RunInterrupted
from rayfl.results import load
from rayfl.runner import resume_experiment, run_experiment

# --------------------------------------------------------------------------- the row set


def parts_dir(tmp_path: Path, sizes: tuple[int, ...] = (23, 0, 31, 18), group: int = 6) -> tuple[Path, int]:
    """Part files of `sizes` rows (one empty) in row groups of `group`; rows numbered over all."""
    d = tmp_path / "parts"
    d.mkdir()
    start = 0
    for k, n in enumerate(sizes):
        write_parquet(d / f"part-{k}.parquet", list_table(n, start=start), row_group_size=group)
        start += n
    return d, start


def test_file_rows_read_exactly_the_rows_asked_in_their_order(tmp_path):
    path, n = parts_dir(tmp_path)
    cfg = pq_cfg(path, "data.read_on_hosts=on", "data.test_fraction=0.25")
    train, test = load_parquet(cfg.data, cfg.run.seed)
    eager_train, eager_test = load_parquet(pq_cfg(path, "data.read_on_hosts=off", "data.test_fraction=0.25").data, 0)
    assert isinstance(train.x, FileRows) and isinstance(test.x, np.ndarray)  # the driver reads the test split
    assert train.x.shape == eager_train.x.shape and train.x.dtype == eager_train.x.dtype == np.float32
    np.testing.assert_array_equal(train.x.read(), eager_train.x)
    np.testing.assert_array_equal(test.x, eager_test.x)
    np.testing.assert_array_equal(train.y, eager_train.y)
    ids = train.x.rows
    picks = np.array([5, 0, 5, len(ids) - 1, 17, 3])  # unsorted, repeated
    np.testing.assert_array_equal(train.x.take(picks).read(), features(n)[ids[picks]])
    np.testing.assert_array_equal(train.x.take(picks).take([1, 3]).read(), features(n)[ids[picks[[1, 3]]]])
    np.testing.assert_array_equal(train.x[2:9], eager_train.x[2:9])
    np.testing.assert_array_equal(train.x[4], eager_train.x[4])
    np.testing.assert_array_equal(np.asarray(train.x), eager_train.x)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(train.x)).read(), eager_train.x)  # what a host gets


def test_the_federated_dataset_keeps_the_rows_unread_and_equal(tmp_path):
    """Server split, max_samples and the rows no client owns dropped (2 of the 4 writers kept):
    the row set follows, unread, to the very rows of the eager arrays."""
    path = write_parquet(tmp_path / "t.parquet", list_table(120), row_group_size=7)
    for method, clients, extra in (("iid", 3, ["data.server_fraction=0.2", "data.max_samples=100"]),
                                   ("natural", 2, ["data.client_column=writer", "data.max_samples=90"])):
        eager = build(pq_cfg(path, "data.read_on_hosts=off", *extra, method=method, clients=clients))
        lazy = build(pq_cfg(path, "data.read_on_hosts=on", *extra, method=method, clients=clients))
        assert isinstance(lazy.train_x, FileRows) and lazy.input_shape == eager.input_shape
        assert method == "iid" or len(lazy.train_x) < 0.7 * 90  # compacted
        np.testing.assert_array_equal(lazy.train_x.read(), eager.train_x)
        for a, b in zip(eager.client_train, lazy.client_train, strict=True):
            np.testing.assert_array_equal(a, b)
        for name in ("train_y", "test_x", "test_y", "server_train"):
            np.testing.assert_array_equal(getattr(lazy, name), getattr(eager, name))


def test_a_host_reads_its_clients_row_groups_only(tmp_path, monkeypatch):
    """Writers in contiguous rows: a host of two writers opens only their row groups, and its
    remapped index sets give each client exactly the rows the eager arrays give it."""
    n, group = 200, 10
    table = list_table(n, writers=[f"w{i // 25}" for i in range(n)])
    path = write_parquet(tmp_path / "w.parquet", table, row_group_size=group)
    cfg = pq_cfg(path, "data.client_column=writer", "data.read_on_hosts=on", method="natural", clients=None)
    lazy = build(cfg)
    eager = build(pq_cfg(path, "data.client_column=writer", "data.read_on_hosts=off", method="natural", clients=None))
    read_groups: list[int] = []
    iter_batches = pq.ParquetFile.iter_batches

    def recording(self, *args, **kwargs):
        read_groups.extend(kwargs["row_groups"])
        return iter_batches(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    mine = {2: lazy.client_train[2], 5: lazy.client_train[5]}
    arrays = {"train_x": lazy.train_x, "train_y": lazy.train_y, "test_x": lazy.test_x, "test_y": lazy.test_y}
    local, remapped = host_rows(arrays, mine)
    file_rows = lazy.train_x.rows[np.concatenate(list(mine.values()))]
    assert sorted(set(read_groups)) == sorted(set((file_rows // group).tolist()))  # writers 2 and 5: rows 50-74, 125-149
    assert len(set(read_groups)) <= 6 < n // group
    assert len(local["train_x"]) == len(local["train_y"]) == sum(len(i) for i in mine.values())
    for c, idx in remapped.items():
        np.testing.assert_array_equal(local["train_x"][idx], eager.train_x[eager.client_train[c]])
        np.testing.assert_array_equal(local["train_y"][idx], eager.train_y[eager.client_train[c]])


def in_process_host(fd: Any, clients: list[int]) -> ClientHostImpl:
    arrays = {"train_x": fd.train_x, "train_y": fd.train_y, "test_x": fd.test_x, "test_y": fd.test_y}
    return ClientHostImpl(0, arrays, {c: fd.client_train[c] for c in clients}, None, ModelConfig(), fd.input_shape,
                          fd.num_classes, 0)


def test_a_host_serves_its_clients_the_eager_rows(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", list_table(90), row_group_size=4)
    eager = build(pq_cfg(path, "data.read_on_hosts=off", clients=5))
    lazy = build(pq_cfg(path, "data.read_on_hosts=on", clients=5))
    host = in_process_host(lazy, [1, 3, 4])
    assert host.info()["train_rows"] == sum(len(lazy.client_train[c]) for c in (1, 3, 4))
    for c in (1, 3, 4):
        ctx = host._context(c, 0, {})
        np.testing.assert_array_equal(ctx.x.numpy(), eager.train_x[eager.client_train[c]])
        np.testing.assert_array_equal(ctx.y.numpy(), eager.train_y[eager.client_train[c]])


def test_a_host_reads_its_rows_from_s3(s3_endpoint):  # noqa: F811 (the fixture)
    """Part files behind a URI: the row set travels pickled (file system included) and a host
    reads its clients' rows from the bucket."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http")
    prefix = f"{BUCKET}/tables/{uuid.uuid4().hex}"
    for k, start in enumerate((0, 30)):
        with fs.open_output_stream(f"{prefix}/part-{k}.parquet") as f:
            pq.write_table(list_table(30, start=start), f, row_group_size=7)
    uri = f"s3://{prefix}?endpoint_override={s3_endpoint}&scheme=http"
    eager = build(pq_cfg(uri, "data.read_on_hosts=off", clients=4))
    lazy = build(pq_cfg(uri, "data.read_on_hosts=on", clients=4))
    lazy.train_x = pickle.loads(pickle.dumps(lazy.train_x))
    host = in_process_host(lazy, [0, 2])
    for c in (0, 2):
        np.testing.assert_array_equal(host._context(c, 0, {}).x.numpy(), eager.train_x[eager.client_train[c]])


def test_auto_leaves_features_over_64_mib_to_the_hosts(tmp_path, monkeypatch):
    """auto: the hosts read the train features when they would take more than 64 MiB as arrays."""
    path = write_parquet(tmp_path / "t.parquet", list_table(50))
    train_bytes = 40 * D * 4  # 40 train rows (test_fraction 0.2) of D float32
    assert tables.READ_ON_HOSTS_BYTES == 64 << 20 and tables.ParquetConfig().read_on_hosts == "auto"
    monkeypatch.setattr(tables, "READ_ON_HOSTS_BYTES", train_bytes)
    assert isinstance(build(pq_cfg(path)).train_x, np.ndarray)
    monkeypatch.setattr(tables, "READ_ON_HOSTS_BYTES", train_bytes - 1)
    assert isinstance(build(pq_cfg(path)).train_x, FileRows)
    assert isinstance(build(pq_cfg(path, "data.read_on_hosts=off")).train_x, np.ndarray)


def test_a_file_that_changed_since_is_a_start_error(tmp_path):
    """A host that cannot read its rows says why in one line (the driver raises it at start)."""
    path = write_parquet(tmp_path / "t.parquet", list_table(60), row_group_size=8)
    lazy = build(pq_cfg(path, "data.read_on_hosts=on"))
    write_parquet(path, list_table(40), row_group_size=8)
    host = in_process_host(lazy, [0])
    key, message = host.info()["start_error"]
    assert key == "data.path" and "holds 40 rows, 60 when the run planned" in message and "\n" not in message
    path.unlink()
    with pytest.raises(ConfigError, match="data.path: .*t.parquet"):
        lazy.train_x.read()


# --------------------------------------------------------------------------- runs


def blobs(n: int, seed: int = 0) -> pa.Table:
    """Three noisy blobs in D features (a list column), string labels, writers w{i % 7}."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    centers = np.eye(3, D, dtype=np.float32) * 2
    x = centers[labels] + 0.5 * rng.standard_normal((n, D)).astype(np.float32)
    return pa.table({"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), D),
                     "label": [["a", "b", "c"][i] for i in labels], "writer": [f"w{i % 7}" for i in range(n)]})


def table_job(path: Path, results_dir: Path, run_id: str, *extra: str):
    return load_config(None, [
        "data.dataset=parquet", f"data.path={path}", "data.features_column=features", "data.max_samples=500",
        "algorithm.clients_per_round=4", "algorithm.local_epochs=null", "algorithm.local_steps=3",
        "algorithm.batch_size=8", "algorithm.lr=0.3", "run.rounds=6", "run.eval_every=2",
        "engine.num_hosts=2", "engine.num_cpus_per_host=0.5", f"output.dir={results_dir}", f"run.run_id={run_id}", *extra,
    ])


PARTITIONS = {
    "iid": ["partition.method=iid", "partition.num_clients=8", "data.server_fraction=0.2", "algorithm.server_as_client=true"],
    "natural": ["partition.method=natural", "partition.num_clients=5", "data.client_column=writer",
                "data.server_fraction=0.1", "algorithm.server_as_client=true"],
}


@pytest.fixture(scope="module")
def blob_table(tmp_path_factory) -> Path:
    return write_parquet(tmp_path_factory.mktemp("blobs") / "blobs.parquet", blobs(640), row_group_size=16)


def run_seeing(cfg) -> tuple[Any, dict[str, Any]]:
    """The run's tables, and what its Federation held: the driver's train features, the server's
    rows, each host's rows."""
    seen: dict[str, Any] = {}

    def on_start(run_dir, fed) -> None:
        seen.update(train_x=fed.dataset.train_x, server_x=fed.server_data.x.numpy(),
                    host_rows=[info["train_rows"] for info in fed.hosts.info])

    return load(run_experiment(cfg, on_start=on_start).run_dir), seen


@pytest.mark.parametrize("partition", sorted(PARTITIONS))
def test_hosts_reading_their_rows_give_the_drivers_tables(ray_local, blob_table, results_dir, partition):
    extra = PARTITIONS[partition]
    # engine.balance off: hosts reading their own rows run their own clients, so the same placement
    eager, e = run_seeing(table_job(blob_table, results_dir, f"{partition}-off", "data.read_on_hosts=off",
                                    "engine.balance=off", *extra))
    two, t = run_seeing(table_job(blob_table, results_dir, f"{partition}-on-2", "data.read_on_hosts=on", *extra))
    one, o = run_seeing(table_job(blob_table, results_dir, f"{partition}-on-1", "data.read_on_hosts=on",
                                  "engine.num_hosts=1", *extra))
    assert isinstance(e["train_x"], np.ndarray) and isinstance(t["train_x"], FileRows)
    np.testing.assert_array_equal(t["server_x"], e["server_x"])  # read from the files at start
    rows = len(e["train_x"]) - len(e["server_x"])  # owned by some client
    assert sum(t["host_rows"]) == o["host_rows"][0] == rows and max(t["host_rows"]) < rows
    assert eager.rounds["test_accuracy"].dropna().iloc[-1] > 0.5
    assert_same_tables(eager, two)
    assert_same_tables(table_without_hosts(eager), table_without_hosts(one))


def test_a_replaced_host_reads_its_rows_again(ray_local, blob_table, results_dir):
    extra = [*PARTITIONS["iid"], "data.read_on_hosts=on", "algorithm.name=scaffold", "algorithm.lr=0.05",
             "output.checkpoint_every=2", "run.rounds=8"]
    clean = load(run_experiment(table_job(blob_table, results_dir, "clean", *extra)).run_dir)
    hurt = load(run_experiment(table_job(blob_table, results_dir, "killed", *extra, "engine.kill_host_every=7",
                                         "engine.max_restarts=10")).run_dir)
    assert hurt.rounds["host_failures"].sum() >= 2 and hurt.clients["rerun"].any()
    for table in ("rounds", "clients", "evals"):
        pd.testing.assert_frame_equal(without_failures(getattr(clean, table)), without_failures(getattr(hurt, table)),
                                      check_like=True)


def test_a_stopped_run_resumes_reading_on_hosts(ray_local, blob_table, results_dir):
    extra = [*PARTITIONS["natural"], "data.read_on_hosts=on", "output.checkpoint_every=2", "run.rounds=7"]
    whole = load(run_experiment(table_job(blob_table, results_dir, "whole", *extra)).run_dir)
    with pytest.raises(RunInterrupted):
        run_experiment(table_job(blob_table, results_dir, "stopped", *extra), on_start=sigterm_after(4))
    run_dir = results_dir / "default" / "stopped"
    assert load(run_dir).rounds["round"].max() == 4
    assert_same_tables(whole, load(resume_experiment(run_dir).run_dir))


# --------------------------------------------------------------------------- memory


TRAIN_MEASURED = RSS_HELPERS + textwrap.dedent("""
    import json, sys
    import psutil, ray
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    big, warm, test, out = sys.argv[1:5]

    def config(path, run_id):
        return load_config(None, [
            "data.dataset=parquet", f"data.path={path}", f"data.test_path={test}", "data.features_column=features",
            "data.client_column=writer", "partition.method=iid", "partition.num_clients=20",
            "algorithm.clients_per_round=4", "algorithm.local_epochs=null", "algorithm.local_steps=5",
            "run.rounds=3", "engine.num_hosts=2", "engine.num_cpus_per_host=1", "engine.pool=off",
            f"output.dir={out}", f"run.run_id={run_id}"])

    seen = {}

    def on_start(run_dir, fed):
        seen["hosts"] = [info["train_rows"] for info in fed.hosts.info]
        seen["driver_x"] = type(fed.dataset.train_x).__name__
        seen["train_rows"] = len(fed.dataset.train_y)

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    run_experiment(config(warm, "warm"))  # imports, Ray's workers and the host class: before measuring
    reset_peak()
    rss0 = psutil.Process().memory_info().rss
    run_experiment(config(big, "big"), on_start=on_start)
    grown = peak_rss() - rss0
    print(json.dumps({"peak_growth": grown, **seen}))
""")


def test_a_million_row_parquet_table_trains_with_the_features_left_to_the_hosts(tmp_path):
    """The done-when of reading on hosts: the driver's peak memory growth over a whole run
    (dataset build, hosts, 3 rounds) stays well below the table's float32 features."""
    n, feats = 1_000_000, 64
    big, warm, test = tmp_path / "big.parquet", tmp_path / "warm.parquet", tmp_path / "test.parquet"
    write_big_table(big, n, feats, group=10_000)
    write_big_table(warm, 2_000, feats, group=500, seed=1)
    write_big_table(test, 1_000, feats, group=500, seed=2)
    out = subprocess.run([sys.executable, "-c", TRAIN_MEASURED, str(big), str(warm), str(test), str(tmp_path / "results")],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    mb = 1 << 20
    feature_bytes = n * feats * 4
    print(f"\n[read on hosts] rows {n:,} in {pq.ParquetFile(big).num_row_groups} row groups, file "
          f"{big.stat().st_size / mb:.1f} MiB, float32 features {feature_bytes / mb:.1f} MiB; driver peak RSS growth "
          f"over the run {got['peak_growth'] / mb:.1f} MiB ({got['peak_growth'] / feature_bytes:.2f}x the features); "
          f"driver train_x: {got['driver_x']}; rows each host read: {got['hosts']}")
    assert got["peak_growth"] < 0.5 * feature_bytes  # the driver read with the features: 2.4x (585 MiB)
    assert got["driver_x"] == "FileRows" and got["train_rows"] == n
    assert sum(got["hosts"]) == n and max(got["hosts"]) < n
