"""TensorBoard and MLflow callbacks, driven with hand-made rows and read back with each
tracker's own reader: TensorBoard's EventAccumulator, and MlflowClient against a real
`mlflow server` (started once for this file) and a local SQLite store."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rayfl.callbacks.base import RunInfo
from rayfl.callbacks.trackers import (
    MLflow,
    MLflowConfig,
    TensorBoard,
    TensorBoardConfig,
    mlflow_tracker,
    tensorboard,
)
from rayfl.config import ConfigError

EVAL_ROUNDS = (1, 3, 4)
CONFIG: dict[str, Any] = {
    "run": {"experiment": "default", "seed": 0, "rounds": 5},
    "algorithm": {"name": "fedavg", "lr": 0.01, "kwargs": {}},
    "system": {"tiers": [{"name": "fast", "fraction": 0.5}]},
    "data": {"note": "x" * 7000},
}


def loss(r: int, shift: float = 0.0) -> float:
    return 1.0 / (r + 1) + shift


def round_row(r: int, shift: float = 0.0) -> dict[str, Any]:
    """A `rounds` row: a None, a NaN (round 2's grad_norm) and a string among the numbers;
    evaluation columns only on EVAL_ROUNDS."""
    row: dict[str, Any] = {
        "round": r, "sim_time": 2.5 * r, "wall_time": 0.1 * r, "bytes": 1000 * r, "clients_ok": 10,
        "train_loss": loss(r, shift), "dropped_reason": None, "phase": "train",
        "grad_norm": math.nan if r == 2 else 0.5,
    }
    if r in EVAL_ROUNDS:
        row.update(test_accuracy=0.5 + 0.1 * r, test_loss=0.3)
    return row


def eval_rows(r: int) -> list[dict[str, Any]]:
    """The global model's row and one personalized row (client 7, a distinct accuracy)."""
    base = {"round": r, "sim_time": 2.5 * r, "wall_time": 0.1 * r, "split": "test"}
    return [
        {**base, "client": -1, "test_loss": 0.3, "test_accuracy": 0.5 + 0.1 * r},
        {**base, "client": 7, "test_loss": 9.0, "test_accuracy": 0.01},
    ]


def drive(cb: Any, run: RunInfo, rounds: range, shift: float = 0.0, status: str | None = "completed") -> None:
    cb.on_run_start(run)
    for r in rounds:
        assert cb.on_round(round_row(r, shift), run) is None
        if r in EVAL_ROUNDS:
            for row in eval_rows(r):
                cb.on_eval(row, run)
    if status is not None:
        cb.on_run_end(status, run)


# ------------------------------------------------------------------------------ TensorBoard


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in all the event files of `log_dir`: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()[SCALARS]}


def test_tensorboard_writes_one_scalar_per_numeric_column(tmp_path: Path) -> None:
    run = RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG)
    cb = tensorboard(TensorBoardConfig())
    drive(cb, run, range(5))
    got = read_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in got["rounds/train_loss"]] == [0, 1, 2, 3, 4]
    assert [v for _, v in got["rounds/train_loss"]] == pytest.approx([loss(r) for r in range(5)])
    assert [s for s, _ in got["rounds/test_accuracy"]] == list(EVAL_ROUNDS)
    assert [s for s, _ in got["rounds/grad_norm"]] == [0, 1, 3, 4]  # NaN skipped
    assert [v for _, v in got["rounds/bytes"]] == [1000.0 * r for r in range(5)]
    assert {"rounds/sim_time", "rounds/wall_time", "rounds/clients_ok"} <= set(got)
    assert not {"rounds/round", "rounds/dropped_reason", "rounds/phase"} & set(got)
    # Global-model evaluations only: the personalized row (accuracy 0.01) is not there.
    assert got["evals/test/test_accuracy"] == [(r, pytest.approx(0.5 + 0.1 * r)) for r in EVAL_ROUNDS]
    assert sorted(t for t in got if t.startswith("evals/")) == ["evals/test/test_accuracy", "evals/test/test_loss"]


