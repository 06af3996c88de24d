"""`RunWriter`: stream a run's rows to Parquet part files while it runs; compact them once it completes.

Layout: `<root>/<experiment>/<run_id>/manifest.json` plus `<table>/part-00000.parquet, ...` for
each table in `RunWriter.TABLES`. `<root>` is a local path or any pyarrow filesystem URI
(`s3://bucket/prefix`, see `rayfl.results.storage`).

When rows reach disk (the flush policy). Rows are buffered in memory; a *flush* writes every
table's buffered rows to that table's next part file. A flush happens

* when `flush_rows` rows are buffered, counted over all tables together: the limit bounds
  memory, which is the sum over tables, and flushing the tables together keeps them consistent
  on disk (a killed run that kept `rounds` row r also kept the `clients` rows logged before it);
* when the oldest buffered row has waited `flush_seconds` (checked whenever a row is appended,
  before it joins the buffer, and by `maybe_flush`, which the engine calls after every server
  step), which bounds what a crash can lose without writing a file per step;
* at every `flush()` call: each checkpoint flushes first, so its part counts name whole files;
* at `close`, whatever the status (completed, failed, interrupted by Ctrl-C or SIGTERM).

So a crash loses at most the rows of the last `flush_seconds` (plus one server step), and a long
run writes a few part files a minute instead of one per step. Progress given to `note_progress`
(the engine's `last_round`) reaches the manifest at the flush that makes its rows durable, never
before them.

No reader ever sees a torn file:

* local disk: every part file is written under a temporary dot-name, fsynced, then renamed into
  place, so any `*.parquet` on disk is complete (readers and pyarrow's dataset discovery skip
  dot-files). `manifest.json` is replaced the same way, so it is always valid JSON. The first
  manifest is hard-linked into place, so two writers can never both claim one run directory.
* object stores (S3, GCS, Azure): there is no rename, but one PUT of a complete object is
  atomic, so each file is serialised in memory and uploaded directly to its final key; readers
  see the old object or the new one. The only weaker guarantee: claiming a run id there is a
  check followed by a PUT, so two writers racing for the same run id are not told apart.
* other remote filesystems (HDFS): written under a temporary dot-name, then moved into place.

Compaction. When a run closes as "completed", each table's part files are merged into
`part-c00000.parquet` (a new `part-c00001`, ... every `rows_per_file` rows), so reading a
finished run opens a file or two per table rather than one per flush. A killed, failed or
interrupted run keeps its parts untouched (`reopen`, i.e. resume, truncates them to its
checkpoint's counts). Three steps, each one safe to crash after:

1. write the merged files, each atomically as above. Until step 2 they are not part of the run:
   readers skip `part-c*` files that the manifest does not name, `reopen` never counts them,
   and a later compaction deletes them first.
2. commit: one atomic manifest write adds `"compacted": {table: [file names]}`. From then on a
   table's rows are exactly the files named there, and leftover `part-NNNNN` files are ignored.
3. delete the merged parts.

A crash before the commit leaves the parts in charge, one after it the merged files: no row is
ever lost, and `rayfl.results.load` never reads one twice (it reads the manifest before the
table files and, if nothing was committed yet, once more after them, so a compaction that
commits meanwhile is noticed and the run is read again). `compact_run` finishes an interrupted
compaction, or compacts a completed run written before compaction existed. A table with one
part file keeps it (the commit names it). Tools that glob `<table>/*.parquet` themselves
(DuckDB, pandas) see one copy of each row once `close` has returned; during steps 1-3, or after
a crash between them until `compact_run` has run, they would see both copies, so use `load` or
the manifest's `compacted` lists for runs that may be mid-compaction.

Column stability. Each table keeps the ordered union of the columns seen so far and one Arrow
type per column, chosen from the lattice

    null < bool < int64 < float64 < string

as the least type that holds every value seen (an int metric that later reports 0.5 becomes
float64; a column that mixes numbers and text becomes string). Rows lacking a column get null.
Every part file of a table is written with the table's full current schema; when a flush
widens the schema (a new column, or a promoted type) the table's earlier parts are rewritten
once with the new schema (atomically, one file at a time). So the part files of a table always
share one schema and `pandas.read_parquet("<run>/<table>")` sees every column, even though
pyarrow infers a directory's schema from its first file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import importlib
import importlib.metadata
import json
import math
import os
import posixpath
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rayfl.results.columns import column
from rayfl.results.storage import Location, RunDir, fsync_dir, put_bytes, write_local_atomically

Scalar = int | float | bool | str | None

# The type lattice, least to greatest.
_RANK: dict[pa.DataType, int] = {pa.null(): 0, pa.bool_(): 1, pa.int64(): 2, pa.float64(): 3, pa.string(): 4}
_BY_RANK = {rank: t for t, rank in _RANK.items()}
RESERVED = ("run_id", "experiment")
VERSIONED_PACKAGES = ("rayfl", "ray", "torch", "numpy", "pyarrow")

# Flush policy defaults (see the module docstring; `output.flush_rows` / `output.flush_seconds`).
FLUSH_ROWS = 50_000
FLUSH_SECONDS = 10.0
# Rows per compacted file: one file per table for any run rayfl's jobs produce, while a huge
# table still comes out in files a reader can hold in memory one at a time.
ROWS_PER_FILE = 1_000_000
# The manifest key that commits a compaction: {table: [file names]}.
COMPACTED = "compacted"
_PART = re.compile(r"part-(\d{5,})\.parquet")
_MERGED = re.compile(r"part-c(\d{5,})\.parquet")


def is_merged_name(name: str) -> bool:
    """True for a compacted file's name (`part-c00000.parquet`): such a file holds rows only
    once a manifest's `compacted` list names it (see the module docstring)."""
    return _MERGED.fullmatch(name) is not None


