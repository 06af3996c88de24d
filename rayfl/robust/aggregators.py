"""Server-side robust aggregation of client vectors, for BR-FFGG (FFGG paper, Alg. 5) and any
other algorithm that replaces the mean by ARAgg.

Every rule takes a stack of n client vectors, shape [n, d], and returns one [d] vector in float64.
They are pure and deterministic; the only randomness (bucketing's shuffle) comes from a
`numpy.random.Generator` the caller derives from (run seed, purpose, round), see `rayfl.rng`.

FFGG App. D (after Def. 2) notes that Krum, the geometric median and the coordinate-wise median
alone are *not* (delta, c)-robust aggregators; composing them with bucketing (Karimireddy et al.
2022) is what makes them so, hence `RobustConfig.bucket_size`.

Memory: beyond the [n, d] stack it is given, a rule allocates a few [d] vectors and
temporaries of O(n x block), never O(n x d), by working over the column slices of
`column_blocks`: at d = 11M and n = 100 the stack alone is 8.8 GB, and each stack-sized
temporary would add as much again. (Bucketing builds the [ceil(n/s), d] stack of its means,
which the inner rule needs, and copies one bucket's s rows at a time.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from rayfl.errors import ConfigError

# A rule after its parameters are bound: (stack [n, d], normalized weights or None) -> [d].
Rule = Callable[[np.ndarray, np.ndarray | None], np.ndarray]

# Where a RobustConfig sits in a job file, for error messages.
AGGREGATOR_KEY = "robust.aggregator"

AggregatorName = Literal[
    "mean",
    "median",
    "trimmed_mean",
    "krum",
    "multi_krum",
    "geometric_median",
    "centered_clipping",
]


# Bytes of float64 in one n x block slab of the stack: the unit of every rule's temporaries. The
# block width depends on n only (never on values or timing), so results are deterministic; 8 MiB
# keeps a rule's extra memory a small fraction of any stack worth blocking, while each block is
# still ~10^6 values, so the per-block Python overhead is negligible next to the numpy work.
BLOCK_BYTES = 8 * 2**20


# ---------------------------------------------------------------- column blocks


def column_blocks(n: int, d: int) -> Iterator[slice]:
    """Slices covering columns 0..d-1 in order, each at most ~BLOCK_BYTES of an [n, d] float64
    stack (the last one may take one column more: see below).

    No block is one column wide unless d = 1: numpy reduces a single column pairwise but several
    columns row by row, so a one-column block would change the last bits of a mean."""
    width = max(2, BLOCK_BYTES // (8 * max(n, 1)))
    start = 0
    while start < d:
        stop = start + width
        if stop >= d - 1:  # the rest, rather than leaving a one-column tail
            stop = d
        yield slice(start, stop)
        start = stop


def row_sq_norms(z: np.ndarray, center: np.ndarray | None = None) -> np.ndarray:
    """[n] squared Euclidean norms of the rows of z (of z - center: squared distances to it),
    added up over column blocks, so the differences never take a whole stack's memory."""
    out = np.zeros(len(z))
    for cols in column_blocks(*z.shape):
        diff = z[:, cols] if center is None else z[:, cols] - center[cols]
        out += np.einsum("ij,ij->i", diff, diff)
        del diff  # before the next block's is allocated: one slab at a time
    return out


def rows_mean(x: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """The mean of x[rows] (all rows: None) over column blocks, without copying those rows.

    Bit for bit `x[rows].mean(axis=0)`: numpy sums each column row by row either way."""
    n = len(x) if rows is None else len(rows)
    out = np.empty(x.shape[1])
    for cols in column_blocks(n, x.shape[1]):
        out[cols] = (x[:, cols] if rows is None else x[rows, cols]).mean(axis=0)
    return out


# ---------------------------------------------------------------- inputs


def as_stack(updates: ArrayLike) -> np.ndarray:
    """Client vectors as a finite float64 [n, d] array (n >= 1).

    Non-finite rows are refused rather than aggregated: one NaN makes a median or a Krum score
    NaN, and the engine already drops non-finite client answers before they reach the server.
    A float64 array is returned as is (no copy), and checked one column block at a time."""
    x = np.asarray(updates, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"need a non-empty [n, d] stack of client vectors, got shape {x.shape}")
    finite = np.ones(len(x), dtype=bool)
    for cols in column_blocks(*x.shape):
        finite &= np.isfinite(x[:, cols]).all(axis=1)
    bad = np.flatnonzero(~finite)
    if bad.size:
        raise ValueError(f"client vectors {bad.tolist()} contain NaN or infinity")
    return x


def checked_weights(weights: ArrayLike | None, n: int) -> np.ndarray | None:
    """n finite weights > 0 as float64, or None for uniform (a zero weight is a client the
    caller should have left out)."""
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"need {n} weights, got shape {w.shape}")
    if not (np.isfinite(w).all() and (w > 0).all()):
        raise ValueError("weights must be finite and > 0")
    return w


