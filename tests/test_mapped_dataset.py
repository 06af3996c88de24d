"""Hosts on the driver's machine map a cached dataset's file (rayfl.data.mapped) instead of
receiving its rows through the object store: the same tables either way, the file pinned
against eviction while the run's hosts may map it, and the rows shipped as before wherever a
host could run on another machine."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from rayfl.config import load_config
from rayfl.data import build_federated_dataset
from rayfl.data import cache as dcache
from rayfl.data.mapped import MappedArrays
from rayfl.engine import local_ray
from rayfl.results import load
from rayfl.runner import build_dataset, run_experiment

LAYOUT_COLUMNS = ["wall_time", "run_id", "experiment"]


def config(results_dir: Path, run_id: str):
    return load_config(None, [
        "data.dataset=synthetic", "partition.num_clients=16", "partition.client_test=proportional",
        "partition.method=iid", "data.features=12", "algorithm.name=fedavg", "algorithm.clients_per_round=8",
        "run.rounds=2", "engine.num_hosts=2", "output.log_clients=true", f"output.dir={results_dir}",
        f"run.run_id={run_id}",
    ])


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in LAYOUT_COLUMNS if c in df.columns]).reset_index(drop=True)


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYFL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "datasets"


def run_seeing_the_hosts_arrays(cfg, dataset) -> tuple[object, list[tuple[Path, int]], Path]:
    """Run; what the hosts were given of the rows, and the pins (path, inode) that existed meanwhile."""
    import ray

    seen: dict[str, object] = {}

    def on_start(run_dir, fed) -> None:
        seen["arrays"] = ray.get(fed.hosts.arrays_ref)
        pins = dcache.cache_dir() / dcache.PINNED_DIR
        seen["pins"] = sorted((p, p.stat().st_ino) for p in pins.iterdir()) if pins.is_dir() else []

    out = run_experiment(cfg, dataset=dataset, on_start=on_start)
    return seen["arrays"], seen["pins"], out.run_dir


def test_hosts_here_map_the_cached_file_and_write_the_same_tables(ray_local, results_dir, cache_root):
    assert local_ray.single_machine(), "the session's Ray was started by ray.init() here"
    miss = build_dataset(config(results_dir, "x"))  # built, stored, and handed back mapped from the file
    hit = build_dataset(config(results_dir, "x"))
    assert miss.mapped is not None and hit.mapped is not None and miss.mapped.path == hit.mapped.path
    cfg = config(results_dir, "x")
    built = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)  # no cache: in memory
    built.from_config = True
    assert built.mapped is None
    shipped, _, built_dir = run_seeing_the_hosts_arrays(config(results_dir, "built"), built)
    assert isinstance(shipped, dict) and not isinstance(shipped, MappedArrays)
    mapped, pins, mapped_dir = run_seeing_the_hosts_arrays(config(results_dir, "mapped"), hit)
    assert isinstance(mapped, MappedArrays) and len(pins) == 1
    assert Path(mapped.path) == pins[0][0] and pins[0][1] == Path(hit.mapped.path).stat().st_ino
    assert not list((cache_root / dcache.PINNED_DIR).iterdir()), "unpinned once the run's hosts are gone"
    a, b = load(built_dir), load(mapped_dir)
    assert len(a.clients) > 0 and len(a.evals) > 0
    for table in ("rounds", "clients", "evals"):
        pd.testing.assert_frame_equal(comparable(getattr(a, table)), comparable(getattr(b, table)), obj=table)


def test_rows_are_shipped_where_a_host_could_run_on_another_machine(ray_local, results_dir, cache_root, monkeypatch):
    build_dataset(config(results_dir, "x"))
    hit = build_dataset(config(results_dir, "x"))
    monkeypatch.setattr(local_ray, "single_machine", lambda: False)  # e.g. a cluster joined by address
    shipped, pins, _ = run_seeing_the_hosts_arrays(config(results_dir, "joined"), hit)
    assert isinstance(shipped, dict) and sorted(shipped) == ["test_x", "test_y", "train_x", "train_y"]
    assert pins == []


def test_arrays_replaced_after_loading_are_shipped_not_the_file(ray_local, results_dir, cache_root):
    build_dataset(config(results_dir, "x"))
    hit = build_dataset(config(results_dir, "x"))
    hit.train_x = hit.train_x * 2.0  # no longer the file's bytes
    shipped, _, _ = run_seeing_the_hosts_arrays(config(results_dir, "changed"), hit)
    assert isinstance(shipped, dict) and (shipped["train_x"] == hit.train_x).all()


def test_a_run_whose_entry_another_run_stored_again_ships_its_rows(ray_local, results_dir, cache_root):
    # two runs that start together both miss the cache and store the entry; the second store
    # replaces the file the first run mapped. The first run ships its rows instead of failing
    # at host start, and writes the same tables as a run on the file.
    build_dataset(config(results_dir, "x"))
    hit = build_dataset(config(results_dir, "x"))
    path = Path(hit.mapped.path)
    stored_again = path.with_suffix(".again")
    stored_again.write_bytes(path.read_bytes())
    stored_again.replace(path)  # as cache._store's rename does
    shipped, pins, replaced_dir = run_seeing_the_hosts_arrays(config(results_dir, "replaced"), hit)
    assert isinstance(shipped, dict) and (shipped["train_x"] == hit.train_x).all() and pins == []
    _, _, fresh_dir = run_seeing_the_hosts_arrays(config(results_dir, "fresh"), build_dataset(config(results_dir, "x")))
    a, b = load(replaced_dir), load(fresh_dir)
    for table in ("rounds", "clients", "evals"):
        pd.testing.assert_frame_equal(comparable(getattr(a, table)), comparable(getattr(b, table)), obj=table)
