"""Where the public datasets live on disk, their official checksums and mirrors, and how to
turn their files into arrays. `load_idx_dataset` and `load_cifar10_files` return a dataset's
own train / test split;
`rayfl.data.datasets` decides how to pool, subsample and re-split it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayfl.data.download import DownloadError, download
from rayfl.data.errors import DatasetError
from rayfl.data.formats import extract_tar, read_cifar_batch, read_idx, verify_md5

# Official md5 of every file we read, keyed by "<dataset dir>/<file>". Uncompressed IDX files
# have no published checksum and are read unverified.
MD5: dict[str, str] = {
    "mnist/train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "mnist/train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "mnist/t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "mnist/t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    "fashion_mnist/train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "fashion_mnist/train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "fashion_mnist/t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "fashion_mnist/t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12e480ee83cd310",
    "cifar10/cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
    "cifar10/cifar-10-batches-py/data_batch_1": "c99cafc152244af753f735de768cd75f",
    "cifar10/cifar-10-batches-py/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "cifar10/cifar-10-batches-py/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "cifar10/cifar-10-batches-py/data_batch_4": "634d18415352ddfa80567beed471001a",
    "cifar10/cifar-10-batches-py/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "cifar10/cifar-10-batches-py/test_batch": "40351d587109b95175f43aff81a1287e",
}

MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ),
    "fashion_mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    "cifar10": ("https://www.cs.toronto.edu/~kriz/",),
}

IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

CIFAR_DIR = "cifar-10-batches-py"
CIFAR_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR_BATCHES: dict[str, tuple[str, ...]] = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}

DOWNLOAD_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Split:
    """Images as float32 [N, C, H, W] in [0, 1] and int64 labels."""

    x: np.ndarray
    y: np.ndarray


def data_root(data_dir: str | Path) -> Path:
    """`data.data_dir` with `~` expanded; relative paths are relative to the CWD."""
    return Path(data_dir).expanduser().absolute()


# --------------------------------------------------------------------------- MNIST-style IDX


def _find_idx(directory: Path, stem: str) -> Path | None:
    """The .gz file (verifiable) if present, else the uncompressed one, else None."""
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    return None


def load_idx_dataset(name: str, directory: Path, splits: Sequence[str], download_missing: bool) -> dict[str, Split]:
    """The official splits ("train", "test") of an MNIST-style dataset in `directory`, fetched
    first when missing and `download_missing`."""
    stems = [stem for s in splits for stem in IDX_FILES[s]]
    missing = [stem for stem in stems if _find_idx(directory, stem) is None]
    if missing:
        fetch_missing(
            name,
            directory,
            [f"{stem}.gz" for stem in missing],
            download_missing,
            what=", ".join(f"{stem}[.gz]" for stem in missing),
        )
    out = {}
    for s in splits:
        images = _read_checked_idx(name, directory, IDX_FILES[s][0])
        labels = _read_checked_idx(name, directory, IDX_FILES[s][1])
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise DatasetError(
                f"{directory}: {s} images have shape {images.shape} and labels {labels.shape}; "
                "expected [N, H, W] images and N labels"
            )
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise DatasetError(f"{directory}: {s} labels must be in 0..9, found {labels.min()}..{labels.max()}")
        x = images.astype(np.float32)[:, None]
        x /= 255.0
        out[s] = Split(x, labels.astype(np.int64))
    return out


def _read_checked_idx(name: str, directory: Path, stem: str) -> np.ndarray:
    path = _find_idx(directory, stem)
    assert path is not None  # fetch_missing guarantees it
    verify_md5(path, MD5.get(f"{name}/{path.name}"))
    return read_idx(path)


# --------------------------------------------------------------------------- CIFAR-10


def load_cifar10_files(directory: Path, splits: Sequence[str], download_missing: bool) -> dict[str, Split]:
    batch_dir = directory / CIFAR_DIR
    needed = [b for s in splits for b in CIFAR_BATCHES[s]]
    missing = [b for b in needed if not (batch_dir / b).is_file()]
    if missing:
        archive = directory / CIFAR_ARCHIVE
        if not archive.is_file():
            fetch_missing(
                "cifar10",
                directory,
                [CIFAR_ARCHIVE],
                download_missing,
                what=f"{', '.join(missing)} (in {batch_dir}) and the archive",
            )
        verify_md5(archive, MD5.get(f"cifar10/{CIFAR_ARCHIVE}"))
        extract_tar(archive, directory, prefix=f"{CIFAR_DIR}/")
        still = [b for b in needed if not (batch_dir / b).is_file()]
        if still:
            raise DatasetError(f"{archive} does not contain {', '.join(still)}; it is not the CIFAR-10 python archive")
    out = {}
    for s in splits:
        xs, ys = [], []
        for b in CIFAR_BATCHES[s]:
            path = batch_dir / b
            verify_md5(path, MD5.get(f"cifar10/{CIFAR_DIR}/{b}"))
            x, y = read_cifar_batch(path)
            xs.append(x)
            ys.append(y)
        x = np.concatenate(xs).astype(np.float32)
        x /= 255.0
        out[s] = Split(x, np.concatenate(ys))
    return out


# --------------------------------------------------------------------------- fetching


def fetch_missing(
    name: str, directory: Path, files: Sequence[str], download_missing: bool, what: str | None = None
) -> None:
    """Download `files` into `directory`, or raise DatasetError saying exactly which files are
    missing where and how to provide them."""
    what = what or ", ".join(files)
    mirrors = MIRRORS[name]
    remedy = (
        f"Place the files in {directory} yourself (from {mirrors[0]}), or point data.data_dir (or the "
        f"RAYFL_DATA_DIR environment variable) at a directory whose {directory.name}/ subdirectory holds them."
    )
    if not download_missing:
        raise DatasetError(f"{name}: missing {what} in {directory}, and data.download is false. {remedy}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"{name}: missing {what}; cannot create {directory} to download into: {e}. {remedy}") from e
    failures = []
    for f in files:
        try:
            download([m + f for m in mirrors], directory / f, MD5.get(f"{name}/{f}"), DOWNLOAD_TIMEOUT_S)
        except DownloadError as e:
            failures.append(f"{f}: {e}")
    if failures:
        raise DatasetError(
            f"{name}: missing {what} in {directory}, and the download failed ({'; '.join(failures)}). {remedy}"
        )
