"""Data users already have: a NumPy `.npz` file, a Parquet table (one file, a directory or a
glob of part files) or a CSV file (`.csv`, or compressed, e.g. `.csv.gz`), on local disk or
anywhere `pyarrow.fs.FileSystem.from_uri` reaches (`s3://bucket/key?endpoint_override=...`,
`gs://...`, `file:///abs/path`). Each is a pool any partitioner splits (iid, dirichlet,
shards, ...), or, with a client column (a writer id, a user id), one client per distinct value
for `partition.method: natural`, like flwr-datasets' NaturalIdPartitioner. `test_path` names
an own test split (same columns); without it rayfl splits off `data.test_fraction`.

A table's sample is made of numeric feature columns (`feature_columns`; by default every column
but the label and client ones), or one list column (`features_column`: a fixed-size list or a
list of numbers, nested lists flattened, reshaped to `shape`), or an encoded-image column
(`image_column`, Parquet only: PNG / JPEG bytes, plain binary or Hugging Face's {bytes, path}
struct), decoded by Pillow into float32 [C, H, W] in [0, 1] (grayscale: one channel). Labels
that are non-negative integers are the class codes themselves; any other labels (strings,
negative numbers) become codes 0..k-1 in sorted order of their distinct values, over train and
test together. Client ids always become codes in sorted order of their distinct values.

Memory: a table is never loaded whole (nor through pandas). Rows are counted first (Parquet
metadata; one pass over a CSV's label column), the subsample (`max_samples`) and the train /
test split are drawn from that count with the very seeded streams `rayfl.data.datasets.as_pool`
uses, and the table is then read in record batches of the needed columns only, every row
written straight into its place in preallocated train / test arrays. The driver holds the
final arrays plus one batch (at most one Parquet row group of the needed columns). The same
file and seed give the same arrays and partition; rows keep file order.

Large Parquet tables go further (`data.read_on_hosts`, ParquetConfig): the driver reads only
the label and client columns of the train rows (and the test split's rows), and the train
features stay in the files as a `rayfl.data.rows.FileRows`; each host reads the rows of its own
clients when it starts, a row group at a time, from the same files (local or any URI the hosts
reach: shared storage, S3). The driver's memory then follows the labels, not the features.
Only Parquet does this: its row groups can be read one by one, found from the metadata alone.
A CSV file has no such index (a host would parse the whole file to find its rows, once per
host and again for each replaced host), and an .npz array is read whole by numpy, so both stay
read on the driver.

`rayfl.data.hf` reads Hugging Face datasets through the same batch reader (`load_table`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from rayfl.config import ConfigError, DataConfig
from rayfl.data.datasets import ArrayDataset, pool_rows
from rayfl.data.rows import FileRows

# Rows per record batch when a config does not say: small enough that a batch of encoded
# images or texts stays a few MB, large enough that numeric columns read at full speed.
BATCH_ROWS = 8192
DECODED_BATCH_ROWS = 256
CSV_BLOCK_BYTES = 4 << 20
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
GLOB_CHARS = "*?["
# Columns pandas / Hugging Face add for a saved index: never a feature by default.
INDEX_PREFIX = "__index_level_"
# data.read_on_hosts: auto leaves train features larger than this to the hosts.
READ_ON_HOSTS_BYTES = 64 << 20


# --------------------------------------------------------------------------- configs


@dataclass
class ColumnConfig(DataConfig):
    """Which columns of a table make a sample (shared by the parquet, csv and hf datasets).

    `label_column`: the class of each row (default "label"). `client_column`: the row's own
    client (writer id, user id), for `partition.method: natural`; null: none. The features are
    one of: `feature_columns`, numeric columns, one value each (null: every column but the label
    and client ones, or that column alone when it is the only one and a list or image column);
    `features_column`, one list column (fixed-size list or list of numbers; nested lists are
    flattened); `image_column`, encoded images (float32 [C, H, W] in [0, 1]). `shape` reshapes
    each row's numbers (e.g. [1, 28, 28] for 784 pixel columns; null: [D], or a nested list's
    own dims). `num_classes`: the class count when the labels are codes and a class may be
    missing from the file (null: the largest label + 1, or the distinct labels). `batch_rows`:
    rows per record batch read (null: 8192, or 256 with encoded images or texts)."""

    # The column holding each row's class.
    label_column: str = "label"
    # The column holding each row's own client (a writer id, a user id), for partition.method
    # natural; null: none.
    client_column: str | None = None
    # Numeric feature columns, one value each; null: every column but the label and client ones. Set
    # at most one of feature_columns, features_column, image_column.
    feature_columns: list[str] | None = None
    # One list column holding each row's features (fixed-size list or list of numbers; nested lists
    # flattened).
    features_column: str | None = None
    # A column of encoded images (PNG / JPEG bytes), decoded into float32 [C, H, W] in [0, 1];
    # Parquet and hf only.
    image_column: str | None = None
    # Reshape each row's numbers, e.g. [1, 28, 28] for 784 pixel columns; null: [D], or a nested
    # list's own dims.
    shape: list[int] | None = None
    # The class count when a class may be missing from the file (>= 2); null: the largest label + 1,
    # or the distinct labels.
    num_classes: int | None = None
    # Rows per record batch read (> 0); null: 8192, or 256 with encoded images or texts.
    batch_rows: int | None = None

    def validate(self) -> None:
        super().validate()
        if not self.label_column:
            raise ConfigError("data.label_column", "must name the label column")
        if self.client_column is not None and self.client_column == self.label_column:
            raise ConfigError("data.client_column", f"is the label column {self.label_column!r}; name the client id column")
        chosen = [k for k in self.feature_keys() if getattr(self, k) is not None]
        if len(chosen) > 1:
            raise ConfigError(f"data.{chosen[1]}", f"set one of {['data.' + k for k in self.feature_keys()]}, not {chosen}")
        self._validate_feature_columns()
        if self.shape is not None:
            if not self.shape or any(d <= 0 for d in self.shape):
                raise ConfigError("data.shape", f"must be a list of positive sizes, e.g. [1, 28, 28], got {self.shape}")
            if self.decoded_column() is not None:
                raise ConfigError("data.shape", "images and texts give their own shape; leave data.shape null")
        if self.num_classes is not None and self.num_classes < 2:
            raise ConfigError("data.num_classes", f"classification needs at least 2 classes, got {self.num_classes}")
        if self.batch_rows is not None and self.batch_rows <= 0:
            raise ConfigError("data.batch_rows", f"must be > 0, got {self.batch_rows}")

    def _validate_feature_columns(self) -> None:
        cols = self.feature_columns
        if cols is None:
            return
        if not cols:
            raise ConfigError("data.feature_columns", "must name at least one column (or be null: every other column)")
        if len(set(cols)) != len(cols):
            raise ConfigError("data.feature_columns", f"names a column twice: {cols}")
        for name in (self.label_column, self.client_column):
            if name in cols:
                raise ConfigError("data.feature_columns", f"holds {name!r}, the label or client column")

    def feature_keys(self) -> tuple[str, ...]:
        """The keys that each pick the features (at most one is set)."""
        return ("feature_columns", "features_column", "image_column")

    def decoded_column(self) -> str | None:
        """The column decoded row by row (images; texts in hf), if any."""
        return self.image_column

    def has_own_clients(self) -> bool:
        return self.client_column is not None

    def rows_per_batch(self) -> int:
        if self.batch_rows is not None:
            return self.batch_rows
        return DECODED_BATCH_ROWS if self.decoded_column() is not None else BATCH_ROWS


@dataclass
class PathConfig(DataConfig):
    """Where a table file is: `path` (a file, a directory of part files or a glob; local, or a
    URI such as s3://bucket/key) and `test_path`, an own test split with the same columns
    (null: rayfl splits off `test_fraction`)."""

    # The table: a file, a directory of part files or a glob; a local path or a URI such as
    # s3://bucket/key.
    path: str = ""
    # An own test split with the same columns; null: split off test_fraction.
    test_path: str | None = None

    def validate(self) -> None:
        super().validate()
        check_location("data.path", self.path)
        if self.test_path is not None:
            check_location("data.test_path", self.test_path)


@dataclass
class TableConfig(ColumnConfig, PathConfig):
    """A table file: where it is (PathConfig: path, test_path) and which of its columns make a
    sample (ColumnConfig)."""


@dataclass
class ParquetConfig(TableConfig):
    """A Parquet table (see TableConfig and ColumnConfig for its keys): one file, a directory of
    part files (those ending .parquet / .pq / .parq, or every file not starting with _ or .) or
    a glob, read in record batches of the needed columns only.

    `read_on_hosts`: who reads the train features. `off`: the driver, into one array shipped to
    the hosts. `on`: each host reads its own clients' rows from the files when it starts (the
    files must be where every host can read them: a local path on one machine, shared storage
    or a URI such as s3://... on a cluster); the driver reads only the labels, the client ids,
    the test split and, with data.server_fraction, the server's rows when the run starts.
    `auto` (the default): `on` when the train features would take more than 64 MiB as arrays.
    Both give the same samples, so the same results."""

    dataset: str = "parquet"
    # Who reads the train features: off (the driver, shipped to the hosts), on (each host its own
    # clients' rows: files every host can reach), auto (on above 64 MiB of features).
    read_on_hosts: Literal["auto", "on", "off"] = "auto"


@dataclass
class CsvConfig(TableConfig):
    """A CSV file with a header row (compressed ones such as .csv.gz too), read in blocks:
    `delimiter` separates fields. Feature columns are parsed as float32; a label or client
    column whose every value is an integer is read as integers, else as strings. A CSV holds no
    lists or image bytes: name numeric `feature_columns` (or none: every other column) and give
    `shape` to reshape them."""

    dataset: str = "csv"
    # The one character separating fields.
    delimiter: str = ","

    def validate(self) -> None:
        for key in ("features_column", "image_column"):
            if getattr(self, key) is not None:
                raise ConfigError(f"data.{key}", "a CSV file holds no list or image columns; use data.feature_columns (and data.shape), or a Parquet file")
        if len(self.delimiter) != 1:
            raise ConfigError("data.delimiter", f"must be one character, got {self.delimiter!r}")
        super().validate()


@dataclass
class NpzConfig(DataConfig):
    """A NumPy .npz file at `path` (local or a URI) with the samples in array `x_key` [N, ...]
    and the labels in `y_key` [N] (non-negative integers are the class codes, anything else is
    coded in sorted order); `client_key` names an optional array [N] of client ids for
    `partition.method: natural`. `test_path`: another .npz with the same arrays, an own test
    split. Float samples become float32, uint8 samples float32 / 255 (images), other integers
    stay int64 (token ids). `shape` reshapes each sample (null: as stored); `num_classes` as in
    ColumnConfig."""

    dataset: str = "npz"
    # The .npz file: a local path or a URI.
    path: str = ""
    # Another .npz with the same arrays, an own test split; null: split off test_fraction.
    test_path: str | None = None
    # The array of samples [N, ...].
    x_key: str = "x"
    # The array of labels [N].
    y_key: str = "y"
    # An array [N] of client ids, for partition.method natural; null: none.
    client_key: str | None = None
    # Reshape each sample; null: as stored.
    shape: list[int] | None = None
    # The class count when a class may be missing (>= 2); null: from the labels.
    num_classes: int | None = None

    def validate(self) -> None:
        super().validate()
        check_location("data.path", self.path)
        if self.test_path is not None:
            check_location("data.test_path", self.test_path)
        if self.shape is not None and (not self.shape or any(d <= 0 for d in self.shape)):
            raise ConfigError("data.shape", f"must be a list of positive sizes, got {self.shape}")
        if self.num_classes is not None and self.num_classes < 2:
            raise ConfigError("data.num_classes", f"classification needs at least 2 classes, got {self.num_classes}")

    def has_own_clients(self) -> bool:
        return self.client_key is not None


# --------------------------------------------------------------------------- loaders


def load_parquet(cfg: ParquetConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """The Parquet table as a (train, test) pair, read in record batches."""
    train = Source(cfg.path, [ParquetPart(f) for f in list_files(cfg.path, "data.path", PARQUET_SUFFIXES)])
    test = None
    if cfg.test_path is not None:
        test = Source(cfg.test_path, [ParquetPart(f) for f in list_files(cfg.test_path, "data.test_path", PARQUET_SUFFIXES)])
    return load_table(cfg, seed, train, test, dataset_name(cfg.path))


def load_csv(cfg: CsvConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """The CSV file as a (train, test) pair, read in blocks (one pass counts the rows)."""
    train = Source(cfg.path, [CsvPart(f, cfg.delimiter) for f in list_files(cfg.path, "data.path", ())])
    test = None
    if cfg.test_path is not None:
        test = Source(cfg.test_path, [CsvPart(f, cfg.delimiter) for f in list_files(cfg.test_path, "data.test_path", ())])
    return load_table(cfg, seed, train, test, dataset_name(cfg.path))


def load_npz(cfg: NpzConfig, seed: int) -> ArrayDataset | tuple[ArrayDataset, ArrayDataset]:
    """The .npz arrays: one pool (rayfl splits it), or a (train, test) pair with test_path."""
    files = [read_npz(cfg.path, "data.path", cfg)]
    if cfg.test_path is not None:
        files.append(read_npz(cfg.test_path, "data.test_path", cfg))
    labels = encode_labels([f["y"] for f in files], "data.y_key", cfg.y_key, cfg.path, cfg.num_classes)
    groups: list[np.ndarray | None] = [None] * len(files)
    num_groups = None
    if cfg.client_key is not None:
        with_ids = [i for i, f in enumerate(files) if "client" in f]
        codes, num_groups = encode_clients([files[i]["client"] for i in with_ids], "data.client_key", cfg.client_key, cfg.path)
        for i, c in zip(with_ids, codes, strict=True):
            groups[i] = c
    name = dataset_name(cfg.path)
    out = [ArrayDataset(f["x"], y, labels.num_classes, name, g, None if g is None else num_groups)
           for f, y, g in zip(files, labels.codes, groups, strict=True)]
    return out[0] if len(out) == 1 else (out[0], out[1])


# --------------------------------------------------------------------------- npz


def read_npz(text: str, key: str, cfg: NpzConfig) -> dict[str, Any]:
    """x (float32 / int64, reshaped to `shape`), y and the client ids of one .npz file."""
    refs = list_files(text, key, (".npz",))
    if len(refs) > 1:
        raise ConfigError(key, f"{text} names {len(refs)} files; give one .npz file")
    ref = refs[0]
    try:
        archive = np.load(ref.open_numpy(), allow_pickle=False)
    except Exception as e:
        raise ConfigError(key, f"{ref.where} is not a readable .npz file: {one_line(e)}") from None
    with archive:
        names = list(archive.files)
        x = _npz_array(archive, cfg.x_key, "data.x_key", ref.where, names)
        y = _npz_array(archive, cfg.y_key, "data.y_key", ref.where, names)
        client = None
        if cfg.client_key is not None and (cfg.client_key in names or key == "data.path"):
            client = _npz_array(archive, cfg.client_key, "data.client_key", ref.where, names)
    x = npz_samples(x, cfg.shape, ref.where)
    for what, arr in (("y_key", y), ("client_key", client)):
        if arr is not None and arr.shape != (len(x),):
            raise ConfigError(f"data.{what}", f"array {getattr(cfg, what)!r} of {ref.where} must be [N] = [{len(x)}], got {list(arr.shape)}")
    out: dict[str, Any] = {"x": x, "y": y}
    if client is not None:
        out["client"] = client
    return out


def _npz_array(archive: Any, name: str, key: str, where: str, names: list[str]) -> np.ndarray:
    if name not in names:
        raise ConfigError(key, f"{where} has no array {name!r}; its arrays are {names}")
    try:
        return archive[name]
    except ValueError as e:  # an object array (pickled): not read, for safety
        raise ConfigError(key, f"array {name!r} of {where} cannot be read without pickle: {one_line(e)}") from None


def npz_samples(x: np.ndarray, shape: list[int] | None, where: str) -> np.ndarray:
    """Samples as models take them: float32 (uint8 images scaled to [0, 1]) or int64 tokens."""
    if x.ndim < 1 or x.dtype.kind not in "fiub":
        raise ConfigError("data.x_key", f"the samples of {where} must be a numeric array [N, ...], got {x.dtype} {list(x.shape)}")
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / np.float32(255)
    elif x.dtype.kind in "fb":
        x = x.astype(np.float32, copy=False)
    else:
        x = x.astype(np.int64, copy=False)
    if x.ndim == 1:
        x = x[:, None]
    if shape is not None:
        if int(np.prod(shape)) != int(np.prod(x.shape[1:])):
            raise ConfigError("data.shape", f"{shape} holds {int(np.prod(shape))} values; a sample of {where} has {int(np.prod(x.shape[1:]))}")
        x = x.reshape(len(x), *shape)
    return x


# --------------------------------------------------------------------------- files


def check_location(key: str, text: str) -> None:
    """A local path (or file:// URI) must exist, a glob match a file, before anything is read;
    other URIs are checked when read (that needs the network and credentials)."""
    if not text:
        raise ConfigError(key, "must name a file, a directory or a URI")
    if "://" in text and not text.startswith("file://"):
        return
    list_files(text, key, ())


@dataclass(frozen=True)
class FileRef:
    """One file on some filesystem, with the name users see in messages."""

    fs: pafs.FileSystem
    path: str
    where: str
    key: str  # the config key that named it (data.path, data.test_path)

    def open_numpy(self) -> Any:
        """A file object np.load reads: the local path, or the remote file's bytes."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return self.path
        with self.fs.open_input_stream(self.path) as f:
            return io.BytesIO(f.read())


def list_files(text: str, key: str, suffixes: tuple[str, ...]) -> list[FileRef]:
    """The files a path names, in sorted order: the file itself, a directory's files (those
    ending in `suffixes` if any does, else all but _ / . names), or a glob's matches."""
    from rayfl.results.storage import Location

    try:
        loc = Location.parse(text)
        fs, path = loc.fs, loc.path
        if any(c in path for c in GLOB_CHARS):
            paths = _glob(fs, path)
        else:
            paths = _file_or_directory(fs, path, suffixes, key, text)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(key, f"cannot list {text}: {one_line(e)}") from None
    if not paths:
        raise ConfigError(key, f"no file matches {text}")
    prefix = "" if isinstance(fs, pafs.LocalFileSystem) else f"{fs.type_name}://"
    return [FileRef(fs, p, prefix + p, key) for p in paths]


def _file_or_directory(fs: pafs.FileSystem, path: str, suffixes: tuple[str, ...], key: str, text: str) -> list[str]:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise ConfigError(key, f"{text} does not exist")
    if info.type != pafs.FileType.Directory:
        return [path]
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = sorted(i.path for i in infos if i.type == pafs.FileType.File and not _hidden(i.path[len(path):]))
    typed = [f for f in files if f.lower().endswith(suffixes)] if suffixes else []
    return typed or files


def _glob(fs: pafs.FileSystem, pattern: str) -> list[str]:
    """Files matching `pattern`, listed below its longest directory without glob characters."""
    parts = pattern.split("/")
    first = next(i for i, p in enumerate(parts) if any(c in p for c in GLOB_CHARS))
    base = "/".join(parts[:first]) or "/"
    recursive = first < len(parts) - 1
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=recursive, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, pattern))


