"""Large populations: a lazily generated population (rayfl.data.lazy) makes each client's size
and rows on demand, the driver and hosts hold no per-client objects over the population, and a
lazy run is identical on 1 and 2 hosts. (How clients are drawn: tests/test_sampling.py.)"""

from __future__ import annotations

import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl.config import ConfigError, load_config
from rayfl.data import build_federated_dataset
from rayfl.data.lazy import ClientIds, LazyFederatedDataset, LazySynthetic, lazy_sizes
from rayfl.data.synthetic import split_clients
from rayfl.engine.clock import SimClock
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.population import Population
from rayfl.engine.system import (
    SystemModel,
)
from rayfl.rng import client_normals, numpy_rng

SMALL_CLIENTS = ["data.size_mu=2.0", "data.size_sigma=0.5", "data.min_client_samples=4",
                 "data.max_client_samples=20"]


def lazy_cfg(n: int, *extra: str):
    return load_config(None, ["data.dataset=synthetic", "data.lazy=true", "partition.method=natural",
                              f"partition.num_clients={n}", *SMALL_CLIENTS, *extra])


# ---------------------------------------------------------------- the lazy population


def test_lazy_rows_depend_only_on_seed_and_client_and_the_host_serves_them():
    cfg = lazy_cfg(40, "data.eval_clients=7")
    ds = build_federated_dataset(cfg.data, cfg.partition, 3)
    assert isinstance(ds, LazyFederatedDataset) and ds.num_clients == 40
    src = ds.source
    sizes = lazy_sizes(cfg.data, np.arange(40), 3)
    # the size law by hand: floor(lognormal(2, 0.5)) + 4, capped at 20, each from (seed, client)
    raw = np.exp(2.0 + 0.5 * client_normals(3, "synthetic.lazy.sizes", np.arange(40)))
    np.testing.assert_array_equal(sizes, np.minimum(np.floor(raw) + 4, 20).astype(np.int64))
    many = lazy_sizes(cfg.data, np.arange(2000), 3)
    assert many.min() >= 4 and many.max() == 20  # the cap is reached
    # a client's size does not depend on the population size or on which clients are asked
    np.testing.assert_array_equal(lazy_sizes(cfg.data, np.array([9, 3]), 3), sizes[[9, 3]])
    n_train, n_test = split_clients(sizes, cfg.data.test_fraction)
    np.testing.assert_array_equal(ds.client_sizes()[np.arange(40)], n_train)
    assert ds.client_sizes()[7] == n_train[7] and len(ds.client_sizes()) == 40
    with pytest.raises(IndexError):
        ds.client_sizes()[np.array([3, 40])]
    assert ds.train_samples == n_train.sum() and len(ds.empty_clients()) == 0 and ds.num_trainable == 40
    counts = ds.class_matrix("test")
    np.testing.assert_array_equal(counts.sum(axis=1), n_test)
    np.testing.assert_array_equal(counts[5], np.bincount(src.client_arrays(5)[3], minlength=ds.num_classes))
    # a fresh copy (what a host unpickles) makes the same rows, in any order
    copy = pickle.loads(pickle.dumps(src))
    for c in (39, 0, 17):
        a, b = src.client_arrays(c), copy.client_arrays(c)
        assert [len(v) for v in a] == [n_train[c], n_train[c], n_test[c], n_test[c]]
        for u, v in zip(a, b, strict=True):
            np.testing.assert_array_equal(u, v)
        assert a[0].dtype == np.float32 and a[1].dtype == np.int64
        assert a[1].min() >= 0 and a[1].max() < cfg.data.classes
    # a different seed is a different population
    other = LazySynthetic(cfg.data, 4)
    assert not np.array_equal(other.client_arrays(0)[0][:2], src.client_arrays(0)[0][:2])
    # the global test set is the held-out rows of the first eval_clients clients
    np.testing.assert_array_equal(ds.test_y, np.concatenate([src.client_arrays(c)[3] for c in range(7)]))
    np.testing.assert_array_equal(ds.test_x, np.concatenate([src.client_arrays(c)[2] for c in range(7)]))

    host = ClientHostImpl(1, src, range(20, 40), None, cfg.model, ds.input_shape, ds.num_classes, 3)
    assert host.client_ids() == list(range(20, 40)) and host.info()["clients"] == 20
    for c in (20, 33, 39):
        ctx = host._context(c, 0, {})
        x, y, tx, ty = src.client_arrays(c)
        np.testing.assert_array_equal(ctx.x.numpy(), x)
        np.testing.assert_array_equal(ctx.y.numpy(), y)
        np.testing.assert_array_equal(ctx.test_x.numpy(), tx)
        np.testing.assert_array_equal(ctx.test_y.numpy(), ty)
    recs = host.run(rows_seen, [39, 21], 0, {})
    assert [r["client"] for r in recs] == [21, 39]
    assert [r["values"]["n"] for r in recs] == [n_train[21], n_train[39]]
    with pytest.raises(KeyError, match="does not host client 19"):
        host.run(rows_seen, [19], 0, {})
    assert len(host.states) == 2  # states exist only for clients that ran


