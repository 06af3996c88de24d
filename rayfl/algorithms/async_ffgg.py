"""Asynchronous FFGG (Alg. 3, arXiv 2305.18285; spec Sec. 3.4 and 6.1-6.4) on the exact
asynchronous engine (`Federation.async_pool`): `concurrency` jobs are in flight; each server
step takes the earliest job on the simulated clock, applies its delayed operator

    theta^{r+1} = theta^r - gamma_theta(d) Delta_{j_r},   Delta_{j_r} = grad_theta f_j(theta^{r-d}, w^tau)

with no averaging and no buffer, and dispatches a new job: to a client drawn uniformly from
all M clients (`dispatch: theory`, what the proof's E_r[F_{m_r}(theta^r)] = F(theta^r) needs;
a client may then run two jobs at once) or back to the finishing worker (`dispatch: worker`,
the authors' Ray notebook). The new job starts from theta^{r+1} (`dispatch_model: new`, Alg. 3
line 6) or from theta^r (`old`: the proof's F_{m_r}(theta^r) and the authors' code).

Step size: `constant` server_lr (null: 1/L), `theory` 1/(2 L sqrt(2 K tau_max)) with K the
concurrency (the number of *active* clients, spec 6.3) and tau_max = algorithm.tau_max, or
`delay_adaptive` gamma K / max(K, d) (the authors' notebook). `max_staleness` drops staler
updates (A5's bound enforced). One `rounds` row per applied update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from rayfl.algorithms.ffgg import (
    FFGGConfig,
    Split,
    check_finite,
    check_solver,
    evaluate_if_due,
    ffgg_client,
    fine_tune_of,
    server_split,
    step_sizes,
)
from rayfl.algorithms.finetune import FineTune
from rayfl.config import ConfigError, RunConfig
from rayfl.engine import AsyncPool, ClientResult, Federation
from rayfl.rng import numpy_rng


@dataclass
class AsyncFFGGConfig(FFGGConfig):
    uploads: ClassVar[tuple[str, ...]] = ()  # each update is applied alone: no aggregate to make robust
    name: str = "async_ffgg"
    # K, the jobs in flight at any time (>= 1); each server step applies the earliest to finish.
    concurrency: int = 8
    # Who runs the next job: theory (a client drawn uniformly from all, busy or not: the proof's
    # assumption) or worker (the one that just finished: the authors' notebook).
    dispatch: Literal["theory", "worker"] = "theory"
    # The model a new job starts from: new (theta after this step, Alg. 3 line 6) or old (theta
    # before it: the proof and the authors' code).
    dispatch_model: Literal["new", "old"] = "new"
    # gamma_theta of an update of delay d: constant (server_lr, null: 1/L); theory (1/(2 L sqrt(2 K
    # tau_max)), the quadratic only); delay_adaptive (server_lr * K / max(K, d)).
    step_rule: Literal["constant", "theory", "delay_adaptive"] = "constant"
    # The delay bound step_rule theory assumes (>= 1); null otherwise.
    tau_max: int | None = None
    # Drop updates whose delay exceeds this many server steps (>= 0, A5's bound enforced); null:
    # keep all.
    max_staleness: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.concurrency < 1:
            raise ConfigError("algorithm.concurrency", f"must be >= 1, got {self.concurrency}")
        if self.step_rule == "theory" and (self.tau_max is None or self.tau_max < 1):
            raise ConfigError("algorithm.tau_max", "step_rule 'theory' needs the delay bound tau_max >= 1")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError("algorithm.max_staleness", f"must be >= 0 or null, got {self.max_staleness}")


@dataclass
class AsyncFFGGState:
    """theta, and how many dispatch draws were made (the next draw's stream key)."""

    theta: np.ndarray
    picks: int = 0


def step_size(cfg: AsyncFFGGConfig, split: Split, base: float, delay: int) -> float:
    """gamma_theta for an update of delay d (see the module docstring)."""
    if cfg.step_rule == "theory":
        if not split.quadratic:
            raise ConfigError("algorithm.step_rule", "'theory' needs L: the quadratic only")
        return 1.0 / (2.0 * split.oracle.L * np.sqrt(2.0 * cfg.concurrency * cfg.tau_max))
    if cfg.step_rule == "delay_adaptive":
        k = cfg.concurrency
        return base * k / max(k, delay)
    return base


def promised_samples(split: Split, tune: FineTune, n: int) -> int:
    """Samples every FFGG job surely processes (lets the pool run jobs in parallel): the Delta
    pass over all n rows, plus tau GD passes on the quadratic (CG / exact: one system pass)."""
    if not split.quadratic:
        return n
    return n * ((tune.steps if tune.solver == "gd" and tune.epochs is None else 1) + 1)


class AsyncDispatcher:
    """Starts jobs from the current theta and picks who runs the next one."""

    def __init__(self, fed: Federation, cfg: AsyncFFGGConfig, split: Split, tune: FineTune, s: AsyncFFGGState):
        self.fed, self.cfg, self.split, self.tune, self.s = fed, cfg, split, tune, s
        self.pool: AsyncPool = fed.async_pool()
        self.sizes = fed.client_sizes

    def uniform_client(self) -> int:
        """Uniform over all trainable clients, busy or not (theory mode's multiset)."""
        c = int(numpy_rng(self.fed.seed, "async_ffgg.sample", self.s.picks).choice(self.fed.trainable_clients))
        self.s.picks += 1
        return c

    def idle_client(self) -> int | None:
        c = self.fed.sample_idle(self.pool.busy_clients, key=self.s.picks)
        self.s.picks += 1
        return c

    def submit(self, client: int, theta: np.ndarray) -> None:
        self.pool.submit(
            client, ffgg_client, theta=theta, split=self.split.spec, tune=self.tune,
            min_backward_samples=promised_samples(self.split, self.tune, int(self.sizes[client])),
        )

    def fill(self, theta: np.ndarray) -> None:
        """Keep `concurrency` jobs in flight (the first K workers in worker mode are distinct)."""
        while len(self.pool) < self.cfg.concurrency:
            c = self.uniform_client() if self.cfg.dispatch == "theory" else self.idle_client()
            if c is None:
                break
            self.submit(c, theta)

    def next_job(self, finished: int, theta: np.ndarray) -> None:
        """Alg. 3 lines 5-7: a new job from `theta` for a uniform client or the same worker."""
        self.submit(self.uniform_client() if self.cfg.dispatch == "theory" else finished, theta)

    def next_result(self, theta: np.ndarray) -> ClientResult:
        """The earliest usable arrival; a failed or too-stale job is replaced, as a worker
        that gave up would be handed new work."""
        while True:
            self.fill(theta)
            res = self.pool.next(max_staleness=self.cfg.max_staleness)
            if res.ok:
                return res
            self.next_job(res.client, theta)


def run_async_ffgg(fed: Federation, cfg: AsyncFFGGConfig, run: RunConfig) -> dict[str, Any]:
    split = server_split(fed, cfg)
    check_solver(cfg, split)
    base, gamma_w = step_sizes(split, cfg)
    tune = fine_tune_of(cfg, gamma_w)
    s = fed.track(AsyncFFGGState(theta=split.theta0.copy()))
    disp = AsyncDispatcher(fed, cfg, split, tune, s)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        res = disp.next_result(s.theta)
        if cfg.dispatch_model == "old":
            disp.next_job(res.client, s.theta)
        gamma = step_size(cfg, split, base, res.staleness)
        s.theta = (s.theta.astype(np.float64) - gamma * res["delta"].astype(np.float64)).astype(split.theta0.dtype)
        check_finite(s.theta, r)
        fed.advance_version()
        if cfg.dispatch_model == "new":
            disp.next_job(res.client, s.theta)
        metrics = {"num_updates": 1, "train_loss": float(res["loss"]), "staleness": int(res.staleness), "step_size": gamma}
        if split.quadratic:
            metrics.update(split.oracle.metrics(s.theta))
        metrics.update(evaluate_if_due(fed, split, s.theta, r, run))
        fed.log_round(r, **metrics)
    disp.pool.drain()
    return {"final_params": s.theta, **metrics}