def _hidden(relative: str) -> bool:
    """Spark's _SUCCESS, .crc files and the like: not data."""
    return any(p.startswith(("_", ".")) for p in relative.split("/") if p)


def dataset_name(text: str) -> str:
    """A short name for messages and results: the file or directory name without suffixes
    (a glob's directory name)."""
    parts = [p for p in text.split("?")[0].split("/") if p and not any(c in p for c in GLOB_CHARS)]
    tail = parts[-1] if parts else text
    return tail.split(".")[0] or tail


# --------------------------------------------------------------------------- parts


class Part(Protocol):
    """One file (or Hugging Face dataset) of a split: its schema, its row count and its rows
    in record batches of some columns."""

    where: str
    key: str

    def schema(self) -> pa.Schema: ...

    def num_rows(self, id_columns: Sequence[str]) -> int: ...

    def batches(self, columns: Sequence[str], batch_rows: int, numeric: Sequence[str]) -> Iterator[Any]: ...


@dataclass
class Source:
    """One split's rows: its parts in order. `where` is the path the user gave."""

    where: str
    parts: list[Any]


class ParquetPart:
    """One Parquet file; rows counted from its metadata, read with iter_batches."""

    def __init__(self, ref: FileRef):
        self.ref, self.where, self.key = ref, ref.where, ref.key
        self._schema: pa.Schema | None = None
        self._rows: int | None = None

    def _describe(self) -> None:
        import pyarrow.parquet as pq

        with self._guard(), self.ref.fs.open_input_file(self.ref.path) as f:
            meta = pq.ParquetFile(f).metadata
            self._schema, self._rows = meta.schema.to_arrow_schema(), meta.num_rows

    def schema(self) -> pa.Schema:
        if self._schema is None:
            self._describe()
        return self._schema

    def num_rows(self, id_columns: Sequence[str] = ()) -> int:
        if self._rows is None:
            self._describe()
        return int(self._rows)

    def batches(self, columns: Sequence[str], batch_rows: int, numeric: Sequence[str] = ()) -> Iterator[Any]:
        import pyarrow.parquet as pq

        with self._guard(), self.ref.fs.open_input_file(self.ref.path) as f:
            pf = pq.ParquetFile(f)
            for group in range(pf.num_row_groups):  # one at a time: Arrow pre-buffers what it is asked for
                yield from pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=list(columns))

    def first_row(self, columns: Sequence[str]) -> Any:
        """A record batch of the first row's `columns` (None for a file without rows)."""
        import pyarrow.parquet as pq

        with self._guard(), self.ref.fs.open_input_file(self.ref.path) as f:
            pf = pq.ParquetFile(f)
            for group in range(pf.num_row_groups):
                if pf.metadata.row_group(group).num_rows:
                    return next(pf.iter_batches(batch_size=1, row_groups=[group], columns=list(columns)))
        return None

    def _guard(self) -> _ReadErrors:
        return _ReadErrors(self.key, f"{self.where} is not a readable Parquet file")


