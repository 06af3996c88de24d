"""Asynchronous FFGG (Alg. 3, arXiv 2305.18285, Sec. 2.2 and App. C) on the exact
asynchronous engine (`Federation.async_pool`): `concurrency` jobs are in flight; each server
step takes the earliest job on the simulated clock, applies its delayed operator

    theta^{r+1} = theta^r - gamma_theta(d) Delta_{j_r},   Delta_{j_r} = grad_theta f_j(theta^{r-d}, w^tau)

with no averaging and no buffer, and dispatches a new job: to a client drawn uniformly from
all M clients (`dispatch: theory`, what the proof's E_r[F_{m_r}(theta^r)] = F(theta^r) needs;
a client may then run two jobs at once) or back to the finishing worker (`dispatch: worker`,
the authors' Ray notebook). The new job starts from theta^{r+1} (`dispatch_model: new`, Alg. 3
line 6) or from theta^r (`old`: the proof's F_{m_r}(theta^r) and the authors' code).

Step size: `constant` server_lr (null: 1/L), `theory` 1/(2 L sqrt(2 K tau_max)) with K the
concurrency (the number of *active* clients, Theorem 7's M) and tau_max = algorithm.tau_max, or
`delay_adaptive` gamma K / max(K, d) (the authors' notebook). `max_staleness` drops staler
updates (Assumption 5's bound enforced). One `rounds` row per applied update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from rayfl.algorithms.ffgg import FFGG, FFGGConfig, FFGGState, Split
from rayfl.algorithms.finetune import FineTune
from rayfl.config import ConfigError
from rayfl.driver import Round, Uploads
from rayfl.driver.asynchronous import Dispatcher
from rayfl.driver.settings import AsynchronyConfig
from rayfl.engine import ClientResult
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
    # Drop updates whose delay exceeds this many server steps (>= 0, Assumption 5's bound enforced); null:
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


class AsyncFFGG(FFGG):
    """Alg. 3: FFGG's parts under the asynchronous driver, one delayed update per server step
    (a buffer of 1, no staleness weight: the delay enters through the step rule)."""

    config = AsyncFFGGConfig
    always_asynchronous = True

    @classmethod
    def asynchrony_of(cls, cfg: Any) -> AsynchronyConfig:
        alg = cfg.algorithm
        return AsynchronyConfig(enabled=True, concurrency=alg.concurrency, buffer_size=1, staleness="constant",
                                max_staleness=alg.max_staleness)

    def dispatcher(self, settings: AsynchronyConfig, run_state: Any) -> Dispatcher:
        return Alg3Dispatch(self, settings, run_state)

    def promised_work(self, client: int, payload: Any) -> tuple[int, int]:
        return 0, promised_samples(self.split, self.tune, int(self.fed.client_sizes[client]))

    def step_size(self, uploads: Uploads) -> float:
        """gamma_theta(d) of the update's delay d."""
        return step_size(self.cfg, self.split, self.gamma_theta, int(uploads.staleness[0]))

    def metrics(self, state: FFGGState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        (res,) = uploads.results
        out = {"num_updates": 1, "train_loss": float(res["loss"]), "staleness": int(res.staleness),
               "step_size": self.step_size(uploads)}
        if self.split.quadratic:
            out.update(self.split.oracle.metrics(state.theta))
        return out


class Alg3Dispatch(Dispatcher):
    """Alg. 3 lines 5-7: each finished job is followed at once by a new one, for a client
    drawn uniformly from all M (`dispatch: theory`, busy or not, stream 'async_ffgg.sample')
    or the same worker (`worker`), from theta before the step (`dispatch_model: old`) or
    after it (`new`); a failed or too-stale job is replaced the same way."""

    def uniform_client(self) -> int:
        fed, picks = self.fed, self.run_state
        c = int(numpy_rng(fed.seed, "async_ffgg.sample", picks.picks).choice(fed.trainable_clients))
        picks.picks += 1
        return c

    def fill(self, state: FFGGState, rnd: Round) -> None:
        """Keep `concurrency` jobs in flight (the first K workers in worker mode are distinct)."""
        while len(self.pool) < self.settings.concurrency:
            c = self.uniform_client() if self.alg.cfg.dispatch == "theory" else self.draw()
            if c is None:
                break
            self.submit(c, state, rnd)

    def next_job(self, finished: int, state: FFGGState, rnd: Round) -> None:
        self.submit(self.uniform_client() if self.alg.cfg.dispatch == "theory" else finished, state, rnd)

    def failed(self, res: ClientResult, state: FFGGState, rnd: Round) -> None:
        self.next_job(res.client, state, rnd)

    def arrived(self, res: ClientResult, state: FFGGState, rnd: Round) -> None:
        if self.alg.cfg.dispatch_model == "old":
            self.next_job(res.client, state, rnd)

    def stepped(self, buffer: list[ClientResult], state: FFGGState, rnd: Round) -> None:
        if self.alg.cfg.dispatch_model == "new":
            self.next_job(buffer[0].client, state, rnd)
