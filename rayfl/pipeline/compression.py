"""Update compression for federated uploads, with optional error feedback.

A client compresses its model update before upload; the server only ever sees the *decoded*
vector, so `compress` returns that dense vector together with the size of the encoded message,
which is what a communication budget counts. Encoding is simulated, not performed: nothing is
serialised, but `nbytes` is the exact length of the message described below.

Wire formats (d is the vector length, k = `CompressionConfig.kept(d)`, s = `levels`):

- every message starts with a header of `HEADER_BYTES` = 8: int32 d, then an int32 word
  holding the codec id and its parameter (QSGD's s);
- ``none``: header + d * itemsize, the raw vector in its own dtype (a dense upload);
- ``topk``: header + k * 4 (int32 indices) + k * 4 (float32 values). The kept coordinates are
  the k largest |x_i|, ties going to the lower index;
- ``randomk``: header + 8 (an int64 seed) + k * 4 (float32 values). The indices are
  `np.random.default_rng(seed).choice(d, k, replace=False)`, so the server regenerates them
  from the seed; values are sent scaled by d / k, which makes the decoded vector unbiased
  (rand-k, Stich et al. 2018);
- ``qsgd``: header + 4 (float32 norm) + ceil(d * (1 + b) / 8), b = ceil(log2(s + 1)): per
  coordinate a sign bit and a b-bit level l in 0..s (QSGD, Alistarh et al. 2017). With
  xi_i = |x_i| / ||x||_2 * s, l = floor(xi_i) + Bernoulli(xi_i - floor(xi_i)); the decoded
  value is ||x||_2 * sign(x_i) * l / s, unbiased (E = x), and x = 0 decodes to 0;
- ``sign``: header + 4 (float32 scale) + ceil(d / 8): one sign bit per coordinate, decoded as
  (||x||_1 / d) * sign(x_i) (EF-SignSGD, Karimireddy et al. 2019). One bit cannot say 0, so
  x_i = 0 is sent as +.

Floats on the wire are float32, so the decoded vector is built from the float32-rounded values,
norm or scale (then cast to the input dtype): the server reconstructs exactly `values`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import numpy as np

# rayfl.config.ConfigError itself; from rayfl.errors since rayfl.config imports this module
from rayfl.errors import ConfigError

CodecName = Literal["none", "topk", "randomk", "qsgd", "sign"]
CODECS: tuple[str, ...] = get_args(CodecName)
HEADER_BYTES = 8
_F32 = 4  # bytes of a float32 or int32 on the wire
_SEED_BYTES = 8


@dataclass
class CompressionConfig:
    """A job's `compression:` section: how each client update is encoded before upload.

    name: none | topk | randomk | qsgd | sign (see the module docstring for each format).
    ratio / k: topk's and randomk's number of kept coordinates, k itself or
    max(1, ceil(ratio * d)) with ratio in (0, 1]; set exactly one (others read neither).
    levels: QSGD's s >= 1, the number of quantisation levels above 0 (read by qsgd only).
    error_feedback: keep what was not sent as client state and add it to the next update
    (Stich et al. 2018; Karimireddy et al. 2019). It matters most for the biased codecs (topk,
    sign: sign-SGD without it can fail to converge); the unbiased ones (randomk, qsgd) work
    without it, at a larger variance.
    """

    # How each upload is encoded: none (dense); topk (the k largest |x_i|); randomk (k seeded random
    # coordinates, scaled d / k: unbiased); qsgd (stochastic quantisation to levels); sign (scaled
    # signs, one bit each).
    name: CodecName = "none"
    # topk and randomk: k = max(1, ceil(ratio * d)) of d coordinates, ratio in (0, 1]. Set this or
    # k.
    ratio: float | None = None
    # topk and randomk: the coordinates kept (>= 1, capped at d). Set this or ratio.
    k: int | None = None
    # qsgd only: s, the quantisation levels above 0 (>= 1); each coordinate costs 1 + ceil(log2(s +
    # 1)) bits.
    levels: int = 16
    # Keep what was not sent as client state and add it to the next update; matters most for the
    # biased codecs (topk, sign).
    error_feedback: bool = True

    def validate_as(self, key: str = "compression") -> None:
        """Checks the chosen codec's fields; errors name `key`.<field>."""
        if self.name not in CODECS:
            raise ConfigError(f"{key}.name", f"unknown {self.name!r}; allowed: {list(CODECS)}")
        if self.name in ("topk", "randomk"):
            if (self.ratio is None) == (self.k is None):
                raise ConfigError(f"{key}.ratio", f"set exactly one of ratio and k for {self.name}")
            if self.ratio is not None and not 0 < self.ratio <= 1:
                raise ConfigError(f"{key}.ratio", f"must be in (0, 1], got {self.ratio!r}")
            if self.k is not None and self.k < 1:
                raise ConfigError(f"{key}.k", f"must be >= 1, got {self.k!r}")
        if self.name == "qsgd" and self.levels < 1:
            raise ConfigError(f"{key}.levels", f"must be >= 1, got {self.levels!r}")

    def kept(self, d: int) -> int:
        """topk's / randomk's k for vectors of length d, capped at d. A ratio * d within float
        rounding of an integer counts as that integer, so 0.07 * 100 keeps 7, not 8."""
        if self.k is not None:
            return min(self.k, d)
        if self.ratio is None:
            raise ConfigError(
                "compression.ratio", f"set exactly one of ratio and k for {self.name}"
            )
        exact = self.ratio * d
        nearest = round(exact)
        k = nearest if math.isclose(exact, nearest, rel_tol=1e-9) else math.ceil(exact)
        return min(max(1, k), d)