def test_tensorboard_resume_continues_in_the_same_directory(tmp_path: Path) -> None:
    run = RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG)
    first = TensorBoard(TensorBoardConfig())
    drive(first, run, range(5))
    second = TensorBoard(TensorBoardConfig())
    second.load_state_dict(first.state_dict())
    drive(second, RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG, resumed=True), range(5, 7))
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    got = read_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in got["rounds/train_loss"]] == list(range(7))
    assert [v for _, v in got["rounds/train_loss"]] == pytest.approx([loss(r) for r in range(7)])


def test_tensorboard_resume_drops_rounds_logged_after_the_checkpoint(tmp_path: Path) -> None:
    """A run checkpointed after round 2 and killed after round 4: its resume re-runs 3 and 4,
    and TensorBoard shows each round once, with the resumed run's values."""
    run = RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG)
    killed = TensorBoard(TensorBoardConfig(log_dir=str(tmp_path / "tb")))
    drive(killed, run, range(3), status=None)
    state = killed.state_dict()
    for r in (3, 4):
        killed.on_round(round_row(r), run)
    killed.on_run_end("interrupted", run)
    resumed = TensorBoard(TensorBoardConfig(log_dir=str(tmp_path / "tb")))
    resumed.load_state_dict(state)
    drive(resumed, RunInfo(run_id="r1", run_dir=None, config=CONFIG, resumed=True), range(3, 6), shift=10.0)
    got = read_scalars(tmp_path / "tb")
    assert [s for s, _ in got["rounds/train_loss"]] == list(range(6))
    expect = [loss(r) for r in range(3)] + [loss(r, 10.0) for r in range(3, 6)]
    assert [v for _, v in got["rounds/train_loss"]] == pytest.approx(expect)


def test_tensorboard_needs_a_log_dir_without_a_run_dir() -> None:
    run = RunInfo(run_id="r1", run_dir=None, config=CONFIG)
    cfg = TensorBoardConfig()
    cfg.validate()
    with pytest.raises(ConfigError) as e:
        TensorBoard(cfg).on_run_start(run)
    assert e.value.key == "callbacks.log_dir"
    assert "\n" not in str(e.value)


def test_missing_tracker_packages_are_one_line_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    for cb, package in ((TensorBoard(TensorBoardConfig()), "tensorboard"), (MLflow(MLflowConfig()), "mlflow")):
        with pytest.raises(ConfigError) as e:
            cb.on_run_start(run)
        assert e.value.key == "callbacks.name"
        assert str(e.value) == f"callbacks.name: {package} is not installed; pip install 'rayfl[trackers]'"


def test_trackers_import_without_their_packages() -> None:
    code = (
        "import sys, rayfl.callbacks.trackers\n"
        "assert not {'mlflow', 'tensorboard', 'torch.utils.tensorboard'} & set(sys.modules), 'eager import'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_config_validation() -> None:
    for cfg, key in (
        (TensorBoardConfig(log_dir=""), "callbacks.log_dir"),
        (TensorBoardConfig(flush_secs=0), "callbacks.flush_secs"),
        (MLflowConfig(experiment=""), "callbacks.experiment"),
        (MLflowConfig(tracking_uri=""), "callbacks.tracking_uri"),
    ):
        with pytest.raises(ConfigError) as e:
            cfg.validate()
        assert e.value.key == key


# ----------------------------------------------------------------------------------- MLflow


def test_mlflow_local_store_in_the_run_dir(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    cb = MLflow(MLflowConfig())
    drive(cb, RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG), range(5), status="stopped_early")
    assert (tmp_path / "mlflow.db").is_file()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert history(client, cb.run_id, "train_loss") == [(r, pytest.approx(loss(r))) for r in range(5)]
    assert client.get_run(cb.run_id).info.status == "FINISHED"


def test_mlflow_resume_sends_no_round_twice(tmp_path: Path) -> None:
    """A run checkpointed after round 2 whose rounds 3 and 4 reached MLflow before it was
    killed: its resume runs 3 and 4 again, and every metric keeps one point a step (MLflow
    cannot delete points; replay gives the same values, so the first ones stay)."""
    from mlflow.tracking import MlflowClient

    run = RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG)
    killed = MLflow(MLflowConfig())
    drive(killed, run, range(3), status=None)
    state = killed.state_dict()
    for r in (3, 4):
        killed.on_round(round_row(r), run)
        for row in eval_rows(r) if r in EVAL_ROUNDS else []:
            killed.on_eval(row, run)
    killed.flush()  # a time-based flush before the kill
    resumed = MLflow(MLflowConfig())
    resumed.load_state_dict(state)
    drive(resumed, RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG, resumed=True), range(3, 7), shift=10.0)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    expect = [loss(r) for r in range(5)] + [loss(r, 10.0) for r in (5, 6)]
    assert history(client, killed.run_id, "train_loss") == [(r, pytest.approx(v)) for r, v in enumerate(expect)]
    for key in ("wall_time", "test_accuracy", "evals.test.test_accuracy"):
        steps = [s for s, _ in history(client, killed.run_id, key)]
        assert steps == sorted(set(steps)), key
    assert [s for s, _ in history(client, killed.run_id, "evals.test.test_accuracy")] == [r for r in range(7) if r in EVAL_ROUNDS]


