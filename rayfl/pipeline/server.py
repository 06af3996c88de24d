"""The server's half of the round pipeline: what replaces a plain weighted sum of the clients'
model-shaped uploads, and what each round records.

The Federation consults it at four points, so no algorithm carries code for any of this:

- `poisson`: whether the cohort is Poisson-sampled (at `mechanism.rate`), as the privacy
  accountant assumes;
- `upload_spec`: what hosts do to each answer before it leaves (rayfl.pipeline.uploads);
- `combine`: the sum of an upload key, robust (an attack crafted into the stack, then the
  robust rule) or private (the exact sum of clipped updates, plus Gaussian noise once, over the
  expected cohort);
- `finish_round`: adaptive clipping's step and the round's `epsilon`, `dp_*` columns.

Every draw comes from (run seed, purpose, round), so any host layout gives the same bits; the
state that moves between rounds (adaptive clip, centered clipping's reference) is checkpointed."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rayfl.errors import ConfigError
from rayfl.pipeline.accounting import Mechanism, calibrate_noise, epsilon, epsilons
from rayfl.pipeline.sections import active
from rayfl.pipeline.uploads import UploadSpec
from rayfl.rng import numpy_rng
from rayfl.robust.aggregators import WEIGHTED, aggregate
from rayfl.robust.server import ByzantineServer

ExactSum = Callable[[list[Any], str, Sequence[float]], np.ndarray]


@dataclass
class PipelineState:
    """What the pipeline carries from round to round (checkpointed with the run)."""

    clip: float | None = None  # this round's clip bound (adaptive clipping moves it)
    references: dict[str, np.ndarray] = field(default_factory=dict)  # centered clipping's, per key
    uploads: np.ndarray | None = None  # local DP: per client id, the rounds it was asked to upload in


@dataclass
class RoundStats:
    """What this round's upload calls told the server, for its `rounds` row."""

    norms: list[float] = field(default_factory=list)


def asynchronous_buffer(cfg: Any) -> int | None:
    """K, the arrivals each server step of an asynchronous run combines; None: synchronous."""
    from rayfl.driver.checks import asynchrony_of
    from rayfl.registry import algorithm_class

    settings = asynchrony_of(cfg, algorithm_class(cfg))
    return None if settings is None else int(settings.buffer_size)


def cohort_size(cfg: Any, num_clients: int) -> int:
    """The expected number of clients per round: clients_per_round, or participation * N;
    asynchronously the buffer's K arrivals per server step."""
    alg = cfg.algorithm
    buffer = asynchronous_buffer(cfg)
    if buffer is not None:
        return min(buffer, num_clients)
    if alg.participation is not None:
        return max(1, int(math.floor(alg.participation * num_clients + 0.5)))
    return min(int(alg.clients_per_round), num_clients)


def mechanism(cfg: Any, num_clients: int, noise_multiplier: float) -> Mechanism:
    """The privacy mechanism one round of this run is, as the accountant sees it. An
    asynchronous server step noises the sum of its buffer's clipped updates, each client in it
    at most once (the dispatcher sees to it), and nobody was sampled at random: a Gaussian
    mechanism of sensitivity C with no amplification (`all`), composed over the steps."""
    p = cfg.privacy
    cohort = cohort_size(cfg, num_clients)
    if p.mode == "local":
        sampling = "local"
    elif cohort >= num_clients or asynchronous_buffer(cfg) is not None:
        sampling = "all"
    else:
        sampling = p.sampling
    return Mechanism(noise_multiplier=noise_multiplier, sampling=sampling, num_clients=num_clients, cohort=cohort)


