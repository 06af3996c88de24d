"""The on-disk dataset cache (rayfl.data.cache): a hit gives the very arrays a build gives,
anything that changes the data misses, and a broken or absent cache never fails a run."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from rayfl.config import Config, load_config
from rayfl.data import FederatedDataset, build_federated_dataset
from rayfl.data import cache as dcache

SMALL = ["data.dataset=synthetic", "data.features=8", "partition.num_clients=20"]
# Shapes of the main layouts: natural clients (client_test), with a server share, a pooled
# partition with proportional client test sets.
LAYOUTS = {
    "natural": [],
    "server": ["data.server_fraction=0.2"],
    "iid_client_test": ["partition.method=iid", "partition.client_test=proportional"],
    "dirichlet_no_client_test": ["partition.method=dirichlet", "partition.min_size=0"],
}


def small(*overrides: str) -> Config:
    return load_config(None, [*SMALL, *overrides])


class CountingBuild:
    """A `build` callable that builds `cfg`'s dataset and counts how often it was asked to."""

    def __init__(self, cfg: Config) -> None:
        self.cfg, self.calls = cfg, 0

    def __call__(self) -> FederatedDataset:
        self.calls += 1
        return build_federated_dataset(self.cfg.data, self.cfg.partition, self.cfg.run.seed)


def cached(cfg: Config, build: CountingBuild) -> FederatedDataset:
    return dcache.cached_build(cfg.data, cfg.partition, cfg.run.seed, build)


def entries(root: Path) -> list[Path]:
    d = root / "datasets"
    return sorted(d.iterdir()) if d.is_dir() else []


def assert_same(a: FederatedDataset, b: FederatedDataset) -> None:
    assert (a.name, a.num_classes, a.input_shape) == (b.name, b.num_classes, b.input_shape)
    for key in ("train_x", "train_y", "test_x", "test_y", "server_train"):
        x, y = getattr(a, key), getattr(b, key)
        assert (x is None) == (y is None), key
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), key
    for key in ("client_train", "client_test"):
        x, y = getattr(a, key), getattr(b, key)
        assert (x is None) == (y is None), key
        if x is not None:
            assert len(x) == len(y), key
            for i, j in zip(x, y, strict=True):
                assert i.dtype == j.dtype == np.int64 and np.array_equal(i, j), key


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RAYFL_CACHE_MAX_MB", raising=False)
    return tmp_path / "cache"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_miss_builds_and_stores_and_a_hit_loads_the_same_arrays(root, layout):
    cfg = small(*LAYOUTS[layout])
    build = CountingBuild(cfg)
    first = cached(cfg, build)
    assert build.calls == 1 and len(entries(root)) == 1
    hit = cached(cfg, build)
    assert build.calls == 1, "a hit does not build"
    hit.check()
    fresh = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    assert_same(hit, fresh)
    assert_same(first, fresh)


def test_runner_build_dataset_goes_through_the_cache(root, monkeypatch):
    from rayfl import runner

    calls = []

    def spy(*args):
        calls.append(args)
        return build_federated_dataset(*args)

    monkeypatch.setattr(runner, "build_federated_dataset", spy)
    cfg = small()
    a, b = runner.build_dataset(cfg), runner.build_dataset(cfg)
    assert len(calls) == 1 and len(entries(root)) == 1
    assert_same(a, b)


def test_every_input_of_the_data_is_in_the_key(monkeypatch):
    base = small()
    key = dcache.cache_key(base.data, base.partition, 0)
    changed = {
        "run seed": (small(), 1),
        "data.seed": (small("data.seed=3"), 0),
        "alpha": (small("data.alpha=0.5"), 0),
        "num_clients": (small("partition.num_clients=21"), 0),
        "method": (small("partition.method=iid"), 0),
        "features": (small("data.features=9"), 0),
        "test_fraction": (small("data.test_fraction=0.3"), 0),
    }
    keys = {name: dcache.cache_key(c.data, c.partition, s) for name, (c, s) in changed.items()}
    assert key not in keys.values() and len(set(keys.values())) == len(keys)
    monkeypatch.setattr(dcache, "code_fingerprint", lambda: "edited")
    assert dcache.cache_key(base.data, base.partition, 0) != key
    monkeypatch.setattr(dcache.np, "__version__", "0.0.0")
    assert dcache.cache_key(base.data, base.partition, 0) != key


