"""Rows of a Parquet table left in their files until a host needs them (`data.read_on_hosts`).

A `FileRows` names rows (global row ids over a source's part files) and how a row becomes a
sample (the feature reader of rayfl.data.tables, already set up: its sample shape is known).
It is small (file references plus one int64 a row) and picklable, so the driver ships it to the
hosts in place of the feature array, and it is numpy-like enough for the generic code on the
way there: `shape`, `dtype`, `len`, and `take(idx)`, which composes row ids without reading.
`read()` reads those rows only: grouped by part file and row group, a record batch of the
feature columns at a time, straight into the returned array. The values are the ones the eager
reader (`tables.read_rows`) writes for the same rows: the same `fill` of the same batches.

Anything that indexes a `FileRows` like an array (`x[idx]`, `x[a:b]`, `np.asarray(x)`) gets
the rows read, so driver code that reads training rows still works; it then holds them.

This module imports neither pyarrow nor rayfl.data.tables at import time: rayfl.data.datasets
and federated use `select`, and `import rayfl.data` stays free of pyarrow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rayfl.data.tables import FileRef


@dataclass(frozen=True, eq=False)
class FileRows:
    """Rows `ids` (global ids over `parts`, in any order; None: every row in file order) of
    Parquet part files, as samples of `features` (a tables.Features, set up) of shape
    `sample_shape`, not read yet."""

    parts: tuple[FileRef, ...]
    part_rows: np.ndarray  # int64 [P]: rows of each part, as the driver counted them
    ids: np.ndarray | None  # int64 [N]; None spares the driver 8 bytes a row while nothing is picked
    features: Any
    sample_shape: tuple[int, ...]
    batch_rows: int

    @property
    def rows(self) -> np.ndarray:
        """The global row ids, in order."""
        return np.arange(self.total_rows, dtype=np.int64) if self.ids is None else self.ids

    @property
    def total_rows(self) -> int:
        """Rows in the part files."""
        return int(np.sum(self.part_rows))

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.sample_shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.sample_shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.features.dtype)

    def __len__(self) -> int:
        return self.total_rows if self.ids is None else len(self.ids)

    def take(self, idx: Any) -> FileRows:
        """The rows at `idx` (any numpy index of a 1-D array), still unread."""
        return replace(self, ids=np.asarray(self.rows[idx], dtype=np.int64).reshape(-1))

    def read(self) -> np.ndarray:
        """The samples of these rows, in their order (reads only the row groups holding them)."""
        rows = self.rows
        if len(rows) < 2 or bool(np.all(rows[1:] >= rows[:-1])):  # a host's rows: sorted, read in place
            return self._read_sorted(rows)
        order = np.argsort(rows, kind="stable")
        got = self._read_sorted(rows[order])
        out = np.empty_like(got)
        out[order] = got
        return out

    def _read_sorted(self, wanted: np.ndarray) -> np.ndarray:
        """The samples of sorted rows `wanted`, part file by part file."""
        out = np.empty((len(wanted), *self.sample_shape), dtype=self.dtype)
        starts = np.concatenate([[0], np.cumsum(self.part_rows)]).astype(np.int64)
        if len(wanted) and (wanted[0] < 0 or wanted[-1] >= starts[-1]):
            raise IndexError(f"row ids must be in [0, {int(starts[-1])}), got [{int(wanted[0])}, {int(wanted[-1])}]")
        for p, ref in enumerate(self.parts):
            lo, hi = (int(b) for b in np.searchsorted(wanted, [starts[p], starts[p + 1]]))
            if hi > lo:
                read_part(ref, int(self.part_rows[p]), wanted[lo:hi] - starts[p], out[lo:hi], self.features, self.batch_rows)
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        """The rows at `key` read (an integer gives one sample)."""
        picked = np.arange(len(self))[key]
        if np.ndim(picked) == 0:
            return self.take(np.array([int(picked)])).read()[0]
        return self.take(picked).read()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.read()
        return out if dtype is None else out.astype(dtype, copy=False)


def read_part(ref: FileRef, expected: int, wanted: np.ndarray, out: np.ndarray, features: Any, batch_rows: int) -> None:
    """Rows `wanted` (sorted ids within the file) of one Parquet file into `out`: only the row
    groups holding some, a record batch of the feature columns at a time."""
    import pyarrow.parquet as pq

    from rayfl.config import ConfigError

    with read_errors(ref), ref.fs.open_input_file(ref.path) as f:
        pf = pq.ParquetFile(f)
        sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        if sum(sizes) != expected:
            raise ConfigError(ref.key, f"{ref.where} holds {sum(sizes)} rows, {expected} when the run planned its rows "
                              "(did it change since?)")
        offset = 0
        for group, size in enumerate(sizes):
            lo, hi = (int(b) for b in np.searchsorted(wanted, [offset, offset + size]))
            if hi > lo:
                read_group(pf, group, offset, wanted[lo:hi], out[lo:hi], features, batch_rows, ref.where)
            offset += size


def read_group(pf: Any, group: int, offset: int, wanted: np.ndarray, out: np.ndarray, features: Any, batch_rows: int,
               where: str) -> None:
    """Rows `wanted` (sorted file-row ids, all in row group `group`, which starts at file row
    `offset`) into `out`, batch by batch, as the driver's reader fills its arrays."""
    import pyarrow as pa

    from rayfl.data.tables import release_batch_memory

    for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=list(features.columns)):
        n = batch.num_rows
        lo, hi = (int(b) for b in np.searchsorted(wanted, [offset, offset + n]))
        if hi > lo:
            features.fill(out[lo:hi], batch, pa.array(wanted[lo:hi] - offset, type=pa.int64()), where, offset)
        offset += n
        release_batch_memory()


def read_errors(ref: FileRef) -> Any:
    """Arrow's read errors on `ref` as one-line ConfigErrors (as the driver's reader gives)."""
    from rayfl.data.tables import _ReadErrors

    return _ReadErrors(ref.key, f"{ref.where} is not a readable Parquet file")


def is_file_rows(x: Any) -> bool:
    return isinstance(x, FileRows)


def select(x: Any, idx: Any) -> Any:
    """x[idx], left unread when `x` is a FileRows (numpy's own `take` flattens)."""
    return x.take(idx) if isinstance(x, FileRows) else x[idx]


def own_rows(client_train: Iterable[np.ndarray]) -> np.ndarray:
    """The sorted union of some clients' train index sets (np.unique's hash table would take
    7x the memory of the rows)."""
    parts = [np.asarray(i, dtype=np.int64) for i in client_train]
    rows = np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
    return rows[np.concatenate([[True], rows[1:] != rows[:-1]])] if len(rows) else rows


def host_rows(arrays: Mapping[str, Any], client_train: Mapping[int, np.ndarray]) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    """A host's own train rows, read once from the files (`arrays["train_x"]` is a FileRows of
    every train row), with its labels, and its clients' index sets remapped to positions in
    them: the host then serves its clients as if it had been handed the whole arrays."""
    mine = own_rows(client_train.values())
    local = dict(arrays)
    local["train_x"] = arrays["train_x"].take(mine).read()
    local["train_y"] = np.asarray(arrays["train_y"])[mine]
    remapped = {c: np.searchsorted(mine, idx).astype(np.int64) for c, idx in client_train.items()}
    return local, remapped


def server_rows(train_x: Any, server_train: np.ndarray | None) -> np.ndarray | None:
    """The server's own rows read from the files when train_x is a FileRows (else None: the
    driver indexes its array as it needs them)."""
    if not isinstance(train_x, FileRows) or server_train is None or len(server_train) == 0:
        return None
    return train_x.take(server_train).read()
