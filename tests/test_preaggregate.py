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
from rayfl.engine import exact_sum
from rayfl.engine.exact_sum import (
    KeptValue,
    common_exponent,
    fixed_point_sum,
    fused_operand,
    max_abs,
    to_float,
)
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


def reference_fixed_point_sum(terms, exponent, shape):
    """The plain algorithm fixed_point_sum must match bit for bit: per term, one float64
    multiply (or, when w * 2**E overflows, multiply by w then ldexp), rint, then add in order."""
    total = np.zeros(shape, dtype=np.float64)
    for value, weight in terms:
        try:
            scale = math.ldexp(float(weight), exponent)
        except OverflowError:
            scale = math.inf
        if math.isfinite(scale):
            term = np.multiply(value, scale, dtype=np.float64)
        else:
            term = np.ldexp(np.multiply(value, float(weight), dtype=np.float64), exponent)
        total = total + np.rint(term)
    return total


def fixed_point_cases():
    """(name, terms, exponent, shape): lengths around any block size, signed and zero weights,
    exact .5 products, inf/nan (signed NaNs, so the order of the adds shows in the bits), the
    overflowing-scale branch, 2-D, non-contiguous and float64/float16 values."""
    rng = np.random.default_rng(7)

    def deltas(n, k, shape=None):
        scales = 10.0 ** rng.uniform(-6, 1, size=k)
        return [(rng.normal(size=shape or n) * s).astype(np.float32) for s in scales]

    def fitted(values, weights):
        return common_exponent(weights, [max_abs(v) for v in values])

    for n, k in ((0, 3), (1, 4), (7, 5), (10_007, 6), (159_010, 8)):
        values = deltas(n, k)
        weights = list(rng.uniform(-0.05, 0.05, size=k))
        weights[1] = 0.0
        yield f"n{n}", list(zip(values, weights, strict=True)), fitted(values, weights), (n,)
    halves = np.arange(-8, 8, dtype=np.float32) + np.float32(0.5)  # k + 1/2 exactly: round half to even
    yield "halves", [(halves, 1.0), (halves, -0.5), (halves * 3, 0.25)], 0, (16,)
    yield "halves-scaled", [(halves, 2.0**-40)], 40, (16,)
    specials = deltas(33, 4)
    weights = [0.3, -0.2, 0.7, 0.01]
    e = fitted(specials, weights)
    nan, neg_nan = np.float32(np.nan), -np.float32(np.nan)
    specials[0][[1, 5]] = [np.inf, nan]  # 1: inf - inf
    specials[1][[1, 2, 5, 7, 9]] = [np.inf, -np.inf, neg_nan, neg_nan, nan]
    specials[2][[3, 7, 9]] = [np.inf, nan, neg_nan]
    yield "inf-nan", list(zip(specials, weights, strict=True)), e, (33,)
    tiny = [np.full(9, 1e-300) * rng.uniform(0.5, 2, size=9), np.float32(1e-30) * rng.normal(size=9).astype(np.float32)]
    # ldexp(1e10, 1000) overflows: those terms scale the product instead; 1e-290 and -3 do not
    yield "overflowing-scale", [(tiny[0], 1e10), (tiny[1], -1e10), (tiny[0], 1e-290), (tiny[0], -3.0)], 1000, (9,)
    grid = deltas(0, 5, shape=(37, 11))
    weights = list(rng.uniform(-0.1, 0.1, size=5))
    yield "2-d", list(zip(grid, weights, strict=True)), fitted(grid, weights), (37, 11)
    strided = [np.asfortranarray(g).T.T for g in grid[:2]] + [rng.normal(size=(11, 37)).astype(np.float32).T]
    yield "non-contiguous", [(v, 0.02) for v in strided], fitted(strided, [0.02] * 3), (37, 11)
    mixed = [rng.normal(size=300), rng.normal(size=300).astype(np.float16), rng.normal(size=300).astype(np.float32)]
    yield "float64-float16", [(v, w) for v, w in zip(mixed, (0.1, -0.2, 0.3), strict=True)], fitted(mixed, [0.1, 0.2, 0.3]), (300,)
    yield "no-terms", [], 0, (5,)
    frozen = deltas(4099, 3)
    for v in frozen:
        v.setflags(write=False)  # as an object-store array is
    yield "read-only", [(v, 0.1 * (i + 1)) for i, v in enumerate(frozen)], fitted(frozen, [0.1, 0.2, 0.3]), (4099,)


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "compiled"])
@pytest.mark.parametrize("case", list(fixed_point_cases()), ids=lambda c: c[0])
def test_fixed_point_sum_matches_the_reference_bit_for_bit(case, compiled, monkeypatch):
    """Every case through numpy's passes and through the compiled kernel (every term that it
    takes: the size threshold lowered to 0)."""
    _, terms, exponent, shape = case
    if compiled:
        monkeypatch.setattr(exact_sum, "FUSED_MIN_ENTRIES", 0)
    with np.errstate(invalid="ignore"):  # inf - inf
        got = fixed_point_sum(iter(terms), exponent, shape)
        want = reference_fixed_point_sum(terms, exponent, shape)
    assert got.dtype == np.float64 and got.shape == shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))  # NaNs' sign and payload too
    name = case[0]
    if name == "inf-nan":  # the case does reach what it is about
        signs = np.signbit(want[np.isnan(want)])
        assert signs.any() and not signs.all() and np.isinf(want).any()
    if name == "overflowing-scale":
        with pytest.raises(OverflowError):
            math.ldexp(terms[0][1], exponent)
        assert np.isfinite(want).all() and np.all(want != 0)


