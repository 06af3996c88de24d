"""Results: streaming Parquet writer, crash safety, loading many runs, plots and summaries."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from matplotlib.image import imread

import rayfl.results.writer as writer_module
from rayfl.results import Results, RunWriter, load
from rayfl.results.plots import (
    metric_frame,
    plot_client_timeline,
    plot_curves,
    run_labels,
    summary_table,
)
from rayfl.results.writer import RunExistsError, compact_run


def config(algorithm: str, lr: float = 0.1) -> dict:
    return {"config": {"algorithm": {"name": algorithm, "lr": lr}, "model": {"name": "linear", "hidden": [8, 4]}}}


def fake_run(root, experiment: str, run_id: str, algorithm: str, rounds: int = 4, lr: float = 0.1) -> None:
    """A small completed run with all three tables, like the engine would write."""
    with RunWriter(root, experiment, run_id, config(algorithm, lr)) as w:
        for r in range(rounds):
            w.append("rounds", {"round": r, "sim_time": 10.0 * (r + 1), "train_loss": 1.0 / (r + 1)})
            w.extend("clients", [
                {"round": r, "client": c, "outcome": "late" if c == 2 else "ok",
                 "dispatch_time": 10.0 * r, "finish_time": 10.0 * r + 3.0 + c}
                for c in range(3)
            ])
            w.append("evals", {"round": r, "client": -1, "test_accuracy": 0.5 + 0.1 * r})
            w.append("evals", {"round": r, "client": 0, "test_accuracy": 0.2})
            w.flush()
        w.close(summary={"test_accuracy": 0.5 + 0.1 * (rounds - 1)})


def parquet_files(run_dir) -> list:
    return sorted(run_dir.rglob("*.parquet"))


# ---------------------------------------------------------------------- writer


def test_round_trip_across_flushes_with_changing_columns(tmp_path):
    w = RunWriter(tmp_path, "exp", "r1", {"seed": 3}, compact=False)  # keep the parts to look at
    w.append("rounds", {"round": 0, "loss": 2, "phase": None})
    w.flush()
    w.append("rounds", {"round": 1, "loss": 1.5, "accuracy": 0.25, "phase": "train"})
    w.append("rounds", {"round": 2, "loss": np.float32(1.25), "done": False})
    w.flush()
    w.append("rounds", {"round": 3, "done": True})
    w.close()

    df = load(w.run_dir).rounds
    assert list(df.columns) == ["experiment", "run_id", "round", "loss", "phase", "accuracy", "done"]
    assert df["round"].tolist() == [0, 1, 2, 3]
    assert df["round"].dtype == np.int64
    assert df["loss"].dtype == np.float64  # the int 2 became 2.0 once 1.5 arrived
    assert df["loss"].tolist()[:3] == [2.0, 1.5, 1.25] and math.isnan(df["loss"].iloc[3])
    assert df["accuracy"].isna().tolist() == [True, False, True, True]
    assert df["phase"].tolist()[1] == "train" and pd.isna(df["phase"].iloc[0])
    assert df["done"].tolist()[2:] == [False, True]
    assert (df["run_id"] == "r1").all() and (df["experiment"] == "exp").all()

    # every part shares the final schema, so reading the directory directly sees every column
    schemas = [pq.read_schema(p) for p in parquet_files(w.run_dir / "rounds")]
    assert len(schemas) == 3 and all(s.equals(schemas[0]) for s in schemas)
    direct = pd.read_parquet(w.run_dir / "rounds")
    assert {"accuracy", "done", "phase", "run_id"} <= set(direct.columns)
    assert sorted(direct["round"].tolist()) == [0, 1, 2, 3]

    # compacted afterwards: one file, the same schema, the same frame
    assert compact_run(w.run_dir) == {"rounds": ["part-c00000.parquet"], "clients": [], "evals": []}
    assert [p.name for p in parquet_files(w.run_dir)] == ["part-c00000.parquet"]
    assert pq.read_schema(w.run_dir / "rounds" / "part-c00000.parquet").equals(schemas[0])
    pd.testing.assert_frame_equal(load(w.run_dir).rounds, df)


def test_mixed_types_widen_to_string(tmp_path):
    w = RunWriter(tmp_path, "exp", "r1", {})
    w.append("evals", {"round": 0, "note": 1})
    w.flush()
    w.append("evals", {"round": 1, "note": "diverged"})
    w.close()
    assert load(w.run_dir).evals["note"].tolist() == ["1", "diverged"]


def test_rows_are_validated_where_they_are_appended(tmp_path):
    w = RunWriter(tmp_path, "exp", "r1", {})
    with pytest.raises(ValueError, match="unknown table"):
        w.append("round", {"round": 0})
    with pytest.raises(TypeError, match="rounds.params"):
        w.append("rounds", {"params": np.zeros(3)})
    with pytest.raises(ValueError, match="reserved"):
        w.append("rounds", {"run_id": "other"})
    w.close()
    with pytest.raises(RuntimeError, match="closed"):
        w.append("rounds", {"round": 0})


def test_manifest_is_written_at_once_and_updated(tmp_path):
    w = RunWriter(tmp_path, "exp", "r1", {"config": {"run": {"seed": 3}}, "seed": 3})
    m = json.loads((w.run_dir / "manifest.json").read_text())
    assert m["status"] == "running" and m["experiment"] == "exp" and m["run_id"] == "r1"
    assert m["config"] == {"run": {"seed": 3}} and m["seed"] == 3
    assert {"python", "torch", "numpy", "pyarrow"} <= set(m["versions"])
    assert "git_revision" in m and "started_at" in m

    w.update_manifest(last_round=7)
    assert json.loads((w.run_dir / "manifest.json").read_text())["last_round"] == 7
    w.close(summary={"final_loss": float("nan"), "rounds": 8})
    m = json.loads((w.run_dir / "manifest.json").read_text())
    assert m["status"] == "completed" and m["error"] is None and m["last_round"] == 7
    assert m["summary"] == {"final_loss": None, "rounds": 8}  # strict JSON: NaN becomes null
    assert m["wall_seconds"] >= 0 and m["finished_at"] >= m["started_at"]
    assert [p.name for p in w.run_dir.iterdir()] == ["manifest.json"]  # no rows, no table dirs


def test_refuses_to_overwrite_an_existing_run(tmp_path):
    fake_run(tmp_path, "exp", "r1", "fedavg")
    before = (tmp_path / "exp" / "r1" / "manifest.json").read_text()
    with pytest.raises(RunExistsError) as e:
        RunWriter(tmp_path, "exp", "r1", {})
    assert isinstance(e.value, FileExistsError)
    message = str(e.value)
    assert "\n" not in message and "run.run_id 'r1'" in message and str(tmp_path / "exp" / "r1") in message
    assert "leave it unset" in message and "--set output.overwrite=true" in message
    assert (tmp_path / "exp" / "r1" / "manifest.json").read_text() == before


def test_a_concurrent_writer_cannot_claim_the_same_run(tmp_path, monkeypatch):
    """The existence check and the first manifest are not one step on disk: the hard link is."""
    real_exists = writer_module.Location.exists
    monkeypatch.setattr(writer_module.Location, "exists", lambda self: False)  # both pass the check
    RunWriter(tmp_path, "exp", "r1", {"who": "first"})
    with pytest.raises(RunExistsError, match="r1"):
        RunWriter(tmp_path, "exp", "r1", {"who": "second"})
    monkeypatch.setattr(writer_module.Location, "exists", real_exists)
    assert json.loads((tmp_path / "exp" / "r1" / "manifest.json").read_text())["who"] == "first"


def test_overwrite_replaces_the_old_run(tmp_path):
    fake_run(tmp_path, "exp", "r1", "fedavg", rounds=4)
    fake_run(tmp_path, "exp", "r2", "fedavg", rounds=2)
    with RunWriter(tmp_path, "exp", "r1", config("fedprox"), overwrite=True) as w:
        w.append("rounds", {"round": 0, "train_loss": 0.5})
    assert [p.relative_to(w.run_dir).as_posix() for p in parquet_files(w.run_dir)] == ["rounds/part-00000.parquet"]
    res = load(tmp_path)
    assert res.rounds.groupby("run_id").size().to_dict() == {"r1": 1, "r2": 2}  # the other run is untouched
    m = res.manifests.set_index("run_id")
    assert m.loc["r1", "algorithm.name"] == "fedprox" and m.loc["r1", "status"] == "completed"
    # overwrite on a fresh run id is an ordinary run
    RunWriter(tmp_path, "exp", "r3", {}, overwrite=True).close()
    assert sorted(load(tmp_path).manifests["run_id"]) == ["r1", "r2", "r3"]


def test_file_uris_and_home_paths_are_local_paths(tmp_path, monkeypatch):
    w = RunWriter(f"file://{tmp_path}/res", "exp", "r1", {})
    w.append("rounds", {"round": 0})
    w.close()
    assert w.run_dir == tmp_path / "res" / "exp" / "r1"  # a Path, as for any local run
    assert (w.run_dir / "rounds" / "part-00000.parquet").is_file()
    assert load(f"file://{tmp_path}/res").manifests["run_dir"].tolist() == [str(w.run_dir)]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load("~/res/exp").rounds["round"].tolist() == [0]
    assert RunWriter("~/res", "exp", "r2", {}).run_dir == tmp_path / "res" / "exp" / "r2"


def test_a_crashed_run_stays_readable(tmp_path):
    w = RunWriter(tmp_path, "exp", "crashed", config("fedavg"))
    for r in range(2):
        w.append("rounds", {"round": r, "train_loss": 1.0})
        w.extend("clients", [{"round": r, "client": c} for c in range(3)])
        w.flush()
    w.append("rounds", {"round": 2, "train_loss": 0.5})  # buffered, never flushed: lost
    # no close: the process "dies" here
    for path in parquet_files(w.run_dir):
        assert pq.read_table(path).num_rows > 0
    assert not [p for p in w.run_dir.rglob("*") if p.name.endswith(".tmp")]
    res = load(tmp_path)
    assert res.rounds["round"].tolist() == [0, 1]
    assert len(res.clients) == 6 and res.evals.empty
    assert res.manifests["status"].tolist() == ["running"]


def test_a_write_that_dies_midway_leaves_no_parquet_file(tmp_path, monkeypatch):
    w = RunWriter(tmp_path, "exp", "r1", {})
    w.append("rounds", {"round": 0})
    w.flush()

    def torn_write(table, where, **kwargs):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(writer_module.pq, "write_table", torn_write)
    w.append("rounds", {"round": 1})
    with pytest.raises(OSError, match="disk full"):
        w.flush()
    assert [p.name for p in parquet_files(w.run_dir)] == ["part-00000.parquet"]
    assert load(w.run_dir).rounds["round"].tolist() == [0]
    assert pd.read_parquet(w.run_dir / "rounds")["round"].tolist() == [0]


def test_context_manager_records_failure_and_interrupt(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), RunWriter(tmp_path, "exp", "failed", {}) as w:
        w.append("rounds", {"round": 0})
        raise RuntimeError("boom")
    with pytest.raises(KeyboardInterrupt), RunWriter(tmp_path, "exp", "stopped", {}):
        raise KeyboardInterrupt
    with RunWriter(tmp_path, "exp", "fine", {}) as w:
        w.append("rounds", {"round": 0})
    with RunWriter(tmp_path, "exp", "closed-early", {}) as w:
        w.close("completed", summary={"x": 1})

    status = {
        run: json.loads((tmp_path / "exp" / run / "manifest.json").read_text())
        for run in ("failed", "stopped", "fine", "closed-early")
    }
    assert status["failed"]["status"] == "failed" and "boom" in status["failed"]["error"]
    assert status["stopped"]["status"] == "interrupted"
    assert status["fine"]["status"] == "completed" and status["fine"]["error"] is None
    assert status["closed-early"]["summary"] == {"x": 1}
    assert load(tmp_path / "exp" / "failed").rounds["round"].tolist() == [0]  # rows kept on failure


# ---------------------------------------------------------------------- load


def test_load_a_root_with_two_experiments_of_two_runs(tmp_path):
    for exp in ("alpha", "beta"):
        fake_run(tmp_path, exp, "a", "fedavg", rounds=3)
        fake_run(tmp_path, exp, "b", "fedprox", rounds=4, lr=0.01)
    res = load(tmp_path)
    assert isinstance(res, Results)
    assert len(res.rounds) == 2 * (3 + 4) and len(res.clients) == 3 * 2 * (3 + 4)
    assert res.rounds.groupby(["experiment", "run_id"]).size().to_dict() == {
        ("alpha", "a"): 3, ("alpha", "b"): 4, ("beta", "a"): 3, ("beta", "b"): 4,
    }
    m = res.manifests.set_index(["experiment", "run_id"])
    assert len(m) == 4 and set(m["status"]) == {"completed"}
    assert m.loc[("beta", "b"), "algorithm.name"] == "fedprox"
    assert m.loc[("beta", "b"), "algorithm.lr"] == 0.01
    assert m.loc[("alpha", "a"), "model.hidden"] == "[8, 4]"
    assert m.loc[("alpha", "a"), "summary.test_accuracy"] == pytest.approx(0.7)
    assert m.loc[("alpha", "a"), "run_dir"] == str(tmp_path / "alpha" / "a")

    assert set(load(tmp_path / "beta").rounds["experiment"]) == {"beta"}
    one = load(tmp_path / "alpha" / "b")
    assert one.rounds["run_id"].unique().tolist() == ["b"] and len(one.manifests) == 1


def test_tables_without_rows_keep_their_key_columns(tmp_path):
    RunWriter(tmp_path, "exp", "empty", {}).close()
    res = load(tmp_path)
    for frame in (res.rounds, res.clients, res.evals):
        assert frame.empty and list(frame.columns) == ["experiment", "run_id"]


def test_load_without_runs_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no runs under"):
        load(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(tmp_path / "missing")


# ---------------------------------------------------------------------- plots and summaries


def assert_png(path) -> None:
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0  # something was drawn


def test_plots_produce_pngs(tmp_path):
    fake_run(tmp_path / "res", "exp", "a", "fedavg")
    fake_run(tmp_path / "res", "exp", "b", "fedprox")
    res = load(tmp_path / "res")
    assert_png(plot_curves(res, "test_accuracy", path=tmp_path / "figs" / "acc.png"))
    assert_png(plot_curves(res, "train_loss", x="sim_time", path=tmp_path / "figs" / "loss.png"))
    assert_png(plot_client_timeline(res, "a", rounds=[1, 2], path=tmp_path / "figs" / "gantt.png"))
    with pytest.raises(ValueError, match="no column 'nope'"):
        plot_curves(res, "nope", path=tmp_path / "x.png")
    with pytest.raises(ValueError, match="no client tasks"):
        plot_client_timeline(res, "zzz", path=tmp_path / "x.png")


def test_curves_use_the_global_model_rows(tmp_path):
    fake_run(tmp_path, "exp", "a", "fedavg", rounds=3)
    frame = metric_frame(load(tmp_path), "test_accuracy")
    assert frame["test_accuracy"].tolist() == pytest.approx([0.5, 0.6, 0.7])  # client -1 only


def test_summary_table(tmp_path):
    fake_run(tmp_path, "exp", "a", "fedavg", rounds=3, lr=0.1)
    fake_run(tmp_path, "exp", "b", "fedprox", rounds=5, lr=0.01)
    RunWriter(tmp_path, "exp", "c", config("fedavg")).close("failed", error="no rows")
    table = summary_table(load(tmp_path)).set_index("run_id")
    assert list(table.index) == ["a", "b", "c"]
    assert math.isnan(table.loc["c", "final_test_accuracy"]) and table.loc["c", "status"] == "failed"
    assert table.loc["a", "final_test_accuracy"] == pytest.approx(0.7)
    assert table.loc["b", "max_test_accuracy"] == pytest.approx(0.9)
    assert table.loc["b", "max_test_accuracy_round"] == 4
    assert table.loc["b", "algorithm.lr"] == 0.01  # varies between runs, so shown
    assert "model.name" not in table.columns  # the same everywhere, so left out
    losses = summary_table(load(tmp_path), metric="train_loss").set_index("run_id")
    assert losses.loc["b", "min_train_loss"] == pytest.approx(0.2)
    assert losses.loc["b", "min_train_loss_round"] == 4


def test_runs_with_the_same_id_in_two_experiments_stay_apart(tmp_path):
    fake_run(tmp_path, "alpha", "a", "fedavg", rounds=3)
    fake_run(tmp_path, "beta", "a", "fedavg", rounds=5)
    res = load(tmp_path)
    frame = metric_frame(res, "test_accuracy")
    assert frame.groupby("experiment").size().to_dict() == {"alpha": 3, "beta": 5}
    assert sorted(run_labels(res).values()) == ["alpha/fedavg (a)", "beta/fedavg (a)"]
    table = summary_table(res).set_index("experiment")
    assert table.loc["alpha", "last_round"] == 2 and table.loc["beta", "last_round"] == 4
    with pytest.raises(ValueError, match="pass experiment"):
        plot_client_timeline(res, "a", path=tmp_path / "x.png")
    assert_png(plot_client_timeline(res, "a", experiment="beta", path=tmp_path / "gantt.png"))


def test_summary_of_a_metric_nobody_logged_is_an_error(tmp_path):
    fake_run(tmp_path, "exp", "a", "fedavg")
    with pytest.raises(ValueError, match="test_acuracy"):
        summary_table(load(tmp_path), metric="test_acuracy")