class CsvPart:
    """One CSV file, read in blocks. Counting its rows (one pass over the label and client
    columns) also fixes those columns' type: int64 when every value is an integer, else
    string, so a block that looks different from the first cannot change it."""

    def __init__(self, ref: FileRef, delimiter: str):
        self.ref, self.where, self.key, self.delimiter = ref, ref.where, ref.key, delimiter
        self._schema: pa.Schema | None = None
        self._rows: int | None = None
        self._types: dict[str, pa.DataType] = {}

    @contextlib.contextmanager
    def _reader(self, columns: Sequence[str] | None, types: dict[str, pa.DataType]) -> Iterator[Any]:
        """A streaming reader of some columns (empty fields are missing values, strings too)."""
        import pyarrow.csv as pacsv

        convert = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True,
                                       include_columns=list(columns) if columns is not None else None)
        with self._guard(), self.ref.fs.open_input_stream(self.ref.path) as stream:
            yield pacsv.open_csv(stream, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                                 parse_options=pacsv.ParseOptions(delimiter=self.delimiter), convert_options=convert)

    def schema(self) -> pa.Schema:
        if self._schema is None:
            with self._reader(None, {}) as reader:
                self._schema = reader.schema
        return self._schema

    def num_rows(self, id_columns: Sequence[str] = ()) -> int:
        if self._rows is None:
            columns = list(id_columns) or self.schema().names[:1]
            rows, integral = 0, dict.fromkeys(columns, True)
            with self._reader(columns, dict.fromkeys(columns, pa.string())) as reader:
                for batch in reader:
                    rows += batch.num_rows
                    for name in columns:
                        integral[name] = integral[name] and _all_integers(batch.column(name))
            self._rows = rows
            self._types = {c: pa.int64() if integral[c] else pa.string() for c in id_columns}
        return self._rows

    def batches(self, columns: Sequence[str], batch_rows: int, numeric: Sequence[str] = ()) -> Iterator[Any]:
        with self._reader(columns, {**self._types, **dict.fromkeys(numeric, pa.float32())}) as reader:
            yield from reader

    def _guard(self) -> _ReadErrors:
        return _ReadErrors(self.key, f"cannot read {self.where} as CSV")


