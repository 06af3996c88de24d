"""Read one run, an experiment or a whole results root into pandas DataFrames.

Part files are read one at a time and concatenated with pandas, so runs written by different
rayfl versions (different columns) still load together: the result has the union of columns.
Only complete part files are read (`*.parquet`, never the writer's dot-named temp files), so
loading a run that is still being written, or that crashed, is safe. A compacted run (see
`rayfl.results.writer`) is read from exactly the files its manifest's `compacted` lists name;
any other run from its `part-NNNNN` files, skipping merged files no commit names, and its
manifest is read again afterwards so that a compaction committing meanwhile is noticed (its
merged parts may have been deleted mid-read): no row is ever read twice or missed. Paths may be
local or any pyarrow filesystem URI (`s3://bucket/prefix`, see `rayfl.results.storage`);
everything is read through that filesystem.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rayfl.results.storage import Location, RunDir
from rayfl.results.writer import RunWriter, compacted_files, is_merged_name

if TYPE_CHECKING:  # imported where frames are built: a run writes results but never reads them,
    import pandas as pd  # and pandas is 0.4 s of its start-up

KEYS = ["experiment", "run_id"]


@dataclass
class Results:
    """Every table of every run found, plus one manifest row per run.

    `manifests` has experiment, run_id, status, run_dir, the manifest's other scalar fields,
    nested fields flattened with dots ("summary.test_accuracy", "versions.torch"), and the
    run's config flattened without a prefix ("algorithm.name", "model.hidden"); list values
    are stored as their JSON text so the column can be grouped on."""

    rounds: pd.DataFrame
    clients: pd.DataFrame
    evals: pd.DataFrame
    manifests: pd.DataFrame

    def table(self, name: str) -> pd.DataFrame:
        """A table by name (one of `RunWriter.TABLES`)."""
        if name not in RunWriter.TABLES:
            raise ValueError(f"unknown table {name!r}; tables are {list(RunWriter.TABLES)}")
        return getattr(self, name)


def load(path: str | Path = "results") -> Results:
    """Load every run at or below `path`, to compare runs and sweeps with pandas.

    Args:
        path: a run directory, an experiment or a results root; a local path or a URI such
            as `s3://bucket/prefix`.

    Returns:
        Their `rounds`, `clients` and `evals` tables and one manifest row per run."""
    import pandas as pd

    manifests = []
    tables: dict[str, list[pd.DataFrame]] = {t: [] for t in RunWriter.TABLES}
    for run in _find(Location.parse(path)):
        manifest, frames = _read_run(run)
        experiment = str(manifest.get("experiment") or posixpath.basename(posixpath.dirname(run.path)))
        run_id = str(manifest.get("run_id") or posixpath.basename(run.path))
        manifests.append(manifest_row(manifest, experiment, run_id, run.name))
        for table, frame in frames.items():
            if len(frame):
                tables[table].append(_with_keys(frame, experiment, run_id))
    return Results(
        rounds=_concat(tables["rounds"]),
        clients=_concat(tables["clients"]),
        evals=_concat(tables["evals"]),
        manifests=pd.DataFrame(manifests),
    )


def find_runs(root: str | Path) -> list[RunDir]:
    """Run directories (those holding a manifest.json) at or below `root`, in path order:
    Paths for a local root, URIs for a remote one."""
    return [run.name for run in _find(Location.parse(root))]


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """One run's manifest.json as a dict."""
    return _read_manifest(Location.parse(run_dir))


def read_table(table_dir: str | Path) -> pd.DataFrame:
    """One table of one run, in part order (empty if none): the files its run's compaction
    committed, or else every complete part file."""
    where = Location.parse(table_dir)
    run = _parent(where)
    if run is None or not run.child("manifest.json").is_file():
        return _read_table(where, None)
    _, frames = _read_run(run, [posixpath.basename(where.path)])
    return frames[posixpath.basename(where.path)]


def _find(root: Location) -> list[Location]:
    kind = root.info().type
    if kind == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no results at {root}: the path does not exist")
    if root.child("manifest.json").is_file():
        return [root]
    is_dir = kind == pafs.FileType.Directory
    entries = root.fs.get_file_info(pafs.FileSelector(root.path, recursive=True)) if is_dir else []
    found = sorted(
        (
            posixpath.relpath(posixpath.dirname(e.path), root.path).split("/")
            for e in entries
            if e.type == pafs.FileType.File and e.base_name == "manifest.json"
        ),
    )
    if not found:
        raise FileNotFoundError(
            f"no runs under {root}: expected <experiment>/<run_id>/manifest.json below it "
            "(pass a run directory, an experiment directory or the results root)"
        )
    return [root.child(*rel) for rel in found]