def test_lazy_iid_labels_follow_the_shared_model():
    """Synthetic-IID by hand: every row's label is argmax(W x + b) for the one (W, b) drawn
    from (seed, 'synthetic.iid'), and the rows are the client's train rows then its test rows."""
    cfg = lazy_cfg(30, "data.iid=true")
    ds = build_federated_dataset(cfg.data, cfg.partition, 5)
    shared = numpy_rng(5, "synthetic.iid")
    w = shared.normal(0.0, 1.0, size=(cfg.data.classes, cfg.data.features))
    b = shared.normal(0.0, 1.0, size=cfg.data.classes)
    for c in (0, 11, 29):
        x, y, tx, ty = ds.source.client_arrays(c)
        rows, labels = np.concatenate([x, tx]).astype(np.float64), np.concatenate([y, ty])
        assert len(labels) == lazy_sizes(cfg.data, np.array([c]), 5)[0]
        np.testing.assert_array_equal(labels, np.argmax(rows @ w.T + b, axis=1))
    # features ~ N(0, diag(j^-1.2)): the first feature's spread is ~1, the last's ~60^-0.6
    allx = np.concatenate([ds.source.client_arrays(c)[0] for c in range(30)])
    assert 0.7 < allx[:, 0].std() < 1.3 and allx[:, -1].std() < 0.3


def rows_seen(ctx, **_):
    return {"n": ctx.num_samples, "x_sum": float(ctx.x.double().sum()), "y_sum": int(ctx.y.sum())}