def test_mlflow_needs_a_tracking_uri_without_a_run_dir() -> None:
    with pytest.raises(ConfigError) as e:
        MLflow(MLflowConfig()).on_run_start(RunInfo(run_id="r1", run_dir=None, config=CONFIG))
    assert e.value.key == "callbacks.tracking_uri"
    assert "\n" not in str(e.value)


def test_mlflow_unreachable_server_is_a_quick_config_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    start = time.monotonic()
    with pytest.raises(ConfigError) as e:
        MLflow(MLflowConfig(tracking_uri=f"http://127.0.0.1:{port}")).on_run_start(
            RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG))
    assert e.value.key == "callbacks.tracking_uri"
    assert time.monotonic() - start < 15


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real tracking server on a free port (SQLite backend), stopped with its workers."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
        "--default-artifact-root", str(tmp / "artifacts"),
    ]
    uri = f"http://127.0.0.1:{port}"
    with open(tmp / "server.log", "wb") as log:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(proc, uri, start, tmp / "server.log")
            print(f"mlflow server healthy after {time.monotonic() - start:.1f} s")
            yield uri
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def wait_healthy(proc: subprocess.Popen, uri: str, start: float, log: Path, timeout: float = 60) -> None:
    """Until the server answers /health; a server that exits or stays silent fails the test
    with its log (a tracker test that cannot reach its server must not pass by skipping)."""
    while True:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited ({proc.returncode}):\n{log.read_text()}")
        if time.monotonic() - start > timeout:
            pytest.fail(f"mlflow server not healthy after {timeout:.0f} s:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_against_a_tracking_server(mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    cfg = MLflowConfig(tracking_uri=mlflow_server, experiment="server-test")
    cfg.validate()
    cb = mlflow_tracker(cfg)
    run = RunInfo(run_id="r1", run_dir=tmp_path, config=CONFIG)
    drive(cb, run, range(5))
    client = MlflowClient(mlflow_server)
    got = client.get_run(cb.run_id)
    assert got.info.status == "FINISHED"
    assert got.info.run_name == "r1"
    assert got.data.tags["rayfl.run_id"] == "r1"
    assert got.data.tags["rayfl.run_dir"] == str(tmp_path)
    assert history(client, cb.run_id, "train_loss") == [(r, pytest.approx(loss(r))) for r in range(5)]
    assert [s for s, _ in history(client, cb.run_id, "test_accuracy")] == list(EVAL_ROUNDS)
    assert [s for s, _ in history(client, cb.run_id, "grad_norm")] == [0, 1, 3, 4]
    assert history(client, cb.run_id, "evals.test.test_accuracy") == [(r, pytest.approx(0.5 + 0.1 * r)) for r in EVAL_ROUNDS]
    metrics = set(got.data.metrics)
    assert {"sim_time", "wall_time", "bytes", "clients_ok", "evals.test.test_loss"} <= metrics
    assert not {"round", "dropped_reason", "phase", "evals.test.client", "evals.test.sim_time"} & metrics
    params = got.data.params
    assert params["algorithm.lr"] == "0.01"
    assert params["run.rounds"] == "5"
    assert params["algorithm.kwargs"] == "{}"
    assert params["system.tiers"] == '[{"name": "fast", "fraction": 0.5}]'
    assert len(params["data.note"]) == 6000  # MLflow's param length limit

    # Resume: the checkpoint's state brings the same MLflow run back, with the new rounds.
    state = cb.state_dict()
    assert state == {"mlflow_run_id": cb.run_id}
    again = MLflow(cfg)
    again.load_state_dict(state)
    resumed_cfg = {**CONFIG, "run": {**CONFIG["run"], "rounds": 7}}  # `rayfl resume --rounds 7`
    drive(again, RunInfo(run_id="r1", run_dir=tmp_path, config=resumed_cfg, resumed=True), range(5, 7),
          status="interrupted")
    assert again.run_id == cb.run_id
    assert history(client, cb.run_id, "train_loss") == [(r, pytest.approx(loss(r))) for r in range(7)]
    exp = client.get_experiment_by_name("server-test")
    assert len(client.search_runs([exp.experiment_id])) == 1
    got = client.get_run(cb.run_id)
    assert got.info.status == "KILLED"
    assert got.data.params["run.rounds"] == "5"  # a logged param is never changed


def test_mlflow_runs_in_one_process_do_not_mix(mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    cfg = MLflowConfig(tracking_uri=mlflow_server, experiment="two-runs", run_name="trial", flush_secs=0)
    a, b = MLflow(cfg), MLflow(cfg)
    run_a = RunInfo(run_id="a", run_dir=tmp_path / "a", config=CONFIG)
    run_b = RunInfo(run_id="b", run_dir=tmp_path / "b", config=CONFIG)
    a.on_run_start(run_a)
    b.on_run_start(run_b)
    for r in range(3):
        a.on_round(round_row(r), run_a)
        b.on_round(round_row(r, shift=100.0), run_b)
    a.on_run_end("completed", run_a)
    b.on_run_end("failed", run_b)
    client = MlflowClient(mlflow_server)
    assert history(client, a.run_id, "train_loss") == [(r, pytest.approx(loss(r))) for r in range(3)]
    assert history(client, b.run_id, "train_loss") == [(r, pytest.approx(loss(r, 100.0))) for r in range(3)]
    assert client.get_run(b.run_id).info.status == "FAILED"
    assert client.get_run(b.run_id).data.tags["rayfl.run_id"] == "b"


def test_a_real_run_mirrors_its_rounds_and_job_to_the_tracking_server(mlflow_server: str, ray_local: Any, tmp_path: Path) -> None:
    """`callbacks: [{name: mlflow, tracking_uri: ...}]` on a real run: the server holds every
    round's train_loss as the Parquet `rounds` table has it, and the job as params."""
    from mlflow.tracking import MlflowClient

    from rayfl.config import build_callbacks, load_config
    from rayfl.results import load
    from rayfl.runner import run_experiment

    cfg = load_config(None, ["partition.num_clients=6", "algorithm.clients_per_round=3", "run.rounds=4", "run.eval_every=2",
                             "algorithm.lr=0.07", "engine.num_hosts=1", f"output.dir={tmp_path}", "run.run_id=tracked"])
    cfg.callbacks = build_callbacks([{"name": "mlflow", "tracking_uri": mlflow_server, "experiment": "e2e", "flush_secs": 0}])
    out = run_experiment(cfg)
    rounds = load(out.run_dir).rounds.sort_values("round")
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["rayfl.run_id"] == "tracked"
    assert run.data.params["algorithm.lr"] == "0.07" and run.data.params["run.rounds"] == "4"
    got = history(client, run.info.run_id, "train_loss")
    assert [step for step, _ in got] == list(rounds["round"])
    assert [value for _, value in got] == pytest.approx(list(rounds["train_loss"]), rel=1e-12)
    assert [step for step, _ in history(client, run.info.run_id, "test_accuracy")] == [1, 3]