def normalized_weights(weights: ArrayLike | None, n: int) -> np.ndarray | None:
    """`checked_weights` scaled to sum to 1, or None for uniform."""
    w = checked_weights(weights, n)
    return None if w is None else w / w.sum()


# ---------------------------------------------------------------- rules


def mean(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """The plain (or weighted) mean: FFGG Alg. 1 line 8, the non-robust control.

    Whole-stack numpy: a reduction over rows (or BLAS's w @ x) allocates only the [d] result."""
    x = as_stack(x)
    w = normalized_weights(weights, len(x))
    return x.mean(axis=0) if w is None else w @ x


def coordinate_median(x: np.ndarray) -> np.ndarray:
    """Coordinate-wise median (Yin et al. 2018; the CM of FFGG App. D and of the authors'
    Byzantine notebook). Even n: the average of the two middle values.

    Per column block (np.median partitions a copy of what it is given), bit for bit the same."""
    x = as_stack(x)
    out = np.empty(x.shape[1])
    for cols in column_blocks(*x.shape):
        out[cols] = np.median(x[:, cols], axis=0)
    return out


def trim_count(n: int, trim: int | None = None, fraction: float | None = None) -> int:
    """b, the number of values trimmed from *each* side: `trim`, or floor(fraction * n)."""
    if (trim is None) == (fraction is None):
        raise ValueError("give exactly one of trim and fraction")
    b = int(trim) if trim is not None else math.floor(float(fraction) * n)
    if b < 0 or 2 * b >= n:
        raise ValueError(f"trimming {b} from each side of {n} values leaves none (need 2b < n)")
    return b


def trimmed_mean(x: np.ndarray, trim: int) -> np.ndarray:
    """Coordinate-wise trimmed mean (Yin et al. 2018): per coordinate, drop the b smallest and
    the b largest of the n values and average the n - 2b left.

    Sorted one column block at a time (np.sort copies), bit for bit the same as sorting all."""
    x = as_stack(x)
    n = len(x)
    b = trim_count(n, trim=trim)
    out = np.empty(x.shape[1])
    for cols in column_blocks(*x.shape):
        out[cols] = np.sort(x[:, cols], axis=0)[b : n - b].mean(axis=0)
    return out


def pairwise_sq_distances(x: np.ndarray) -> np.ndarray:
    """[n, n] squared Euclidean distances by direct differences rather than the Gram trick,
    which cancels badly when vectors are close.

    Added up over column blocks, one row's differences within a block at a time: memory
    O(n x block), not n*d (nor n*n*d), and each block is re-read n times while it is in cache."""
    x = as_stack(x)
    n = len(x)
    out = np.zeros((n, n))
    for cols in column_blocks(*x.shape):
        block = x[:, cols]
        for i in range(n):
            out[i] += row_sq_norms(block, block[i])
    return out


def krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    """Krum scores (Blanchard et al. 2017, Sec. 4): for each i, the sum of squared distances to
    its n - f - 2 nearest other vectors. Needs n > 2f + 2, so at least one neighbour counts."""
    x = as_stack(x)
    n = len(x)
    if f < 0 or n <= 2 * f + 2:
        raise ValueError(f"Krum with f={f} needs n > 2f + 2 = {2 * f + 2} inputs, got n={n}")
    d2 = pairwise_sq_distances(x)
    np.fill_diagonal(d2, np.inf)  # i is not its own neighbour
    return np.sort(d2, axis=1)[:, : n - f - 2].sum(axis=1)


def krum_select(x: np.ndarray, f: int, m: int = 1) -> np.ndarray:
    """Indices of the m best-scored vectors, best first; ties go to the lower index."""
    scores = krum_scores(x, f)
    if not 1 <= m <= len(scores):
        raise ValueError(f"multi-Krum needs 1 <= m <= n = {len(scores)}, got m={m}")
    return np.argsort(scores, kind="stable")[:m]


def krum(x: np.ndarray, f: int) -> np.ndarray:
    """Krum (Blanchard et al. 2017): the one input with the lowest score, returned as is."""
    x = as_stack(x)
    return x[krum_select(x, f, 1)[0]].copy()


def multi_krum(x: np.ndarray, f: int, m: int | None = None) -> np.ndarray:
    """Multi-Krum (Blanchard et al. 2017): the mean of the m best-scored inputs, scores computed
    once (not re-scored after each pick). m = None takes m = n - f."""
    x = as_stack(x)
    chosen = krum_select(x, f, len(x) - f if m is None else m)
    return rows_mean(x, chosen)


def geometric_median(
    x: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    smoothing: float = 1e-6,
) -> np.ndarray:
    """argmin_v sum_i w_i ||v - x_i|| by the smoothed Weiszfeld iteration of RFA (Pillutla et
    al. 2022): v <- sum_i beta_i x_i / sum_i beta_i, with beta_i = w_i / max(nu, ||v - x_i||).

    Starts at the weighted mean; stops when the objective improves by at most `tol` relative to
    its value (RFA's criterion) or after `max_iter` steps. nu = `smoothing` keeps a step finite
    when v lands on an input.

    One blocked pass over the stack for the distances to each v (they serve both the objective
    and the next step's beta), one BLAS product for the next v: no [n, d] temporary."""
    x = as_stack(x)
    w = normalized_weights(weights, len(x))
    w = np.full(len(x), 1.0 / len(x)) if w is None else w
    v = w @ x
    dist = np.sqrt(row_sq_norms(x, v))
    objective = w @ dist
    for _ in range(max_iter):
        beta = w / np.maximum(dist, smoothing)
        np.matmul(beta, x, out=v)  # v is not read by the product: overwrite it in place
        v /= beta.sum()
        dist = np.sqrt(row_sq_norms(x, v))
        previous, objective = objective, w @ dist
        if abs(previous - objective) <= tol * objective:
            break
    return v


def clip_scale(norms: np.ndarray, tau: float) -> np.ndarray:
    """min(1, tau / norm) for each norm: the factor that clips a row to norm at most tau."""
    scale = np.ones_like(norms)
    over = norms > tau
    scale[over] = tau / norms[over]
    return scale


def clip(z: np.ndarray, tau: float) -> np.ndarray:
    """Each row of z scaled to norm at most tau: z * min(1, tau / ||z||). The norms are taken
    over column blocks; the result is, necessarily, a new array of z's size."""
    return z * clip_scale(np.sqrt(row_sq_norms(z)), tau)[:, None]


def centered_clipping(
    x: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    tau: float,
    iters: int = 1,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Centered clipping (Karimireddy et al. 2021, Sec. 4, rule CC): L times v <- v + (1/n) sum_i
    clip_tau(x_i - v), from v = `reference` (the previous aggregate, as the paper's momentum;
    zero when none is given, as the paper's first step). Each step moves v by at most tau.
    tau = inf is the mean after one step.

    Each step takes the rows' distances to v over column blocks, then clips and averages one
    block of x - v at a time (each row scaled by its whole distance): no [n, d] temporary."""
    x = as_stack(x)
    w = normalized_weights(weights, len(x))
    if not tau > 0:
        raise ValueError(f"clipping radius tau must be > 0, got {tau}")
    v = np.zeros(x.shape[1]) if reference is None else np.array(reference, dtype=np.float64)
    if v.shape != (x.shape[1],):
        raise ValueError(f"reference must have shape ({x.shape[1]},), got {v.shape}")
    step = np.empty_like(v)
    for _ in range(iters):
        scale = clip_scale(np.sqrt(row_sq_norms(x, v)), tau)[:, None]
        for cols in column_blocks(*x.shape):
            z = x[:, cols] - v[cols]
            z *= scale
            step[cols] = z.mean(axis=0) if w is None else w @ z
            del z  # before the next block's is allocated: one slab at a time
        v += step  # v is this function's own copy
    return v


# ---------------------------------------------------------------- bucketing


def canonical_order(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """An order of the rows that depends only on their contents (a bytewise sort of each row and
    its weight), so that bucketing's shuffle does not depend on the order the caller listed the
    clients in (arrival order, host count). Equal rows are interchangeable, so ties are harmless.

    The rows are sorted through a bytes view of x, not a copy with the weights appended: runs of
    bytewise-equal rows are then put in their weights' byte order (stably). That is the order of
    sorting rows-with-weights, since the weight's bytes come after the row's."""
    x = np.ascontiguousarray(x, dtype=np.float64)  # no copy for a C-contiguous float64 stack
    n = len(x)
    # (d = 0: all rows are the same empty string; numpy's void view would lose them.)
    order = np.argsort(_byte_rows(x), kind="stable") if x.shape[1] else np.arange(n)
    if weights is None or n < 2:
        return order
    w = _byte_rows(np.ascontiguousarray(weights, dtype=np.float64).reshape(n, 1))
    ends = [k for k in range(1, n) if not _same_bytes(x, order[k - 1], order[k])]
    for run in np.split(np.arange(n), ends):  # runs of equal rows, each in index order
        if len(run) > 1:
            order[run] = order[run][np.argsort(w[order[run]], kind="stable")]
    return order


def _byte_rows(a: np.ndarray) -> np.ndarray:
    """The rows of a C-contiguous 2-D array as opaque byte strings (a view), which numpy sorts
    bytewise."""
    return a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()


def _same_bytes(x: np.ndarray, i: int, j: int) -> bool:
    """Whether rows i and j of a C-contiguous float64 x hold the same bytes (0.0 and -0.0 differ,
    as in the sort), compared block by block up to the first difference."""
    bits = x.view(np.uint64)
    return all(np.array_equal(bits[i, c], bits[j, c]) for c in column_blocks(2, x.shape[1]))


def bucket_means(
    x: np.ndarray, s: int, rng: np.random.Generator, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Bucketing's first half (Karimireddy et al. 2022, Alg. 1): a random permutation, then the
    mean of each run of s consecutive vectors: ceil(n / s) bucket means.

    The last bucket may hold fewer than s vectors; it is averaged over its own size (the paper's
    1/s there would shrink it towards zero). With weights, bucket means are weighted and each
    bucket carries its members' total weight."""
    x = as_stack(x)
    n = len(x)
    weights = checked_weights(weights, n)
    if s < 1:
        raise ValueError(f"bucket size must be >= 1, got {s}")
    order = canonical_order(x, weights)[rng.permutation(n)]
    means = np.empty((math.ceil(n / s), x.shape[1]))
    totals = None if weights is None else np.empty(len(means))
    for k, start in enumerate(range(0, n, s)):
        members = order[start : start + s]
        if weights is None:
            means[k] = x[members].mean(axis=0)
        else:
            totals[k] = weights[members].sum()
            means[k] = weights[members] @ x[members] / totals[k]
    return means, totals


def bucketing(
    x: np.ndarray,
    s: int,
    rng: np.random.Generator,
    inner: Rule,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Bucketing (Karimireddy et al. 2022, Alg. 1): `inner` applied to the bucket means. It
    shrinks the spread of the honest inputs by s, which turns Krum / RFA / CM into (delta,
    c)-robust aggregators under heterogeneity, at the cost of up to f contaminated buckets."""
    means, totals = bucket_means(x, s, rng, weights)
    return inner(means, normalized_weights(totals, len(means)) if totals is not None else None)


# ---------------------------------------------------------------- config and entry point


@dataclass
class RobustConfig:
    """Which aggregator the server uses, and its parameters (only the chosen rule's are read).

    name: mean | median | trimmed_mean | krum | multi_krum | geometric_median | centered_clipping.
    trim / trim_fraction: trimmed mean's b per side, or b = floor(trim_fraction * n) (one of them).
    byzantine: f, the Byzantine inputs Krum tolerates (n > 2f + 2 needed; with bucketing n is the
    number of buckets, and f stays f since each attacker spoils at most one bucket).
    select: multi-Krum's m (null: n - f).
    tol, max_iter, smoothing: the geometric median's Weiszfeld stop rule and nu.
    tau, clip_iters: centered clipping's radius (null: no clipping) and L.
    bucket_size: s; 1 is no bucketing (the FFGG authors' Byzantine run used s = 2 with median).
    """

    # The aggregation rule: mean (the algorithm's own average), median (coordinate-wise),
    # trimmed_mean, krum, multi_krum, geometric_median (RFA's smoothed Weiszfeld) or
    # centered_clipping.
    name: AggregatorName = "mean"
    # trimmed_mean only: b, the values dropped at each end per coordinate (>= 0). Set this or
    # trim_fraction.
    trim: int | None = None
    # trimmed_mean only: b = floor(trim_fraction * n), in [0, 0.5). Set this or trim.
    trim_fraction: float | None = None
    # krum and multi_krum: f, the Byzantine inputs tolerated (n > 2f + 2 needed; with bucketing n
    # counts buckets).
    byzantine: int = 0
    # multi_krum only: m, how many lowest-scoring inputs are averaged (>= 1); null: n - f.
    select: int | None = None
    # geometric_median only: stop when the objective improves by at most this, relative (> 0).
    tol: float = 1e-8
    # geometric_median only: the most Weiszfeld steps (>= 1).
    max_iter: int = 100
    # geometric_median only: nu, the floor on each distance that keeps a step finite (> 0).
    smoothing: float = 1e-6
    # centered_clipping only: the clipping radius, each step moving the aggregate by at most tau (>
    # 0); null: no clipping.
    tau: float | None = 1.0
    # centered_clipping only: L, the clipping steps per round (>= 1), starting from the previous
    # aggregate.
    clip_iters: int = 1
    # s: average random buckets of s inputs before the rule (Karimireddy et al. 2022); 1: no
    # bucketing.
    bucket_size: int = 1

    def validate_as(self, key: str = AGGREGATOR_KEY) -> None:
        """Checks that do not depend on the number of inputs; errors name `key`.<field>."""
        if self.name not in _RULES:
            raise ConfigError(f"{key}.name", f"unknown {self.name!r}; allowed: {AGGREGATORS}")
        _at_least(f"{key}.bucket_size", self.bucket_size, 1)
        if self.name == "trimmed_mean":
            if (self.trim is None) == (self.trim_fraction is None):
                raise ConfigError(f"{key}.trim", "set exactly one of trim and trim_fraction")
            if self.trim is not None:
                _at_least(f"{key}.trim", self.trim, 0)
            else:
                _fraction(f"{key}.trim_fraction", self.trim_fraction, 0.5)
        if self.name in ("krum", "multi_krum"):
            _at_least(f"{key}.byzantine", self.byzantine, 0)
            if self.select is not None:
                _at_least(f"{key}.select", self.select, 1)
        if self.name == "geometric_median":
            _positive_number(f"{key}.tol", self.tol)
            _at_least(f"{key}.max_iter", self.max_iter, 1)
            _positive_number(f"{key}.smoothing", self.smoothing)
        if self.name == "centered_clipping":
            if self.tau is not None:
                _positive_number(f"{key}.tau", self.tau)
            _at_least(f"{key}.clip_iters", self.clip_iters, 1)

    def check_inputs(self, n: int, key: str = AGGREGATOR_KEY) -> None:
        """Checks against n, the number of vectors the rule will see (buckets when bucketing)."""
        if self.name == "trimmed_mean":
            by_count = self.trim is not None
            b = self.trim if by_count else math.floor(self.trim_fraction * n)
            if 2 * b >= n:
                raise ConfigError(
                    f"{key}.{'trim' if by_count else 'trim_fraction'}",
                    f"trimming {b} from each side of {n} inputs leaves none (need 2b < n)",
                )
        if self.name in ("krum", "multi_krum"):
            f = self.byzantine
            if n <= 2 * f + 2:
                raise ConfigError(
                    f"{key}.byzantine", f"Krum with f={f} needs more than 2f + 2 inputs, got {n}"
                )
            if self.name == "multi_krum" and self.select is not None and self.select > n:
                raise ConfigError(f"{key}.select", f"cannot average {self.select} of {n} inputs")


def aggregate(
    updates: ArrayLike,
    cfg: RobustConfig,
    rng: np.random.Generator | None,
    reference: ArrayLike | None = None,
    weights: ArrayLike | None = None,
) -> np.ndarray:
    """ARAgg(x_1, ..., x_n) as configured: the server step of FFGG Alg. 5 line 9.

    `rng` drives bucketing's shuffle (may be None without bucketing); `reference` is centered
    clipping's starting point (the previous aggregate); `weights` (e.g. data sizes) are honoured
    by mean, geometric_median and centered_clipping only, since a weighted median or Krum score
    has no agreed definition and a Byzantine client could inflate its own weight anyway."""
    cfg.validate_as()
    x = as_stack(updates)
    # Raw weights go to bucketing, which normalizes after its canonical reordering, so that
    # not even the rounding of the weights' sum depends on the input order.
    w = checked_weights(weights, len(x))
    if w is not None and cfg.name not in WEIGHTED:
        raise ValueError(f"aggregator {cfg.name!r} takes no weights; weighted: {sorted(WEIGHTED)}")
    ref = None if reference is None else np.asarray(reference, dtype=np.float64)

    def rule(stack: np.ndarray, wts: np.ndarray | None) -> np.ndarray:
        return _RULES[cfg.name](stack, cfg, ref, wts)

    if cfg.bucket_size == 1:
        cfg.check_inputs(len(x))
        return rule(x, None if w is None else w / w.sum())
    if rng is None:
        raise ValueError("bucketing needs a numpy Generator (derive it from the seed and round)")
    cfg.check_inputs(math.ceil(len(x) / cfg.bucket_size))
    return bucketing(x, cfg.bucket_size, rng, rule, w)


# Each rule with its config bound: (stack, cfg, reference, normalized weights) -> [d].
_Opt = np.ndarray | None
_Bound = Callable[[np.ndarray, RobustConfig, _Opt, _Opt], np.ndarray]


def _mean(x: np.ndarray, cfg: RobustConfig, ref: _Opt, w: _Opt) -> np.ndarray:
    return mean(x, w)


def _median(x: np.ndarray, cfg: RobustConfig, ref: _Opt, w: _Opt) -> np.ndarray:
    return coordinate_median(x)


def _trimmed(x: np.ndarray, cfg: RobustConfig, ref: _Opt, w: _Opt) -> np.ndarray:
    return trimmed_mean(x, trim_count(len(x), cfg.trim, cfg.trim_fraction))


def _krum(x: np.ndarray, cfg: RobustConfig, ref: _Opt, w: _Opt) -> np.ndarray:
    return krum(x, cfg.byzantine)


def _multi_krum(x: np.ndarray, cfg: RobustConfig, ref: _Opt, w: _Opt) -> np.ndarray:
    return multi_krum(x, cfg.byzantine, cfg.select)


def _gm(x: np.ndarray, cfg: RobustConfig, ref: _Opt, w: _Opt) -> np.ndarray:
    return geometric_median(x, w, tol=cfg.tol, max_iter=cfg.max_iter, smoothing=cfg.smoothing)


def _cc(x: np.ndarray, cfg: RobustConfig, ref: _Opt, w: _Opt) -> np.ndarray:
    tau = math.inf if cfg.tau is None else cfg.tau
    return centered_clipping(x, ref, tau=tau, iters=cfg.clip_iters, weights=w)


_RULES: dict[str, _Bound] = {
    "mean": _mean,
    "median": _median,
    "trimmed_mean": _trimmed,
    "krum": _krum,
    "multi_krum": _multi_krum,
    "geometric_median": _gm,
    "centered_clipping": _cc,
}

AGGREGATORS: tuple[str, ...] = tuple(_RULES)
WEIGHTED = frozenset({"mean", "geometric_median", "centered_clipping"})


def _at_least(key: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(key, f"must be an integer >= {low}, got {value!r}")


def _positive_number(key: str, value: object) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf
    if not ok:
        raise ConfigError(key, f"must be a finite number > 0, got {value!r}")


def _fraction(key: str, value: object, below: float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < below
    if not ok:
        raise ConfigError(key, f"must be a number in [0, {below}), got {value!r}")
