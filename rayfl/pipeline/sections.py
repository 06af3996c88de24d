"""The job sections of the round pipeline: `privacy:`, `compression:` and `robust:`.

Each applies to every algorithm whose upload is model-shaped (its config declares `uploads`,
the keys of its clients' answers the server only ever averages). The checks that need more than
one section (which algorithm, pre-aggregation, the cohort) live in `check_pipeline`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rayfl.checks import choice, positive_float
from rayfl.errors import ConfigError
from rayfl.pipeline.compression import CompressionConfig
from rayfl.robust.aggregators import RobustConfig
from rayfl.robust.attacks import AttackConfig, byzantine_count


@dataclass
class PrivacyConfig:
    """Client-level differential privacy (DP-FedAvg, McMahan et al., ICLR 2018).

    Each client's update (every uploaded array together, as one vector) is clipped to L2 norm
    `clip`. `central`: the server adds Gaussian noise of std `noise_multiplier * clip` once to
    the sum of the round's clipped updates, and divides by the expected cohort size (every
    client counts equally: the sensitivity bound needs it). `local`: each client adds that
    noise to its own clipped update before sending it. Epsilon at `delta` after each round is
    in the `rounds` table (column `epsilon`), computed by Google's dp-accounting; under `local`,
    that of the client asked for the most uploads so far (`dp_most_uploads`)."""

    # Differential privacy: off; central (clip each update, the server adds Gaussian noise to the
    # sum); local (each client noises its own clipped upload).
    mode: Literal["off", "central", "local"] = "off"
    # C: the L2 norm every client's update is clipped to (the initial C with `adaptive`)
    clip: float = 1.0
    # z: noise std = z * C. Set this or `target_epsilon`, not both
    noise_multiplier: float | None = None
    # calibrate z before the run so that epsilon after run.rounds rounds is this
    target_epsilon: float | None = None
    # delta of (epsilon, delta)-DP; null: 1 / num_clients ** 1.1, the paper's choice
    delta: float | None = None
    # how the round's clients are drawn, as the accountant assumes: poisson (each client
    # independently with probability cohort / num_clients) or fixed (exactly the cohort,
    # without replacement; accounted by RDP only)
    sampling: Literal["poisson", "fixed"] = "poisson"
    # rdp (Renyi DP) or pld (privacy loss distributions: tighter, slower, Poisson only)
    accountant: Literal["rdp", "pld"] = "rdp"
    # refuse to start a run whose epsilon after run.rounds would exceed this
    max_epsilon: float | None = None
    # adaptive clipping (Andrew et al., NeurIPS 2021): C follows the `target_quantile` of the
    # update norms, C <- C * exp(-clip_lr * (noised fraction of unclipped updates - quantile))
    adaptive: bool = False
    # adaptive only: the quantile of update norms the clip C tracks, in (0, 1).
    target_quantile: float = 0.5
    # adaptive only: the geometric step size of C's update (> 0).
    clip_lr: float = 0.2
    # std of the noise on the count of unclipped updates; null: cohort / 20 (the paper's)
    clip_count_stddev: float | None = None

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def validate(self) -> None:
        choice("privacy.mode", self.mode, ("off", "central", "local"))
        choice("privacy.sampling", self.sampling, ("poisson", "fixed"))
        choice("privacy.accountant", self.accountant, ("rdp", "pld"))
        if not self.on:
            return
        positive_float("privacy.clip", self.clip)
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ConfigError("privacy.noise_multiplier", "set exactly one of noise_multiplier and target_epsilon")
        if self.noise_multiplier is not None:
            positive_float("privacy.noise_multiplier", self.noise_multiplier)
        if self.target_epsilon is not None:
            positive_float("privacy.target_epsilon", self.target_epsilon)
        if self.delta is not None and not 0 < self.delta < 1:
            raise ConfigError("privacy.delta", f"must be in (0, 1), got {self.delta}")
        if self.max_epsilon is not None:
            positive_float("privacy.max_epsilon", self.max_epsilon)
        if self.accountant == "pld" and (self.sampling == "fixed" or self.mode == "local"):
            why = "fixed-size sampling" if self.sampling == "fixed" else "local DP"
            raise ConfigError("privacy.accountant", f"pld does not account {why} here; use rdp")
        if self.adaptive:
            if self.mode != "central":
                raise ConfigError("privacy.adaptive", "adaptive clipping is for central DP (privacy.mode: central)")
            if not 0 < self.target_quantile < 1:
                raise ConfigError("privacy.target_quantile", f"must be in (0, 1), got {self.target_quantile}")
            positive_float("privacy.clip_lr", self.clip_lr)
            if self.clip_count_stddev is not None:
                positive_float("privacy.clip_count_stddev", self.clip_count_stddev)


@dataclass
class RobustSection:
    """Byzantine clients and a robust aggregator, for any algorithm with a model-shaped upload.

    `attack`: who is Byzantine (`count` or `fraction` of all clients, fixed for the run from its
    seed) and what they send (rayfl.robust.attacks: sign_flip, random_sign, gaussian, constant,
    alie, ipm, label_flip). `aggregator`: what replaces the server's weighted mean
    (rayfl.robust.aggregators: median, trimmed_mean, krum, multi_krum, geometric_median,
    centered_clipping; `mean` keeps the algorithm's own average, to measure an attack)."""

    # What replaces the server's weighted mean of the uploads (sub-keys below); name mean keeps the
    # algorithm's own average.
    aggregator: RobustConfig = field(default_factory=RobustConfig)
    # Which clients are Byzantine and what they send (sub-keys below); name none: no attack.
    attack: AttackConfig = field(default_factory=AttackConfig)

    @property
    def on(self) -> bool:
        return self.robust_aggregator or self.attack.name != "none"

    @property
    def robust_aggregator(self) -> bool:
        """Anything but the plain mean (a bucketed mean included)."""
        return self.aggregator.name != "mean" or self.aggregator.bucket_size != 1

    @property
    def needs_every_update(self) -> bool:
        """A non-linear rule (or an omniscient attack) reads each client's vector."""
        return self.on

    def validate(self) -> None:
        self.aggregator.validate_as("robust.aggregator")
        self.attack.validate_as("robust.attack")


def active(cfg: Any) -> list[str]:
    """The pipeline sections a config turns on, by name."""
    on = []
    if cfg.privacy.on:
        on.append("privacy")
    if cfg.compression.name != "none":
        on.append("compression")
    if cfg.robust.on:
        on.append("robust")
    return on


def check_pipeline(cfg: Any, algorithm: Any = None) -> None:
    """Checks across sections, before anything runs: the algorithm must upload something
    model-shaped and not refuse the sections; robust aggregation needs every update (no host
    pre-aggregation); combinations without a sound meaning are refused, naming why.
    `algorithm`: the parts-built class the config names (None: a hand-written loop)."""
    alg = cfg.algorithm
    plain = getattr(type(alg), "robust_variant_of", None)
    if plain is not None and not cfg.robust.robust_aggregator:
        raise ConfigError("robust.aggregator", f"{alg.name} is {plain} with a robust aggregator; set robust.aggregator, "
                                               f"e.g. {{name: median, bucket_size: 2}}, or run {plain} for the plain mean")
    sections = active(cfg)
    if not sections:
        return
    first = sections[0]
    from rayfl.driver.checks import asynchrony_of

    cls = algorithm
    if cls is not None:
        why = cls.refuses_pipeline(cfg, sections)
        if why is not None:
            raise ConfigError(first, f"{first} does not apply to {alg.name}: {why}")
    elif not getattr(type(alg), "uploads", ()):
        raise ConfigError(first, f"the server loop {alg.name!r} declares no model-shaped upload (`uploads` on its config "
                                 "class), so the round pipeline cannot transform it")
    if getattr(alg, "server_as_client", False):
        raise ConfigError("algorithm.server_as_client", f"the server's own update would bypass {first}; set it to false")
    if cfg.robust.on:
        check_attack(cfg)
    if cfg.robust.on and cfg.engine.preaggregate == "on":
        raise ConfigError("engine.preaggregate", "robust aggregation needs every client's update on the server; "
                                                 "set engine.preaggregate to auto or off")
    if cfg.robust.on and cfg.privacy.mode == "central":
        raise ConfigError("robust", "a robust rule's output is not a sum of clipped updates, so noise calibrated to a "
                                    "sum's sensitivity does not make it private; use privacy.mode: local (each client "
                                    "noises its own upload, which the rule then only post-processes)")
    settings = asynchrony_of(cfg, cls)
    synchronous = settings is None
    if cfg.robust.on and settings is not None and settings.buffer_size == 1:
        raise ConfigError("robust", f"{alg.name} applies each arrival alone (a buffer of 1): a robust rule over one "
                                    "update is that update; buffer several (asynchrony.buffer_size, or fedbuff)")
    if cfg.privacy.on and synchronous and alg.participation is None and alg.clients_per_round is None:
        raise ConfigError("privacy", "needs a cohort size: set algorithm.clients_per_round or algorithm.participation")
    if cfg.privacy.on and cfg.privacy.sampling == "poisson" and cfg.system.policy == "over_selection":
        raise ConfigError("privacy.sampling", "over-selection draws a fixed number of clients; use sampling: fixed")


def check_attack(cfg: Any) -> None:
    """A data attack needs labels to flip; fewer than half the clients may be Byzantine (checked
    here when the config alone says how many clients there are, else when the run starts)."""
    attack = cfg.robust.attack
    if attack.data_attack and not cfg.data.has_labels():
        raise ConfigError("robust.attack.name", f"{attack.name} needs labels; data.dataset {cfg.data.dataset!r} has none")
    clients = cfg.planned_clients()
    if clients is not None:
        byzantine_count(clients, attack, "robust.attack")


__all__ = ["CompressionConfig", "PrivacyConfig", "RobustSection", "active", "check_pipeline"]
