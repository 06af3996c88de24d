"""Arrays that are views of one file, shipped to processes on the same machine as the file's
path and layout and mapped there, instead of copied through the object store.

A dataset cache entry (rayfl.data.cache) is an uncompressed .npz: every array lies in the file
as it lies in memory. Reading 1,000 MNIST-sized clients (235 MB) into the driver took 0.4-0.9 s
of a short run's start-up and `ray.put` of them another 0.3-0.5 s; mapping the file takes
milliseconds, and every process that maps it shares the same page-cache pages. Only a Ray that
cannot place a host on another machine may be given a path (rayfl.engine.local_ray.single_machine).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npformat


@dataclass(frozen=True)
class ArrayLayout:
    """Where one array's bytes lie in the file (C order)."""

    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def npz_layout(path: str | Path) -> dict[str, ArrayLayout]:
    """The layout of every array of an uncompressed .npz; raises ValueError on a compressed or
    foreign member, a damaged header, or a member the file is too short to hold."""
    out = {}
    size = os.path.getsize(path)
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"unexpected member {info.filename}")
            f.seek(info.header_offset)
            local = f.read(30)  # the zip local file header; name and extra field lengths at 26
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"bad local header for {info.filename}")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            f.seek(start)
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = npformat.read_array_header_2_0(f)
            layout = ArrayLayout(f.tell(), dtype.str, tuple(int(d) for d in shape))
            if fortran or dtype.hasobject or layout.offset - start + layout.nbytes != info.file_size:
                raise ValueError(f"{info.filename} does not match its size in the archive")
            if layout.offset + layout.nbytes > size:
                raise ValueError(f"{info.filename} is truncated")
            out[info.filename[: -len(".npy")]] = layout
    return out


class MappedArrays(Mapping[str, np.ndarray]):
    """Named arrays mapped from one file. `writable=True` maps copy-on-write (the driver's view:
    writes stay private, like arrays read into memory); False maps read-only (a host's view,
    like arrays read zero-copy from the object store). Pickles as the path, the file's identity
    and the layouts; the receiver maps the file again, read-only, and refuses a file that is not
    the same one (replaced or removed: its bytes may differ)."""

    def __init__(self, path: str | Path, layouts: Mapping[str, ArrayLayout], writable: bool = False,
                 identity: tuple[int, int, int] | None = None):
        self.path = str(path)
        self.layouts = dict(layouts)
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            found = (st.st_dev, st.st_ino, st.st_size)
            if identity is not None and tuple(identity) != found:
                raise FileNotFoundError(f"{self.path} is no longer the file the dataset was mapped from")
            self.identity = found
            # an empty file cannot be mapped; a dataset file never is one
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY if writable else mmap.ACCESS_READ)
        self._arrays = {
            name: np.frombuffer(self._map, dtype=lay.dtype, count=math.prod(lay.shape), offset=lay.offset).reshape(lay.shape)
            for name, lay in self.layouts.items()
        }

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def only(self, names: list[str], path: str | Path | None = None) -> MappedArrays:
        """A read-only mapping of just `names`, of the same file or of `path`, another name of
        it (a hard link: the identity check holds)."""
        return MappedArrays(path or self.path, {n: self.layouts[n] for n in names}, identity=self.identity)

    def __reduce__(self):
        return (MappedArrays, (self.path, self.layouts, False, self.identity))
