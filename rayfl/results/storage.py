"""Where results live: a local directory or any pyarrow filesystem URI.

`output.dir` and `rayfl.results.load` accept a plain path (relative or absolute, `~` expanded),
`file:///abs/path`, or a URI that `pyarrow.fs.FileSystem.from_uri` understands (`s3://bucket/
prefix`, `gs://...`, `hdfs://...`; query options such as `?endpoint_override=host:port&scheme=
http` are kept). A location is shown to users as a `Path` when it is on local disk and as its
URI string otherwise (`RunDir`), so local runs behave exactly as before and remote ones can be
passed straight back to `load`.

Writes go through `put_bytes`: an object store has no rename, but one PUT of a complete object
is atomic (readers see the old object or the new one, never a torn one), so the bytes are
serialised in memory first and uploaded in one write. Other remote filesystems (HDFS) have a
rename, so they get a temporary dot-name and a move. Local disk is handled by the writer itself
(temp dot-name, fsync, rename, fsync the directory).
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs

from rayfl.errors import ConfigError

# How a directory is named to users: a Path on local disk, the URI string elsewhere.
RunDir = Path | str

# Filesystems without rename where one completed upload is atomic.
OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})


def is_uri(location: str | Path) -> bool:
    """True for `scheme://...` strings; a Path or a plain path never is one."""
    return isinstance(location, str) and "://" in location


@dataclass(frozen=True)
class Location:
    """A directory on some filesystem: the filesystem, the path inside it, and the user's name."""

    fs: pafs.FileSystem
    path: str
    name: RunDir

    @classmethod
    def parse(cls, location: str | Path) -> Location:
        """Resolve a path or URI; `file://` URIs and plain paths become local Paths."""
        if not is_uri(location):
            local = Path(location).expanduser()
            return cls(pafs.LocalFileSystem(), str(local.absolute()), local)
        uri = str(location)
        fs, path = pafs.FileSystem.from_uri(uri)
        if isinstance(fs, pafs.LocalFileSystem):
            return cls(fs, path, Path(path))
        parts = urlsplit(uri)
        name = urlunsplit(parts._replace(path=parts.path.rstrip("/")))
        return cls(fs, path.rstrip("/"), name)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def is_object_store(self) -> bool:
        return self.fs.type_name in OBJECT_STORES

    def child(self, *names: str) -> Location:
        """The location `names` below this one (URI query options are kept)."""
        path = posixpath.join(self.path, *names) if self.path else "/".join(names)
        if isinstance(self.name, Path):
            return Location(self.fs, path, self.name.joinpath(*names))
        parts = urlsplit(self.name)
        sub = "/".join([parts.path.rstrip("/"), *names])
        return Location(self.fs, path, urlunsplit(parts._replace(path=sub)))

    def info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def __str__(self) -> str:
        return str(self.name)


def put_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Make `path` hold exactly `data`, never a prefix of it, on a non-local filesystem.

    Object stores: one upload of the complete bytes (a single PUT, or a multipart upload that
    only becomes visible when completed). Filesystems with rename: a temporary dot-name (which
    readers skip) moved into place."""
    if fs.type_name in OBJECT_STORES:
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp")
    with fs.open_output_stream(tmp) as f:
        f.write(data)
    fs.move(tmp, path)


def write_atomically(where: Location, data: bytes) -> None:
    """Make the file at `where` hold exactly `data` on any filesystem: `put_bytes` remotely,
    `write_local_atomically` on local disk."""
    if where.is_local:
        write_local_atomically(Path(where.path), data)
    else:
        put_bytes(where.fs, where.path, data)


def write_local_atomically(path: Path, data: bytes) -> None:
    """A temporary dot-name, fsynced, renamed into place, the directory fsynced: a crash leaves
    the old file or the new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
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


def run_manifest(run_dir: str | Path) -> tuple[Location, dict[str, Any]]:
    """A run directory and its manifest, or a ConfigError naming the directory."""
    location = Location.parse(run_dir)
    manifest_at = location.child("manifest.json")
    if not manifest_at.is_file():
        raise ConfigError("run_dir", f"{location} holds no run (no manifest.json)")
    try:
        return location, json.loads(manifest_at.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError("run_dir", f"{location} holds no readable run manifest ({e})") from e