def _read_manifest(run: Location) -> dict[str, Any]:
    where = run.child("manifest.json")
    try:
        manifest = json.loads(where.read_bytes())
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON: {e}") from e
    if not isinstance(manifest, dict):
        raise ValueError(f"{where} must hold a JSON object")
    return manifest


def _read_run(run: Location, tables: Sequence[str] = RunWriter.TABLES) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """A run's manifest and tables, read consistently even while its writer compacts it: the
    writer commits the merged files to the manifest before it deletes a single part, so a read
    that found no commit both before and after it saw every part (see the module docstring)."""
    manifest = _read_manifest(run)
    committed = compacted_files(manifest)
    if committed is None:
        try:
            frames = {t: _read_table(run.child(t), None) for t in tables}
        except FileNotFoundError:  # a part was deleted mid-read: did a compaction commit?
            manifest = _read_manifest(run)
            if compacted_files(manifest) is None:
                raise
        else:
            again = _read_manifest(run)
            if compacted_files(again) is None:
                return manifest, frames
            manifest = again
        committed = compacted_files(manifest)
        assert committed is not None
    return manifest, {t: _read_table(run.child(t), committed.get(t, [])) for t in tables}


def _read_table(table_dir: Location, names: list[str] | None) -> pd.DataFrame:
    """The files `names` of one table directory, in that order; with None, every complete part
    file except merged ones (`part-c*`) that no compaction committed."""
    import pandas as pd

    if names is not None:
        paths = [table_dir.child(n).path for n in names]
    else:
        if not table_dir.is_dir():
            return pd.DataFrame()
        entries = table_dir.fs.get_file_info(pafs.FileSelector(table_dir.path))
        paths = sorted(
            e.path
            for e in entries
            if e.type == pafs.FileType.File
            and e.base_name.endswith(".parquet")
            and not e.base_name.startswith((".", "_"))
            and not is_merged_name(e.base_name)
        )
    frames = [pq.read_table(p, filesystem=table_dir.fs).to_pandas() for p in paths]
    return _concat_frames([f for f in frames if len(f)])


def _parent(where: Location) -> Location | None:
    """The directory holding `where` (URI query options kept), or None at a root."""
    if not where.path.strip("/") or "/" not in where.path.strip("/"):
        return None
    path = posixpath.dirname(where.path.rstrip("/"))
    if isinstance(where.name, Path):
        return Location(where.fs, path, where.name.parent)
    parts = urlsplit(where.name)
    return Location(where.fs, path, urlunsplit(parts._replace(path=posixpath.dirname(parts.path.rstrip("/")))))


def manifest_row(manifest: Mapping[str, Any], experiment: str, run_id: str, run_dir: RunDir) -> dict[str, Any]:
    """One flat row describing a run (see `Results`)."""
    row: dict[str, Any] = {
        "experiment": experiment,
        "run_id": run_id,
        "status": manifest.get("status"),
        "run_dir": str(run_dir),
    }
    for key, value in manifest.items():
        if key in row or key == "config":
            continue
        row.update(flatten(value, key))
    config = manifest.get("config")
    if isinstance(config, Mapping):
        row.update(flatten(config))
    return row


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings to dotted keys; lists to JSON text; scalars as they are."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list):
        value = json.dumps(value)
    return {prefix: value}


def _with_keys(frame: pd.DataFrame, experiment: str, run_id: str) -> pd.DataFrame:
    import pandas as pd

    rest = frame.drop(columns=[c for c in KEYS if c in frame.columns])
    keys = pd.DataFrame({"experiment": experiment, "run_id": run_id}, index=rest.index)
    return pd.concat([keys, rest], axis=1)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    import pandas as pd

    out = _concat_frames(frames)
    return out if len(out.columns) else pd.DataFrame(columns=KEYS)


def _concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    import pandas as pd

    if not frames:
        return pd.DataFrame()
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    return pd.concat(frames, ignore_index=True, sort=False)
