"""An on-disk cache of built federated datasets, so reruns of one config skip the generation.

Generating 1,000 synthetic clients takes 1-2 s of every run's start-up; mapping them back
(rayfl.data.mapped) takes milliseconds, and hosts on the same machine map the same file. An
entry is reused only when everything that determines the data is the same: the data and
partition config, the effective seed, numpy's version and the source of the code that
generates data (every `.py` file under `rayfl/data/` and `rayfl/rng.py`). Only datasets made
from the config alone are cached (`cacheable`): a file-backed dataset depends on files the key
does not cover.

Entries live in `$RAYFL_CACHE_DIR/datasets/` (default `~/.cache/rayfl/datasets/`), one
uncompressed `.npz` each, least recently used evicted beyond `RAYFL_CACHE_MAX_MB` MiB (default
2048). While a run's hosts map an entry it is also linked under `.pinned/`, so an eviction
meanwhile frees its space only when the run ends. `RAYFL_CACHE_DIR=off` disables the cache:
nothing is read or written. The cache is best effort: an entry that cannot be read is rebuilt,
one that cannot be written only logs a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rayfl.config import DataConfig, PartitionConfig
from rayfl.data.federated import FederatedDataset
from rayfl.data.mapped import MappedArrays, npz_layout
from rayfl.data.stored import dataset_arrays, dataset_from_arrays

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the file layout or the key changes
DEFAULT_MAX_MB = 2048
# DataConfig fields that only locate or fetch files, which cacheable datasets never read;
# `seed` is replaced by the effective seed. Any other field stays in the key.
_UNUSED_DATA_FIELDS = ("data_dir", "download", "seed")
_RAYFL = Path(__file__).resolve().parents[1]
_STALE_TMP_SECONDS = 3600.0  # a temp file this old was left by a writer that died


def cacheable(data: DataConfig) -> bool:
    """Whether the dataset is generated from the config alone (so the key covers all it depends on)."""
    return data.generated_by_rayfl()


def cache_dir() -> Path | None:
    """The directory of dataset entries, or None when RAYFL_CACHE_DIR=off."""
    root = os.environ.get("RAYFL_CACHE_DIR", "").strip()
    if root.lower() == "off":
        return None
    return Path(root or "~/.cache/rayfl").expanduser() / "datasets"


def max_bytes() -> int:
    """The size bound from RAYFL_CACHE_MAX_MB (MiB); a malformed value falls back to the default."""
    raw = os.environ.get("RAYFL_CACHE_MAX_MB", "")
    try:
        mb = float(raw) if raw.strip() else DEFAULT_MAX_MB
    except ValueError:
        log.warning("RAYFL_CACHE_MAX_MB=%r is not a number; using %d", raw, DEFAULT_MAX_MB)
        mb = DEFAULT_MAX_MB
    return int(mb * 2**20)


def code_fingerprint() -> str:
    """sha256 of the data-generating source files, so an edit to them invalidates every entry."""
    h = hashlib.sha256()
    files = sorted((_RAYFL / "data").rglob("*.py")) + [_RAYFL / "rng.py"]
    for f in files:
        h.update(f.relative_to(_RAYFL).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def effective_seed(data: DataConfig, seed: int) -> int:
    """The seed the data are drawn from: data.seed pins it, as in build_federated_dataset."""
    return data.seed if data.seed is not None else seed


def cache_key(data: DataConfig, partition: PartitionConfig, seed: int) -> str:
    """sha256 of a canonical JSON of every input the generated data depend on."""
    data_fields = {k: v for k, v in dataclasses.asdict(data).items() if k not in _UNUSED_DATA_FIELDS}
    doc = {
        "format": FORMAT_VERSION,
        "data": data_fields,
        "partition": dataclasses.asdict(partition),
        "seed": int(effective_seed(data, seed)),
        "numpy": np.__version__,
        "code": code_fingerprint(),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def cached_build(
    data: DataConfig, partition: PartitionConfig, seed: int, build: Callable[[], FederatedDataset]
) -> FederatedDataset:
    """`build()`'s dataset, loaded from the cache when an entry for these inputs exists; a
    fresh build is stored for the next run."""
    root = cache_dir()
    if root is None or not cacheable(data):
        return build()
    key = cache_key(data, partition, seed)
    path = root / f"{key}.npz"
    if path.exists():
        try:
            fd = _load(path, key)
        except Exception as err:  # truncated, corrupt, unreadable: rebuild and overwrite
            log.warning("dataset cache entry %s is unreadable (%s); rebuilding it", path, err)
        else:
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: evicted last
            log.info("dataset loaded from cache %s", path)
            return fd
    fd = build()
    try:
        _store(fd, root, path, key)
        _evict(root, keep=path, limit=max_bytes())
    except Exception as err:  # read-only dir, full disk, ...: the run goes on without the cache
        log.warning("could not write the dataset cache in %s (%s); continuing without it", root, err)
        return fd
    # the stored entry, mapped, as a later run gets it: hosts on this machine map the file
    # instead of receiving a copy through the object store, and the driver drops the built
    # arrays (a FEMNIST-sized build held them and their object-store copy: 5.8 GB for 2.7)
    try:
        return _load(path, key)
    except Exception as err:
        log.warning("could not map the dataset cache entry %s (%s); using the built arrays", path, err)
        return fd


def _store(fd: FederatedDataset, root: Path, path: Path, key: str) -> None:
    """Write the entry to a temp file beside it, then rename: readers never see half a file."""
    root.mkdir(parents=True, exist_ok=True)
    fd_tmp, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=root)
    try:
        with os.fdopen(fd_tmp, "wb") as f:
            np.savez(f, **dataset_arrays(fd, key=key))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(path: Path, key: str) -> FederatedDataset:
    """Map an entry back; raises on anything missing or inconsistent (the caller rebuilds).

    The row arrays stay views of the file, mapped copy-on-write (rayfl.data.mapped): the pages
    come from the page cache as they are touched, and a host on this machine maps the same
    pages instead of receiving a copy. Reading them into memory took 0.4-0.9 s for the 235 MB
    of 1,000 MNIST-sized clients. The price is that a flipped bit inside an array goes
    unnoticed (the zip CRC is not checked); truncation, a damaged header or a wrong size does not.
    """
    mapped = MappedArrays(path, npz_layout(path), writable=True)
    fd, meta = dataset_from_arrays(mapped, mapped=mapped)
    if meta["key"] != key:
        raise ValueError("entry was written for another key")
    return fd


def _evict(root: Path, keep: Path, limit: int) -> None:
    """Delete least recently used entries (oldest mtime first) until the directory fits in
    `limit` bytes; `keep`, the entry just written, always stays. Stale temp files go too."""
    entries = []
    now = time.time()
    for p in root.iterdir():
        try:
            st = p.stat()
        except FileNotFoundError:  # removed by another process meanwhile
            continue
        if p.name.startswith(".tmp-") and now - st.st_mtime > _STALE_TMP_SECONDS:
            p.unlink(missing_ok=True)
            continue
        entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if p == keep or not p.name.endswith(".npz") or p.name.startswith(".tmp-"):
            continue
        p.unlink(missing_ok=True)
        total -= size


PINNED_DIR = ".pinned"  # hard links to entries that running processes have mapped


def pin_entry(path: Path, identity: tuple[int, int, int] | None = None) -> Path | None:
    """Another name for entry `path` that eviction never removes, for a run whose hosts map the
    file (a host started later, to replace a dead one, maps it again). None when the link
    cannot be made, or when `path` is no longer the file of `identity` (device, inode, size:
    a run that started beside this one stored the same entry again, replacing the file this run
    mapped); the caller then ships the arrays instead. `unpin` removes it; links left by
    processes that died on this machine are removed here."""
    import psutil

    pins = path.parent / PINNED_DIR
    me = socket.gethostname()
    try:
        pins.mkdir(exist_ok=True)
        for old in pins.iterdir():
            host, _, rest = old.name.partition("~")
            pid = rest.split("~", 1)[0]
            if host == me and pid.isdigit() and not psutil.pid_exists(int(pid)):
                old.unlink(missing_ok=True)
        for n in range(100):
            link = pins / f"{me}~{os.getpid()}~{n}~{path.name}"
            try:
                os.link(path, link)
            except FileExistsError:
                continue
            st = link.stat()
            if identity is not None and (st.st_dev, st.st_ino, st.st_size) != tuple(identity):
                link.unlink(missing_ok=True)
                log.info("dataset cache entry %s was replaced since it was mapped; shipping the arrays instead", path)
                return None
            return link
    except OSError as err:
        log.info("could not pin dataset cache entry %s (%s); shipping the arrays instead", path, err)
    return None


def unpin(link: Path) -> None:
    """Remove a link made by `pin_entry` (the entry itself stays until evicted)."""
    link.unlink(missing_ok=True)