def test_large_terms_take_the_compiled_pass_with_the_reference_bits():
    """At the default threshold a model-sized term is added by the compiled kernel, small,
    strided or float16 ones by numpy; the bits are the reference's either way."""
    n = exact_sum.FUSED_MIN_ENTRIES
    rng = np.random.default_rng(3)
    big = [(rng.normal(size=n) * 10.0 ** -k).astype(np.float32) for k in range(3)]
    assert fused_operand(big[0], (n,)) is not None and exact_sum.fused_kernel() is not None
    assert fused_operand(big[0][:-1], (n - 1,)) is None  # small
    assert fused_operand(np.zeros(2 * n, np.float32)[::2], (n,)) is None  # strided
    assert fused_operand(np.zeros(n, np.float16), (n,)) is None
    assert fused_operand(big[0], (n + 1,)) is None  # another shape: numpy's broadcasting rules
    weights = [0.5, -0.25, 0.125]
    e = common_exponent(weights, [max_abs(v) for v in big])
    got = fixed_point_sum(zip(big, weights, strict=True), e, (n,))
    np.testing.assert_array_equal(got.view(np.int64), reference_fixed_point_sum(list(zip(big, weights, strict=True)), e, (n,)).view(np.int64))


def test_without_the_kernel_the_sums_take_numpys_passes(monkeypatch):
    """Numba unable to load the kernel (here: its module not importable): one warning, then
    numpy's passes, the same bits."""
    import sys

    monkeypatch.setattr(exact_sum, "FUSED_MIN_ENTRIES", 0)
    values = [np.linspace(-1, 1, 101, dtype=np.float32), np.full(101, 0.3, dtype=np.float32)]
    terms = list(zip(values, [0.7, 0.2], strict=True))
    exact_sum.fused_kernel.cache_clear()
    try:
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, "rayfl.engine.rounded_sum", None)
            with pytest.warns(UserWarning, match="numpy's slower passes"):
                got = fixed_point_sum(terms, 30, (101,))
            assert exact_sum.fused_kernel() is None
    finally:
        exact_sum.fused_kernel.cache_clear()
    np.testing.assert_array_equal(got.view(np.int64), reference_fixed_point_sum(terms, 30, (101,)).view(np.int64))
    assert exact_sum.fused_kernel() is not None


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
    # two hosts of 3 clients in chunks of 2: partial sums on the hosts, no output held (rayfl.engine.partials)
    chunks = {2: ["engine.clients_per_chunk=2"]}
    runs = {h: run(tmp, f"on{h}", f"engine.num_hosts={h}", "engine.vectorize=on", "engine.preaggregate=on",
                   *chunks.get(h, [])) for h in (1, 2, 3)}
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
    from test_host_failures import kill_and_wait

    from rayfl.engine.federation import Federation

    common = ["algorithm.name=scaffold", "engine.num_hosts=2", "engine.preaggregate=on"]
    ref_tables, ref_final = run(tmp_path, "reference", *common, "engine.preaggregate=off")
    original = Federation.weighted_sum
    killed = []

    def kill_then_sum(self, results, key, weights):
        if not killed and key == "delta" and results and results[0].round == 1:
            kill_and_wait(self.hosts[results[0].host])
            killed.append(results[0].host)
        return original(self, results, key, weights)

    monkeypatch.setattr(Federation, "weighted_sum", kill_then_sum)
    tables, final = run(tmp_path, "killed", *common)
    assert killed
    np.testing.assert_array_equal(final, ref_final)
    assert int(tables.rounds["host_failures"].sum()) == 1
    for table in ("rounds", "evals", "clients"):
        pd.testing.assert_frame_equal(comparable(getattr(tables, table)), comparable(getattr(ref_tables, table)))


def test_hosts_sum_with_their_answers_when_the_grid_and_weights_hold(tmp_path, monkeypatch):
    """FedAvg tells the call the weights it will sum with if every client is accepted; the
    hosts then sum on the last round's grid at once, and `weighted_sum` takes those partial
    sums only where the grid and the weights are the ones it needs: rounds whose grid moved
    or whose clients dropped out ask the hosts again. The same bits as without pre-aggregation."""
    import rayfl.engine.federation as federation

    exponents: list[int] = []
    real = federation.common_exponent
    monkeypatch.setattr(federation, "common_exponent", lambda w, m: exponents.append(real(w, m)) or exponents[-1])
    feds: list = []
    common = ["partition.num_clients=12", "algorithm.clients_per_round=8", "algorithm.local_epochs=1",
              "algorithm.batch_size=8", "algorithm.lr=0.3", "model.name=mlp", "model.hidden=[8]", "run.rounds=10",
              "run.eval_every=5", "system.dropout=0.15", "output.log_clients=true", f"output.dir={tmp_path}",
              "engine.num_cpus_per_host=0.5", "engine.num_hosts=2", "engine.vectorize=on"]
    tables = {}
    for mode in ("on", "off"):
        cfg = load_config(None, [*common, f"engine.preaggregate={mode}", f"run.run_id=preagg-{mode}"])
        tables[mode] = load(run_experiment(cfg, on_start=lambda _dir, fed: feds.append(fed)).run_dir)
    on, off = feds
    assert off.presums_used == 0 and on.presums_used > 0
    rounds = on.cfg.run.rounds
    assert on.presums_used < 2 * (rounds - 1)  # some rounds asked again ...
    grids = exponents[:rounds]
    assert len(set(grids)) > 1  # ... among them, rounds whose grid moved
    dropped = tables["on"].clients.query("outcome != 'ok'")["round"].unique()
    assert len(dropped) > 0  # and rounds whose weights changed
    np.testing.assert_array_equal(np.asarray(on.server_state.x), np.asarray(off.server_state.x))
    for table in ("rounds", "clients"):
        pd.testing.assert_frame_equal(comparable(getattr(tables["on"], table)), comparable(getattr(tables["off"], table)))
