"""Byzantine clients for BR-FFGG (FFGG Alg. 5 line 7: "Byzantine clients can send anything";
App. D: they are omniscient, knowing the honest updates and the aggregation rule).

Model attacks replace the vector a Byzantine client uploads; they see the round's honest vectors
where the attack needs them (ALIE, IPM). Label flipping is a data attack: the Byzantine client
trains honestly on relabelled data, so its upload is its own update. All randomness comes from a
`numpy.random.Generator` the caller derives from (run seed, purpose, round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, TypeVar, get_args

import numpy as np
from numpy.typing import ArrayLike

from rayfl.errors import ConfigError
from rayfl.robust.aggregators import column_blocks, rows_mean

AttackName = Literal[
    "none", "sign_flip", "random_sign", "gaussian", "constant", "alie", "ipm", "label_flip"
]
ATTACKS: tuple[str, ...] = get_args(AttackName)

# The attacks whose uploads start from each Byzantine client's own vector (`craft`'s `own`); the
# others need only how many Byzantine clients there are.
FROM_OWN = frozenset({"none", "label_flip", "sign_flip", "random_sign"})

# Where an AttackConfig sits in a job file, for error messages.
ATTACK_KEY = "robust.attack"

Labels = TypeVar("Labels")


# ---------------------------------------------------------------- model attacks


def sign_flip(own: ArrayLike, scale: float = 1.0) -> np.ndarray:
    """-s * x for each row x: the gradient flip of the FFGG authors' Byzantine run (s = 1; the
    literature's "bit flip" BF, Karimireddy et al. 2021) and its scaled variant. The FFGG paper names
    no attack: its Alg. 5, line 7, lets Byzantine clients "send anything"."""
    return -float(scale) * np.asarray(own, dtype=np.float64)


def random_sign(own: ArrayLike, rng: np.random.Generator, prob: float = 0.5) -> np.ndarray:
    """Random sign noise: each coordinate's sign flipped independently with probability p.

    The FFGG paper defines no attack (Alg. 5, line 7); this keeps every magnitude and
    randomizes directions (p = 1/2: the sign bits become coin flips; p = 1: `sign_flip`)."""
    x = np.asarray(own, dtype=np.float64)
    return np.where(rng.random(x.shape) < prob, -x, x)


def gaussian(count: int, dim: int, rng: np.random.Generator, sigma: float) -> np.ndarray:
    """count vectors of i.i.d. N(0, sigma^2) coordinates, sent instead of an update (the
    "random Gaussian" attack of the Byzantine-robustness literature)."""
    return float(sigma) * rng.standard_normal((count, dim))


def constant(count: int, dim: int, value: float) -> np.ndarray:
    """The "arbitrary constant" attack: every coordinate equals `value` (a vector that ignores
    the honest ones, which FFGG's Alg. 5, line 7, allows: "send anything")."""
    return np.full((count, dim), float(value))


def alie_z(n: int, f: int) -> float:
    """z_max of "A Little Is Enough" (Baruch et al. 2019): with s = floor(n/2 + 1) - f honest
    supporters needed for a majority, z = Phi^-1((n - s) / n); n all clients, f Byzantine.

    (Some public implementations use Phi^-1((n - f - s) / (n - f)); this follows the paper.)"""
    s = math.floor(n / 2 + 1) - f
    p = (n - s) / n
    if not 0 < p < 1:
        raise ValueError(f"ALIE's z is undefined for n={n}, f={f} (Phi^-1({p}))")
    return NormalDist().inv_cdf(p)


def alie(
    honest: ArrayLike, count: int, z: float | None = None, *, rows: np.ndarray | None = None
) -> np.ndarray:
    """ALIE (Baruch et al. 2019): every Byzantine sends mu - z sigma, with mu and sigma the
    coordinate-wise mean and (population) standard deviation of the honest vectors: a small
    shift inside the honest spread, which medians and Krum do not reject. z defaults to
    `alie_z(n, f)` with n = honest + count, f = count.

    `rows`: the honest vectors are honest[rows] (read in place, as in `craft`). The moments are
    taken one column block at a time, bit for bit numpy's whole-stack mean and std."""
    h, rows = _honest(honest, rows)
    g = len(h) if rows is None else len(rows)
    z = alie_z(g + count, count) if z is None else float(z)
    mu, sigma = np.empty(h.shape[1]), np.empty(h.shape[1])
    for cols in column_blocks(g, h.shape[1]):
        block = h[:, cols] if rows is None else h[rows, cols]
        mu[cols], sigma[cols] = block.mean(axis=0), block.std(axis=0)
    sigma *= z  # mu - z * sigma, in place: the same two roundings, no more [d] temporaries
    mu -= sigma
    return np.tile(mu, (count, 1))


def ipm(
    honest: ArrayLike, count: int, epsilon: float = 0.1, *, rows: np.ndarray | None = None
) -> np.ndarray:
    """Inner-product manipulation (Xie et al. 2020): every Byzantine sends -eps * mean(honest),
    making the aggregate's inner product with the true mean negative for a large enough eps.
    `rows`: the honest vectors are honest[rows] (read in place, as in `craft`)."""
    h, rows = _honest(honest, rows)
    return np.tile(-float(epsilon) * rows_mean(h, rows), (count, 1))


# ---------------------------------------------------------------- data attack


def flip_labels(y: Labels, num_classes: int) -> Labels:
    """Label flipping: y -> C - 1 - y, applied to a Byzantine client's labels (numpy or torch
    integer arrays; the type is kept)."""
    if num_classes < 2:
        raise ValueError(f"label flipping needs >= 2 classes, got {num_classes}")
    if bool((y < 0).any()) or bool((y >= num_classes).any()):  # type: ignore[operator]
        raise ValueError(f"labels must lie in [0, {num_classes})")
    return num_classes - 1 - y  # type: ignore[operator,return-value]


# ---------------------------------------------------------------- config and entry points


@dataclass
class AttackConfig:
    """Who is Byzantine and what they send.

    name: none | sign_flip | random_sign | gaussian | constant | alie | ipm | label_flip.
    count / fraction: B Byzantine clients, or B = floor(fraction * M) (one of them; Alg. 5 needs
    delta < 1/2). scale: sign_flip's s. flip_prob: random_sign's p. sigma: gaussian's std.
    value: constant's value. z: ALIE's z (null: Baruch et al.'s z_max from n and f).
    epsilon: IPM's eps (default 0.1: small, so the attack hides inside the honest spread).
    """

    # What Byzantine clients send: none; sign_flip (-scale * own update); random_sign (each sign
    # flipped with flip_prob); gaussian (N(0, sigma^2) noise); constant (every coordinate value);
    # alie (honest mean - z * std); ipm (-epsilon * honest mean); label_flip (train on labels C - 1
    # - y).
    name: AttackName = "none"
    # B, the number of Byzantine clients (fixed for the run from its seed; 2B < clients). Set this
    # or fraction.
    count: int | None = None
    # B = floor(fraction * clients), in [0, 0.5). Set this or count.
    fraction: float | None = None
    # sign_flip only: s, the factor on the flipped update (> 0).
    scale: float = 1.0
    # random_sign only: each coordinate's probability of a flipped sign, in [0, 1].
    flip_prob: float = 0.5
    # gaussian only: the noise's standard deviation (> 0).
    sigma: float = 1.0
    # constant only: the value of every coordinate sent.
    value: float = 0.0
    # alie only: how many honest standard deviations the crafted vector sits below the mean; null:
    # Baruch et al.'s z_max from n and B.
    z: float | None = None
    # ipm only: eps of -eps * honest mean (> 0); small, so the attack hides inside the honest
    # spread.
    epsilon: float = 0.1

    @property
    def data_attack(self) -> bool:
        """True when the attack changes a Byzantine client's data (labels), not its upload."""
        return self.name == "label_flip"

    def validate_as(self, key: str = ATTACK_KEY) -> None:
        """Checks that do not depend on the number of clients; errors name `key`.<field>."""
        if self.name not in ATTACKS:
            raise ConfigError(f"{key}.name", f"unknown {self.name!r}; allowed: {ATTACKS}")
        if self.name != "none" and (self.count is None) == (self.fraction is None):
            raise ConfigError(f"{key}.count", "set exactly one of count and fraction")
        if self.count is not None:
            _integer(f"{key}.count", self.count)
        if self.fraction is not None and not (_number(self.fraction) and 0 <= self.fraction < 0.5):
            raise ConfigError(f"{key}.fraction", f"must be in [0, 0.5), got {self.fraction!r}")
        checks = {
            "sign_flip": ("scale", _number(self.scale) and self.scale > 0, "a number > 0"),
            "random_sign": ("flip_prob", _number(self.flip_prob) and 0 <= self.flip_prob <= 1,
                            "a probability in [0, 1]"),
            "gaussian": ("sigma", _number(self.sigma) and self.sigma > 0, "a number > 0"),
            "constant": ("value", _number(self.value), "a finite number"),
            "alie": ("z", self.z is None or _number(self.z), "a finite number or null"),
            "ipm": ("epsilon", _number(self.epsilon) and self.epsilon > 0, "a number > 0"),
        }
        if self.name in checks:
            field, ok, what = checks[self.name]
            if not ok:
                raise ConfigError(f"{key}.{field}", f"must be {what}, got {getattr(self, field)!r}")


def byzantine_count(num_clients: int, cfg: AttackConfig, key: str = ATTACK_KEY) -> int:
    """B: `count`, or floor(fraction * M), the largest B <= delta M (FFGG, App. D); 2B < M required."""
    if cfg.name == "none":
        return 0
    b = cfg.count if cfg.count is not None else math.floor(cfg.fraction * num_clients)
    if 2 * b >= num_clients:
        field = "count" if cfg.count is not None else "fraction"
        raise ConfigError(f"{key}.{field}", f"{b} Byzantine of {num_clients} clients is not < 1/2")
    return b


def choose_byzantine(num_clients: int, cfg: AttackConfig, rng: np.random.Generator) -> np.ndarray:
    """The Byzantine client ids, sorted: B of range(M) drawn without replacement from `rng`."""
    b = byzantine_count(num_clients, cfg)
    return np.sort(rng.choice(num_clients, size=b, replace=False))


def craft(
    cfg: AttackConfig,
    honest: ArrayLike,
    rng: np.random.Generator,
    own: ArrayLike | None = None,
    count: int | None = None,
    *,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """The [B, d] vectors the Byzantine clients upload this round.

    `honest` is the [G, d] stack of honest uploads (the omniscient view). `own` is the [B, d]
    stack of what the Byzantine clients would have sent honestly; without it (attackers added
    on top of M clients, as in the FFGG authors' run) give `count`, and sign-based attacks start
    from the vector of an honest client drawn per attacker (the FFGG paper runs no Byzantine
    experiment; the authors' public Byzantine notebook does this). `none` and
    `label_flip` send `own` as is (a label-flipper's update comes from its flipped data).

    `rows` (G row indices): the honest uploads are honest[rows], read in place rather than
    copied, since the server's stack is most of the driver's memory; the result is the same."""
    h, rows = _honest(honest, rows)
    g = len(h) if rows is None else len(rows)
    base = None if own is None else np.atleast_2d(np.asarray(own, dtype=np.float64))
    b = len(base) if base is not None else count
    if b is None or (count is not None and b != count):
        raise ValueError("give `own` (one row per Byzantine client) or `count`, consistently")
    name = cfg.name
    if name in ("none", "label_flip"):
        if base is None:
            raise ValueError(f"attack {name!r} uploads the Byzantines' own updates: give `own`")
        return base.copy()
    if name in ("sign_flip", "random_sign") and base is None:
        picks = rng.integers(g, size=b)
        base = h[picks if rows is None else rows[picks]]
    if name == "sign_flip":
        return sign_flip(base, cfg.scale)
    if name == "random_sign":
        return random_sign(base, rng, cfg.flip_prob)
    if name == "gaussian":
        return gaussian(b, h.shape[1], rng, cfg.sigma)
    if name == "constant":
        return constant(b, h.shape[1], cfg.value)
    if name == "alie":
        return alie(h, b, cfg.z, rows=rows)
    if name == "ipm":
        return ipm(h, b, cfg.epsilon, rows=rows)
    raise ValueError(f"unknown attack {name!r}")


def _honest(
    honest: ArrayLike, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The stack as float64 (no copy if it is already) and `rows` as indices, checked: the
    honest vectors are h[rows], or all of h when rows is None."""
    h = np.asarray(honest, dtype=np.float64)
    shape = h.shape if rows is None else (len(rows), *h.shape[1:])
    if h.ndim != 2 or shape[0] == 0:
        raise ValueError(f"need a non-empty [G, d] stack of honest vectors, got shape {shape}")
    return h, None if rows is None else np.asarray(rows, dtype=np.intp)


def _integer(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(key, f"must be an integer >= 0, got {value!r}")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
