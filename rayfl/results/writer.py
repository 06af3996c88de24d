"""`RunWriter`: stream a run's rows to Parquet part files while it runs.

Layout: `<root>/<experiment>/<run_id>/manifest.json` plus `<table>/part-00000.parquet, ...` for
each table in `RunWriter.TABLES`. `<root>` is a local path or any pyarrow filesystem URI
(`s3://bucket/prefix`, see `rayfl.results.storage`). A crash loses at most the rows appended
since the last `flush`, and no reader ever sees a torn file:

* local disk: every part file is written under a temporary dot-name, fsynced, then renamed into
  place, so any `*.parquet` on disk is complete (readers and pyarrow's dataset discovery skip
  dot-files). `manifest.json` is replaced the same way, so it is always valid JSON. The first
  manifest is hard-linked into place, so two writers can never both claim one run directory.
* object stores (S3, GCS, Azure): there is no rename, but one PUT of a complete object is
  atomic, so each file is serialised in memory and uploaded directly to its final key; readers
  see the old object or the new one. The only weaker guarantee: claiming a run id there is a
  check followed by a PUT, so two writers racing for the same run id are not told apart.
* other remote filesystems (HDFS): written under a temporary dot-name, then moved into place.

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

import dataclasses
import datetime as _dt
import importlib
import importlib.metadata
import json
import math
import os
import posixpath
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayfl.results.storage import Location, RunDir, put_bytes

Scalar = int | float | bool | str | None

# The type lattice, least to greatest.
_RANK: dict[pa.DataType, int] = {pa.null(): 0, pa.bool_(): 1, pa.int64(): 2, pa.float64(): 3, pa.string(): 4}
_BY_RANK = {rank: t for t, rank in _RANK.items()}
RESERVED = ("run_id", "experiment")
VERSIONED_PACKAGES = ("rayfl", "ray", "torch", "numpy", "pyarrow")


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
    run's directory is removed first.

    Use as a context manager: leaving the block normally closes the run as "completed"; an
    exception closes it as "failed" (or "interrupted" for Ctrl-C and SIGTERM) and propagates."""

    TABLES = ("rounds", "clients", "evals")

    def __init__(
        self,
        root: str | Path,
        experiment: str,
        run_id: str,
        manifest: Mapping[str, Any],
        overwrite: bool = False,
    ):
        for label, name in (("experiment", experiment), ("run_id", run_id)):
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"{label} must be a non-empty name without '/', got {name!r}")
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

    @classmethod
    def reopen(cls, run_dir: str | Path, parts: Mapping[str, int]) -> RunWriter:
        """Continue a stopped run in its directory: keep each table's first `parts[table]`
        part files (what its checkpoint names), delete the ones written after it (a resumed
        run writes those rows again, identically), and go on with their schema."""
        self = cls.__new__(cls)
        self._dir = Location.parse(run_dir)
        self.run_dir = self._dir.name
        self.manifest_path = self._dir.child("manifest.json").name
        self.manifest = json.loads(self._dir.child("manifest.json").read_bytes())
        self.experiment, self.run_id = self.manifest["experiment"], self.manifest["run_id"]
        self._buffers = {t: [] for t in self.TABLES}
        self._schemas, self._written_schema, self._parts = {}, {}, {}
        fs = self._dir.fs
        for table in self.TABLES:
            keep = int(parts.get(table, 0))
            found = sorted(f.path for f in _part_files(fs, posixpath.join(self._dir.path, table)))
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

    @property
    def location(self) -> Location:
        """The run directory on its filesystem (checkpoints are written beside the tables)."""
        return self._dir

    def part_counts(self) -> dict[str, int]:
        """How many part files each table has: the writer's position, for a checkpoint."""
        return {t: len(parts) for t, parts in self._parts.items()}

    # ------------------------------------------------------------------ rows

    def append(self, table: str, row: Mapping[str, Any]) -> None:
        """Buffer one row. Values must be scalars (int, float, bool, str, None; numpy scalars
        are unwrapped); a `run_id` column is added."""
        self._check_open()
        self._check_table(table)
        clean: dict[str, Scalar] = {"run_id": self.run_id}
        for key, value in row.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"{table}: column names must be non-empty strings, got {key!r}")
            if key in RESERVED:
                raise ValueError(f"{table}: column {key!r} is reserved (the writer and loader add it)")
            clean[key] = _scalar(table, key, value)
        schema = self._schemas[table]
        for key, value in clean.items():
            schema[key] = _join(schema.get(key, pa.null()), _arrow_type(value))
        self._buffers[table].append(clean)

    def extend(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Buffer several rows (see `append`)."""
        for row in rows:
            self.append(table, row)

    def flush(self) -> None:
        """Write each table's buffered rows to its next part file."""
        self._check_open()
        for table in self.TABLES:
            self._flush_table(table)

    def _flush_table(self, table: str) -> None:
        rows = self._buffers[table]
        if not rows:
            return
        schema = pa.schema(list(self._schemas[table].items()))
        fs = self._dir.fs
        if self._written_schema[table] is not None and not schema.equals(self._written_schema[table]):
            for part in self._parts[table]:
                self._write_table(_conform(pq.read_table(part, filesystem=fs), schema), part)
        data = pa.Table.from_pylist([_coerce_row(row, schema) for row in rows], schema=schema)
        table_dir = posixpath.join(self._dir.path, table)
        if not self._parts[table] and not self._dir.is_object_store:
            fs.create_dir(table_dir, recursive=True)
        part = posixpath.join(table_dir, f"part-{len(self._parts[table]):05d}.parquet")
        self._write_table(data, part)
        self._parts[table].append(part)
        self._written_schema[table] = schema
        self._buffers[table] = []

    # ------------------------------------------------------------------ manifest

    def update_manifest(self, **fields: Any) -> None:
        """Merge `fields` into manifest.json (atomically), e.g. progress such as `last_round`."""
        self.manifest.update(fields)
        path = posixpath.join(self._dir.path, "manifest.json")
        if self._dir.is_local:
            _atomic_write_json(Path(path), self.manifest)
        else:
            put_bytes(self._dir.fs, path, _manifest_bytes(self.manifest))

    # ------------------------------------------------------------------ files

    def _write_table(self, table: pa.Table, path: str) -> None:
        """Write one whole part file so that no reader ever sees it half written."""
        if self._dir.is_local:
            _atomic_write_table(table, Path(path))
            return
        buffer = pa.BufferOutputStream()  # serialise fully before any byte leaves the process
        pq.write_table(table, buffer)
        put_bytes(self._dir.fs, path, buffer.getvalue().to_pybytes())

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
        """Flush the remaining rows and record the final status. Closing twice does nothing.

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

    def _finish(self, status: str, error: str | None, summary: Mapping[str, Any] | None) -> None:
        self.closed = True
        self.update_manifest(
            status=status,
            finished_at=_now(),
            wall_seconds=time.monotonic() - self._t0,
            error=error,
            summary=dict(summary) if summary is not None else None,
        )

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


def _part_files(fs: Any, table_dir: str) -> list[Any]:
    """The complete part files of one table directory (never the dot-named temporaries)."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(table_dir, allow_not_found=True)
    return [
        f
        for f in fs.get_file_info(selector)
        if f.type == pafs.FileType.File and f.base_name.startswith("part-") and f.base_name.endswith(".parquet")
    ]


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


def _coerce_row(row: Mapping[str, Scalar], schema: pa.Schema) -> dict[str, Scalar]:
    """Convert a row's values to its columns' types (missing columns become None)."""
    return {f.name: _coerce(row.get(f.name), f.type) for f in schema}


def _coerce(value: Scalar, target: pa.DataType) -> Scalar:
    if value is None:
        return None
    if target == pa.string():
        return value if isinstance(value, str) else _text(value)
    if target == pa.float64():
        return float(value)
    if target == pa.int64():
        return int(value)
    return value


def _text(value: bool | int | float) -> str:
    # The same spelling Arrow uses when it casts an older part's column to string.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(_manifest_bytes(manifest))
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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
    _fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a rename durable; best effort (not every platform can open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
