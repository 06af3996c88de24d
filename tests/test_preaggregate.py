"""Host pre-aggregation (engine.preaggregate) and its exact fixed-point sums.

Unit level: any grouping of the terms into partial sums gives the same total bits, and the
total is the float64 weighted sum to within the grid. End to end (real Ray): FedAvg with
vectorisation and pre-aggregation on gives identical Parquet tables on 1, 2 and 3 hosts; the
same bits as pre-aggregation off (SCAFFOLD, two kept outputs, with a host killed between the
round and the server's sum: it is replaced and the run ends as the failure-free one)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rayfl.config import ConfigError, load_config
from rayfl.engine.exact_sum import KeptValue, common_exponent, fixed_point_sum, max_abs, to_float
from rayfl.results import load
from rayfl.runner import run_experiment

IGNORED = ["wall_time", "run_id", "host", "rerun", "host_failures"]


def exact_total(values, weights, groups):
    """Partial fixed-point sums over `groups` (lists of term indices), added in reverse."""
    e = common_exponent(weights, [max_abs(v) for v in values])
    parts = [fixed_point_sum([(values[i], weights[i]) for i in g], e, values[0].shape) for g in groups]
    total = np.zeros(values[0].shape)
    for p in reversed(parts):
        total += p
    return to_float(total, e)


def test_any_grouping_gives_the_same_bits_and_the_float64_sum():
    rng = np.random.default_rng(0)
    scales = 10.0 ** rng.uniform(-6, 2, size=(12, 1))  # magnitudes far apart, as deltas are
    values = [(rng.normal(size=300) * s).astype(np.float32) for s in scales]
    weights = list(rng.uniform(0.01, 0.3, size=12))
    one = exact_total(values, weights, [list(range(12))])
    for groups in ([[0, 5, 7], [1, 2, 3, 4], [6, 8, 9, 10, 11]], [[i] for i in range(12)], [list(range(11, -1, -1))]):
        np.testing.assert_array_equal(exact_total(values, weights, groups), one)
    # against the correctly rounded sum of the float64 products: half a grid unit per term,
    # then the one rounding of the total to float64
    ref = np.array([math.fsum(float(w) * float(v[i]) for v, w in zip(values, weights, strict=True)) for i in range(300)])
    grid = 2.0 ** -common_exponent(weights, [max_abs(v) for v in values])
    assert np.all(np.abs(one - ref) <= 12 * 0.5 * grid + np.abs(ref) * 2.0**-52)
    bound = sum(w * float(np.abs(v).max()) for v, w in zip(values, weights, strict=True))
    assert grid <= bound * 2.0**-51  # float64's own resolution for a sum of that size


def test_the_grid_does_not_overflow_and_rejects_non_finite_bounds():
    big = [np.full(4, 3e38, dtype=np.float32)] * 8
    total = exact_total(big, [1.0] * 8, [[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_allclose(total, 8 * float(np.float32(3e38)), rtol=1e-15)
    zeros = [np.zeros(3, dtype=np.float32)] * 2
    np.testing.assert_array_equal(exact_total(zeros, [0.5, 0.5], [[0], [1]]), np.zeros(3))
    with pytest.raises(FloatingPointError):
        common_exponent([1.0], [float("inf")])
    # a large weight on tiny values: w * 2**E overflows, the product is scaled instead
    tiny = [np.full(2, 1e-300), np.full(2, 2e-300)]
    # (E is capped at 1000 here, so the grid, 2**-1000, is coarser than the values deserve)
    np.testing.assert_allclose(exact_total(tiny, [1e9, 1e9], [[0], [1]]), 3e-291, rtol=1e-9)
    kept = KeptValue.of(np.array([1.0, np.nan], dtype=np.float32))
    assert not kept.finite and KeptValue.of(np.array([-2.0, 1.0])).max_abs == 2.0


def test_preaggregate_is_validated():
    with pytest.raises(ConfigError, match="engine.preaggregate"):
        load_config(None, ["engine.preaggregate=maybe"])


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in ("round", "phase", "client", "split") if c in df.columns]
    return df.drop(columns=[c for c in IGNORED if c in df.columns]).sort_values(keys, kind="stable").reset_index(drop=True)


def run(tmp, name, *extra):
    cfg = load_config(None, [
        "partition.num_clients=9", "algorithm.clients_per_round=6", "algorithm.local_epochs=1",
        "algorithm.batch_size=8", "model.name=mlp", "model.hidden=[8]", "run.rounds=2", "run.eval_every=1",
        "output.log_clients=true", f"output.dir={tmp}", f"run.run_id={name}", "engine.num_cpus_per_host=0.5",
        *extra,
    ])
    feds = []
    out = run_experiment(cfg, on_start=lambda _dir, fed: feds.append(fed))
    return load(out.run_dir), np.asarray(feds[0].server_state.x)


@pytest.fixture(scope="module")
def fedavg_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preagg")
    runs = {h: run(tmp, f"on{h}", f"engine.num_hosts={h}", "engine.vectorize=on", "engine.preaggregate=on")
            for h in (1, 2, 3)}
    return runs


@pytest.mark.parametrize("table", ["rounds", "evals", "clients"])
def test_one_two_three_hosts_give_identical_tables(fedavg_runs, table):
    base = comparable(getattr(fedavg_runs[1][0], table))
    assert len(base) > 0
    for key in (2, 3):
        pd.testing.assert_frame_equal(comparable(getattr(fedavg_runs[key][0], table)), base)


def test_final_models_are_the_same_bits(fedavg_runs):
    final = fedavg_runs[1][1]
    for key in (2, 3):
        np.testing.assert_array_equal(fedavg_runs[key][1], final)


def test_scaffold_with_a_host_killed_before_the_servers_sum(tmp_path, monkeypatch):
    """SCAFFOLD keeps two outputs; in round 1 a host is killed after the clients ran and
    before the server summed: its accepted tasks run again on a replacement host, and the run
    ends with the same bits as the failure-free run with pre-aggregation off."""
    import ray

    from rayfl.engine.federation import Federation

    common = ["algorithm.name=scaffold", "engine.num_hosts=2", "engine.preaggregate=on"]
    ref_tables, ref_final = run(tmp_path, "reference", *common, "engine.preaggregate=off")
    original = Federation.weighted_sum
    killed = []

    def kill_then_sum(self, results, key, weights):
        if not killed and key == "delta" and results and results[0].round == 1:
            ray.kill(self.hosts[results[0].host], no_restart=True)
            killed.append(results[0].host)
        return original(self, results, key, weights)

    monkeypatch.setattr(Federation, "weighted_sum", kill_then_sum)
    tables, final = run(tmp_path, "killed", *common)
    assert killed
    np.testing.assert_array_equal(final, ref_final)
    assert int(tables.rounds["host_failures"].sum()) == 1
    for table in ("rounds", "evals", "clients"):
        pd.testing.assert_frame_equal(comparable(getattr(tables, table)), comparable(getattr(ref_tables, table)))