def test_the_key_uses_the_effective_seed_and_ignores_where_files_live():
    def key(cfg: Config, seed: int) -> str:
        return dcache.cache_key(cfg.data, cfg.partition, seed)

    pinned = small("data.seed=7")
    assert key(pinned, 0) == key(pinned, 1), "data.seed pins the data whatever run.seed"
    assert key(pinned, 0) == key(small(), 7), "data.seed 7 is the data of run.seed 7"
    assert key(small("data.data_dir=/elsewhere"), 0) == key(small(), 0)


def test_a_changed_seed_field_or_code_rebuilds(root, monkeypatch):
    cfg = small()
    build = CountingBuild(cfg)
    cached(cfg, build)
    for other in (small("run.seed=1"), small("data.alpha=0.5"), small("partition.num_clients=19")):
        b = CountingBuild(other)
        assert_same(cached(other, b), build_federated_dataset(other.data, other.partition, other.run.seed))
        assert b.calls == 1, other
    monkeypatch.setattr(dcache, "code_fingerprint", lambda: "edited")
    cached(cfg, build)
    assert build.calls == 2 and len(entries(root)) == 5


def test_the_code_fingerprint_covers_data_sources_and_rng(tmp_path, monkeypatch):
    src = Path(dcache.__file__).resolve().parents[1]
    copy = tmp_path / "rayfl"
    shutil.copytree(src / "data", copy / "data", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(src / "rng.py", copy / "rng.py")
    monkeypatch.setattr(dcache, "_RAYFL", copy)
    before = dcache.code_fingerprint()
    assert before == dcache.code_fingerprint()
    fps = {before}
    for edited in ("data/synthetic.py", "rng.py", "data/partition.py"):
        with (copy / edited).open("a") as f:
            f.write("\n# edited\n")
        fps.add(dcache.code_fingerprint())
    (copy / "data" / "new_module.py").write_text("X = 1\n")
    fps.add(dcache.code_fingerprint())
    assert len(fps) == 5


@pytest.mark.parametrize("damage", ["truncate_half", "empty", "garbage", "other_key"])
def test_a_damaged_entry_is_a_miss_that_rebuilds_and_repairs(root, caplog, damage):
    cfg = small()
    build = CountingBuild(cfg)
    cached(cfg, build)
    (path,) = entries(root)
    data = path.read_bytes()
    if damage == "truncate_half":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage":
        path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    else:  # a well-formed entry of another config under this key's name
        other = small("run.seed=5")
        cached(other, CountingBuild(other))
        (other_path,) = set(entries(root)) - {path}
        shutil.copy(other_path, path)
    with caplog.at_level(logging.WARNING, logger=dcache.__name__):
        got = cached(cfg, build)
    assert build.calls == 2 and "unreadable" in caplog.text
    fresh = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    assert_same(got, fresh)
    assert_same(cached(cfg, build), fresh)
    assert build.calls == 2, "the rebuilt entry replaced the damaged one"


def test_off_neither_reads_nor_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAYFL_CACHE_DIR", "off")
    assert dcache.cache_dir() is None
    cfg = small()
    build = CountingBuild(cfg)
    cached(cfg, build)
    cached(cfg, build)
    assert build.calls == 2
    assert not any(tmp_path.rglob("*")), "nothing written, not even under HOME"


def test_the_default_location_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("RAYFL_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dcache.cache_dir() == tmp_path / ".cache" / "rayfl" / "datasets"


def test_an_unwritable_cache_only_warns(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("RAYFL_CACHE_DIR", str(blocker))  # datasets/ cannot be made under a file
    cfg = small()
    build = CountingBuild(cfg)
    with caplog.at_level(logging.WARNING, logger=dcache.__name__):
        got = cached(cfg, build)
    assert build.calls == 1 and "could not write" in caplog.text
    assert_same(got, build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed))


def test_a_full_disk_only_warns_and_leaves_no_temp_file(root, monkeypatch, caplog):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcache.np, "savez", full)
    cfg = small()
    with caplog.at_level(logging.WARNING, logger=dcache.__name__):
        got = cached(cfg, CountingBuild(cfg))
    assert "No space left" in caplog.text and entries(root) == []
    got.check()


def test_eviction_keeps_the_directory_under_the_bound_and_the_newest_entry(root, monkeypatch):
    def cfg(seed: int) -> Config:  # equal-sized clients, so every entry has the same size
        return small("data.size_sigma=0", f"run.seed={seed}")

    def store(seed: int, mtime: float) -> Path:
        before = set(entries(root))
        cached(cfg(seed), CountingBuild(cfg(seed)))
        (new,) = set(entries(root)) - before
        os.utime(new, (mtime, mtime))
        return new

    first = store(0, 1000.0)
    size = first.stat().st_size
    monkeypatch.setenv("RAYFL_CACHE_MAX_MB", str(2.5 * size / 2**20))  # room for two entries
    second = store(1, 2000.0)
    # A hit makes seed 0 the most recently used, so seed 1 is the one to go.
    b0 = CountingBuild(cfg(0))
    cached(cfg(0), b0)
    assert b0.calls == 0
    third = store(2, 3000.0)
    assert set(entries(root)) == {first, third} and not second.exists()
    assert sum(p.stat().st_size for p in entries(root)) <= 2.5 * size
    monkeypatch.setenv("RAYFL_CACHE_MAX_MB", "0")  # nothing fits: only the entry just written stays
    fourth = store(3, 500.0)
    assert entries(root) == [fourth]


@pytest.mark.parametrize(
    "overrides",
    [[*SMALL, "data.lazy=true"], ["data.dataset=mnist", "partition.method=iid", "partition.num_clients=20"],
     ["data.dataset=digits", "partition.method=iid", "partition.num_clients=20"]],
)
def test_datasets_not_made_from_the_config_alone_are_never_cached(root, overrides):
    cfg = load_config(None, overrides)  # mnist and digits have none of SMALL's synthetic keys
    assert not dcache.cacheable(cfg.data)
    sentinel = object()
    calls = []

    def build():
        calls.append(1)
        return sentinel

    for _ in range(2):
        assert dcache.cached_build(cfg.data, cfg.partition, cfg.run.seed, build) is sentinel
    assert len(calls) == 2 and not root.exists()


def test_only_eager_synthetic_is_cacheable():
    assert dcache.cacheable(small().data)
    assert not dcache.cacheable(small("data.lazy=true").data)


# --------------------------------------------------------------------- mapped entries

ROW_ARRAYS = ["train_x", "train_y", "test_x", "test_y"]


def test_a_hit_maps_the_entry_copy_on_write(root):
    """A hit's row arrays are views of the file (no read into memory), writable like built
    ones, and a write stays private: the file, and the next hit, keep the built values."""
    cfg = small()
    cached(cfg, CountingBuild(cfg))
    hit = cached(cfg, CountingBuild(cfg))
    (path,) = entries(root)
    assert hit.mapped is not None and Path(hit.mapped.path) == path
    before = path.read_bytes()
    for key in ROW_ARRAYS:
        arr = getattr(hit, key)
        assert arr is hit.mapped[key] and arr.flags.writeable, key
    hit.train_x[:] = 7.0
    hit.test_y[:] = 1
    assert path.read_bytes() == before
    assert_same(cached(cfg, CountingBuild(cfg)), build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed))


