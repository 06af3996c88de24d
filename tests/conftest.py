"""Shared fixtures: one real local Ray for the whole session, paths to the offline data."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The offline data: $RAYFL_DATA_DIR (CI sets it), else the copy kept beside the repository. It is
# exported, so every job of the suite that leaves data.data_dir out reads it, as users' jobs do.
OFFLINE_DATA = Path(os.environ.get("RAYFL_DATA_DIR") or REPO.parent / "shared" / "data").absolute()
SHARED_MNIST = OFFLINE_DATA / "mnist"
if SHARED_MNIST.is_dir():
    os.environ.setdefault("RAYFL_DATA_DIR", str(OFFLINE_DATA))
_CACHE_DIR: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Give the session (and every process it starts: they inherit os.environ) its own empty
    dataset cache, so tests never read or fill the user's ~/.cache/rayfl. Each xdist worker
    runs this too and gets its own."""
    global _CACHE_DIR
    _CACHE_DIR = tempfile.mkdtemp(prefix="rayfl-test-cache-")
    os.environ["RAYFL_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


# Warm pooled hosts (rayfl.engine.pool) on the session's Ray, leased by the runs the tests make
# in-process. A fresh host imports torch and rayfl, 2-3 s of CPU, and the suite makes hundreds
# of runs: with the pool it took 7:45 instead of 14:25 on 2 cores. A leased host is reset to a
# fresh one's state and gives the same tables (test_pool.py); fresh hosts still run wherever a
# run needs more hosts than the pool holds, a killed host is replaced, `engine.pool=off` is set,
# and in every `rayfl` subprocess with its own Ray. RAYFL_TEST_POOL=0 runs every test on fresh hosts.
TEST_POOL_HOSTS = int(os.environ.get("RAYFL_TEST_POOL", "4"))


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray with 2 CPUs and the test pool, started once and always shut down."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        refill_test_pool()
        yield ray
    finally:
        ray.shutdown()


def refill_test_pool() -> None:
    """Top the session's pool up to TEST_POOL_HOSTS (a test that empties it calls this after)."""
    from rayfl.engine import pool

    if TEST_POOL_HOSTS > 0:
        pool.start_pool(TEST_POOL_HOSTS)


@pytest.fixture
def refill_pool():
    """`refill_test_pool`, for a test that empties the session's pool."""
    return refill_test_pool


@pytest.fixture
def shared_mnist() -> Path:
    if not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"{SHARED_MNIST} is not present (set RAYFL_DATA_DIR to a directory holding mnist/)")
    return SHARED_MNIST.parent


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


# The files with the longest total run time, longest first. They are collected first, so the two
# xdist workers of the README's command (`--dist loadfile`: a file stays on one worker) start
# on them and finish on short files, instead of one worker running a long file alone at the end.
LONGEST_FILES = (
    "test_plugins.py", "test_guides.py", "test_host_failures.py", "test_sweep.py", "test_resume.py", "test_cli_runs.py", "test_async.py",
    "test_federation.py", "test_state_commits.py", "test_determinism.py", "test_user_errors.py",
    "test_remote_storage.py", "test_soak.py", "test_preaggregate.py", "test_vectorized.py", "test_scale.py",
    "test_startup.py", "test_async_driver.py", "test_docs_site.py", "test_readme_blocks.py", "test_table_rows.py",
    "test_checkpoint_format.py", "test_quickstart_notebook.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # stable: the rest keep their order