def resolve_noise(cfg: Any, num_clients: int) -> tuple[float, float, float]:
    """(z, delta, epsilon after run.rounds): z given or calibrated to `target_epsilon`; a
    ConfigError when the run would spend more than `max_epsilon`. Called before any round."""
    p = cfg.privacy
    delta = p.delta if p.delta is not None else float(num_clients) ** -1.1
    rounds = cfg.run.rounds
    z, total = planned_noise(mechanism(cfg, num_clients, 1.0), rounds, p.noise_multiplier, p.target_epsilon, delta,
                             p.accountant)
    if p.max_epsilon is not None and total > p.max_epsilon:
        raise ConfigError("privacy.max_epsilon", f"{rounds} rounds at noise multiplier {z:.4g} spend epsilon {total:.4g} "
                                                 f"at delta {delta:.3g}, over the limit {p.max_epsilon}; raise the noise "
                                                 "or lower run.rounds")
    return z, delta, total


@functools.lru_cache(maxsize=16)
def planned_noise(
    template: Mechanism, rounds: int, noise_multiplier: float | None, target_epsilon: float | None, delta: float,
    accountant: str,
) -> tuple[float, float]:
    """(z, epsilon after `rounds`) for a mechanism: z as given or calibrated. Remembered, since
    a run resolves it before Ray starts and again when its pipeline is built (a PLD
    calibration takes seconds)."""
    z = float(noise_multiplier) if noise_multiplier is not None else calibrate_noise(
        template, rounds, target_epsilon, delta, accountant)
    return z, epsilon(replace(template, noise_multiplier=z), rounds, delta, accountant)