def compacted_files(manifest: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """The committed compaction of a run, {table: [file names]}, or None when it has none."""
    done = manifest.get(COMPACTED)
    if not isinstance(done, Mapping):
        return None
    return {str(t): [str(n) for n in names] for t, names in done.items()}


class RunExistsError(FileExistsError):
    """The run directory already holds a run: results are never silently replaced."""

    def __init__(self, run_id: str, run_dir: RunDir):
        self.run_id = run_id
        self.run_dir = run_dir
        super().__init__(
            f"run.run_id {run_id!r} is taken: {run_dir} already holds a run; choose another "
            "run.run_id (or leave it unset for a fresh one), or --set output.overwrite=true "
            "to replace the old run"
        )


class RunWriter:
    """Buffered, crash-safe writer of one run's tables and manifest (see the module docstring).

    `run_dir` is a `Path` for a local root and the run's URI string for a remote one. A run id
    already used under `root` raises `RunExistsError`, unless `overwrite` is set: then the old
    run's directory is removed first. `flush_rows`, `flush_seconds` and `clock` (seconds, for
    `flush_seconds`; injectable so tests need not sleep) set the flush policy; `compact` and
    `rows_per_file` the compaction of a completed run.

    Use as a context manager: leaving the block normally closes the run as "completed"; an
    exception closes it as "failed" (or "interrupted" for Ctrl-C and SIGTERM) and propagates."""

    TABLES = ("rounds", "clients", "evals")
    # A flush writes `rounds` last: a round's row on disk then means its task and evaluation
    # rows are on disk too, even when the process is killed in the middle of a flush.
    FLUSH_ORDER = ("clients", "evals", "rounds")

    def __init__(
        self,
        root: str | Path,
        experiment: str,
        run_id: str,
        manifest: Mapping[str, Any],
        overwrite: bool = False,
        *,
        flush_rows: int = FLUSH_ROWS,
        flush_seconds: float = FLUSH_SECONDS,
        compact: bool = True,
        rows_per_file: int = ROWS_PER_FILE,
        clock: Callable[[], float] = time.monotonic,
    ):
        for label, name in (("experiment", experiment), ("run_id", run_id)):
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"{label} must be a non-empty name without '/', got {name!r}")
        self._configure(flush_rows, flush_seconds, compact, rows_per_file, clock)
        self.experiment = experiment
        self.run_id = run_id
        self._dir = Location.parse(root).child(experiment, run_id)
        self.run_dir: RunDir = self._dir.name
        manifest_at = self._dir.child("manifest.json")
        self.manifest_path: RunDir = manifest_at.name
        if manifest_at.exists():
            if not overwrite:
                raise RunExistsError(run_id, self.run_dir)
            self._dir.fs.delete_dir(self._dir.path)
        if not self._dir.is_object_store:  # object stores have no directories to make
            self._dir.fs.create_dir(self._dir.path, recursive=True)

        self._buffers: dict[str, list[dict[str, Scalar]]] = {t: [] for t in self.TABLES}
        self._schemas: dict[str, dict[str, pa.DataType]] = {t: {"run_id": pa.string()} for t in self.TABLES}
        self._written_schema: dict[str, pa.Schema | None] = dict.fromkeys(self.TABLES)
        self._parts: dict[str, list[str]] = {t: [] for t in self.TABLES}
        self._t0 = time.monotonic()
        self.closed = False

        self.manifest: dict[str, Any] = dict(manifest)
        self.manifest.update(
            experiment=experiment,
            run_id=run_id,
            status="running",
            started_at=_now(),
            versions=package_versions(),
            git_revision=git_revision(),
        )
        self._claim_manifest()

    @staticmethod
    def check_free(root: str | Path, experiment: str, run_id: str, overwrite: bool = False) -> None:
        """Raise RunExistsError now if `RunWriter(root, experiment, run_id)` would: a caller
        says so before it starts anything slow (Ray, the hosts). The writer checks again
        when it claims the directory."""
        run_dir = Location.parse(root).child(experiment, run_id)
        if not overwrite and run_dir.child("manifest.json").exists():
            raise RunExistsError(run_id, run_dir.name)

    @classmethod
    def reopen(
        cls,
        run_dir: str | Path,
        parts: Mapping[str, int],
        *,
        flush_rows: int = FLUSH_ROWS,
        flush_seconds: float = FLUSH_SECONDS,
        compact: bool = True,
        rows_per_file: int = ROWS_PER_FILE,
        clock: Callable[[], float] = time.monotonic,
    ) -> RunWriter:
        """Continue a stopped run in its directory: keep each table's first `parts[table]`
        part files (what its checkpoint names), delete the ones written after it (a resumed
        run writes those rows again, identically), and go on with their schema."""
        self = cls.__new__(cls)
        self._configure(flush_rows, flush_seconds, compact, rows_per_file, clock)
        self._dir = Location.parse(run_dir)
        self.run_dir = self._dir.name
        self.manifest_path = self._dir.child("manifest.json").name
        self.manifest = json.loads(self._dir.child("manifest.json").read_bytes())
        if compacted_files(self.manifest) is not None:
            raise ValueError(f"{self.run_dir}: the run completed and was compacted; it cannot be continued")
        self.experiment, self.run_id = self.manifest["experiment"], self.manifest["run_id"]
        self._buffers = {t: [] for t in self.TABLES}
        self._schemas, self._written_schema, self._parts = {}, {}, {}
        fs = self._dir.fs
        for table in self.TABLES:
            keep = int(parts.get(table, 0))
            found = _files(fs, posixpath.join(self._dir.path, table), _PART)
            if len(found) < keep:
                raise ValueError(f"{self.run_dir}: table {table} has {len(found)} part files, its checkpoint names {keep}")
            for extra in found[keep:]:
                fs.delete_file(extra)
            self._parts[table] = found[:keep]
            schema = pq.read_schema(found[keep - 1], filesystem=fs) if keep else None
            self._written_schema[table] = schema
            self._schemas[table] = {f.name: f.type for f in schema} if schema else {"run_id": pa.string()}
        self._t0 = time.monotonic()
        self.closed = False
        resumes = [*self.manifest.get("resumed_at", []), _now()]
        self.update_manifest(status="running", resumed_at=resumes, finished_at=None, error=None)
        return self

    def _configure(
        self, flush_rows: int, flush_seconds: float, compact: bool, rows_per_file: int, clock: Callable[[], float]
    ) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be >= 1, got {flush_rows}")
        if not flush_seconds > 0:
            raise ValueError(f"flush_seconds must be > 0, got {flush_seconds}")
        if rows_per_file < 1:
            raise ValueError(f"rows_per_file must be >= 1, got {rows_per_file}")
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.compact = compact
        self.rows_per_file = rows_per_file
        self._clock = clock
        self._buffered = 0  # rows buffered over all tables
        self._oldest: float | None = None  # clock() when the oldest buffered row arrived
        self._progress: dict[str, Any] = {}  # noted progress, for the manifest at the next flush
        self._progress_written: dict[str, Any] = {}

    @property
    def location(self) -> Location:
        """The run directory on its filesystem (checkpoints are written beside the tables)."""
        return self._dir

    def part_counts(self) -> dict[str, int]:
        """How many part files each table has: the writer's position, for a checkpoint."""
        return {t: len(parts) for t, parts in self._parts.items()}

    @property
    def buffered_rows(self) -> int:
        """Rows appended but not yet flushed, over all tables (what a crash now would lose)."""
        return self._buffered

    # ------------------------------------------------------------------ rows

    def append(self, table: str, row: Mapping[str, Any]) -> None:
        """Buffer one row, flushing first if the buffered rows are due by age and after if the
        buffer is full (see the module docstring). Values must be scalars (int, float, bool,
        str, None; numpy scalars are unwrapped); a `run_id` column is added."""
        self._check_open()
        self._check_table(table)
        clean: dict[str, Scalar] = {"run_id": self.run_id}
        for key, value in row.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"{table}: column names must be non-empty strings, got {key!r}")
            if key in RESERVED:
                raise ValueError(f"{table}: column {key!r} is reserved (the writer and loader add it)")
            clean[key] = _scalar(table, key, value)
        if self._due_by_age():  # before this row joins: a due buffer is written as it stands
            self.flush()
        schema = self._schemas[table]
        for key, value in clean.items():
            kind, known = _arrow_type(value), schema.get(key)
            if kind is not known:  # pyarrow's primitive types are cached: the usual row skips the join
                schema[key] = kind if known is None else _join(known, kind)
        self._buffers[table].append(clean)
        self._buffered += 1
        if self._oldest is None:
            self._oldest = self._clock()
        if self._buffered >= self.flush_rows:
            self.flush()

    def extend(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Buffer several rows (see `append`)."""
        for row in rows:
            self.append(table, row)

    def note_progress(self, **fields: Any) -> None:
        """Record progress (e.g. `last_round`) that the rows appended so far reach; it goes into
        the manifest at the next flush, once those rows are on disk."""
        self._progress.update(fields)

    def flush_due(self) -> bool:
        """Whether the policy asks for a flush now: `flush_rows` rows buffered, or the oldest
        buffered row `flush_seconds` old."""
        return self._buffered >= self.flush_rows or self._due_by_age()

    def maybe_flush(self) -> bool:
        """Flush if `flush_due()`; True if it did. The engine calls this after every server step."""
        self._check_open()
        if not self.flush_due():
            return False
        self.flush()
        return True

    def _due_by_age(self) -> bool:
        return self._oldest is not None and self._clock() - self._oldest >= self.flush_seconds

    def flush(self) -> None:
        """Write each table's buffered rows to its next part file, then noted progress to the
        manifest. Always safe to call (a checkpoint does, so its part counts are whole files)."""
        self._check_open()
        try:
            for table in self.FLUSH_ORDER:
                self._flush_table(table)
        finally:  # a failed table keeps its rows buffered, and counted
            self._buffered = sum(len(rows) for rows in self._buffers.values())
            if not self._buffered:
                self._oldest = None
        if self._progress != self._progress_written:
            progress = dict(self._progress)
            self.update_manifest(**progress)
            self._progress_written = progress

    def _flush_table(self, table: str) -> None:
        rows = self._buffers[table]
        if not rows:
            return
        schema = pa.schema(list(self._schemas[table].items()))
        fs = self._dir.fs
        if self._written_schema[table] is not None and not schema.equals(self._written_schema[table]):
            for part in self._parts[table]:
                _write_parquet(self._dir, _conform(pq.read_table(part, filesystem=fs), schema), part)
        data = _rows_to_table(rows, schema)
        table_dir = posixpath.join(self._dir.path, table)
        if not self._parts[table] and not self._dir.is_object_store:
            fs.create_dir(table_dir, recursive=True)
        part = posixpath.join(table_dir, f"part-{len(self._parts[table]):05d}.parquet")
        _write_parquet(self._dir, data, part)
        self._parts[table].append(part)
        self._written_schema[table] = schema
        self._buffers[table] = []

    # ------------------------------------------------------------------ manifest

    def update_manifest(self, **fields: Any) -> None:
        """Merge `fields` into manifest.json (atomically), e.g. progress such as `last_round`.
        `self.manifest` changes only once the write succeeded, so it never claims more than the
        file does (a failed compaction commit must not ride along with a later update)."""
        merged = {**self.manifest, **fields}
        _write_manifest(self._dir, merged)
        self.manifest = merged

    # ------------------------------------------------------------------ files

    def _claim_manifest(self) -> None:
        """Write the first manifest, failing if another writer claimed this run meanwhile."""
        path = posixpath.join(self._dir.path, "manifest.json")
        if self._dir.is_local:
            _write_json_exclusive(Path(path), self.manifest, self.run_id, self.run_dir)
            return
        # No create-if-absent in pyarrow's filesystems: check again just before the one PUT.
        if self._dir.child("manifest.json").exists():
            raise RunExistsError(self.run_id, self.run_dir)
        put_bytes(self._dir.fs, path, _manifest_bytes(self.manifest))

    def close(self, status: str = "completed", error: str | None = None, summary: Mapping[str, Any] | None = None) -> None:
        """Flush the remaining rows and record the final status; compact a completed run
        (`compact`). Closing twice does nothing.

        If the last flush fails, the manifest still records status "failed" before the error
        propagates, so the run directory never claims to be running when nothing is."""
        if self.closed:
            return
        try:
            self.flush()
        except BaseException as exc:
            self._finish("failed", error or f"flush failed: {exc!r}", summary)
            raise
        self._finish(status, error, summary)
        if status == "completed" and self.compact:
            self._compact()

    def discard(self) -> None:
        """Delete the directory of a run that never started (its hosts refused the job as bad
        input): it holds nothing but the manifest, and the user's retry under the same run id
        must find the name free. Not for a resumed run, whose directory holds its results."""
        self.closed = True
        self._dir.fs.delete_dir(self._dir.path)

    def _finish(self, status: str, error: str | None, summary: Mapping[str, Any] | None) -> None:
        self.closed = True
        self.update_manifest(
            status=status,
            finished_at=_now(),
            wall_seconds=time.monotonic() - self._t0,
            error=error,
            summary=dict(summary) if summary is not None else None,
        )

    def _compact(self) -> None:
        """Compact the just-completed run. A failure is reported, not raised: every step leaves
        the run complete and readable (see the module docstring), so a completed run must not
        turn into an error because a merge of its files failed; `compact_run` retries it."""
        try:
            _compact(self._dir, self.manifest, self.rows_per_file, lambda files: self.update_manifest(**{COMPACTED: files}))
        except Exception as exc:
            warnings.warn(
                f"rayfl: compacting {self.run_dir} failed ({exc!r}); its rows are complete in its part "
                "files; rayfl.results.writer.compact_run(run_dir) tries again",
                RuntimeWarning,
                stacklevel=3,
            )
            with contextlib.suppress(Exception):  # self.manifest holds a commit only if it was written
                self.update_manifest(compaction_error=repr(exc))

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self.closed:
            return False
        if exc is None:
            self.close("completed")
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):  # Ctrl-C, SIGTERM (Ray raises SystemExit)
            self.close("interrupted", error=repr(exc))
        else:
            self.close("failed", error=repr(exc))
        return False

    # ------------------------------------------------------------------ checks

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"run {self.run_id} is closed")

    def _check_table(self, table: str) -> None:
        if table not in self.TABLES:
            raise ValueError(f"unknown table {table!r}; tables are {list(self.TABLES)}")


def _files(fs: pafs.FileSystem, table_dir: str, pattern: re.Pattern[str]) -> list[str]:
    """The paths of one table directory's files named like `pattern` (complete files: never the
    dot-named temporaries), in numeric order."""
    selector = pafs.FileSelector(table_dir, allow_not_found=True)
    found = []
    for f in fs.get_file_info(selector):
        match = pattern.fullmatch(f.base_name) if f.type == pafs.FileType.File else None
        if match:
            found.append((int(match.group(1)), f.path))
    return [path for _, path in sorted(found)]


# ---------------------------------------------------------------------- compaction


def compact_run(run_dir: str | Path, rows_per_file: int = ROWS_PER_FILE) -> dict[str, list[str]]:
    """Compact a completed run in place, or finish a compaction that a crash interrupted (see
    the module docstring); returns the committed file names per table. Runs that did not
    complete are refused: their part files are what `rayfl resume` continues from."""
    where = Location.parse(run_dir)
    manifest = json.loads(where.child("manifest.json").read_bytes())
    if manifest.get("status") != "completed":
        raise ValueError(f"{where}: only a completed run can be compacted; its status is {manifest.get('status')!r}")
    return _compact(where, manifest, rows_per_file, lambda files: _write_manifest(where, {**manifest, COMPACTED: files}))


def _compact(
    where: Location,
    manifest: Mapping[str, Any],
    rows_per_file: int,
    commit: Callable[[dict[str, list[str]]], None],
) -> dict[str, list[str]]:
    """Write merged files, `commit` their names to the manifest, then delete what they replace.
    Merged files are deleted again if anything fails before the commit (so that tools globbing
    the directory do not see rows twice); nothing is deleted before the commit succeeded."""
    fs = where.fs
    files = compacted_files(manifest)
    if files is None:
        files, written = {}, []
        try:
            for table in RunWriter.TABLES:
                table_dir = posixpath.join(where.path, table)
                for stale in _files(fs, table_dir, _MERGED):  # an interrupted compaction's, never committed
                    fs.delete_file(stale)
                parts = _files(fs, table_dir, _PART)
                if len(parts) <= 1:
                    files[table] = [posixpath.basename(p) for p in parts]
                else:
                    files[table] = _merge(where, parts, rows_per_file, written)
        except BaseException:
            for path in written:
                with contextlib.suppress(Exception):
                    fs.delete_file(path)
            raise
        commit(files)
    for table, names in files.items():
        keep = set(names)
        table_dir = posixpath.join(where.path, table)
        for path in [*_files(fs, table_dir, _PART), *_files(fs, table_dir, _MERGED)]:
            if posixpath.basename(path) not in keep:
                fs.delete_file(path)
    return files


def _merge(where: Location, parts: list[str], rows_per_file: int, written: list[str]) -> list[str]:
    """Rewrite one table's parts, in order, as `part-c00000.parquet`, ... of `rows_per_file`
    rows (the last one shorter); appends each path to `written` as soon as it exists."""
    fs = where.fs
    table_dir = posixpath.dirname(parts[0])
    schema = pq.read_schema(parts[-1], filesystem=fs)  # the widest: earlier parts were widened to it
    names: list[str] = []
    chunk: list[pa.Table] = []
    filled = 0
    for part in parts:
        rest = _conform(pq.read_table(part, filesystem=fs), schema)
        while rest.num_rows:
            head = rest.slice(0, rows_per_file - filled)
            rest = rest.slice(head.num_rows)
            chunk.append(head)
            filled += head.num_rows
            if filled == rows_per_file:
                names.append(_write_merged(where, table_dir, len(names), chunk, written))
                chunk, filled = [], 0
    if chunk:
        names.append(_write_merged(where, table_dir, len(names), chunk, written))
    return names


def _write_merged(where: Location, table_dir: str, index: int, chunk: list[pa.Table], written: list[str]) -> str:
    name = f"part-c{index:05d}.parquet"
    path = posixpath.join(table_dir, name)
    _write_parquet(where, pa.concat_tables(chunk), path)  # one row group, whatever the chunks
    written.append(path)
    return name


# ---------------------------------------------------------------------- column types


def _scalar(table: str, key: str, value: Any) -> Scalar:
    """Unwrap numpy scalars and refuse anything that is not one Parquet cell."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        unwrapped = item()
        if isinstance(unwrapped, (bool, int, float, str)):
            return unwrapped
    raise TypeError(
        f"{table}.{key}: only scalars (int, float, bool, str, None) can be logged, got {type(value).__name__}"
    )