def _all_integers(arr: pa.Array) -> bool:
    """Whether every (non-null) string of a CSV column is an integer."""
    try:
        pc.cast(arr, pa.int64())
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False


class _ReadErrors:
    """Arrow's read errors as one-line ConfigErrors naming the file (and its config key)."""

    def __init__(self, key: str, what: str):
        self.key, self.what = key, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        if kind is not None and issubclass(kind, (pa.ArrowException, OSError)) and not issubclass(kind, ConfigError):
            raise ConfigError(self.key, f"{self.what}: {one_line(value)}") from None
        return False


# --------------------------------------------------------------------------- features


class Features(Protocol):
    """How one batch's rows become samples: `setup` reads the sample shape off the first row,
    `fill` writes the rows at `idx` into `out` (a slice of the preallocated array)."""

    columns: list[str]
    numeric: list[str]
    dtype: Any

    def setup(self, batch: Any, where: str) -> tuple[int, ...]: ...

    def fill(self, out: np.ndarray, batch: Any, idx: pa.Array, where: str, offset: int) -> None: ...


@dataclass
class NumericColumns:
    """One number per column; a sample is the columns in order, reshaped to `shape`."""

    columns: list[str]
    shape: tuple[int, ...] | None = None
    dtype: Any = np.float32

    @property
    def numeric(self) -> list[str]:
        return self.columns

    def setup(self, batch: Any, where: str) -> tuple[int, ...]:
        return _reshape_to(self.shape, (len(self.columns),), where)

    def fill(self, out: np.ndarray, batch: Any, idx: pa.Array, where: str, offset: int) -> None:
        flat = out.reshape(len(out), -1)
        for j, name in enumerate(self.columns):
            arr = column_of(batch, name).take(idx)
            _no_nulls(arr, "data.feature_columns", name, where)
            flat[:, j] = arr.to_numpy(zero_copy_only=False)