class RoundPipeline:
    """The driver-side round pipeline of one run (see the module docstring)."""

    def __init__(self, cfg: Any, fed: Any):
        self.cfg = cfg
        self.seed = int(fed.seed)
        self.num_clients = fed.population.num_trainable  # N of the accountant: who can be sampled
        self.client_ids = int(fed.num_clients)  # every id, trainable or not
        self.num_classes = int(fed.dataset.num_classes)
        self.privacy = cfg.privacy if cfg.privacy.on else None
        self.compression = cfg.compression if cfg.compression.name != "none" else None
        self.robust = cfg.robust if cfg.robust.on else None
        self.byzantine = ByzantineServer(fed, cfg.robust.aggregator, cfg.robust.attack) if self.robust else None
        self.state = PipelineState()
        self.stats = RoundStats()
        self.keys: tuple[str, ...] = ()
        self.round = 0  # the server round in progress (its random streams); the Federation sets it
        self.cohort = cohort_size(cfg, self.num_clients)
        self.asynchronous = asynchronous_buffer(cfg) is not None
        self.z = self.delta = self.planned_epsilon = 0.0
        self._epsilons: dict[int, float] = {}
        self._asked: set[int] = set()  # local DP: the clients asked for an upload this round
        if self.privacy is not None:
            self.z, self.delta, self.planned_epsilon = resolve_noise(cfg, self.num_clients)
            self.state.clip = float(self.privacy.clip)
            if self.local:
                self.state.uploads = np.zeros(self.client_ids, dtype=np.int64)
            self.mechanism = mechanism(cfg, self.num_clients, self.z)
            # every round's epsilon at once: one accountant pass, not one per round (4.4 s of a
            # 100-round RDP run, 32 s with PLD, when recomputed each round)
            spent = epsilons(self.mechanism, cfg.run.rounds, self.delta, self.privacy.accountant)
            self._epsilons = {r + 1: e for r, e in enumerate(spent)}

    @classmethod
    def of(cls, cfg: Any, fed: Any) -> RoundPipeline | None:
        """The run's pipeline, or None when no section is on (the plain path, untouched)."""
        return cls(cfg, fed) if active(cfg) else None

    # ---------------------------------------------------------------- what the run records

    def manifest(self) -> dict[str, Any]:
        """The resolved settings a reader of the results needs (noise, delta, planned epsilon)."""
        out: dict[str, Any] = {"sections": active(self.cfg)}
        if self.privacy is not None:
            out.update(noise_multiplier=self.z, delta=self.delta, planned_epsilon=self.planned_epsilon,
                       cohort=self.cohort, sampling=self.mechanism.sampling, weighting="uniform over the expected cohort",
                       **({"asynchronous": "each server step noises its buffer's clipped sum; no amplification by "
                                           "sampling is assumed"} if self.asynchronous else {}))
        if self.byzantine is not None:
            out["byzantine"] = sorted(self.byzantine.byzantine)
        return out

    # ---------------------------------------------------------------- sampling

    @property
    def poisson(self) -> bool:
        return self.privacy is not None and self.mechanism.sampling == "poisson"

    # ---------------------------------------------------------------- client side

    @property
    def local(self) -> bool:
        """Local DP: each client noises its own upload."""
        return self.privacy is not None and self.privacy.mode == "local"

    @property
    def keeps_client_state(self) -> bool:
        """Error feedback makes every upload call change its clients' state."""
        return self.compression is not None and self.compression.error_feedback

    @property
    def needs_every_update(self) -> bool:
        return self.robust is not None

    def upload_spec(self, keys: tuple[str, ...], ids: list[int]) -> UploadSpec:
        """What hosts do to the answers of a call on `ids` (their own random streams come from
        each task's round and client, so this needs no round)."""
        self.keys = keys
        flip: frozenset[int] = frozenset()
        if self.byzantine is not None and self.cfg.robust.attack.data_attack:
            flip = frozenset(c for c in ids if c in self.byzantine.byzantine)
        local = self.z * self.state.clip if self.local else 0.0
        if self.local:
            self._asked.update(int(c) for c in ids)
        return UploadSpec(keys=keys, compression=self.compression, clip=self.state.clip, local_noise_std=local,
                          flip_labels=flip, num_classes=self.num_classes)

    def after_call(self, results: list[Any]) -> None:
        """Remember the accepted answers' norms (adaptive clipping, the clipped fraction)."""
        for r in results:
            norm = r.extra.get("pipeline", {}).get("update_norm")
            if norm is not None:
                self.stats.norms.append(float(norm))

    # ---------------------------------------------------------------- server side

    def combine(self, results: list[Any], key: str, weights: Sequence[float], exact_sum: ExactSum) -> np.ndarray:
        """What the server uses in place of sum_k weights[k] * results[k][key]."""
        total_weight = float(np.sum(np.asarray(weights, dtype=np.float64)))
        if self.robust is not None:
            return self._robust(results, key, weights) * mean_scale(weights)
        if self.privacy is not None and self.privacy.mode == "central":
            clipped_sum = exact_sum(results, key, [1.0] * len(results))
            rng = numpy_rng(self.seed, f"privacy.noise.{key}", self.round)
            noise = rng.normal(0.0, self.noise_std, size=clipped_sum.shape)
            return (clipped_sum + noise) * (total_weight / self.cohort)
        if self.privacy is not None:  # local: each upload is noised already; equal weights
            return exact_sum(results, key, [total_weight / self.cohort] * len(results))
        return exact_sum(results, key, weights)

    def _robust(self, results: list[Any], key: str, weights: Sequence[float]) -> np.ndarray:
        assert self.byzantine is not None
        stream = "" if key == self.keys[0] else f".{key}"
        shape = np.shape(results[0][key])
        stack = self.byzantine.vectors(results, key, self.round, stream=stream).reshape(len(results), -1)
        rule = self.cfg.robust.aggregator
        w = np.asarray(weights, dtype=np.float64)
        uniform = w.size > 0 and bool((w == w[0]).all())  # the unweighted rule: same value, no rounding of w
        w = w / w.sum() if rule.name in WEIGHTED and not uniform and w.sum() > 0 else None
        rng = numpy_rng(self.seed, "byzantine.aggregate" + stream, self.round)
        out = aggregate(stack, rule, rng, reference=self.state.references.get(key), weights=w)
        if rule.name == "centered_clipping":
            self.state.references[key] = out
        return out.reshape(shape)

    @property
    def noise_std(self) -> float:
        """Std of the server's noise on the sum: z * C, with adaptive clipping's share of the
        budget taken out (Andrew et al. 2021, Thm. 1: z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2)."""
        assert self.privacy is not None and self.state.clip is not None
        return self.update_noise_multiplier * self.state.clip

    @property
    def clip_count_stddev(self) -> float:
        assert self.privacy is not None
        p = self.privacy
        return p.clip_count_stddev if p.clip_count_stddev is not None else self.cohort / 20.0

    @property
    def update_noise_multiplier(self) -> float:
        if self.privacy is None or not self.privacy.adaptive:
            return self.z
        sigma_b = self.clip_count_stddev
        if 2.0 * sigma_b <= self.z:
            raise ConfigError("privacy.clip_count_stddev", f"adaptive clipping needs 2 * clip_count_stddev > noise "
                                                           f"multiplier ({2 * sigma_b:.4g} <= {self.z:.4g})")
        return (self.z**-2 - (2.0 * sigma_b) ** -2) ** -0.5

    def finish_round(self, round: int) -> dict[str, Any]:
        """The round's pipeline columns, and adaptive clipping's step for the next round."""
        norms = np.asarray(self.stats.norms, dtype=np.float64)
        self.round, self.stats = round + 1, RoundStats()
        if self.privacy is None:
            return {}
        clip = self.state.clip  # what this round clipped to: it moves only below
        most = self.count_uploads() if self.local else None
        row: dict[str, Any] = {
            "epsilon": self.epsilon_after(round + 1 if most is None else most),
            "dp_clip": clip,
            "dp_clipped_fraction": float(np.mean(norms > clip)) if len(norms) else float("nan"),
            "dp_noise_std": self.noise_std if self.privacy.mode == "central" else self.z * clip,
        }
        if most is not None:
            row["dp_most_uploads"] = most
        if self.privacy.adaptive:
            self.state.clip = adaptive_clip(clip, norms, self.privacy.target_quantile, self.privacy.clip_lr,
                                            self.cohort, self.clip_count_stddev, numpy_rng(self.seed, "privacy.clip_count", round))
        return row

    def count_uploads(self) -> int:
        """Local DP: count this round for every client asked to upload in it (once, however many
        upload calls the round made; whether or not its upload arrived, since it may have been
        seen) and return the most rounds any client has uploaded in. Each upload is that
        client's own Gaussian mechanism and the server knows who sent it, so the worst-off
        client's guarantee is the composition of its own uploads: epsilon after that many."""
        uploads = self.state.uploads
        assert uploads is not None
        uploads[sorted(self._asked)] += 1  # each id once: a round counts once
        self._asked = set()
        return int(uploads.max(initial=0))

    def epsilon_after(self, rounds: int) -> float:
        """Epsilon at delta after `rounds` rounds (each round counted, aggregated or not; under
        local DP, `rounds` of one client's uploads)."""
        if rounds == 0:
            return 0.0
        if rounds not in self._epsilons:
            self._epsilons[rounds] = epsilon(self.mechanism, rounds, self.delta, self.privacy.accountant)
        return self._epsilons[rounds]

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        uploads = None if self.state.uploads is None else self.state.uploads.copy()
        return {"state": replace(self.state, references=dict(self.state.references), uploads=uploads)}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.state = saved["state"]


def mean_scale(weights: Sequence[float]) -> float:
    """What a robust aggregate (a mean) is multiplied by to stand in for sum_k w_k x_k: the
    total weight, or exactly 1 for weights meant to sum to 1 (1/n each, n_k / N), whose rounded
    sum may miss 1 by an ulp that would only perturb the result's last bits."""
    total = math.fsum(float(w) for w in weights)
    return 1.0 if abs(total - 1.0) <= len(weights) * 2.0**-52 else total


def adaptive_clip(
    clip: float, norms: np.ndarray, quantile: float, lr: float, cohort: int, stddev: float, rng: np.random.Generator
) -> float:
    """Andrew et al. 2021, Alg. 1: C <- C * exp(-lr * (b - quantile)) with b the noised
    fraction of the round's updates no longer than C, (sum 1[norm <= C] + N(0, stddev^2)) / m."""
    unclipped = float(np.sum(norms <= clip))
    b = (unclipped + rng.normal(0.0, stddev)) / cohort
    return float(clip * math.exp(-lr * (b - quantile)))
