"""Results on an S3-compatible store: a real moto server on loopback, real pyarrow S3, real Ray."""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from rayfl.results import RunWriter, load
from rayfl.results.storage import Location, put_bytes
from rayfl.results.writer import RunExistsError

BUCKET = "rayfl-results"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never wait for an instance-metadata endpoint
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with one bucket, and test credentials in the environment."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"127.0.0.1:{port}"
    try:
        pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir(BUCKET)
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_root(s3_endpoint: str) -> str:
    """A fresh prefix in the bucket, as the URI a user would put in output.dir."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex}/results?endpoint_override={s3_endpoint}&scheme=http"


def keys_under(uri: str) -> list[str]:
    """Every object key below a URI, relative to it."""
    where = Location.parse(uri)
    infos = where.fs.get_file_info(pafs.FileSelector(where.path, recursive=True, allow_not_found=True))
    return sorted(i.path[len(where.path) + 1:] for i in infos if i.type == pafs.FileType.File)


def read_manifest_at(uri: str) -> dict:
    return json.loads(Location.parse(uri).child("manifest.json").read_bytes())


# ---------------------------------------------------------------------- the writer on S3


def test_writer_on_s3_widens_the_schema_across_flushes(s3_root):
    w = RunWriter(s3_root, "exp", "r1", {"seed": 3}, compact=False)  # keep the parts to look at
    assert isinstance(w.run_dir, str) and w.run_dir.startswith(f"s3://{BUCKET}/")
    assert "/results/exp/r1?endpoint_override=" in w.run_dir  # the query survives, so load(run_dir) works
    assert read_manifest_at(w.run_dir)["status"] == "running"
    w.append("rounds", {"round": 0, "loss": 2, "note": 1})
    w.flush()
    w.append("rounds", {"round": 1, "loss": 1.5, "accuracy": 0.25, "note": "diverged"})
    w.flush()
    w.append("rounds", {"round": 2, "done": True})
    w.close(summary={"final_loss": float("nan")})

    assert keys_under(w.run_dir) == [
        "manifest.json", "rounds/part-00000.parquet", "rounds/part-00001.parquet", "rounds/part-00002.parquet",
    ]  # written straight to the final keys: no temp objects, no directory markers
    where = Location.parse(w.run_dir)
    schemas = [pq.read_schema(f"{where.path}/rounds/part-0000{i}.parquet", filesystem=where.fs) for i in range(3)]
    assert all(s.equals(schemas[0]) for s in schemas)  # the early parts were rewritten wider
    assert schemas[0].names == ["run_id", "round", "loss", "note", "accuracy", "done"]

    df = load(w.run_dir).rounds
    assert df["round"].tolist() == [0, 1, 2]
    assert df["loss"].tolist()[:2] == [2.0, 1.5] and df["note"].tolist()[:2] == ["1", "diverged"]
    manifest = read_manifest_at(w.run_dir)
    assert manifest["status"] == "completed" and manifest["summary"] == {"final_loss": None}


def test_a_reused_run_id_on_s3_is_refused_unless_overwrite(s3_root):
    with RunWriter(s3_root, "exp", "r1", {"seed": 1}) as w:
        for r in range(3):
            w.append("rounds", {"round": r})
            w.flush()
    before = read_manifest_at(w.run_dir)

    with pytest.raises(RunExistsError) as e:
        RunWriter(s3_root, "exp", "r1", {"seed": 2})
    message = str(e.value)
    assert isinstance(e.value, FileExistsError) and "\n" not in message
    assert "'r1'" in message and w.run_dir in message and "output.overwrite=true" in message
    assert read_manifest_at(w.run_dir) == before  # untouched

    with RunWriter(s3_root, "exp", "r1", {"seed": 2}, overwrite=True) as again:
        again.append("rounds", {"round": 0, "loss": 0.5})
    assert keys_under(again.run_dir) == ["manifest.json", "rounds/part-00000.parquet"]  # old parts gone
    res = load(s3_root)
    assert res.rounds["round"].tolist() == [0] and res.rounds["loss"].tolist() == [0.5]
    assert res.manifests["seed"].tolist() == [2]


def test_load_reads_a_root_an_experiment_and_a_run_by_uri(s3_root):
    for experiment in ("alpha", "beta"):
        for run_id, rounds in (("a", 2), ("b", 3)):
            with RunWriter(s3_root, experiment, run_id, {}) as w:
                w.extend("rounds", [{"round": r} for r in range(rounds)])
    res = load(s3_root)
    assert res.rounds.groupby(["experiment", "run_id"]).size().to_dict() == {
        ("alpha", "a"): 2, ("alpha", "b"): 3, ("beta", "a"): 2, ("beta", "b"): 3,
    }
    base, query = s3_root.split("?")
    assert res.manifests["run_dir"].tolist()[0] == f"{base}/alpha/a?{query}"
    assert set(load(f"{base}/beta?{query}").rounds["experiment"]) == {"beta"}
    assert load(res.manifests["run_dir"].iloc[-1]).rounds["round"].tolist() == [0, 1, 2]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(f"{base}/missing?{query}")


def test_put_bytes_on_a_filesystem_with_rename_moves_into_place(tmp_path):
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())  # not local, not an object store
    put_bytes(fs, "m.json", b"{}")
    put_bytes(fs, "m.json", b'{"a": 1}')
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # the temp dot-name is gone
    assert (tmp_path / "m.json").read_bytes() == b'{"a": 1}'


# ---------------------------------------------------------------------- a real run


def test_a_run_on_s3_reads_back_with_load_duckdb_and_report(ray_local, s3_root, tmp_path, monkeypatch, capsys):
    from rayfl.cli import main
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    cfg = load_config(None, [
        "run.rounds=3", "partition.num_clients=10", "algorithm.clients_per_round=5",
        "run.experiment=remote", "run.run_id=tiny", f"output.dir={s3_root}",
    ])
    outcome = run_experiment(cfg)
    assert isinstance(outcome.run_dir, str) and outcome.run_dir.startswith(f"s3://{BUCKET}/")

    res = load(s3_root)
    assert sorted(res.rounds["round"]) == [0, 1, 2]
    assert res.manifests["status"].tolist() == ["completed"] and res.manifests["run_id"].tolist() == ["tiny"]
    assert len(res.clients) == 3 * 5

    # what a user does with DuckDB: every rounds part below the root, through pyarrow's S3
    root = Location.parse(s3_root)
    infos = root.fs.get_file_info(pafs.FileSelector(root.path, recursive=True))
    parts = sorted(i.path for i in infos if "/rounds/" in i.path and i.path.endswith(".parquet"))
    con = duckdb.connect()
    con.register("rounds", duckdb.from_arrow(ds.dataset(parts, filesystem=root.fs, format="parquet"), connection=con))
    rows = con.sql(
        "select run_id, count(*), min(round), max(round), count(train_loss) from rounds group by run_id"
    ).fetchall()
    assert rows == [("tiny", 3, 0, 2, 3)]

    # `rayfl report` on the URI: figures go to ./report/<prefix> here
    monkeypatch.chdir(tmp_path)
    assert main(["report", s3_root]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "figure:" in out
    assert sorted(p.name for p in (tmp_path / "report" / "results").glob("*.png"))


# ---------------------------------------------------------------------- relative output.dir in a Ray job


def test_a_relative_output_dir_inside_a_ray_job_is_warned_about(monkeypatch, tmp_path):
    from rayfl.runner import RAY_JOB_ENV, relative_output_in_job_warning

    monkeypatch.delenv(RAY_JOB_ENV, raising=False)
    assert relative_output_in_job_warning("results") is None  # not in a job: the user's own cwd
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip"}, "metadata": {"job_submission_id": "raysubmit_X"}}
    monkeypatch.setenv(RAY_JOB_ENV, json.dumps(job))
    monkeypatch.chdir(tmp_path)
    warning = relative_output_in_job_warning("results")
    assert warning is not None and "\n" not in warning
    assert "raysubmit_X" in warning and str(tmp_path / "results") in warning and "s3://" in warning
    assert "temporary copy of --working-dir" in warning
    monkeypatch.setenv(RAY_JOB_ENV, json.dumps({"runtime_env": {}, "metadata": {}}))
    assert "the job driver's working directory" in (relative_output_in_job_warning("results") or "")
    assert relative_output_in_job_warning(str(tmp_path / "abs")) is None
    assert relative_output_in_job_warning(f"file://{tmp_path}") is None
    assert relative_output_in_job_warning("s3://bucket/results") is None
    assert Path("~/x").expanduser().is_absolute() and relative_output_in_job_warning("~/x") is None


def test_a_crashed_run_on_s3_resumes_from_its_checkpoint_there(ray_local, s3_root):
    """Checkpoints live beside the Parquet on the same filesystem, URIs included."""
    from rayfl.config import load_config
    from rayfl.runner import resume_experiment, run_experiment

    def cfg(run_id: str):
        return load_config(None, [
            "algorithm.name=scaffold", "run.rounds=5", "partition.num_clients=10", "algorithm.clients_per_round=4",
            "output.checkpoint_every=2", f"output.dir={s3_root}", f"run.run_id={run_id}",
        ])

    def crash_after_round_2(run_dir, fed) -> None:
        log_round = fed.log_round

        def log_then_crash(r: int, **metrics) -> None:
            log_round(r, **metrics)
            if r == 2:
                raise RuntimeError("crash")

        fed.log_round = log_then_crash

    whole = load(run_experiment(cfg("whole")).run_dir)
    with pytest.raises(RuntimeError, match="crash"):
        run_experiment(cfg("crashed"), on_start=crash_after_round_2)
    run_uri = Location.parse(s3_root).child("default", "crashed").name
    assert "checkpoint.npz" in keys_under(run_uri)
    resumed = load(resume_experiment(run_uri).run_dir)
    drop = ["wall_time", "run_id"]
    for table in ("rounds", "clients"):
        a = getattr(whole, table).drop(columns=drop, errors="ignore").sort_values(["round", *(["client"] if table == "clients" else [])])
        b = getattr(resumed, table).drop(columns=drop, errors="ignore").sort_values(["round", *(["client"] if table == "clients" else [])])
        assert a.reset_index(drop=True).equals(b.reset_index(drop=True)), table
