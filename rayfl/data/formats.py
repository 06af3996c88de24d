"""Readers for the on-disk formats of the public datasets: IDX (MNIST, Fashion-MNIST), the
pickled CIFAR-10 python batches, and their tar archive. Pure file -> array code, no policy."""

from __future__ import annotations

import gzip
import hashlib
import math
import pickle
import struct
import tarfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.data.errors import DatasetError

# IDX type codes -> big-endian numpy dtypes (http://yann.lecun.com/exdb/mnist/, "IDX format").
IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def md5_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex md5 of a file, read in chunks so large archives do not sit in memory twice."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_md5(path: Path, expected: str | None) -> None:
    """Raise DatasetError naming the file and both checksums if they differ."""
    if expected is None:
        return
    actual = md5_file(path)
    if actual != expected:
        raise DatasetError(
            f"checksum mismatch for {path}: expected md5 {expected}, got {actual}. The file is "
            "corrupt, truncated or not the official one; delete it and download it again "
            "(or replace it with the official file)."
        )


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode an IDX buffer: 2 zero bytes, a type code, the number of dims, big-endian uint32
    dims, then the row-major payload. Returns a native-endian array."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in IDX_DTYPES:
        raise DatasetError(
            f"{source} is not an IDX file (magic bytes {data[:4].hex() or 'missing'}); "
            "delete it and download the official file again"
        )
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise DatasetError(f"{source}: IDX header is truncated ({ndim} dims declared)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(IDX_DTYPES[data[2]])
    expected = math.prod(dims) * dtype.itemsize
    if len(data) - header != expected:
        raise DatasetError(
            f"{source}: IDX header declares shape {dims} ({expected} bytes of data) but the file "
            f"holds {len(data) - header}; it is truncated or corrupt, delete it and download it again"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file, gzip-compressed when its name ends in .gz."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"cannot read {path}: {e}; delete it and download it again") from e
    return parse_idx(data, str(path))


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and numpy arrays: a CIFAR batch is a pickle, and a
    pickle from an untrusted file could otherwise run arbitrary code."""

    ALLOWED = {
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch: (uint8 [n, 3, 32, 32] in channel-major order, int64 [n])."""
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
        raise DatasetError(f"cannot read CIFAR batch {path}: {e}") from e
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DatasetError(f"{path} is not a CIFAR-10 python batch (no b'data' / b'labels' keys)")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise DatasetError(
            f"{path}: expected data [n, 3072] and n labels, got data {data.shape} and {labels.shape[0]} labels"
        )
    return data.reshape(-1, 3, 32, 32), labels


def extract_tar(archive: Path, dest: Path, prefix: str) -> None:
    """Extract the members under `prefix` of a tar archive into `dest`, refusing absolute
    paths, '..' and links so a crafted archive cannot write outside `dest`."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = []
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if not m.name.startswith(prefix) or m.name.startswith("/") or ".." in parts:
                    continue
                if not (m.isfile() or m.isdir()):
                    continue
                members.append(m)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # Python < 3.11.4: members were checked above
                tar.extractall(dest, members=members)
    except (OSError, tarfile.TarError, EOFError) as e:
        raise DatasetError(f"cannot extract {archive} into {dest}: {e}") from e