@dataclass
class OneColumn:
    """Features read from one column (a list, encoded images, texts): no numeric columns."""

    column: str

    @property
    def columns(self) -> list[str]:
        return [self.column]

    @property
    def numeric(self) -> list[str]:
        return []


@dataclass
class ListColumn(OneColumn):
    """One list column (fixed-size or not, possibly nested); every row must hold as many
    numbers as the first, in the same nesting."""

    shape: tuple[int, ...] | None = None
    dtype: Any = np.float32
    dims: tuple[int, ...] = ()

    def setup(self, batch: Any, where: str) -> tuple[int, ...]:
        first = column_of(batch, self.column).slice(0, 1)
        dims: list[int] = []
        while _is_list(first.type):
            _no_nulls(first, "data.features_column", self.column, where)
            dims.append(int(pc.list_value_length(first)[0].as_py()))
            first = first.flatten()
        if not dims:
            raise ConfigError("data.features_column", f"column {self.column!r} of {where} is {first.type}, not a list column")
        if not (pa.types.is_integer(first.type) or pa.types.is_floating(first.type) or pa.types.is_boolean(first.type)):
            raise ConfigError("data.features_column", f"column {self.column!r} of {where} holds {first.type}, not numbers")
        self.dims = tuple(dims)
        return _reshape_to(self.shape, self.dims, where)

    def fill(self, out: np.ndarray, batch: Any, idx: pa.Array, where: str, offset: int) -> None:
        values = column_of(batch, self.column).take(idx)
        for depth, size in enumerate(self.dims):
            _no_nulls(values, "data.features_column", self.column, where)
            lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(lengths != size)
            if len(bad):
                row = offset + int(idx[int(bad[0] // int(np.prod(self.dims[:depth])))].as_py())
                raise ConfigError("data.features_column", f"rows of column {self.column!r} in {where} differ in length: "
                                  f"the first holds {list(self.dims)}, row {row} holds {int(lengths[bad[0]])} at depth {depth}")
            values = values.flatten()
        _no_nulls(values, "data.features_column", self.column, where)
        out.reshape(len(out), -1)[:] = values.to_numpy(zero_copy_only=False).reshape(len(out), -1)


@dataclass
class ImageColumn(OneColumn):
    """Encoded images (PNG, JPEG, anything Pillow reads), decoded to float32 [C, H, W] in
    [0, 1]: grayscale as one channel, anything else as RGB. All must share the first's size."""

    dtype: Any = np.float32
    first: tuple[int, ...] = ()

    def setup(self, batch: Any, where: str) -> tuple[int, ...]:
        self.first = decode_image(image_bytes(column_of(batch, self.column)[0], self.column, where, 0), self.column, where, 0).shape
        return self.first

    def fill(self, out: np.ndarray, batch: Any, idx: pa.Array, where: str, offset: int) -> None:
        col = column_of(batch, self.column)
        for k, i in enumerate(idx.to_numpy()):
            row = offset + int(i)
            img = decode_image(image_bytes(col[int(i)], self.column, where, row), self.column, where, row)
            if img.shape != self.first:
                raise ConfigError("data.image_column", f"images of column {self.column!r} differ in size: row {row} of {where} "
                                  f"is {_chw(img.shape)}, the first is {_chw(self.first)}; resize them to one size first")
            out[k] = img


def image_bytes(value: pa.Scalar, column: str, where: str, row: int) -> bytes:
    """The encoded bytes of one image cell: plain binary, or a {bytes, path} struct (Hugging
    Face's Image feature; a local `path` is read when `bytes` is null)."""
    if pa.types.is_struct(value.type):
        cell = value.as_py() or {}
        data, path = cell.get("bytes"), cell.get("path")
        if data is None and path:
            try:
                return Path(path).read_bytes()
            except OSError as e:
                raise ConfigError("data.image_column", f"row {row} of {where}: cannot read image file {path}: {one_line(e)}") from None
    else:
        data = value.as_py()
    if not isinstance(data, (bytes, bytearray)):
        raise ConfigError("data.image_column", f"row {row} of column {column!r} in {where} holds no image bytes")
    return bytes(data)


def decode_image(data: bytes, column: str, where: str, row: int) -> np.ndarray:
    """float32 [C, H, W] in [0, 1] of one encoded image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            gray = img.mode in ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
            arr = np.asarray(img.convert("L" if gray else "RGB"), dtype=np.float32) / np.float32(255)
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ConfigError("data.image_column", f"row {row} of column {column!r} in {where} is not a readable image: {one_line(e)}") from None
    return arr[None] if arr.ndim == 2 else np.ascontiguousarray(arr.transpose(2, 0, 1))


def _chw(shape: tuple[int, ...]) -> str:
    c, h, w = shape
    return f"{h}x{w} with {c} channel{'s' if c > 1 else ''}"


def _reshape_to(shape: tuple[int, ...] | None, natural: tuple[int, ...], where: str) -> tuple[int, ...]:
    if shape is None:
        return natural
    if int(np.prod(shape)) != int(np.prod(natural)):
        raise ConfigError("data.shape", f"{list(shape)} holds {int(np.prod(shape))} values; a row of {where} has {int(np.prod(natural))}")
    return tuple(shape)


# --------------------------------------------------------------------------- columns


@dataclass
class Columns:
    """What the reader takes from each batch: the features, the label, the client id."""

    features: Any  # a Features
    label: str
    client: str | None

    def needed(self, has_client: bool = True) -> list[str]:
        return [*self.features.columns, *(c for c in self.ids(has_client) if c not in self.features.columns)]

    def ids(self, has_client: bool = True) -> list[str]:
        """The label and client columns (without the features)."""
        return [self.label] + ([self.client] if self.client is not None and has_client else [])


def resolve_columns(cfg: ColumnConfig, schema: pa.Schema, where: str, text: Features | None = None) -> Columns:
    """The columns of `schema` the config names (each checked to exist), with the default
    features (every other column) filled in."""
    names = schema.names
    need_column(names, cfg.label_column, "data.label_column", where)
    if cfg.client_column is not None:
        need_column(names, cfg.client_column, "data.client_column", where)
    shape = tuple(cfg.shape) if cfg.shape is not None else None
    if text is not None:
        features: Any = text
    elif cfg.image_column is not None:
        need_column(names, cfg.image_column, "data.image_column", where)
        features = ImageColumn(cfg.image_column)
    elif cfg.features_column is not None:
        need_column(names, cfg.features_column, "data.features_column", where)
        features = ListColumn(cfg.features_column, shape)
    else:
        features = default_features(cfg, schema, where, shape)
    return Columns(features, cfg.label_column, cfg.client_column)


def default_features(cfg: ColumnConfig, schema: pa.Schema, where: str, shape: tuple[int, ...] | None) -> Any:
    """`feature_columns`, or every column but the label and client ones: numbers each, or the
    one list / image column when it is the only one left."""
    if cfg.feature_columns is not None:
        columns = list(cfg.feature_columns)
        for name in columns:
            need_column(schema.names, name, "data.feature_columns", where)
    else:
        columns = [n for n in schema.names if n not in (cfg.label_column, cfg.client_column) and not n.startswith(INDEX_PREFIX)]
        if not columns:
            raise ConfigError("data.feature_columns", f"{where} has no column besides the label and client ones")
        if len(columns) == 1 and _is_list(_storage_type(schema.field(columns[0]).type)):
            return ListColumn(columns[0], shape)
        if len(columns) == 1 and _is_image_type(schema.field(columns[0]).type) and shape is None:
            return ImageColumn(columns[0])
    for name in columns:
        t = _storage_type(schema.field(name).type)
        if not (is_number(t) or pa.types.is_decimal(t)):
            raise ConfigError("data.feature_columns", f"column {name!r} of {where} is {t}, not a number; {_hint(name, t)}")
    return NumericColumns(columns, shape)


def _hint(name: str, t: pa.DataType) -> str:
    """What to set instead, for a column that is no number."""
    if _is_image_type(t):
        return f"for images set data.image_column: {name}"
    if _is_list(t):
        return f"for a list column set data.features_column: {name}"
    return "name the numeric columns in data.feature_columns (or the client id column in data.client_column)"


def need_column(names: list[str], name: str, key: str, where: str) -> None:
    if name not in names:
        raise ConfigError(key, f"column {name!r} is not in {where}; its columns are {names}")


def column_of(batch: Any, name: str) -> pa.Array:
    """One column of a record batch or table as a plain array (chunks joined, dictionary and
    extension types unwrapped)."""
    arr = batch.column(name)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def _storage_type(t: pa.DataType) -> pa.DataType:
    if isinstance(t, pa.ExtensionType):
        t = t.storage_type
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_image_type(t: pa.DataType) -> bool:
    t = _storage_type(t)
    if pa.types.is_struct(t):
        return t.get_field_index("bytes") >= 0
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _no_nulls(arr: pa.Array, key: str, name: str, where: str) -> None:
    if arr.null_count:
        raise ConfigError(key, f"column {name!r} of {where} has {arr.null_count} missing value(s); fill or drop those rows first")


# --------------------------------------------------------------------------- reading


@dataclass
class Rows:
    """What one destination (train or test) got from a source: samples, raw labels, raw ids."""

    x: np.ndarray | FileRows | None  # None: the features were not read (read_rows(features=False))
    labels: pa.Array | np.ndarray
    clients: pa.Array | np.ndarray | None


class IdSink:
    """One id column (label or client) of one destination as it is read: integers go straight
    into an int64 array, anything else stays Arrow pieces (coded once every split is read)."""

    def __init__(self, size: int):
        self.size = size
        self.ints: np.ndarray | None = None
        self.pieces: list[pa.Array] = []

    def add(self, arr: pa.Array, lo: int, hi: int) -> None:
        if self.pieces or arr.null_count or not pa.types.is_integer(arr.type):
            if self.ints is not None:  # a later part file stores it otherwise: keep what came as Arrow
                self.pieces, self.ints = [pa.array(self.ints[:lo])], None
            self.pieces.append(arr)
            return
        if self.ints is None:
            self.ints = np.empty(self.size, dtype=np.int64)
        self.ints[lo:hi] = arr.to_numpy(zero_copy_only=False)

    def result(self, key: str, name: str, where: str) -> pa.Array | np.ndarray:
        """The column: the int64 array itself, or one Arrow array of the pieces."""
        if self.ints is not None or not self.pieces:
            return self.ints if self.ints is not None else np.zeros(0, dtype=np.int64)
        return concat(self.pieces, key, name, where)


def read_rows(source: Source, cols: Columns, wanted: list[np.ndarray], batch_rows: int, features: bool = True) -> list[Rows]:
    """The rows at `wanted` (sorted file-row ids, one array per destination) of `source`, read
    in batches of the needed columns only, each batch's rows written straight into arrays
    preallocated once the first row shows the sample shape. `features=False` reads the label
    and client columns alone (the rows' `x` is then None)."""
    client = client_column(source, cols)
    reader = cols.features
    columns = cols.needed(client is not None) if features else cols.ids(client is not None)
    outs: list[np.ndarray] | None = None
    labels = [IdSink(len(w)) for w in wanted]
    clients = [IdSink(len(w)) for w in wanted]
    offset = 0
    for part in source.parts:
        for batch in part.batches(columns, batch_rows, reader.numeric if features else []):
            n = batch.num_rows
            if n == 0:
                continue
            if outs is None and features:
                shape = reader.setup(batch, part.where)
                outs = [np.empty((len(w), *shape), dtype=reader.dtype) for w in wanted]
            for i, w in enumerate(wanted):
                lo, hi = (int(b) for b in np.searchsorted(w, [offset, offset + n]))
                if hi == lo:
                    continue
                idx = pa.array(w[lo:hi] - offset, type=pa.int64())
                if outs is not None:
                    reader.fill(outs[i][lo:hi], batch, idx, part.where, offset)
                labels[i].add(column_of(batch, cols.label).take(idx), lo, hi)
                if client is not None:
                    clients[i].add(column_of(batch, client).take(idx), lo, hi)
            offset += n
            release_batch_memory()
    expected = sum(p.num_rows() for p in source.parts)
    if offset == 0 or offset != expected:
        raise ConfigError(source.parts[0].key, f"{source.where} has no rows" if offset == 0
                          else f"{source.where} gave {offset} rows, its metadata says {expected} (did it change while read?)")
    return [Rows(x, lab.result("data.label_column", cols.label, source.where),
                 cl.result("data.client_column", str(client), source.where) if client is not None else None)
            for x, lab, cl in zip(outs or [None] * len(wanted), labels, clients, strict=True)]


def client_column(source: Source, cols: Columns) -> str | None:
    """The client column when every part file has it, None when none has; else an error."""
    has_client = [cols.client is not None and cols.client in p.schema().names for p in source.parts]
    if len(set(has_client)) > 1:
        raise ConfigError("data.client_column", f"column {cols.client!r} is in some part files of {source.where} but not all")
    return cols.client if has_client and has_client[0] else None


def release_batch_memory() -> None:
    """Hand the freed batch buffers back: Arrow's allocator (mimalloc, jemalloc) would keep
    them, and the driver's memory would then grow with the rows read, not the batch."""
    pa.default_memory_pool().release_unused()


def concat(arrays: list[pa.Array], key: str, name: str | None, where: str) -> pa.Array:
    """One array of the pieces (part files may store a column with different types)."""
    if not arrays:
        return pa.array([], type=pa.int64())
    return pa.concat_arrays(same_type(arrays, key, str(name), where))


def load_table(cfg: ColumnConfig, seed: int, train: Source, test: Source | None, name: str,
               text: Features | None = None, num_classes: int | None = None) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, test) of a table source: columns checked in every part, rows planned from the
    counts, read in batches into their final arrays, labels and client ids coded."""
    cols = resolve_columns(cfg, train.parts[0].schema(), train.parts[0].where, text)
    for source in [train, *([test] if test is not None else [])]:
        check_parts(source, cols, cfg)
    ids = [c for c in (cols.label, cols.client) if c is not None]
    n_train = sum(p.num_rows(ids) for p in train.parts)
    n_test = None if test is None else sum(p.num_rows([c for c in ids if c in p.schema().names]) for p in test.parts)
    picked = pool_rows(n_train, n_test, cfg, seed)  # None: every row of that split
    train_rows, test_rows = (np.arange(n) if rows is None else rows for rows, n in zip(picked, (n_train, n_test or 0), strict=True))
    batch = cfg.rows_per_batch()
    shape = host_read_shape(cfg, train, cols, len(train_rows))
    if shape is not None:
        got = read_ids_here(train, test, cols, train_rows, test_rows, shape, batch, every_train_row=picked[0] is None)
    elif test is None:
        got = read_rows(train, cols, [train_rows, test_rows], batch)
    else:
        got = read_rows(train, cols, [train_rows], batch) + read_rows(test, cols, [test_rows], batch)
    return assemble(got, cfg, name, train.where, num_classes)


def host_read_shape(cfg: ColumnConfig, train: Source, cols: Columns, n_rows: int) -> tuple[int, ...] | None:
    """The sample shape when the hosts are to read the train features (`data.read_on_hosts`:
    on, or auto with features over READ_ON_HOSTS_BYTES), else None. Read off the first row
    (the feature reader is set up by it, as the eager reader's first batch does)."""
    mode = getattr(cfg, "read_on_hosts", "off")
    if mode == "off" or not all(isinstance(p, ParquetPart) for p in train.parts):
        return None
    first = next((b for b in (p.first_row(cols.features.columns) for p in train.parts) if b is not None), None)
    if first is None:
        return None  # no rows: the eager reader says so
    shape = tuple(cols.features.setup(first, train.parts[0].where))
    size = n_rows * int(np.prod(shape)) * np.dtype(cols.features.dtype).itemsize
    return shape if mode == "on" or size > READ_ON_HOSTS_BYTES else None


def read_ids_here(train: Source, test: Source | None, cols: Columns, train_rows: np.ndarray, test_rows: np.ndarray,
                  shape: tuple[int, ...], batch: int, every_train_row: bool) -> list[Rows]:
    """The train split's labels and client ids, its features left in the files (a FileRows the
    hosts read), and the test split's rows read here (for the driver's evaluation)."""
    files = FileRows(tuple(p.ref for p in train.parts), np.array([p.num_rows() for p in train.parts], dtype=np.int64),
                     None if every_train_row else train_rows, cols.features, shape, batch)
    if test is not None:
        ids = read_rows(train, cols, [train_rows], batch, features=False)
        return [Rows(files, ids[0].labels, ids[0].clients), *read_rows(test, cols, [test_rows], batch)]
    ids = read_rows(train, cols, [train_rows, test_rows], batch, features=False)
    test_x = replace(files, ids=test_rows).read()
    return [Rows(files, ids[0].labels, ids[0].clients), Rows(test_x, ids[1].labels, ids[1].clients)]


def check_parts(source: Source, cols: Columns, cfg: ColumnConfig) -> None:
    """Every part file holds the feature and label columns (a test file may lack the client
    column: its rows then belong to no client)."""
    for part in source.parts:
        names = part.schema().names
        for name in cols.features.columns:
            need_column(names, name, _feature_key(cfg, cols), part.where)
        need_column(names, cols.label, "data.label_column", part.where)


def _feature_key(cfg: ColumnConfig, cols: Columns) -> str:
    for key in cfg.feature_keys():
        if getattr(cfg, key, None) is not None:
            return f"data.{key}"
    return "data.feature_columns"


def assemble(got: list[Rows], cfg: ColumnConfig, name: str, where: str, num_classes: int | None) -> tuple[ArrayDataset, ArrayDataset]:
    """The (train, test) ArrayDatasets of the rows read: labels and client ids coded over
    train and test together."""
    labels = encode_labels([g.labels for g in got], "data.label_column", cfg.label_column, where,
                           cfg.num_classes if cfg.num_classes is not None else num_classes)
    groups: list[np.ndarray | None] = [None] * len(got)
    num_groups = None
    with_ids = [i for i, g in enumerate(got) if g.clients is not None]
    if with_ids:
        codes, num_groups = encode_clients([got[i].clients for i in with_ids], "data.client_column", cfg.client_column, where)
        for i, c in zip(with_ids, codes, strict=True):
            groups[i] = c
    train, test = (ArrayDataset(g.x, y, labels.num_classes, name, gr, num_groups if gr is not None else None)
                   for g, y, gr in zip(got, labels.codes, groups, strict=True))
    return train, test


# --------------------------------------------------------------------------- labels


@dataclass
class Labels:
    """Class codes per split, the class count, and what each code stands for (the sorted
    distinct values when the labels were coded; None when they are the codes themselves)."""

    codes: list[np.ndarray]
    num_classes: int
    classes: list[Any] | None = field(default=None)


def encode_labels(parts: list[pa.Array | np.ndarray], key: str, name: str, where: str, num_classes: int | None) -> Labels:
    """Labels as int64 codes: non-negative integers are kept (num_classes: given, else the
    largest + 1), anything else (strings, negative integers) is coded 0..k-1 in sorted order
    of the distinct values over all splits, so the same file always gives the same codes.
    Fewer than two distinct labels is an error naming the column."""
    ints = label_ints(parts, key, name, where)
    low = None if ints is None else min(int(v.min(initial=0)) for v in ints)
    if low is not None and low < 0 and num_classes is not None:
        raise ConfigError(key, f"column {name!r} of {where} holds label {low}, not a class code in [0, {num_classes}) "
                          "(Hugging Face writes -1 for a row without a label)")
    if ints is not None and low >= 0:
        top = max(int(v.max(initial=0)) for v in ints)
        k = num_classes if num_classes is not None else top + 1
        if top >= k:
            raise ConfigError("data.num_classes", f"is {k}, but column {name!r} of {where} holds label {top}")
        least = min(int(v.min(initial=top)) for v in ints)
        codes, classes, distinct = ints, None, [least] if least == top else [least, top]
    else:
        arrow = [pa.array(v) for v in ints] if ints is not None else arrow_parts(parts, key, name, where)
        codes, classes = sorted_codes(arrow, key, name, where)
        distinct = classes
        k = len(classes) if num_classes is None else num_classes
        if len(classes) > k:
            raise ConfigError("data.num_classes", f"is {k}, but column {name!r} of {where} holds {len(classes)} distinct labels")
    if len(distinct) < 2:
        shown = distinct[0] if distinct else "none"
        raise ConfigError(key, f"column {name!r} of {where} has 1 class ({shown!r}); classification needs at least 2")
    return Labels(codes, int(k), classes)


def label_ints(parts: list[pa.Array | np.ndarray], key: str, name: str, where: str) -> list[np.ndarray] | None:
    """Numeric labels as writable int64 arrays (int64 numpy parts as they are), or None for
    labels that are not numbers; fractional numbers are an error."""
    arrow = None
    if not all(isinstance(p, np.ndarray) and p.dtype.kind in "iub" for p in parts):
        arrow = arrow_parts(parts, key, name, where)
        if not is_number(arrow[0].type):
            return None
    out = []
    for i, p in enumerate(parts):
        values = p if arrow is None else arrow[i].to_numpy(zero_copy_only=False)
        if values.dtype.kind == "f" and not (np.all(np.isfinite(values)) and np.all(values == np.round(values))):
            raise ConfigError(key, f"column {name!r} of {where} holds fractional numbers; labels are class codes "
                              "(integers) or class names (strings)")
        values = values.astype(np.int64, copy=False)
        out.append(values if values.flags.writeable else values.copy())
    return out


def arrow_parts(parts: list[pa.Array | np.ndarray], key: str, name: str, where: str) -> list[pa.Array]:
    """The parts as Arrow arrays of one type, without missing values."""
    arrow = same_type([p if isinstance(p, pa.Array) else pa.array(p) for p in parts], key, name, where)
    for p in arrow:
        _no_nulls(p, key, name, where)
    return arrow


def encode_clients(parts: list[pa.Array | np.ndarray], key: str, name: str | None, where: str) -> tuple[list[np.ndarray], int]:
    """Client ids as codes 0..g-1 in sorted order of the distinct ids over all splits."""
    codes, distinct = sorted_codes(arrow_parts(parts, key, str(name), where), key, str(name), where)
    return codes, len(distinct)


def sorted_codes(parts: list[pa.Array], key: str, name: str, where: str) -> tuple[list[np.ndarray], list[Any]]:
    """Each value's position among the sorted distinct values of all parts."""
    try:
        distinct = pc.unique(pa.chunked_array(parts, type=parts[0].type))
        distinct = distinct.take(pc.sort_indices(distinct))
        codes = [pc.index_in(p, value_set=distinct).to_numpy(zero_copy_only=False).astype(np.int64) for p in parts]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ConfigError(key, f"column {name!r} of {where} ({parts[0].type}) cannot be coded: {one_line(e)}") from None
    return codes, distinct.to_pylist()


def same_type(parts: list[pa.Array], key: str, name: str, where: str) -> list[pa.Array]:
    """The parts (splits, files) of one column cast to the first's type, or a one-line error."""
    first = parts[0].type
    try:
        return [p if p.type == first else p.cast(first) for p in parts]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ConfigError(key, f"column {name!r} of {where} has different types across files: {one_line(e)}") from None


def is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def class_names(cfg: TableConfig | NpzConfig) -> list[Any] | None:
    """What each class code of a parquet, csv or npz dataset stands for when its labels were
    coded (their sorted distinct values), or None when the labels are the codes themselves.
    Reads the label column (array) alone."""
    if isinstance(cfg, NpzConfig):
        files = [cfg.path, *([cfg.test_path] if cfg.test_path else [])]
        labels = [read_npz(p, "data.path", cfg)["y"] for p in files]
        return encode_labels(labels, "data.y_key", cfg.y_key, cfg.path, cfg.num_classes).classes
    labels = [_label_column(text, key, cfg) for text, key in ((cfg.path, "data.path"), (cfg.test_path, "data.test_path")) if text]
    return encode_labels(labels, "data.label_column", cfg.label_column, cfg.path, cfg.num_classes).classes


def _label_column(text: str, key: str, cfg: TableConfig) -> pa.Array:
    if isinstance(cfg, CsvConfig):
        parts: list[Any] = [CsvPart(f, cfg.delimiter) for f in list_files(text, key, ())]
    else:
        parts = [ParquetPart(f) for f in list_files(text, key, PARQUET_SUFFIXES)]
    pieces = []
    for part in parts:
        need_column(part.schema().names, cfg.label_column, "data.label_column", part.where)
        part.num_rows([cfg.label_column])
        pieces += [column_of(b, cfg.label_column) for b in part.batches([cfg.label_column], BATCH_ROWS, [])]
    return concat(pieces, "data.label_column", cfg.label_column, text)


def one_line(e: BaseException | None) -> str:
    return " ".join(str(e).split()) or type(e).__name__


