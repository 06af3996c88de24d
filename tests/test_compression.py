"""Update compression: each codec's decoded vector and message size checked by hand, the
stochastic codecs' unbiasedness by seeded chi-squared tests, and error feedback's invariant
(sent + residual == sum of raw updates)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rayfl.config import ConfigError
from rayfl.pipeline.compression import (
    HEADER_BYTES,
    CompressionConfig,
    compress,
    encoded_nbytes,
    with_error_feedback,
)

CODECS = [
    CompressionConfig("none"),
    CompressionConfig("topk", ratio=0.1),
    CompressionConfig("randomk", k=3),
    CompressionConfig("qsgd", levels=2),
    CompressionConfig("sign"),
]


def _chi2_upper(df: int, z: float = 3.719) -> float:
    """The chi-squared(df) upper quantile at the normal quantile z (3.719: p = 1e-4), by
    Wilson-Hilferty; numpy only. With a fixed seed the tests are deterministic, and 1e-4 keeps
    a seed change from flaking while the planted bugs give statistics hundreds of times it."""
    c = 2 / (9 * df)
    return df * (1 - c + z * math.sqrt(c)) ** 3


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- top-k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_keeps_the_k_largest_magnitudes(dtype):
    x = np.array([0.1, -3, 2, 0.5, -0.2], dtype=dtype)
    out = compress(x, CompressionConfig("topk", k=2), _rng())
    assert out.values.dtype == dtype
    np.testing.assert_array_equal(out.values, np.array([0, -3, 2, 0, 0], dtype=dtype))


def test_topk_breaks_ties_by_lower_index():
    x = np.array([1.0, -2.0, 2.0, -2.0, 0.5])
    out = compress(x, CompressionConfig("topk", k=2), _rng())
    np.testing.assert_array_equal(out.values, [0, -2, 2, 0, 0])


def test_topk_keeps_exactly_k_nonzeros_on_random_input():
    x = _rng(1).normal(size=200)
    out = compress(x, CompressionConfig("topk", k=17), _rng())
    kept = np.flatnonzero(out.values)
    assert len(kept) == 17
    assert np.abs(x[kept]).min() > np.abs(np.delete(x, kept)).max()
    np.testing.assert_array_equal(out.values[kept], x[kept].astype(np.float32))


@pytest.mark.parametrize(
    ("ratio", "d", "k"),
    [
        (0.5, 5, 3),  # ceil(2.5)
        (0.1, 1000, 100),
        (0.07, 100, 7),  # 0.07 * 100 == 7.000000000000001 in floats: still 7
        (0.01, 50, 1),  # ceil(0.5)
        (0.001, 10, 1),  # max(1, ceil(0.01))
        (1.0, 4, 4),
    ],
)
def test_ratio_to_k_rounds_up(ratio, d, k):
    assert CompressionConfig("topk", ratio=ratio).kept(d) == k


def test_k_is_capped_at_d():
    assert CompressionConfig("topk", k=10).kept(4) == 4
    out = compress(np.array([1.0, -2.0, 3.0]), CompressionConfig("topk", k=10), _rng())
    np.testing.assert_array_equal(out.values, [1, -2, 3])


# ---------------------------------------------------------------- random-k


def test_randomk_keeps_k_coordinates_scaled_by_d_over_k():
    x = _rng(2).uniform(0.5, 2.0, size=20) * np.array([1, -1] * 10)  # no zeros
    out = compress(x, CompressionConfig("randomk", k=5), _rng(3))
    kept = np.flatnonzero(out.values)
    assert len(kept) == 5
    np.testing.assert_array_equal(out.values[kept], (x[kept] * 4.0).astype(np.float32))


def test_randomk_same_seed_same_indices():
    x = np.arange(1.0, 31.0)
    cfg = CompressionConfig("randomk", ratio=0.2)
    a = compress(x, cfg, _rng(7)).values
    b = compress(x, cfg, _rng(7)).values
    c = compress(x, cfg, _rng(8)).values
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(np.flatnonzero(a), np.flatnonzero(c))


def test_randomk_is_unbiased():
    # Coordinate i decodes to x_i * d/k with probability k/d, else 0: mean x_i, variance
    # x_i^2 (d/k - 1). The z-scores of the mean over n draws sum in square to ~chi2(d).
    d, k, n = 10, 3, 4000
    x = np.linspace(-2.0, 3.0, d) + 0.25  # no zeros
    rng = _rng(11)
    cfg = CompressionConfig("randomk", k=k)
    mean = np.mean([compress(x, cfg, rng).values for _ in range(n)], axis=0)
    z = (mean - x) / np.sqrt(x**2 * (d / k - 1) / n)
    assert np.sum(z**2) < _chi2_upper(d)


# ---------------------------------------------------------------- QSGD


def test_qsgd_is_on_the_grid_and_unbiased():
    # The level of coordinate i is floor(xi_i) + Bernoulli(p_i), p_i = frac(xi_i),
    # xi_i = |x_i| / ||x|| * s: the count of upper levels over n draws is Binomial(n, p_i),
    # so sum (U_i - n p_i)^2 / (n p_i (1 - p_i)) is ~chi2 with one df per coordinate.
    s, n = 4, 3000
    x = _rng(5).normal(size=12)
    norm = float(np.float32(np.linalg.norm(x)))  # the float32 norm the message carries
    xi = np.abs(x) / norm * s
    low = np.floor(xi)
    p = xi - low
    assert np.all(n * p * (1 - p) >= 10)  # every coin is fair game for the normal approximation

    cfg, rng = CompressionConfig("qsgd", levels=s), _rng(6)
    upper = np.zeros(len(x))
    for _ in range(n):
        dec = compress(x, cfg, rng).values
        level = np.abs(dec) * s / norm
        np.testing.assert_allclose(level, np.round(level), atol=1e-9)  # on the grid
        level = np.round(level)
        assert np.all((level == low) | (level == low + 1))
        assert np.all((np.sign(dec) == np.sign(x)) | (level == 0))
        upper += level == low + 1
    chi2 = np.sum((upper - n * p) ** 2 / (n * p * (1 - p)))
    assert chi2 < _chi2_upper(len(x))


def test_qsgd_hand_example_and_zero_vector():
    # x = [3, -4]: ||x|| = 5; with s = 5, xi = [3, 4] are integers, so no coin is tossed.
    out = compress(np.array([3.0, -4.0]), CompressionConfig("qsgd", levels=5), _rng())
    np.testing.assert_array_equal(out.values, [3.0, -4.0])
    zero = compress(np.zeros(6, dtype=np.float32), CompressionConfig("qsgd"), _rng())
    np.testing.assert_array_equal(zero.values, np.zeros(6))
    assert zero.values.dtype == np.float32


# ---------------------------------------------------------------- sign


def test_sign_scales_by_mean_magnitude():
    out = compress(np.array([1.0, -2.0, 0.0, 3.0]), CompressionConfig("sign"), _rng())
    np.testing.assert_array_equal(out.values, [1.5, -1.5, 1.5, 1.5])  # mean|x| = 6/4, 0 -> +
    out32 = compress(np.array([0.5, -0.25], dtype=np.float32), CompressionConfig("sign"), _rng())
    assert out32.values.dtype == np.float32
    np.testing.assert_array_equal(out32.values, [0.375, -0.375])


# ---------------------------------------------------------------- all codecs


@pytest.mark.parametrize("cfg", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_shape_and_reproducibility(cfg, dtype):
    x = _rng(9).normal(size=40).astype(dtype)
    a = compress(x, cfg, _rng(4))
    b = compress(x, cfg, _rng(4))
    assert a.values.dtype == dtype and a.values.shape == x.shape
    np.testing.assert_array_equal(a.values, b.values)


def test_compress_rejects_non_vectors():
    with pytest.raises(ValueError, match="1-D float"):
        compress(np.ones((2, 3)), CompressionConfig(), _rng())
    with pytest.raises(ValueError, match="1-D float"):
        compress(np.arange(3), CompressionConfig(), _rng())


@pytest.mark.parametrize(
    ("cfg", "d", "dtype", "nbytes"),
    [
        (CompressionConfig("none"), 1000, np.float32, 8 + 4000),
        (CompressionConfig("none"), 1000, np.float64, 8 + 8000),
        (CompressionConfig("topk", k=10), 1000, np.float32, 8 + 40 + 40),
        (CompressionConfig("topk", ratio=0.01), 1000, np.float64, 8 + 40 + 40),
        (CompressionConfig("randomk", k=10), 1000, np.float32, 8 + 8 + 40),
        (CompressionConfig("qsgd", levels=16), 1000, np.float32, 8 + 4 + 750),  # 1+5 bits
        (CompressionConfig("qsgd", levels=1), 1000, np.float32, 8 + 4 + 250),  # 1+1 bits
        (CompressionConfig("qsgd", levels=3), 1000, np.float32, 8 + 4 + 375),  # 1+2 bits
        (CompressionConfig("qsgd", levels=4), 1000, np.float32, 8 + 4 + 500),  # 1+3 bits
        (CompressionConfig("qsgd", levels=16), 3, np.float32, 8 + 4 + 3),  # ceil(18 / 8)
        (CompressionConfig("sign"), 1000, np.float32, 8 + 4 + 125),
        (CompressionConfig("sign"), 1001, np.float32, 8 + 4 + 126),
    ],
)
def test_nbytes_matches_the_wire_format(cfg, d, dtype, nbytes):
    x = _rng(10).normal(size=d).astype(dtype)
    assert HEADER_BYTES == 8
    assert compress(x, cfg, _rng()).nbytes == nbytes
    assert encoded_nbytes(d, np.dtype(dtype).itemsize, cfg) == nbytes


# ---------------------------------------------------------------- error feedback


@pytest.mark.parametrize("cfg", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_error_feedback_conserves_the_sum_of_updates(cfg, dtype):
    rng, data = _rng(12), _rng(13)
    updates = [data.normal(size=50).astype(dtype) for _ in range(20)]
    residual, sent_total = None, np.zeros(50)
    for u in updates:
        sent, residual = with_error_feedback(u, residual, cfg, rng)
        assert sent.values.dtype == dtype and residual.dtype == np.float64
        sent_total += sent.values
    raw_total = np.sum([u.astype(np.float64) for u in updates], axis=0)
    assert np.max(np.abs(sent_total + residual - raw_total)) <= 1e-10 * np.max(np.abs(raw_total))
    if cfg.name != "none":
        assert np.any(residual != 0)  # something was held back, so the check had work to do


def test_without_error_feedback_the_residual_is_none():
    cfg = CompressionConfig("topk", k=2, error_feedback=False)
    x = np.array([0.1, -3, 2, 0.5, -0.2])
    sent, residual = with_error_feedback(x, np.ones(5), cfg, _rng())
    assert residual is None
    np.testing.assert_array_equal(sent.values, [0, -3, 2, 0, 0])  # the old residual is ignored


def test_error_feedback_sends_the_residual_later():
    # topk k=1: round 1 sends -3 and holds back [0.1, 0, 2]; round 2 adds it to [0, 0, 1.5],
    # so v = [0.1, 0, 3.5] and 3.5 goes out.
    cfg = CompressionConfig("topk", k=1)
    sent, res = with_error_feedback(np.array([0.1, -3.0, 2.0]), None, cfg, _rng())
    np.testing.assert_array_equal(sent.values, [0, -3, 0])
    sent, res = with_error_feedback(np.array([0.0, 0.0, 1.5]), res, cfg, _rng())
    np.testing.assert_array_equal(sent.values, [0, 0, 3.5])
    np.testing.assert_allclose(res, [0.1, 0, 0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="residual shape"):
        with_error_feedback(np.zeros(3), np.zeros(4), cfg, _rng())


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        (CompressionConfig("gzip"), "compression.name"),  # type: ignore[arg-type]
        (CompressionConfig("topk"), "compression.ratio"),  # neither ratio nor k
        (CompressionConfig("randomk", ratio=0.1, k=3), "compression.ratio"),  # both
        (CompressionConfig("topk", ratio=0.0), "compression.ratio"),
        (CompressionConfig("randomk", ratio=1.5), "compression.ratio"),
        (CompressionConfig("topk", ratio=float("nan")), "compression.ratio"),
        (CompressionConfig("topk", k=0), "compression.k"),
        (CompressionConfig("qsgd", levels=0), "compression.levels"),
    ],
)
def test_bad_config_names_the_field(cfg, key):
    with pytest.raises(ConfigError) as err:
        cfg.validate_as()
    assert str(err.value).startswith(f"{key}: ")
    assert err.value.key == key


def test_validate_uses_the_given_key_and_reads_only_the_chosen_codec():
    with pytest.raises(ConfigError, match=r"^upload\.compression\.k: "):
        CompressionConfig("randomk", k=-1).validate_as("upload.compression")
    for ok in (
        CompressionConfig(),
        CompressionConfig("topk", ratio=1.0),
        CompressionConfig("randomk", k=1),
        CompressionConfig("qsgd", levels=1),
        CompressionConfig("sign", ratio=5.0, k=0, levels=0),  # fields sign never reads
    ):
        ok.validate_as()
