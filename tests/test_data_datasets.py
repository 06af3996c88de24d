"""Dataset readers, pools and the Synthetic(alpha, beta) generator. No network: downloads are
either disabled or served by a monkeypatched urlopen."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import struct
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from rayfl.config import ConfigError, section_config
from rayfl.data import DatasetError, build_federated_dataset, load_pool, sources
from rayfl.data.formats import parse_idx, read_cifar_batch, read_idx
from rayfl.data.synthetic import generate_synthetic
from rayfl.rng import derive_seed, numpy_rng, torch_generator

SHARED_MNIST = Path(os.environ.get("RAYFL_DATA_DIR", "/nonexistent")) / "mnist"  # conftest sets it when a copy exists

# --------------------------------------------------------------------------- helpers


def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode an array in the IDX format: 0, 0, type code, ndim, big-endian dims, payload."""
    codes = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype(">i2"): 0x0B, np.dtype(">i4"): 0x0C,
             np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}
    dtype = arr.dtype.newbyteorder(">") if arr.dtype.itemsize > 1 else arr.dtype
    head = bytes([0, 0, codes[np.dtype(dtype)], arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return head + arr.astype(dtype).tobytes()


def write_idx(path: Path, arr: np.ndarray) -> Path:
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def fake_mnist(root: Path, name: str = "mnist", n_train: int = 30, n_test: int = 20, gz: bool = True) -> dict:
    """Write a tiny dataset in the real MNIST layout; returns the arrays written."""
    rng = np.random.default_rng(0)
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for stem, arr in arrays.items():
        write_idx(d / (f"{stem}.gz" if gz else stem), arr)
    return arrays


def trust_files(monkeypatch: pytest.MonkeyPatch, root: Path, name: str) -> None:
    """Register the md5 of our fake files as the 'official' ones."""
    for f in (root / name).iterdir():
        monkeypatch.setitem(sources.MD5, f"{name}/{f.name}", md5(f))


# --------------------------------------------------------------------------- rng


def test_derive_seed_is_stable_and_separates_streams():
    # A fixed value guards against any change of the hash (it must match across machines).
    key = b"7\x1fdata.split\x1f-1\x1f-1"
    expected = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & ((1 << 63) - 1)
    assert derive_seed(7, "data.split") == expected
    seeds = {derive_seed(0, "a"), derive_seed(1, "a"), derive_seed(0, "b"), derive_seed(0, "a", round=1),
             derive_seed(0, "a", client=1), derive_seed(0, "a", 1, 1)}
    assert len(seeds) == 6
    assert all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(0, "x", 1, 23) != derive_seed(0, "x", 12, 3)


def test_numpy_and_torch_streams_are_reproducible():
    assert np.array_equal(numpy_rng(3, "p", 2, 1).random(5), numpy_rng(3, "p", 2, 1).random(5))
    assert not np.array_equal(numpy_rng(3, "p", 2, 1).random(5), numpy_rng(3, "p", 2, 2).random(5))
    a = torch.rand(4, generator=torch_generator(3, "init"))
    b = torch.rand(4, generator=torch_generator(3, "init"))
    assert torch.equal(a, b)


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_idx_reader_round_trips_real_format(tmp_path, suffix):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    labels = np.array([7, 1], dtype=np.uint8)
    got = read_idx(write_idx(tmp_path / f"img{suffix}", images))
    assert got.shape == (2, 3, 4) and got.dtype == np.uint8
    assert np.array_equal(got, images)
    assert np.array_equal(read_idx(write_idx(tmp_path / f"lbl{suffix}", labels)), labels)


def test_idx_reader_handles_big_endian_types():
    arr = np.array([[1, -2, 300000], [4, 5, -6]], dtype=np.int32)
    got = parse_idx(idx_bytes(arr))
    assert got.dtype == np.dtype("=i4") and np.array_equal(got, arr)
    floats = np.array([0.5, -1.25], dtype=np.float64)
    assert np.array_equal(parse_idx(idx_bytes(floats)), floats)


def test_idx_reader_rejects_bad_magic_and_truncation(tmp_path):
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(DatasetError, match="bad-idx.*not an IDX file"):
        read_idx(bad)
    short = tmp_path / "short-idx"
    short.write_bytes(idx_bytes(np.zeros((4, 2), dtype=np.uint8))[:-3])
    with pytest.raises(DatasetError, match=r"short-idx.*\(4, 2\).*truncated"):
        read_idx(short)


# --------------------------------------------------------------------------- MNIST-style pools


def test_mnist_pool_official_split(tmp_path, monkeypatch):
    arrays = fake_mnist(tmp_path)
    trust_files(monkeypatch, tmp_path, "mnist")
    train, test = load_pool(section_config("data", dataset="mnist", data_dir=str(tmp_path), download=False), seed=0)
    assert train.x.shape == (30, 1, 28, 28) and test.x.shape == (20, 1, 28, 28)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert np.allclose(train.x[:, 0] * 255.0, arrays["train-images-idx3-ubyte"])
    assert np.array_equal(test.y, arrays["t10k-labels-idx1-ubyte"])
    assert train.x.min() >= 0.0 and train.x.max() <= 1.0
    assert train.num_classes == 10 and train.name == "mnist"


def test_mnist_pool_pooled_and_test_only(tmp_path, monkeypatch):
    fake_mnist(tmp_path)
    trust_files(monkeypatch, tmp_path, "mnist")
    cfg = section_config("data", dataset="mnist", data_dir=str(tmp_path), download=False, split="pooled", test_fraction=0.1)
    train, test = load_pool(cfg, seed=0)
    assert (len(train), len(test)) == (45, 5)
    again, _ = load_pool(cfg, seed=0)
    other, _ = load_pool(cfg, seed=1)
    assert np.array_equal(train.x, again.x)
    assert not np.array_equal(train.y, other.y)
    # test_only must not need the train files at all.
    for f in (tmp_path / "mnist").glob("train-*"):
        f.unlink()
    cfg = section_config("data", dataset="mnist", data_dir=str(tmp_path), download=False, source="test_only", test_fraction=0.25)
    train, test = load_pool(cfg, seed=0)
    assert (len(train), len(test)) == (15, 5)


def test_max_samples_subsamples_before_split(tmp_path, monkeypatch):
    fake_mnist(tmp_path, n_train=40, n_test=20)
    trust_files(monkeypatch, tmp_path, "mnist")
    base = {"dataset": "mnist", "data_dir": str(tmp_path), "download": False, "max_samples": 12}
    train, test = load_pool(section_config("data", **base, split="pooled", test_fraction=0.25), seed=0)
    assert (len(train), len(test)) == (9, 3)
    train, test = load_pool(section_config("data", **base), seed=0)  # official: keeps the 2:1 ratio
    assert (len(train), len(test)) == (8, 4)


def test_uncompressed_idx_files_are_accepted(tmp_path):
    arrays = fake_mnist(tmp_path, name="fashion_mnist", gz=False)
    train, test = load_pool(section_config("data", dataset="fashion_mnist", data_dir=str(tmp_path), download=False), seed=0)
    assert len(train) == 30 and np.array_equal(train.y, arrays["train-labels-idx1-ubyte"])


def test_md5_mismatch_names_file_and_checksums(tmp_path):
    fake_mnist(tmp_path)  # not the official bytes, so the official md5 cannot match
    path = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    with pytest.raises(DatasetError) as err:
        load_pool(section_config("data", dataset="mnist", data_dir=str(tmp_path), download=False), seed=0)
    msg = str(err.value)
    assert str(path) in msg
    assert sources.MD5["mnist/train-images-idx3-ubyte.gz"] in msg
    assert md5(path) in msg


def test_missing_files_without_download_name_files_and_directory(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("must not touch the network when data.download is false")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    (tmp_path / "mnist").mkdir()
    write_idx(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz", np.zeros(3, dtype=np.uint8))
    with pytest.raises(DatasetError) as err:
        load_pool(section_config("data", dataset="mnist", data_dir=str(tmp_path), download=False), seed=0)
    msg = str(err.value)
    assert str(tmp_path / "mnist") in msg
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
        assert stem in msg
    assert "t10k-labels" not in msg
    assert "data.download is false" in msg and "data.data_dir" in msg


def test_failed_download_gives_clear_message(tmp_path, monkeypatch):
    calls = []

    def offline(request, timeout=None):
        calls.append((request.full_url, timeout))
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    target = tmp_path / "data"
    with pytest.raises(DatasetError) as err:
        load_pool(section_config("data", dataset="fashion_mnist", data_dir=str(target), download=True, source="test_only"), seed=0)
    msg = str(err.value)
    assert "download failed" in msg and "network is unreachable" in msg
    assert str(target / "fashion_mnist") in msg
    assert "t10k-images-idx3-ubyte" in msg and "data.data_dir" in msg
    assert "train-images" not in msg  # test_only needs only the test files
    assert calls and all(t == sources.DOWNLOAD_TIMEOUT_S for _, t in calls)
    assert not list((target / "fashion_mnist").glob("*.part"))


def test_download_fetches_verifies_and_loads(tmp_path, monkeypatch):
    served = tmp_path / "served"
    arrays = fake_mnist(served, n_test=10)
    for f in (served / "mnist").iterdir():
        monkeypatch.setitem(sources.MD5, f"mnist/{f.name}", md5(f))
    urls = []

    def fake_urlopen(request, timeout=None):
        urls.append(request.full_url)
        return io.BytesIO((served / "mnist" / request.full_url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    cfg = section_config("data", dataset="mnist", data_dir=str(tmp_path / "cache"), source="test_only", test_fraction=0.2)
    train, test = load_pool(cfg, seed=0)
    assert len(train) + len(test) == 10
    assert sorted(u.rsplit("/", 1)[1] for u in urls) == ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    assert urls[0].startswith(sources.MIRRORS["mnist"][0])
    assert (tmp_path / "cache" / "mnist" / "t10k-images-idx3-ubyte.gz").is_file()
    assert np.array_equal(np.sort(np.concatenate([train.y, test.y])), np.sort(arrays["t10k-labels-idx1-ubyte"]))


def test_data_dir_expands_home_and_cwd(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert sources.data_root("~/d") == tmp_path / "d"
    monkeypatch.chdir(tmp_path)
    assert sources.data_root("rel") == tmp_path / "rel"


def test_real_mnist_test_set():
    if not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST test files not present in {SHARED_MNIST}")
    assert md5(SHARED_MNIST / "t10k-images-idx3-ubyte.gz") == sources.MD5["mnist/t10k-images-idx3-ubyte.gz"]
    arrays = sources.load_idx_dataset("mnist", SHARED_MNIST, ["test"], download_missing=False)
    x, y = arrays["test"].x, arrays["test"].y
    assert x.shape == (10_000, 1, 28, 28) and x.dtype == np.float32
    assert x.min() == 0.0 and x.max() == 1.0
    counts = np.bincount(y, minlength=10)
    assert counts.min() == 892 and counts.max() == 1135 and counts.sum() == 10_000
    cfg = section_config("data", dataset="mnist", data_dir=str(SHARED_MNIST.parent), source="test_only", test_fraction=0.1,
                     download=False)
    train, test = load_pool(cfg, seed=0)
    assert (len(train), len(test)) == (9000, 1000)


# --------------------------------------------------------------------------- CIFAR-10


def write_cifar_batches(batch_dir: Path, n: int = 4) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Tiny batches in the real format: a pickled dict with bytes keys, uint8 data [n, 3072]."""
    batch_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for i, name in enumerate([*(f"data_batch_{j}" for j in range(1, 6)), "test_batch"]):
        rng = np.random.default_rng(i)
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [f"img{k}.png".encode() for k in range(n)]}
        (batch_dir / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = (data, labels)
    return written


def trust_cifar(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    for f in directory.rglob("*"):
        if f.is_file():
            monkeypatch.setitem(sources.MD5, f"cifar10/{f.relative_to(directory).as_posix()}", md5(f))


def test_cifar_batch_reader_keeps_channel_major_layout(tmp_path):
    written = write_cifar_batches(tmp_path)
    x, y = read_cifar_batch(tmp_path / "data_batch_2")
    data, labels = written["data_batch_2"]
    assert x.shape == (4, 3, 32, 32) and y.dtype == np.int64
    assert np.array_equal(x[1, 0].ravel(), data[1, :1024])  # red plane first
    assert np.array_equal(x[1, 2].ravel(), data[1, 2048:])
    assert y.tolist() == labels


def test_cifar_pool_from_batches(tmp_path, monkeypatch):
    written = write_cifar_batches(tmp_path / "cifar10" / "cifar-10-batches-py")
    trust_cifar(monkeypatch, tmp_path / "cifar10")
    train, test = load_pool(section_config("data", dataset="cifar10", data_dir=str(tmp_path), download=False), seed=0)
    assert train.x.shape == (20, 3, 32, 32) and test.x.shape == (4, 3, 32, 32)
    assert np.allclose(test.x.reshape(4, -1) * 255.0, written["test_batch"][0])
    assert train.y.tolist() == sum((written[f"data_batch_{j}"][1] for j in range(1, 6)), [])


def test_cifar_pool_from_tarball(tmp_path, monkeypatch):
    staging = tmp_path / "staging"
    write_cifar_batches(staging / "cifar-10-batches-py")
    (tmp_path / "cifar10").mkdir()
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(staging / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    trust_cifar(monkeypatch, staging)
    monkeypatch.setitem(sources.MD5, "cifar10/cifar-10-python.tar.gz", md5(archive))
    train, test = load_pool(section_config("data", dataset="cifar10", data_dir=str(tmp_path), download=False), seed=0)
    assert (len(train), len(test)) == (20, 4)
    assert (tmp_path / "cifar10" / "cifar-10-batches-py" / "data_batch_5").is_file()


def test_cifar_tarball_checksum_and_missing_messages(tmp_path):
    with pytest.raises(DatasetError, match=r"data_batch_1.*cifar-10-batches-py.*archive.*data\.download is false"):
        load_pool(section_config("data", dataset="cifar10", data_dir=str(tmp_path), download=False), seed=0)
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "cifar-10-python.tar.gz").write_bytes(b"not really a tarball")
    with pytest.raises(DatasetError, match=r"cifar-10-python\.tar\.gz.*c58f30108f718f92721af3b95e74349a"):
        load_pool(section_config("data", dataset="cifar10", data_dir=str(tmp_path), download=False), seed=0)


class _Exploit:
    """Unpickling it would run a shell command. (`print` would be fragile here: Ray replaces
    `builtins.print` in a process that used it, so the pickle names Ray's function instead.)"""

    def __reduce__(self):
        return (os.system, ("true",))


def test_cifar_reader_refuses_code_in_pickles(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": _Exploit(), b"labels": []}, protocol=2))
    with pytest.raises(DatasetError, match=r"refusing to load \w+\.system"):
        read_cifar_batch(path)


# --------------------------------------------------------------------------- digits


def test_digits_pool():
    train, test = load_pool(section_config("data", dataset="digits", test_fraction=0.25), seed=0)
    assert train.x.shape[1:] == (1, 8, 8) and train.x.dtype == np.float32
    assert len(train) + len(test) == 1797 and len(test) == round(0.25 * 1797)
    assert train.x.min() == 0.0 and train.x.max() == 1.0
    assert set(np.unique(train.y)) == set(range(10))
    again, _ = load_pool(section_config("data", dataset="digits", test_fraction=0.25), seed=0)
    other, _ = load_pool(section_config("data", dataset="digits", test_fraction=0.25), seed=1)
    assert np.array_equal(train.y, again.y) and not np.array_equal(train.y, other.y)


def test_synthetic_has_no_pool():
    with pytest.raises(DatasetError, match="build_federated_dataset"):
        load_pool(section_config("data", dataset="synthetic"), seed=0)


# --------------------------------------------------------------------------- synthetic


SMALL = {"size_mu": 3.0, "size_sigma": 0.5, "min_client_samples": 20,
         "max_client_samples": 100}


def test_synthetic_shapes_and_natural_split():
    data = section_config("data", features=12, classes=4, test_fraction=0.25, **SMALL)
    fd = build_federated_dataset(data, section_config("partition", num_clients=15), seed=0)
    gen = generate_synthetic(data, 15, seed=0)
    assert fd.train_x.shape[1:] == (12,) and fd.input_shape == (12,) and fd.num_classes == 4
    assert fd.train_x.dtype == np.float32 and fd.train_y.dtype == np.int64
    assert fd.train_y.max() < 4 and fd.name.startswith("synthetic")
    assert fd.client_test is not None and fd.server_train is None
    sizes = fd.client_sizes() + np.array([len(t) for t in fd.client_test])
    assert np.array_equal(sizes, gen.sizes)
    assert np.all((gen.sizes >= 20) & (gen.sizes <= 100))
    # Every global test sample belongs to exactly one client's test part.
    assert np.array_equal(np.sort(np.concatenate(fd.client_test)), np.arange(len(fd.test_y)))
    for k in range(15):
        assert len(fd.client_test[k]) == max(1, round(0.25 * gen.sizes[k]))


def test_synthetic_is_deterministic_and_clientwise():
    data = section_config("data", **SMALL)
    a, b, c = (generate_synthetic(data, 20, seed=s) for s in (5, 5, 6))
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x[:20], c.x[:20])  # every client has >= 20 rows
    # A client's data does not depend on how many clients are generated.
    more = generate_synthetic(data, 25, seed=5)
    n = int(a.sizes.sum())
    assert np.array_equal(more.x[:n], a.x)


def test_synthetic_alpha_beta_control_heterogeneity():
    """beta spreads the clients' input means: B_k ~ N(0, beta) shifts every feature of client k."""
    base = {"features": 10, **SMALL}
    far = generate_synthetic(section_config("data", beta=5.0, **base), 40, seed=0)
    near = generate_synthetic(section_config("data", alpha=0.0, beta=0.0, **base), 40, seed=0)

    def spread(g):
        means = np.array([g.x[s:e].mean() for s, e in zip(g.offsets[:-1], g.offsets[1:], strict=True)])
        return means.std()

    assert spread(far) > 3 * spread(near)


def test_synthetic_iid_clients_share_one_labelling():
    """Synthetic-IID: one W, b for everybody, so one linear rule labels every client's data."""
    base = {"features": 10, **SMALL}
    iid = generate_synthetic(section_config("data", iid=True, **base), 30, seed=0)
    non = generate_synthetic(section_config("data", alpha=1.0, beta=1.0, **base), 30, seed=0)

    def fit_accuracy(g) -> float:  # one least-squares linear rule for all clients' labels
        onehot = np.eye(10)[g.y]
        xb = np.hstack([g.x, np.ones((len(g.x), 1))])
        w, *_ = np.linalg.lstsq(xb, onehot, rcond=None)
        return float(np.mean((xb @ w).argmax(1) == g.y))

    assert fit_accuracy(iid) > fit_accuracy(non) + 0.2


def test_synthetic_natural_server_share():
    data = section_config("data", server_fraction=0.3, **SMALL)
    fd = build_federated_dataset(data, section_config("partition", num_clients=30), seed=0)
    assert fd.server_train is not None
    owned = np.concatenate([*fd.client_train, fd.server_train])
    assert len(np.unique(owned)) == len(owned) == len(fd.train_y)
    assert abs(len(fd.server_train) / len(fd.train_y) - 0.3) < 0.05
    assert fd.client_sizes().min() >= 1


def test_synthetic_pooled_with_another_partitioner():
    fd = build_federated_dataset(section_config("data", **SMALL), section_config("partition", num_clients=12, method="iid"), seed=0)
    assert fd.client_test is None and fd.num_clients == 12
    assert fd.client_sizes().max() - fd.client_sizes().min() <= 1


def test_min_client_samples_below_two_is_rejected():
    data = section_config("data", min_client_samples=1, max_client_samples=1)
    with pytest.raises(ConfigError, match="data.min_client_samples"):
        generate_synthetic(data, 3, seed=0)


def test_ten_thousand_small_clients_generate_fast():
    start = time.perf_counter()
    fd = build_federated_dataset(section_config("data", **SMALL), section_config("partition", num_clients=10_000), seed=0)
    elapsed = time.perf_counter() - start
    assert fd.num_clients == 10_000 and len(fd.client_test) == 10_000
    assert elapsed < 10.0, f"10,000 clients took {elapsed:.1f} s"