def test_mapped_arrays_travel_as_their_path_and_map_read_only(root):
    import pickle

    from rayfl.data.mapped import MappedArrays

    cfg = small("partition.num_clients=200")
    cached(cfg, CountingBuild(cfg))
    hit = cached(cfg, CountingBuild(cfg))
    shipped = hit.mapped.only(ROW_ARRAYS)
    blob = pickle.dumps(shipped)
    assert len(blob) < 2000 < hit.train_x.nbytes, "the path and layouts, not the rows"
    back = pickle.loads(blob)
    assert isinstance(back, MappedArrays) and sorted(back) == sorted(ROW_ARRAYS)
    for key in ROW_ARRAYS:
        assert np.array_equal(back[key], getattr(hit, key)) and back[key].dtype == getattr(hit, key).dtype, key
        assert not back[key].flags.writeable, key


def test_a_mapping_refuses_a_file_that_is_no_longer_the_one_shipped(root):
    import pickle

    cfg = small()
    cached(cfg, CountingBuild(cfg))
    hit = cached(cfg, CountingBuild(cfg))
    blob = pickle.dumps(hit.mapped.only(["train_x"]))
    path = Path(hit.mapped.path)
    data = path.read_bytes()
    path.unlink()  # `hit` keeps the old file's inode alive, so the new one cannot reuse it
    path.write_bytes(data)
    with pytest.raises(FileNotFoundError, match="no longer the file"):
        pickle.loads(blob)
    path.unlink()
    with pytest.raises(FileNotFoundError):
        pickle.loads(blob)


