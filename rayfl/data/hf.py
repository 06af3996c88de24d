"""Hugging Face `datasets` as rayfl datasets (`data.dataset: hf`), each usable with every
partitioner, or with `partition.method: natural` when `client_column` names the rows' own
clients (a writer id, a user id).

Where the rows come from, in this order: `data_files` (local Parquet / Arrow / CSV / JSON
files: a list, the train split, or a mapping split -> files), read with the packaged builder of
their extension; `path` as a `save_to_disk` directory (a Dataset, or a DatasetDict whose
`split` and `test_split` name the train and test splits); `path` as another local directory
or file `datasets.load_dataset` reads (an image folder, a directory of Parquet files); else
`path` as a Hub name (`name` its configuration), fetched when the network allows. A Dataset
alone (or a DatasetDict without `test_split`) is one pool split with `data.test_fraction`.

The samples: an `image_column` (a `datasets.Image` feature: decoded by Pillow into float32
[C, H, W] in [0, 1], grayscale as one channel; all images one size), a `text_column` turned
into `seq_len` token ids (int64, padded / truncated with 0) by `tokenizer`, a
"package.module:attr" function text -> token ids, or numeric feature columns / one list column
as in `rayfl.data.tables`. A `ClassLabel` label column gives the class count; other labels are
coded as tables' are. Rows are read through `rayfl.data.tables.load_table` in Arrow batches
(no decoding into Python objects besides the images and texts themselves), straight into the
final arrays.

`datasets` is imported only when such a dataset is loaded, so `import rayfl` does not import
it; without it, a one-line error says `pip install datasets`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rayfl.config import ConfigError, DataConfig
from rayfl.data.datasets import ArrayDataset
from rayfl.data.tables import (
    ColumnConfig,
    OneColumn,
    Source,
    column_of,
    dataset_name,
    list_files,
    load_table,
    one_line,
)

# The packaged `datasets` builder that reads files of each extension.
BUILDERS = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".csv": "csv",
            ".json": "json", ".jsonl": "json", ".txt": "text"}
INSTALL = "the hf dataset needs Hugging Face datasets: pip install datasets"


@dataclass
class HfSource(DataConfig):
    """Where a Hugging Face dataset's rows come from (see the module docstring for the order).

    `path`: a save_to_disk directory, a local directory or file `load_dataset` reads, or a Hub
    name such as "ylecun/mnist". `name`: the Hub dataset's configuration (null: its default).
    `data_files`: local data files instead of `path`, a list (the train split) or a mapping
    split -> file(s); globs allowed. `split` / `test_split`: the train and the test split of a
    DatasetDict (test_split null: the train split alone, split with test_fraction).
    `cache_dir`: where `load_dataset` keeps what it prepares (null: Hugging Face's default)."""

    # A save_to_disk directory, a local directory or file load_dataset reads, or a Hub name such as
    # ylecun/mnist. Set this or data_files.
    path: str = ""
    # The Hub dataset's configuration; null: its default.
    name: str | None = None
    # Local data files instead of path: a list (the train split) or a mapping split -> file(s);
    # globs allowed.
    data_files: list[str] | dict[str, Any] | None = None
    # The train split of a DatasetDict.
    split: str = "train"
    # The test split of a DatasetDict; null: the train split alone, split with test_fraction.
    test_split: str | None = None
    # Where load_dataset keeps what it prepares; null: Hugging Face's default.
    cache_dir: str | None = None

    def validate(self) -> None:
        super().validate()
        if importlib.util.find_spec("datasets") is None:
            raise ConfigError("data.dataset", INSTALL)
        if bool(self.path) == (self.data_files is not None):
            raise ConfigError("data.path", "set one of data.path (a directory, file or Hub name) and data.data_files")
        if self.path and looks_local(self.path) and not Path(self.path).expanduser().exists():
            raise ConfigError("data.path", f"{self.path} does not exist")
        for split, files in split_files(self.data_files).items():
            for text in files:
                list_files(text, f"data.data_files.{split}", ())


@dataclass
class HfConfig(ColumnConfig, HfSource):
    """A Hugging Face dataset: where its rows come from (HfSource: path, name, data_files,
    split, test_split, cache_dir) and which columns make a sample (ColumnConfig: label_column,
    client_column, image_column, feature_columns, features_column, shape, num_classes,
    batch_rows), or `text_column`, a string column made into `seq_len` token ids by
    `tokenizer` (an import path "package.module:attr" of a function text -> token ids; 0 pads)."""

    dataset: str = "hf"
    # A string column made into seq_len token ids by tokenizer (instead of image or feature
    # columns); null: none.
    text_column: str | None = None
    # text_column's tokenizer: 'package.module:attr' of a function text -> token ids (0 pads).
    tokenizer: str | None = None
    # Token ids per text sample, padded or truncated (> 0).
    seq_len: int = 64

    def validate(self) -> None:
        super().validate()
        if self.text_column is not None:
            self._validate_text()
        elif self.tokenizer is not None:
            raise ConfigError("data.tokenizer", "tokenizes data.text_column, which is not set")

    def _validate_text(self) -> None:
        if self.tokenizer is None:
            raise ConfigError("data.tokenizer", f"data.text_column {self.text_column!r} needs a tokenizer: an import path 'package.module:attr' of a function text -> token ids")
        load_tokenizer(self.tokenizer)
        if self.seq_len <= 0:
            raise ConfigError("data.seq_len", f"must be > 0, got {self.seq_len}")

    def feature_keys(self) -> tuple[str, ...]:
        return (*super().feature_keys(), "text_column")

    def decoded_column(self) -> str | None:
        return self.image_column or self.text_column


def load_hf(cfg: HfConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """The dataset's train (and test) split as a (train, test) pair of arrays."""
    datasets = import_datasets()
    train, test = pick_splits(open_dataset(cfg, datasets), cfg)
    where, key = (cfg.path, "data.path") if cfg.path else ("data.data_files", "data.data_files")
    text = None
    if cfg.text_column is not None:
        text = TextColumn(cfg.text_column, load_tokenizer(cfg.tokenizer or ""), cfg.tokenizer or "", cfg.seq_len)
    return load_table(cfg, seed, Source(where, [HfPart(train, f"{where} [{cfg.split}]", key)]),
                      None if test is None else Source(where, [HfPart(test, f"{where} [{cfg.test_split}]", key)]),
                      hf_name(cfg), text, class_count(train, cfg.label_column, datasets))


# --------------------------------------------------------------------------- opening


def import_datasets() -> Any:
    """Hugging Face `datasets`, imported only now (`import rayfl` must stay cheap)."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("data.dataset", INSTALL) from None
    return datasets


def looks_local(path: str) -> bool:
    """Whether `path` means local disk (not a Hub name): it exists, or is written as a path."""
    return Path(path).expanduser().exists() or path.startswith(("/", ".", "~")) or Path(path).suffix != ""


def split_files(data_files: list[str] | Mapping[str, Any] | None) -> dict[str, list[str]]:
    """`data_files` as split -> list of files (a plain list is the train split)."""
    if data_files is None:
        return {}
    if not isinstance(data_files, Mapping):
        return {"train": list(data_files)}
    out = {}
    for split, files in data_files.items():
        if isinstance(files, str):
            files = [files]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ConfigError(f"data.data_files.{split}", f"must be a file or a list of files, got {files!r}")
        out[str(split)] = files
    return out


def open_dataset(cfg: HfConfig, datasets: Any) -> Any:
    """The Dataset or DatasetDict the config names, or a one-line ConfigError."""
    if cfg.data_files is not None:
        return _from_files(cfg, datasets)
    local = Path(cfg.path).expanduser()
    if local.is_dir() and ((local / "dataset_dict.json").is_file() or (local / "state.json").is_file()):
        return _guarded(lambda: datasets.load_from_disk(str(local)), "data.path", f"cannot read the saved dataset {local}")
    if local.exists():
        return _guarded(lambda: datasets.load_dataset(str(local), cfg.name, cache_dir=cfg.cache_dir),
                        "data.path", f"cannot read {local} with datasets.load_dataset")
    return _guarded(lambda: datasets.load_dataset(cfg.path, cfg.name, cache_dir=cfg.cache_dir), "data.path",
                    f"{cfg.path!r} is not a local path, and loading it from the Hugging Face Hub failed")


def _from_files(cfg: HfConfig, datasets: Any) -> Any:
    files = {split: [ref.where for text in texts for ref in list_files(text, f"data.data_files.{split}", ())]
             for split, texts in split_files(cfg.data_files).items()}
    suffixes = {Path(f).suffix.lower() for fs in files.values() for f in fs}
    builders = {BUILDERS.get(s) for s in suffixes}
    if len(builders) != 1 or None in builders:
        raise ConfigError("data.data_files", f"files must all be one of {sorted(BUILDERS)} (one kind), got {sorted(suffixes)}")
    (builder,) = builders
    return _guarded(lambda: datasets.load_dataset(builder, data_files=files, cache_dir=cfg.cache_dir),
                    "data.data_files", f"cannot read the {builder} files")


def _guarded(load: Callable[[], Any], key: str, what: str) -> Any:
    try:
        return load()
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(key, f"{what}: {type(e).__name__}: {one_line(e)}") from None


def pick_splits(loaded: Any, cfg: HfConfig) -> tuple[Any, Any | None]:
    """(train, test or None) of a Dataset / DatasetDict."""
    if not isinstance(loaded, Mapping):  # one Dataset
        if cfg.test_split is not None:
            raise ConfigError("data.test_split", f"{cfg.path or 'data.data_files'} is one Dataset without splits; "
                              "leave data.test_split null (data.test_fraction splits it)")
        return loaded, None
    names = list(loaded.keys())
    for key, split in (("data.split", cfg.split), ("data.test_split", cfg.test_split)):
        if split is not None and split not in names:
            raise ConfigError(key, f"{cfg.path or 'data.data_files'} has no split {split!r}; its splits are {names}")
    return loaded[cfg.split], None if cfg.test_split is None else loaded[cfg.test_split]


def class_count(ds: Any, label: str, datasets: Any) -> int | None:
    """The class count of a ClassLabel label column (None for other features)."""
    feature = ds.features.get(label)
    return feature.num_classes if isinstance(feature, datasets.ClassLabel) else None


def hf_name(cfg: HfConfig) -> str:
    """A short name for results: the directory's or the Hub dataset's name."""
    if cfg.path:
        return dataset_name(cfg.path.rstrip("/")) if looks_local(cfg.path) else cfg.path.split("/")[-1]
    return "hf"


class HfPart:
    """A Dataset as one part of a table source: rows in Arrow batches of some columns."""

    def __init__(self, ds: Any, where: str, key: str):
        self.ds, self.where, self.key = ds, where, key

    def schema(self) -> pa.Schema:
        return self.ds.features.arrow_schema

    def num_rows(self, id_columns: Any = ()) -> int:
        return len(self.ds)

    def batches(self, columns: list[str], batch_rows: int, numeric: Any = ()) -> Any:
        yield from self.ds.select_columns(list(columns)).with_format("arrow").iter(batch_size=batch_rows)


# --------------------------------------------------------------------------- texts


def load_tokenizer(path: str) -> Callable[[str], Any]:
    """The function an import path names, or a one-line ConfigError at data.tokenizer."""
    from rayfl.registry import import_object

    fn = import_object(path, "data.tokenizer")
    if not callable(fn):
        raise ConfigError("data.tokenizer", f"{path!r} is a {type(fn).__name__}, not a function text -> token ids")
    return fn


@dataclass
class TextColumn(OneColumn):
    """Texts made into `seq_len` int64 token ids by a tokenizer (truncated, or padded with 0)."""

    tokenize: Callable[[str], Any]
    tokenizer: str
    seq_len: int
    dtype: Any = np.int64

    def setup(self, batch: Any, where: str) -> tuple[int, ...]:
        return (self.seq_len,)

    def fill(self, out: np.ndarray, batch: Any, idx: pa.Array, where: str, offset: int) -> None:
        texts = column_of(batch, self.column).take(idx).to_pylist()
        out[:] = 0
        for k, text in enumerate(texts):
            row = offset + int(idx[k].as_py())
            if not isinstance(text, str):
                raise ConfigError("data.text_column", f"row {row} of column {self.column!r} in {where} is {type(text).__name__}, not text")
            ids = self.token_ids(text, row, where)[: self.seq_len]
            out[k, : len(ids)] = ids

    def token_ids(self, text: str, row: int, where: str) -> np.ndarray:
        """The tokenizer's answer as a 1-D int64 array: a list, an array, or a mapping with
        `input_ids` (a transformers tokenizer's)."""
        try:
            got = self.tokenize(text)
        except Exception as e:
            raise ConfigError("data.tokenizer", f"{self.tokenizer!r} failed on row {row} of {where}: {type(e).__name__}: {one_line(e)}") from None
        if isinstance(got, Mapping) and "input_ids" in got:
            got = got["input_ids"]
        ids = np.asarray(got).reshape(-1)
        if ids.dtype.kind not in "iu" or (len(ids) and ids.min() < 0):
            raise ConfigError("data.tokenizer", f"{self.tokenizer!r} must return non-negative integer token ids; "
                              f"for row {row} of {where} it returned {ids.dtype} {ids[:5].tolist()}")
        return ids.astype(np.int64)