def _arrow_type(value: Scalar) -> pa.DataType:
    if value is None:
        return pa.null()
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def _join(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The least type of the lattice that holds values of both types."""
    return _BY_RANK[max(_RANK[a], _RANK[b])]


def _rows_to_table(rows: Sequence[Mapping[str, Scalar]], schema: pa.Schema) -> pa.Table:
    """Buffered rows as one Arrow table in `schema` (missing columns become None), built column
    by column: a flush may hold tens of thousands of rows, and per-row, per-cell conversion
    would stall the server loop for seconds."""
    columns = []
    for field in schema:
        values = [row.get(field.name) for row in rows]
        exact, convert = _CONVERT.get(field.type, (None, None))
        if convert is not None:
            values = [v if v is None or type(v) is exact else convert(v) for v in values]
        columns.append(column(values, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _text(value: bool | int | float) -> str:
    # The same spelling Arrow uses when it casts an older part's column to string.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# A column's values that are not already of its Python type, converted: an int in a float64
# column, a bool in an int64 one, a number in a string one.
_CONVERT: dict[pa.DataType, tuple[type, Callable[[Any], Scalar]]] = {
    pa.string(): (str, lambda v: v if isinstance(v, str) else _text(v)),
    pa.float64(): (float, float),
    pa.int64(): (int, int),
}


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """An older part re-expressed in a wider schema: new columns null, promoted types cast."""
    columns = []
    for f in schema:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


# ---------------------------------------------------------------------- atomic files


def _write_parquet(where: Location, table: pa.Table, path: str) -> None:
    """Write one whole Parquet file under `where`'s filesystem so that no reader ever sees it
    half written (see the module docstring)."""
    if where.is_local:
        _atomic_write_table(table, Path(path))
        return
    buffer = pa.BufferOutputStream()  # serialise fully before any byte leaves the process
    pq.write_table(table, buffer)
    put_bytes(where.fs, path, buffer.getvalue().to_pybytes())


def _write_manifest(where: Location, manifest: Mapping[str, Any]) -> None:
    """Replace a run's manifest.json atomically (rename on local disk, one PUT elsewhere)."""
    path = posixpath.join(where.path, "manifest.json")
    if where.is_local:
        _atomic_write_json(Path(path), manifest)
    else:
        put_bytes(where.fs, path, _manifest_bytes(manifest))


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    _fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """Strict JSON (other tools read manifests too): NaN and infinities are written as null."""
    plain = json.loads(json.dumps(manifest, default=_json_default))
    return (json.dumps(_finite(plain), indent=2, allow_nan=False) + "\n").encode()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _atomic_write_json(path: Path, manifest: Mapping[str, Any]) -> None:
    write_local_atomically(path, _manifest_bytes(manifest))


def _write_json_exclusive(path: Path, manifest: Mapping[str, Any], run_id: str, run_dir: RunDir) -> None:
    """Write the first manifest without ever replacing one a concurrent writer just made:
    a hard link fails if the name exists (rename would silently overwrite)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(_manifest_bytes(manifest))
    _fsync_file(tmp)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise RunExistsError(run_id, run_dir) from None
    except OSError:  # a filesystem without hard links: fall back to a plain rename
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _json_default(obj: Any) -> Any:
    """Make config values JSON-friendly: numpy scalars / arrays, paths, sets, dataclasses."""
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return str(obj)


# ---------------------------------------------------------------------- provenance


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def package_versions() -> dict[str, str]:
    """Python and the key packages' versions; a package that is not installed is left out.

    Installed distribution metadata is read first, so nothing heavy (ray, torch) is imported;
    a module that is importable but not installed (a source checkout) reports `__version__`."""
    versions = {"python": sys.version.split()[0]}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
            continue
        except importlib.metadata.PackageNotFoundError:
            pass
        try:
            version = getattr(importlib.import_module(name), "__version__", None)
        except Exception:
            continue
        if isinstance(version, str):
            versions[name] = version
    return versions


def git_revision() -> str | None:
    """`git rev-parse HEAD` of the rayfl source tree, or None (not a checkout, no git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = out.stdout.strip()
    return rev if out.returncode == 0 and rev else None