def test_a_pinned_entry_outlives_its_eviction_until_unpinned(root):
    import pickle

    cfg = small()
    cached(cfg, CountingBuild(cfg))
    hit = cached(cfg, CountingBuild(cfg))
    path = Path(hit.mapped.path)
    link = dcache.pin_entry(path)
    assert link is not None and link.parent == path.parent / dcache.PINNED_DIR and link.samefile(path)
    blob = pickle.dumps(hit.mapped.only(ROW_ARRAYS, link))
    dcache._evict(path.parent, keep=path.parent / "none.npz", limit=0)  # every entry goes
    assert not path.exists()
    back = pickle.loads(blob)  # a host started now (replacing a dead one) still maps it
    assert np.array_equal(back["train_x"], hit.train_x)
    dcache.unpin(link)
    assert not link.exists()


def test_an_entry_replaced_since_it_was_mapped_is_not_pinned(root):
    # two runs that start together both build the entry; the second's store replaces the file
    # the first has mapped, and the first must not hand its hosts the new file under its identity
    cfg = small()
    cached(cfg, CountingBuild(cfg))
    hit = cached(cfg, CountingBuild(cfg))
    path = Path(hit.mapped.path)
    data = path.read_bytes()
    path.unlink()  # `hit` keeps the old file's inode alive, so the new one cannot reuse it
    path.write_bytes(data)
    assert dcache.pin_entry(path, hit.mapped.identity) is None
    assert not any((path.parent / dcache.PINNED_DIR).iterdir())  # no link left behind
    link = dcache.pin_entry(path, hit.mapped.identity[:2] + (path.stat().st_size,))
    assert link is None  # another inode, the same size
    same = cached(cfg, CountingBuild(cfg))
    link = dcache.pin_entry(path, same.mapped.identity)
    assert link is not None and link.samefile(path)


def test_pins_left_by_dead_processes_here_are_cleared(root):
    import socket
    import subprocess
    import sys

    cfg = small()
    cached(cfg, CountingBuild(cfg))
    (path,) = entries(root)
    pins = path.parent / dcache.PINNED_DIR
    pins.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = socket.gethostname()
    stale = pins / f"{me}~{dead.pid}~0~{path.name}"
    live = pins / f"{me}~{os.getpid()}~0~{path.name}"
    elsewhere = pins / f"another-machine~{dead.pid}~0~{path.name}"  # its pids mean nothing here
    for p in (stale, live, elsewhere):
        os.link(path, p)
    link = dcache.pin_entry(path)
    assert link is not None and link not in (live, elsewhere) and link.samefile(path)
    assert not stale.exists() and live.exists() and elsewhere.exists()


def test_a_pickled_mapped_dataset_carries_its_rows_not_the_file(root):
    import pickle

    cfg = small()
    cached(cfg, CountingBuild(cfg))
    hit = cached(cfg, CountingBuild(cfg))
    blob = pickle.dumps(hit)
    Path(hit.mapped.path).unlink()  # evicted meanwhile: the copy does not need it
    back = pickle.loads(blob)
    assert back.mapped is None
    assert_same(back, build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed))