def test_client_ids_is_a_set_without_per_client_objects():
    ids = ClientIds(np.array([3, 5, 9], dtype=np.int64))
    assert 5 in ids and 9 in ids and 4 not in ids and 10 not in ids and -1 not in ids
    assert list(ids) == [3, 5, 9] and len(ids) == 3
    assert list(ClientIds(np.array([9, 3, 5]))) == [3, 5, 9]
    block = ClientIds(range(10**9, 2 * 10**9))  # a host's block of a billion: O(1)
    assert np.int64(10**9) in block and 2 * 10**9 not in block and len(block) == 10**9


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["data.dataset=digits", "partition.method=iid"], "data.lazy"),
        (["data.server_fraction=0.1"], "data.lazy"),
        (["partition.method=iid"], "data.lazy"),
        (["data.eval_clients=0"], "data.eval_clients"),
    ],
)
def test_lazy_bad_configs_name_the_field(sets, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.lazy=true", "partition.method=natural", *sets])
    assert e.value.key == field


# ---------------------------------------------------------------- O(active) driver state


POPULATION = 200_000


def test_driver_state_for_200k_clients_is_arrays_not_per_client_objects():
    """Dataset, system model and sampling over 200,000 registered clients (the Ray run below
    has as many): a few MB of numpy
    arrays (the eager dataset would hold ~1 GB of rows and 200,000 index arrays)."""
    cfg = lazy_cfg(POPULATION, "system.availability.kind=periodic", "system.availability.period=100")
    tracemalloc.start()
    ds = build_federated_dataset(cfg.data, cfg.partition, 0)
    system = SystemModel(cfg.system, POPULATION, 1000.0, 0)
    population = Population(cfg, ds, system, SimClock())
    picks = [population.sample(r, 5) for r in range(3)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 28 * 2**20, f"driver set-up for {POPULATION} clients peaked at {peak / 2**20:.0f} MB"
    assert all(len(p) == 5 for p in picks)
    for obj in (ds, ds.source, population, system, system.availability):
        for name, value in vars(obj).items():
            if isinstance(value, (list, dict, set, tuple)):
                assert len(value) < 1000, f"{type(obj).__name__}.{name} holds {len(value)} entries"


# ---------------------------------------------------------------- a real lazy run

REGISTERED = 100_000_000  # SCAFFOLD over 10^8 registered clients: state only for those sampled


def lazy_job(results_dir: Path, hosts: int, run_id: str):
    return lazy_cfg(
        REGISTERED, "algorithm.name=scaffold", "algorithm.clients_per_round=12", "algorithm.batch_size=8",
        "run.rounds=4", "run.eval_every=1", "data.eval_clients=50", f"engine.num_hosts={hosts}",
        "engine.num_cpus_per_host=0.5", "system.availability.kind=periodic", "system.availability.period=10",
        "output.checkpoint_every=3", f"output.dir={results_dir}", f"run.run_id={run_id}",
    )


@pytest.fixture(scope="module")
def lazy_runs(ray_local, tmp_path_factory):
    """SCAFFOLD at 10^8: one host whole, and two hosts stopped by SIGTERM after round 2 (between
    checkpoints) and resumed."""
    from test_resume import sigterm_after

    from rayfl.engine.runlog import RunInterrupted
    from rayfl.results import load
    from rayfl.runner import resume_experiment, run_experiment

    results_dir = tmp_path_factory.mktemp("lazy") / "results"
    one = load(run_experiment(lazy_job(results_dir, 1, "whole")).run_dir)
    with pytest.raises(RunInterrupted):
        run_experiment(lazy_job(results_dir, 2, "stopped"), on_start=sigterm_after(2))
    stopped = results_dir / "default" / "stopped"
    assert load(stopped).rounds["round"].max() == 2
    return one, load(resume_experiment(stopped).run_dir)


def test_lazy_scaffold_at_1e8_is_identical_on_1_and_2_hosts_and_resumed(lazy_runs):
    layout = ["wall_time", "host", "run_id", "experiment"]

    def comparable(df: pd.DataFrame) -> pd.DataFrame:
        return df.drop(columns=[c for c in layout if c in df.columns]).reset_index(drop=True)

    one, two = lazy_runs
    assert one.clients["host"].nunique() == 1 and two.clients["host"].nunique() == 2
    assert len(one.rounds) == 4 and (one.clients["outcome"] == "ok").sum() > 0
    pd.testing.assert_frame_equal(comparable(one.rounds), comparable(two.rounds))
    pd.testing.assert_frame_equal(comparable(one.clients), comparable(two.clients))
    pd.testing.assert_frame_equal(comparable(one.evals), comparable(two.evals))
    # every task saw its client's lazily made rows
    cfg = lazy_cfg(REGISTERED)
    clients = one.clients
    n_train, _ = split_clients(lazy_sizes(cfg.data, clients["client"].to_numpy(), cfg.run.seed), cfg.data.test_fraction)
    np.testing.assert_array_equal(clients["num_samples"].to_numpy(), n_train)
    assert clients["client"].max() > REGISTERED // 10  # drawn from the whole population


def test_client_state_is_held_and_counted_for_sampled_clients_only(lazy_runs):
    """SCAFFOLD's c_i exist for the clients that ever finished a task, and the rounds table
    says how many and how large (one model-sized float32 vector each)."""
    one, _ = lazy_runs
    ok = one.clients[one.clients["outcome"] == "ok"]
    have = [ok[ok["round"] <= r]["client"].nunique() for r in range(4)]
    assert one.rounds["clients_with_state"].tolist() == have
    per_client = one.rounds["client_state_bytes"].iloc[-1] / have[-1]
    params = 60 * 10 + 10  # the logistic model on 60 features, 10 classes
    assert per_client == 4 * params
