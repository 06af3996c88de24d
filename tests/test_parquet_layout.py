"""Parquet that stays fast to read: the writer flushes by rows and age (not once per server
step), and a completed run's part files are compacted into one file per table, atomically: a
crash at any point of the compaction loses no row and `load` never reads one twice."""

from __future__ import annotations

import importlib
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow.parquet as pq
import pytest

# the loopback S3 server and its helpers (module-scoped fixtures, imported to be used here)
from test_remote_storage import keys_under, s3_endpoint, s3_root  # noqa: F401

import rayfl.results.writer as writer_module
from rayfl.results import RunWriter, load
from rayfl.results.storage import Location
from rayfl.results.writer import compact_run

REPO = Path(__file__).resolve().parents[1]
load_module = importlib.import_module("rayfl.results.load")  # `rayfl.results.load` the attribute is the function
COMPACTED = writer_module.COMPACTED


class FakeClock:
    """A monotonic clock the test moves by hand, so age triggers need no sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def part_names(run_dir: Path, table: str) -> list[str]:
    return sorted(p.name for p in (run_dir / table).glob("*.parquet")) if (run_dir / table).is_dir() else []


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def write_run(root, run_id: str, flushes: int = 6, **options) -> RunWriter:
    """A run of `flushes` flushes of 2 rounds, 3 client rows each, and one eval each; not closed."""
    w = RunWriter(root, "exp", run_id, {}, **options)
    for f in range(flushes):
        for r in (2 * f, 2 * f + 1):
            w.extend("clients", [{"round": r, "client": c, "loss": 0.1 * c} for c in range(3)])
            w.append("rounds", {"round": r, "train_loss": 1.0 / (r + 1), **({"note": "late"} if r == 5 else {})})
        w.append("evals", {"round": 2 * f + 1, "client": -1, "test_accuracy": 0.1 * f})
        w.flush()
    return w


# ---------------------------------------------------------------------- the flush policy


def test_rows_trigger_flushes_every_table_at_once(tmp_path):
    """`flush_rows` counts the rows of all tables together and flushes them all together."""
    w = RunWriter(tmp_path, "exp", "rows", {}, flush_rows=5, clock=FakeClock())
    w.extend("clients", [{"round": 0, "client": c} for c in range(3)])
    w.append("rounds", {"round": 0})
    assert w.buffered_rows == 4 and not w.flush_due() and not w.maybe_flush()
    assert not (w.run_dir / "rounds").exists() and not (w.run_dir / "clients").exists()
    w.append("evals", {"round": 0, "client": -1})  # the 5th row, in a third table
    assert w.buffered_rows == 0
    assert w.part_counts() == {"rounds": 1, "clients": 1, "evals": 1}
    assert len(load(w.run_dir).clients) == 3 and len(load(w.run_dir).rounds) == 1
    for r in range(1, 5):  # 4 more rounds rows alone: still under the limit
        w.append("rounds", {"round": r})
    assert w.part_counts()["rounds"] == 1 and w.buffered_rows == 4
    w.append("rounds", {"round": 5})
    assert w.part_counts() == {"rounds": 2, "clients": 1, "evals": 1}  # nothing buffered elsewhere: no empty parts


def test_age_trigger_uses_the_oldest_buffered_row(tmp_path):
    clock = FakeClock()
    w = RunWriter(tmp_path, "exp", "age", {}, flush_seconds=10, clock=clock)
    assert not w.flush_due()  # nothing buffered: never due, however long it has been
    clock.advance(100)
    w.append("rounds", {"round": 0})
    clock.advance(9.9)
    w.append("rounds", {"round": 1})
    assert not w.maybe_flush() and w.part_counts()["rounds"] == 0
    clock.advance(0.1)  # the oldest row is 10 s old now
    assert w.flush_due() and w.maybe_flush()
    assert part_names(w.run_dir, "rounds") == ["part-00000.parquet"] and w.buffered_rows == 0
    assert pq.read_table(w.run_dir / "rounds" / "part-00000.parquet").num_rows == 2
    clock.advance(100)
    assert not w.flush_due() and not w.maybe_flush()  # idle with an empty buffer: nothing is due

    # a row arriving after a due wait: the waiting rows are written as they stand, it starts anew
    w.append("rounds", {"round": 2})
    clock.advance(30)
    w.append("rounds", {"round": 3})
    assert w.part_counts()["rounds"] == 2 and w.buffered_rows == 1
    assert pq.read_table(w.run_dir / "rounds" / "part-00001.parquet").column("round").to_pylist() == [2]
    clock.advance(5)
    assert not w.flush_due()  # round 3 is 5 s old, not 35: the age is the buffer's, not the last flush's
    w.close("failed")
    assert load(w.run_dir).rounds["round"].tolist() == [0, 1, 2, 3]  # close flushes whatever the status


def test_progress_reaches_the_manifest_only_with_its_rows(tmp_path):
    clock = FakeClock()
    w = RunWriter(tmp_path, "exp", "progress", {}, flush_seconds=10, clock=clock)
    w.append("rounds", {"round": 0})
    w.note_progress(last_round=0, sim_time=1.5)
    assert "last_round" not in manifest(w.run_dir)  # its row is not on disk yet
    clock.advance(10)
    assert w.maybe_flush()
    assert manifest(w.run_dir)["last_round"] == 0 and manifest(w.run_dir)["sim_time"] == 1.5
    w.append("rounds", {"round": 1})
    w.note_progress(last_round=1, sim_time=3.0)
    w.flush()  # as a checkpoint does
    assert manifest(w.run_dir)["last_round"] == 1
    w.append("rounds", {"round": 2})
    w.note_progress(last_round=2, sim_time=4.0)
    w.close("interrupted")
    m = manifest(w.run_dir)
    assert m["last_round"] == 2 and m["status"] == "interrupted" and COMPACTED not in m


def test_policy_arguments_are_checked(tmp_path):
    for bad in ({"flush_rows": 0}, {"flush_seconds": 0}, {"rows_per_file": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RunWriter(tmp_path, "exp", "bad", {}, **bad)


def test_output_config_drives_the_writer():
    from rayfl.config import ConfigError, load_config

    out = load_config(None, []).output
    assert (out.flush_rows, out.flush_seconds, out.flush_every_rounds, out.compact) == (50_000, 10.0, None, True)
    out = load_config(None, ["output.flush_rows=7", "output.flush_seconds=0.5", "output.compact=false"]).output
    assert out.writer_options() == {"flush_rows": 7, "flush_seconds": 0.5, "compact": False}
    assert load_config(None, ["output.flush_every_rounds=1"]).output.flush_every_rounds == 1  # old manifests carry it
    for bad in ("output.flush_rows=0", "output.flush_seconds=0", "output.flush_every_rounds=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config(None, [bad])


# ---------------------------------------------------------------------- compaction



def test_a_completed_run_is_compacted_into_one_file_per_table(tmp_path):
    kept = write_run(tmp_path, "parts", compact=False)
    kept.close()
    w = write_run(tmp_path, "compacted")
    assert part_names(w.run_dir, "rounds") == [f"part-0000{i}.parquet" for i in range(6)]
    w.close(summary={"x": 1})
    for table in RunWriter.TABLES:
        assert part_names(w.run_dir, table) == ["part-c00000.parquet"]
    m = manifest(w.run_dir)
    assert m[COMPACTED] == {t: ["part-c00000.parquet"] for t in RunWriter.TABLES}
    assert m["status"] == "completed" and m["summary"] == {"x": 1}
    assert not [p for p in w.run_dir.rglob(".*")]  # no temporaries left
    a, b = load(kept.run_dir), load(w.run_dir)
    for table in RunWriter.TABLES:
        pd.testing.assert_frame_equal(getattr(a, table).drop(columns="run_id"), getattr(b, table).drop(columns="run_id"))
        direct = pd.read_parquet(w.run_dir / table)  # a reader globbing the directory: one copy of each row
        assert len(direct) == len(getattr(a, table))
    assert b.rounds["note"].tolist()[5] == "late"  # a column that appeared mid-run
    with pytest.raises(ValueError, match="compacted"):
        RunWriter.reopen(w.run_dir, {"rounds": 1})


def test_large_tables_are_split_in_order(tmp_path):
    w = write_run(tmp_path, "split", rows_per_file=5)  # 36 clients rows, 12 rounds rows, 6 evals
    w.close()
    assert part_names(w.run_dir, "clients") == [f"part-c0000{i}.parquet" for i in range(8)]
    sizes = [pq.read_metadata(w.run_dir / "clients" / n).num_rows for n in part_names(w.run_dir, "clients")]
    assert sizes == [5] * 7 + [1]
    assert part_names(w.run_dir, "evals") == ["part-c00000.parquet", "part-c00001.parquet"]
    res = load(w.run_dir)
    assert res.clients["round"].tolist() == [r for r in range(12) for _ in range(3)]
    assert res.rounds["round"].tolist() == list(range(12))


def test_a_single_part_is_kept_and_empty_tables_stay_empty(tmp_path):
    with RunWriter(tmp_path, "exp", "one", {}) as w:
        w.append("rounds", {"round": 0})
    assert part_names(w.run_dir, "rounds") == ["part-00000.parquet"]
    assert manifest(w.run_dir)[COMPACTED] == {"rounds": ["part-00000.parquet"], "clients": [], "evals": []}
    assert load(w.run_dir).rounds["round"].tolist() == [0] and load(w.run_dir).clients.empty


@pytest.mark.parametrize("status", ["failed", "interrupted", "killed"])
def test_a_run_that_did_not_complete_keeps_its_parts(tmp_path, status):
    w = write_run(tmp_path, status)
    if status != "killed":
        w.close(status)
    assert part_names(w.run_dir, "rounds") == [f"part-0000{i}.parquet" for i in range(6)]
    assert COMPACTED not in manifest(w.run_dir)
    with pytest.raises(ValueError, match="only a completed run"):
        compact_run(w.run_dir)
    assert len(load(w.run_dir).clients) == 36
    again = RunWriter.reopen(w.run_dir, {"rounds": 4, "clients": 4, "evals": 4})  # resume still works
    assert part_names(w.run_dir, "rounds") == [f"part-0000{i}.parquet" for i in range(4)]
    again.close()
    assert part_names(w.run_dir, "rounds") == ["part-c00000.parquet"]
    assert load(w.run_dir).rounds["round"].tolist() == list(range(8))


def snapshot(run_dir: Path, to: Path) -> Path:
    """What a crash at this instant leaves on disk."""
    shutil.copytree(run_dir, to)
    return to


def test_a_crash_anywhere_in_a_compaction_loses_nothing_and_doubles_nothing(tmp_path, monkeypatch):
    reference = write_run(tmp_path / "ref", "run", compact=False)
    reference.close()
    expected = load(reference.run_dir)
    crashes: dict[str, Path] = {}
    real_write = writer_module._write_manifest

    def write_manifest(where, m):
        if COMPACTED in m and "after_merge" not in crashes:
            crashes["after_merge"] = snapshot(Path(where.path), tmp_path / "after_merge")  # merged, not committed
            real_write(where, m)
            crashes["after_commit"] = snapshot(Path(where.path), tmp_path / "after_commit")  # nothing deleted yet
            return
        real_write(where, m)

    monkeypatch.setattr(writer_module, "_write_manifest", write_manifest)
    w = write_run(tmp_path / "live", "run")
    w.close()
    monkeypatch.undo()
    mid = snapshot(crashes["after_commit"], tmp_path / "mid_delete")  # some parts deleted, not all
    for name in ("part-00000.parquet", "part-00003.parquet"):
        (mid / "rounds" / name).unlink()
    crashes["mid_delete"] = mid

    before = crashes["after_merge"]
    assert "part-c00000.parquet" in part_names(before, "rounds") and len(part_names(before, "rounds")) == 7
    assert COMPACTED not in manifest(before)
    for where, run_dir in crashes.items():
        got = load(run_dir)
        for table in RunWriter.TABLES:
            pd.testing.assert_frame_equal(getattr(got, table), getattr(expected, table), obj=f"{where}: {table}")
        assert load_module.read_table(run_dir / "rounds")["round"].tolist() == list(range(12))
        compact_run(run_dir)  # finishes (or redoes) the compaction
        assert all(part_names(run_dir, t) == ["part-c00000.parquet"] for t in RunWriter.TABLES), where
        pd.testing.assert_frame_equal(load(run_dir).clients, expected.clients)
        assert len(pd.read_parquet(run_dir / "clients")) == len(expected.clients)


def test_a_failed_compaction_leaves_the_parts_in_charge(tmp_path, monkeypatch):
    real_merge = writer_module._merge

    def merge_then_fail(where, parts, rows_per_file, written):
        names = real_merge(where, parts, rows_per_file, written)
        if parts[0].split("/")[-2] == "clients":
            raise OSError("disk full")
        return names

    monkeypatch.setattr(writer_module, "_merge", merge_then_fail)
    w = write_run(tmp_path, "run")
    with pytest.warns(RuntimeWarning, match="disk full"):
        w.close()
    m = manifest(w.run_dir)
    assert m["status"] == "completed" and COMPACTED not in m and "disk full" in m["compaction_error"]
    assert part_names(w.run_dir, "rounds") == [f"part-0000{i}.parquet" for i in range(6)]  # merged file removed
    assert len(pd.read_parquet(w.run_dir / "rounds")) == 12 and len(load(w.run_dir).clients) == 36
    monkeypatch.undo()
    compact_run(w.run_dir)
    assert part_names(w.run_dir, "clients") == ["part-c00000.parquet"] and len(load(w.run_dir).clients) == 36


@pytest.mark.parametrize("how", ["listed", "reading"])
def test_load_notices_a_compaction_that_commits_while_it_reads(tmp_path, monkeypatch, how):
    """The writer commits before it deletes, so `load` re-reads the manifest after the parts and
    switches to the merged files when a commit appeared meanwhile."""
    w = write_run(tmp_path, "run", compact=False)
    w.close()
    expected = load(w.run_dir)
    real_read_table, real_pq = load_module._read_table, load_module.pq
    state = {"done": False}

    def compact_once() -> None:
        if not state["done"]:
            state["done"] = True
            compact_run(w.run_dir)

    if how == "listed":  # the commit lands just before the parts are listed: they are gone
        def read_table(table_dir, names):
            if names is None:
                compact_once()
            return real_read_table(table_dir, names)

        monkeypatch.setattr(load_module, "_read_table", read_table)
    else:  # the parts were listed, then deleted before they were read
        def read_parquet(path, **kwargs):
            if "/part-0" in path:
                compact_once()
            return real_pq.read_table(path, **kwargs)

        monkeypatch.setattr(load_module, "pq", SimpleNamespace(read_table=read_parquet))
    got = load(w.run_dir)
    assert state["done"]
    for table in RunWriter.TABLES:
        pd.testing.assert_frame_equal(getattr(got, table), getattr(expected, table))


def test_compaction_on_s3(s3_root):  # noqa: F811
    w = write_run(s3_root, "r1")
    w.close()
    assert keys_under(w.run_dir) == sorted(["manifest.json", *(f"{t}/part-c00000.parquet" for t in RunWriter.TABLES)])
    res = load(w.run_dir)
    assert res.rounds["round"].tolist() == list(range(12)) and len(res.clients) == 36

    # a crash after the merged files went up and before the commit: they are ignored until
    # compact_run, which redoes the merge and removes the parts
    crashed = write_run(s3_root, "r2", compact=False)
    crashed.close()
    where = Location.parse(crashed.run_dir)
    for table in RunWriter.TABLES:
        parts = writer_module._files(where.fs, f"{where.path}/{table}", writer_module._PART)
        writer_module._merge(where, parts, writer_module.ROWS_PER_FILE, [])
    assert "rounds/part-c00000.parquet" in keys_under(crashed.run_dir)
    assert load(crashed.run_dir).rounds["round"].tolist() == list(range(12))
    compact_run(crashed.run_dir)
    assert [k for k in keys_under(crashed.run_dir) if k.startswith("rounds/")] == ["rounds/part-c00000.parquet"]
    assert len(load(crashed.run_dir).clients) == 36


# ---------------------------------------------------------------------- the straggler job


def test_the_fedasync_straggler_job_leaves_one_file_per_table(ray_local, tmp_path, capsys):
    """300 FedAsync server steps: a handful of flushes (checkpoints, age), not one per step,
    and one file per table once compacted."""
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    cfg = load_config(REPO / "jobs" / "stragglers_fedasync.yaml", [f"output.dir={tmp_path}", "run.rounds=300"])
    assert cfg.output.flush_every_rounds is None and cfg.output.checkpoint_every == 10
    before_close: dict[str, int] = {}

    def count_parts_at_close(run_dir, fed) -> None:
        writer = fed.runlog.writer
        close = writer.close

        def counting_close(*args, **kwargs):
            before_close.update(writer.part_counts())
            return close(*args, **kwargs)

        writer.close = counting_close

    outcome = run_experiment(cfg, on_start=count_parts_at_close)
    run_dir = Path(outcome.run_dir)
    # 30 checkpoints flush, and age flushes every 10 s: far fewer parts than the 300 steps
    assert 0 < before_close["rounds"] <= 300 // 10 + 1 + outcome.wall_seconds // 10
    files = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*.parquet"))
    assert files == ["clients/part-c00000.parquet", "evals/part-c00000.parquet", "rounds/part-c00000.parquet"]
    t0 = time.perf_counter()
    res = load(run_dir)
    seconds = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\nstragglers_fedasync, 300 steps: {len(files)} files, load {seconds:.3f} s "
              f"({before_close['rounds']} rounds parts before compaction)")
    assert res.rounds["round"].tolist() == list(range(300))
    assert len(res.clients) >= 300 and res.clients["task"].is_unique
    assert len(res.evals) == 15
    m = res.manifests.iloc[0]
    assert m["status"] == "completed" and m["last_round"] == 299
