"""Robust aggregators, bucketing and Byzantine attacks (rayfl.robust) against hand-computed values
on tiny inputs. Every expected number below is worked out in the comment next to it."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from rayfl.config import ConfigError, build_section
from rayfl.robust import (
    AttackConfig,
    RobustConfig,
    aggregate,
    alie,
    alie_z,
    bucket_means,
    bucketing,
    byzantine_count,
    canonical_order,
    centered_clipping,
    choose_byzantine,
    coordinate_median,
    craft,
    flip_labels,
    geometric_median,
    ipm,
    krum,
    krum_scores,
    krum_select,
    mean,
    multi_krum,
    random_sign,
    sign_flip,
    trimmed_mean,
)

# Krum's hand example (n = 6, f = 1, so n - f - 2 = 3 neighbours count). Squared distances:
#        x0   x1   x2   x3   x4   x5
#   x0    -    5    1    5    1  680
#   x1    5    -    8   20    2  729
#   x2    1    8    -    4    2  629
#   x3    5   20    4    -   10  641
#   x4    1    2    2   10    -  677
#   x5  680  729  629  641  677    -
# 3 nearest: x0 1+1+5=7, x1 2+5+8=15, x2 1+2+4=7, x3 4+5+10=19, x4 1+2+2=5, x5 629+641+677=1947.
# With 2 neighbours x0 (1+1=2) would win, with 4 neighbours x0 (1+1+5+5=12) would win too.
KRUM_X = np.array([[4.0, 2.0], [3.0, 0.0], [5.0, 2.0], [5.0, 4.0], [4.0, 1.0], [30.0, 0.0]])

# Five honest points near the origin plus one huge outlier.
HONEST5 = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]])
OUTLIER = np.array([[1e6, -1e6]])


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- mean, median, trimmed mean


def test_mean_plain_and_weighted() -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]])
    np.testing.assert_allclose(mean(x), [3.0, 2.0])
    # weights 1, 1, 2: ((1 + 3 + 2*5) / 4, (2 + 4 + 0) / 4) = (3.5, 1.5)
    np.testing.assert_allclose(mean(x, np.array([1.0, 1.0, 2.0])), [3.5, 1.5])
    assert mean(x.astype(np.float32)).dtype == np.float64


def test_coordinate_median_odd_and_even() -> None:
    # column 0 sorted: 1 2 5 8 -> (2 + 5) / 2; column 1 sorted: -1 0 3 7 -> (0 + 3) / 2
    x = np.array([[1.0, 0.0], [5.0, -1.0], [2.0, 7.0], [8.0, 3.0]])
    np.testing.assert_allclose(coordinate_median(x), [3.5, 1.5])
    np.testing.assert_allclose(coordinate_median(x[:3]), [2.0, 0.0])


TRIM_X = np.array([[1.0, -50.0], [2.0, 0.0], [3.0, 1.0], [7.0, 5.0], [100.0, 3.0]])


def test_trimmed_mean_trims_both_sides() -> None:
    # b = 1: column 0 keeps 2 3 7 -> 4 (trimming the bottom only: 2 3 7 100 -> 28);
    # column 1 sorted -50 0 1 3 5 keeps 0 1 3 -> 4/3 (trimming the top only: -50 0 1 3 -> -11.5)
    np.testing.assert_allclose(trimmed_mean(TRIM_X, 1), [4.0, 4 / 3])
    np.testing.assert_allclose(trimmed_mean(TRIM_X, 0), [113 / 5, -41 / 5])  # the mean
    np.testing.assert_allclose(trimmed_mean(TRIM_X, 2), [3.0, 1.0])  # b = 2 of 5: the median
    # rows in another order, same answer (trimming is per coordinate, not per row)
    np.testing.assert_allclose(trimmed_mean(TRIM_X[::-1], 1), [4.0, 4 / 3])


def test_trimmed_mean_fraction_and_impossible_b() -> None:
    # b = floor(fraction * 5): 0.2 -> 1, 0.39 -> 1, 0.4 -> 2
    for fraction, expected in ((0.2, [4.0, 4 / 3]), (0.39, [4.0, 4 / 3]), (0.4, [3.0, 1.0])):
        cfg = RobustConfig(name="trimmed_mean", trim_fraction=fraction)
        np.testing.assert_allclose(aggregate(TRIM_X, cfg, None), expected)
    with pytest.raises(ValueError, match="leaves none"):
        trimmed_mean(TRIM_X[:4], 2)
    with pytest.raises(ConfigError) as err:
        aggregate(TRIM_X[:4], RobustConfig(name="trimmed_mean", trim=2), None)
    assert err.value.key == "robust.aggregator.trim"


# ---------------------------------------------------------------- Krum


def test_krum_scores_and_choice_by_hand() -> None:
    np.testing.assert_array_equal(krum_scores(KRUM_X, 1), [7.0, 15.0, 7.0, 19.0, 5.0, 1947.0])
    assert krum_select(KRUM_X, 1).tolist() == [4]
    np.testing.assert_array_equal(krum(KRUM_X, 1), KRUM_X[4])
    # ties (x0 and x2 both score 7) go to the lower index
    assert krum_select(KRUM_X, 1, 3).tolist() == [4, 0, 2]


def test_multi_krum_by_hand() -> None:
    # m = 3: mean of x4, x0, x2 = ((4 + 4 + 5) / 3, (1 + 2 + 2) / 3)
    np.testing.assert_allclose(multi_krum(KRUM_X, 1, 3), [13 / 3, 5 / 3])
    # m = n - f = 5 drops only x5: ((4+3+5+5+4) / 5, (2+0+2+4+1) / 5)
    np.testing.assert_allclose(multi_krum(KRUM_X, 1), [21 / 5, 9 / 5])


def test_krum_needs_n_above_2f_plus_2() -> None:
    with pytest.raises(ValueError, match="2f"):
        krum(KRUM_X[:4], 1)  # n = 4 = 2f + 2
    krum(KRUM_X[:5], 1)  # n = 5 is enough
    with pytest.raises(ConfigError) as err:
        aggregate(KRUM_X[:4], RobustConfig(name="krum", byzantine=1), None)
    assert err.value.key == "robust.aggregator.byzantine"


# ---------------------------------------------------------------- geometric median


def test_geometric_median_of_convex_quadrilateral_is_diagonal_crossing() -> None:
    # For four points in convex position the geometric median is where the diagonals cross:
    # (0,0)-(3,3) is y = x, (2,0)-(0,1) is x + 2y = 2, so (2/3, 2/3).
    q = np.array([[0.0, 0.0], [2.0, 0.0], [3.0, 3.0], [0.0, 1.0]])
    v = geometric_median(q, tol=1e-15, max_iter=10_000)
    np.testing.assert_allclose(v, [2 / 3, 2 / 3], atol=1e-6)


def test_geometric_median_optimality_and_brute_force() -> None:
    x = rng(3).random((5, 2))
    v = geometric_median(x, tol=1e-15, max_iter=10_000)
    # optimality: the unit vectors from the inputs to v sum to zero (v is no input here)
    unit = (v - x) / np.linalg.norm(v - x, axis=1, keepdims=True)
    assert np.linalg.norm(unit.sum(axis=0)) < 1e-5

    def objective(points: np.ndarray) -> np.ndarray:
        return np.linalg.norm(points[:, None, :] - x[None, :, :], axis=2).sum(axis=1)

    g = np.linspace(0.0, 1.0, 401)  # spacing 0.0025
    grid = np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2)
    best = grid[np.argmin(objective(grid))]
    assert np.linalg.norm(v - best) < 5e-3
    assert objective(v[None])[0] <= objective(best[None])[0] + 1e-12


def test_geometric_median_weights_act_as_multiplicity() -> None:
    x = rng(4).random((4, 3))
    weighted = geometric_median(x, np.array([3.0, 1.0, 1.0, 1.0]), tol=1e-15, max_iter=10_000)
    repeated = geometric_median(np.vstack([x[:1], x[:1], x]), tol=1e-15, max_iter=10_000)
    np.testing.assert_allclose(weighted, repeated, atol=1e-6)
    assert np.linalg.norm(weighted - geometric_median(x, tol=1e-15, max_iter=10_000)) > 1e-3


# ---------------------------------------------------------------- centered clipping


def test_centered_clipping_by_hand() -> None:
    x = np.array([[3.0, 4.0], [0.5, 0.0], [0.0, -2.0]])
    # from v = 0 with tau = 1: clip(3,4) = (0.6, 0.8), (0.5, 0) stays, clip(0,-2) = (0, -1);
    # v = ((0.6 + 0.5 + 0) / 3, (0.8 + 0 - 1) / 3)
    np.testing.assert_allclose(centered_clipping(x, tau=1.0), [1.1 / 3, -0.2 / 3])
    # from v = (1, 0): x - v = (2,4) -> (2,4)/sqrt(20), (-0.5,0) stays, (-1,-2) -> (-1,-2)/sqrt(5)
    r5 = math.sqrt(5.0)
    expected = np.array([1.0, 0.0]) + np.array(
        [(2 / (2 * r5) - 0.5 - 1 / r5) / 3, (4 / (2 * r5) + 0 - 2 / r5) / 3]
    )
    np.testing.assert_allclose(centered_clipping(x, np.array([1.0, 0.0]), tau=1.0), expected)


def test_centered_clipping_infinite_tau_is_mean_and_small_tau_moves_at_most_tau() -> None:
    x = rng(5).normal(size=(7, 4)) * 10
    ref = np.ones(4)
    np.testing.assert_allclose(centered_clipping(x, ref, tau=math.inf), x.mean(axis=0))
    v = ref
    for _ in range(5):
        nxt = centered_clipping(x, v, tau=0.1)
        assert np.linalg.norm(nxt - v) <= 0.1 + 1e-12
        v = nxt
    # L iterations are L single steps, each from the last
    np.testing.assert_allclose(centered_clipping(x, ref, tau=0.1, iters=5), v)
    # weights: tau = inf gives the weighted mean
    w = np.arange(1.0, 8.0)
    np.testing.assert_allclose(
        centered_clipping(x, ref, tau=math.inf, weights=w), w @ x / w.sum()
    )


# ---------------------------------------------------------------- outlier resistance


@pytest.mark.parametrize(
    "cfg",
    [
        RobustConfig(name="median"),
        RobustConfig(name="trimmed_mean", trim=1),
        RobustConfig(name="krum", byzantine=1),
        RobustConfig(name="multi_krum", byzantine=1),
        RobustConfig(name="geometric_median"),
        RobustConfig(name="centered_clipping", tau=1.0, clip_iters=3),
    ],
    ids=lambda c: c.name,
)
def test_one_huge_vector_moves_the_mean_but_not_robust_rules(cfg: RobustConfig) -> None:
    x = np.vstack([HONEST5, OUTLIER])
    honest_mean = HONEST5.mean(axis=0)
    assert np.linalg.norm(mean(x) - honest_mean) > 1e5
    assert np.linalg.norm(aggregate(x, cfg, None) - honest_mean) < 1.0


# ---------------------------------------------------------------- bucketing


def test_canonical_order_depends_on_contents_only() -> None:
    x = rng(6).normal(size=(6, 3))
    w = rng(6).random(6)
    for seed in range(3):
        p = rng(60 + seed).permutation(6)
        np.testing.assert_array_equal(x[p][canonical_order(x[p])], x[canonical_order(x)])
        np.testing.assert_array_equal(w[p][canonical_order(x[p], w[p])], w[canonical_order(x, w)])


def test_bucket_means_by_hand() -> None:
    x = np.array([[1.0], [2.0], [4.0], [8.0], [16.0]])
    order = canonical_order(x)[rng(7).permutation(5)]
    means, totals = bucket_means(x, 2, rng(7))
    assert totals is None
    v = x[order, 0]
    # buckets: order[0:2], order[2:4] and order[4] alone, averaged over its own size (not / 2)
    np.testing.assert_array_equal(means[:, 0], [(v[0] + v[1]) / 2, (v[2] + v[3]) / 2, v[4]])
    # weighted: bucket means weighted, bucket weights the members' sums
    w = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    order_w = canonical_order(x, w)[rng(7).permutation(5)]
    wm, wt = bucket_means(x, 2, rng(7), w)
    a, b = order_w[0], order_w[1]
    assert wm[0, 0] == pytest.approx((w[a] * x[a, 0] + w[b] * x[b, 0]) / (w[a] + w[b]))
    np.testing.assert_allclose(wt, [w[order_w[:2]].sum(), w[order_w[2:4]].sum(), w[order_w[4]]])


def test_bucketing_size_one_is_inner_on_permuted_input() -> None:
    x = rng(8).normal(size=(6, 3))
    order = canonical_order(x)[rng(9).permutation(6)]
    seen: list[np.ndarray] = []

    def inner(stack: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        seen.append(stack)
        return stack[0]  # order-sensitive on purpose

    out = bucketing(x, 1, rng(9), inner)
    np.testing.assert_array_equal(seen[0], x[order])
    np.testing.assert_array_equal(out, x[order[0]])
    # with an order-free inner rule, s = 1 is the rule itself
    cfg = RobustConfig(name="median", bucket_size=1)
    np.testing.assert_array_equal(
        bucketing(x, 1, rng(9), lambda s, w: coordinate_median(s)), aggregate(x, cfg, None)
    )


def test_bucketing_does_not_depend_on_input_order() -> None:
    x = rng(10).normal(size=(7, 3))
    w = rng(11).random(7) + 0.5
    cfg = RobustConfig(name="geometric_median", bucket_size=2)
    base = aggregate(x, cfg, rng(12), weights=w)
    for seed in range(3):
        p = rng(100 + seed).permutation(7)
        np.testing.assert_array_equal(aggregate(x[p], cfg, rng(12), weights=w[p]), base)


def test_bucketing_counts_buckets_for_krum() -> None:
    x = rng(13).normal(size=(9, 2))
    # 9 inputs in buckets of 2 -> 5 bucket means; Krum with f = 1 needs > 4: fine
    aggregate(x, RobustConfig(name="krum", byzantine=1, bucket_size=2), rng(0))
    with pytest.raises(ConfigError) as err:  # buckets of 3 -> 3 means, not > 4
        aggregate(x, RobustConfig(name="krum", byzantine=1, bucket_size=3), rng(0))
    assert err.value.key == "robust.aggregator.byzantine"


def test_aggregate_is_deterministic_for_a_seed() -> None:
    x = rng(14).normal(size=(11, 5))
    cfg = RobustConfig(name="mean", bucket_size=2)
    a, b = aggregate(x, cfg, rng(1)), aggregate(x, cfg, rng(1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, aggregate(x, cfg, rng(2)))  # the odd bucket moves with the seed
    with pytest.raises(ValueError, match="Generator"):
        aggregate(x, cfg, None)


def test_bucketing_with_median_resists_sign_flippers() -> None:
    # The FFGG authors' Byzantine run in small: honest updates near g, attackers send -g.
    g = np.array([1.0, -2.0, 0.5])
    honest = g + 0.01 * rng(15).normal(size=(12, 3))
    byz = craft(AttackConfig(name="sign_flip", count=3), honest, rng(16), count=3)
    x = np.vstack([honest, byz])
    cfg = RobustConfig(name="median", bucket_size=2)
    assert np.linalg.norm(aggregate(x, cfg, rng(17)) - g) < 0.3 * np.linalg.norm(g)
    assert np.linalg.norm(mean(x) - g) > 0.35 * np.linalg.norm(g)


# ---------------------------------------------------------------- inputs and config


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="NaN"):
        aggregate(np.array([[1.0, np.nan], [0.0, 0.0]]), RobustConfig(), None)
    with pytest.raises(ValueError, match="no weights"):
        aggregate(HONEST5, RobustConfig(name="median"), None, weights=np.ones(5))
    with pytest.raises(ValueError, match="> 0"):
        aggregate(HONEST5, RobustConfig(), None, weights=np.array([1.0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="shape"):
        aggregate(HONEST5, RobustConfig(name="centered_clipping"), None, reference=np.zeros(3))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"name": "mode"}, "name"),
        ({"bucket_size": 0}, "bucket_size"),
        ({"name": "trimmed_mean"}, "trim"),
        ({"name": "trimmed_mean", "trim": 1, "trim_fraction": 0.1}, "trim"),
        ({"name": "trimmed_mean", "trim": -1}, "trim"),
        ({"name": "trimmed_mean", "trim_fraction": 0.5}, "trim_fraction"),
        ({"name": "krum", "byzantine": -1}, "byzantine"),
        ({"name": "multi_krum", "select": 0}, "select"),
        ({"name": "geometric_median", "tol": 0.0}, "tol"),
        ({"name": "geometric_median", "max_iter": 0}, "max_iter"),
        ({"name": "geometric_median", "smoothing": -1.0}, "smoothing"),
        ({"name": "centered_clipping", "tau": 0.0}, "tau"),
        ({"name": "centered_clipping", "clip_iters": 0}, "clip_iters"),
    ],
)
def test_robust_config_errors_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        RobustConfig(**kwargs).validate_as()
    assert err.value.key == f"robust.aggregator.{key}"
    assert str(err.value).startswith(f"robust.aggregator.{key}:")


def test_configs_build_from_job_mappings() -> None:
    cfg = build_section(RobustConfig, {"name": "krum", "byzantine": 2}, "robust.aggregator")
    assert cfg == RobustConfig(name="krum", byzantine=2)
    with pytest.raises(ConfigError) as err:
        build_section(RobustConfig, {"trimm": 1}, "robust.aggregator")
    assert err.value.key == "robust.aggregator.trimm"
    with pytest.raises(ConfigError) as err:
        build_section(AttackConfig, {"name": "alie", "z": "big"}, "robust.attack")
    assert err.value.key == "robust.attack.z"
    assert build_section(RobustConfig, {"tau": None}, "a").tau is None  # null = no clipping


# ---------------------------------------------------------------- attacks


def test_sign_flip_by_hand() -> None:
    own = np.array([[1.0, -2.0], [0.5, 0.0]])
    np.testing.assert_array_equal(sign_flip(own, 2.0), [[-2.0, 4.0], [-1.0, 0.0]])
    np.testing.assert_array_equal(sign_flip(own), -own)


def test_craft_sign_flip_without_own_flips_a_random_honest_client() -> None:
    honest = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    out = craft(AttackConfig(name="sign_flip", count=4), honest, rng(20), count=4)
    picks = rng(20).integers(3, size=4)
    np.testing.assert_array_equal(out, -honest[picks])


def test_random_sign() -> None:
    own = np.array([[1.0, -2.0, 3.0, -4.0, 5.0, -6.0]])
    np.testing.assert_array_equal(random_sign(own, rng(21), 1.0), -own)
    np.testing.assert_array_equal(random_sign(own, rng(21), 0.0), own)
    out = random_sign(own, rng(21), 0.5)
    flipped = rng(21).random(own.shape) < 0.5
    np.testing.assert_array_equal(out, np.where(flipped, -own, own))
    np.testing.assert_array_equal(np.abs(out), np.abs(own))
    assert 0 < flipped.sum() < own.size  # this seed flips some and keeps some


def test_gaussian_and_constant() -> None:
    honest = np.zeros((2, 3))
    out = craft(AttackConfig(name="gaussian", count=2, sigma=3.0), honest, rng(22), count=2)
    np.testing.assert_allclose(out, 3.0 * rng(22).standard_normal((2, 3)))
    const = craft(AttackConfig(name="constant", count=2, value=-7.0), honest, rng(0), count=2)
    np.testing.assert_array_equal(const, np.full((2, 3), -7.0))


def test_alie_z_from_n_and_f() -> None:
    # n = 5, f = 1: s = floor(3.5) - 1 = 2, Phi^-1((5 - 2) / 5) = Phi^-1(0.6)
    assert alie_z(5, 1) == pytest.approx(0.2533471031357998, abs=1e-12)
    assert NormalDist().cdf(alie_z(5, 1)) == pytest.approx(0.6)
    # n = 50, f = 24 (Baruch et al.'s example): s = 26 - 24 = 2, Phi^-1(0.96) = 1.7507
    assert alie_z(50, 24) == pytest.approx(1.7506860712521695, abs=1e-12)


def test_alie_by_hand() -> None:
    honest = np.array([[1.0, 0.0], [3.0, 4.0]])  # mu = (2, 2), population sigma = (1, 2)
    np.testing.assert_allclose(alie(honest, 2, z=1.5), [[0.5, -1.0], [0.5, -1.0]])
    # z from n = 2 honest + 1 Byzantine, f = 1: s = floor(2.5) - 1 = 1, Phi^-1(2/3)
    z = NormalDist().inv_cdf(2 / 3)
    out = craft(AttackConfig(name="alie", count=1), honest, rng(0), count=1)
    np.testing.assert_allclose(out, [[2 - z, 2 - 2 * z]])


def test_ipm_by_hand() -> None:
    honest = np.array([[1.0, 2.0], [3.0, 4.0]])  # mean (2, 3)
    np.testing.assert_allclose(ipm(honest, 3, 0.5), [[-1.0, -1.5]] * 3)
    own = np.zeros((1, 2))
    out = craft(AttackConfig(name="ipm", count=1, epsilon=0.5), honest, rng(0), own=own)
    np.testing.assert_allclose(out, [[-1.0, -1.5]])


def test_label_flip() -> None:
    np.testing.assert_array_equal(flip_labels(np.array([0, 3, 9]), 10), [9, 6, 0])
    assert flip_labels(torch.tensor([0, 1, 2]), 3).tolist() == [2, 1, 0]
    with pytest.raises(ValueError):
        flip_labels(np.array([0, 10]), 10)
    cfg = AttackConfig(name="label_flip", fraction=0.2)
    assert cfg.data_attack
    own = np.array([[1.0, 2.0]])
    np.testing.assert_array_equal(craft(cfg, np.zeros((3, 2)), rng(0), own=own), own)
    with pytest.raises(ValueError, match="own"):
        craft(cfg, np.zeros((3, 2)), rng(0), count=1)


def test_choose_byzantine() -> None:
    ids = choose_byzantine(10, AttackConfig(name="sign_flip", count=3), rng(30))
    assert len(set(ids.tolist())) == 3 and ids.tolist() == sorted(ids.tolist())
    assert all(0 <= i < 10 for i in ids)
    again = choose_byzantine(10, AttackConfig(name="sign_flip", count=3), rng(30))
    np.testing.assert_array_equal(ids, again)
    assert byzantine_count(10, AttackConfig(name="ipm", fraction=0.25)) == 2  # floor(2.5)
    assert byzantine_count(10, AttackConfig(name="none")) == 0
    with pytest.raises(ConfigError) as err:
        byzantine_count(10, AttackConfig(name="ipm", count=5))
    assert err.value.key == "robust.attack.count"


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"name": "sleep"}, "name"),
        ({"name": "ipm"}, "count"),
        ({"name": "ipm", "count": 1, "fraction": 0.1}, "count"),
        ({"name": "ipm", "count": -1}, "count"),
        ({"name": "ipm", "fraction": 0.5}, "fraction"),
        ({"name": "sign_flip", "count": 1, "scale": 0.0}, "scale"),
        ({"name": "random_sign", "count": 1, "flip_prob": 1.5}, "flip_prob"),
        ({"name": "gaussian", "count": 1, "sigma": 0.0}, "sigma"),
        ({"name": "constant", "count": 1, "value": math.inf}, "value"),
        ({"name": "alie", "count": 1, "z": math.nan}, "z"),
        ({"name": "ipm", "count": 1, "epsilon": -0.1}, "epsilon"),
    ],
)
def test_attack_config_errors_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        AttackConfig(**kwargs).validate_as()
    assert err.value.key == f"robust.attack.{key}"