class Compressed(NamedTuple):
    """One encoded upload: what the server decodes, and what the message costs."""

    values: np.ndarray  # the decoded dense vector; the input's shape and dtype
    nbytes: int  # the encoded message's length in bytes (module docstring)


def encoded_nbytes(d: int, itemsize: int, cfg: CompressionConfig) -> int:
    """Bytes of the message encoding a length-d vector of `itemsize`-byte floats: the one place
    the wire formats' sizes live."""
    if cfg.name == "none":
        return HEADER_BYTES + d * itemsize
    if cfg.name == "topk":
        return HEADER_BYTES + cfg.kept(d) * (_F32 + _F32)
    if cfg.name == "randomk":
        return HEADER_BYTES + _SEED_BYTES + cfg.kept(d) * _F32
    if cfg.name == "qsgd":
        bits = 1 + cfg.levels.bit_length()  # sign + ceil(log2(s + 1)), exact in integers
        return HEADER_BYTES + _F32 + _ceil_div(d * bits, 8)
    if cfg.name == "sign":
        return HEADER_BYTES + _F32 + _ceil_div(d, 8)
    raise ConfigError("compression.name", f"unknown {cfg.name!r}; allowed: {list(CODECS)}")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def compress(x: np.ndarray, cfg: CompressionConfig, rng: np.random.Generator) -> Compressed:
    """Encodes and decodes the 1-D float vector x with `cfg`'s codec; randomness (randomk's
    seed, QSGD's rounding) comes from `rng` only, so a seeded run is reproducible."""
    x = np.asarray(x)
    if x.ndim != 1 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"compress takes a 1-D float vector, got shape {x.shape} {x.dtype}")
    d = x.shape[0]
    nbytes = encoded_nbytes(d, x.dtype.itemsize, cfg)
    if cfg.name == "none" or d == 0:
        return Compressed(x.copy(), nbytes)
    x64 = x.astype(np.float64)
    out = np.zeros(d, dtype=np.float64)
    if cfg.name == "topk":
        idx = np.argsort(-np.abs(x64), kind="stable")[: cfg.kept(d)]
        out[idx] = _wire(x64[idx])
    elif cfg.name == "randomk":
        k = cfg.kept(d)
        seed = int(rng.integers(0, 2**63 - 1))
        idx = np.random.default_rng(seed).choice(d, size=k, replace=False)
        out[idx] = _wire(x64[idx] * (d / k))
    elif cfg.name == "qsgd":
        out = _qsgd(x64, cfg.levels, rng)
    elif cfg.name == "sign":
        scale = _wire(np.mean(np.abs(x64)))
        out = np.where(x64 >= 0, scale, -scale)
    return Compressed(out.astype(x.dtype), nbytes)


def _wire(v: np.ndarray | float) -> np.ndarray:
    """v as the float32 the message carries, back in float64."""
    return np.asarray(v, dtype=np.float32).astype(np.float64)


def _qsgd(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    """QSGD with s levels. The levels are drawn against the float32 norm the server decodes
    with, so the decoded vector stays unbiased after the norm's rounding."""
    u = rng.random(x.shape[0])  # drawn even for x = 0, so rng use does not depend on x
    norm = float(_wire(np.linalg.norm(x)))
    if norm == 0.0:
        return np.zeros_like(x)
    xi = np.minimum(np.abs(x) / norm * s, s)  # the cap only absorbs the norm's rounding
    low = np.floor(xi)
    level = low + (u < xi - low)
    return norm * np.sign(x) * (level / s)


def with_error_feedback(
    update: np.ndarray,
    residual: np.ndarray | None,
    cfg: CompressionConfig,
    rng: np.random.Generator,
) -> tuple[Compressed, np.ndarray | None]:
    """Compresses one client update, with error feedback if `cfg.error_feedback`.

    With it, v = update + residual (None: zeros) is compressed and the new residual is
    v - sent, kept in float64 whatever the update's dtype, so that over any run the sum of sent
    vectors plus the final residual equals the sum of raw updates to float64 rounding. Without
    it, the update is compressed alone and the residual is None.
    """
    if not cfg.error_feedback:
        return compress(update, cfg, rng), None
    update = np.asarray(update)
    v = update.astype(np.float64)
    if residual is not None:
        if residual.shape != update.shape:
            raise ValueError(f"residual shape {residual.shape} != update shape {update.shape}")
        v = v + residual
    sent = compress(v.astype(update.dtype), cfg, rng)
    return sent, v - sent.values.astype(np.float64)
