"""The inexact lower-level FL oracle of FedRZO_bl: FedAvg on h(x, .) (Alg. 3, Remark 2(ii)).

FedRZO_bl (Qiu, Shanbhag, Yousefian, NeurIPS 2023) needs y(x) = argmin_y (1/m) sum_i h_i(x, y)
at two points per upper round. "[y_eps(x)] can be computed using calls to a standard FL method,
e.g., FedAvg, in the lower level"; "the inexactness error is carefully controlled by terminating
the lower-level FL oracle after [t~_r] iterations" with r the upper round. So one call is a
complete FedAvg run over the *same* clients, through the same Federation (its rounds are real
communication rounds on the simulated clock, logged with phase `lower_<call>`):

    for s = 0 .. R~_r - 1:  send y_s (and the query point x once, at s = 0)
                            each client: H^ steps y <- y - lr grad_y h~_i(x, y; zeta)
                            y_{s+1} = (1/m) sum_i y_i
    return y_{R~_r}

The budget R~_r grows with r; the paper's schedule was lost in extraction, and rayfl's is
min(R_max, R_0 + floor(r / every)). For a minimax
problem h_i = -f_i and the same descent is the ascent of the inner max. The problem is duck
typed: the client receives a picklable spec whose `for_client(ctx)` returns an object with
`lower` (the client's lower-level rows, a dict of tensors) and `lower_gradient(x, y, batch)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rayfl.config import ConfigError
from rayfl.zo.lower_level import minibatch_indices

QUERY_KEY = "fl_oracle.query"


@dataclass
class LowerLevelConfig:
    """Alg. 3's knobs (rayfl's: the box was lost in extraction): R~_r = min(rounds_max, rounds0
    + floor(r / rounds_every)) lower rounds (`growing`; `constant`: rounds0 every call) of
    `local_steps` H^ steps of size `lr` on minibatches of `batch_size`. `init: zeros` starts
    every call at y = 0; `warm` starts at the previous round's y at x_r (not the paper's, an
    option). `randomness: common` gives the two calls of a round the same minibatches (common
    random numbers), so y+ - y0 reflects the query points, not sampling noise; `independent`
    draws per call."""

    # The lower-level budget per call: growing (min(rounds_max, rounds0 + floor(r / rounds_every))
    # FedAvg rounds at upper round r) or constant (rounds0 every call).
    kind: Literal["growing", "constant"] = "growing"
    # The lower-level FedAvg rounds of the first call (>= 1).
    rounds0: int = 5
    # growing only: one more lower round every this many upper rounds (>= 1).
    rounds_every: int = 10
    # growing only: the cap on lower rounds per call (>= rounds0).
    rounds_max: int = 50
    # H^, each client's gradient steps on y per lower round (>= 1).
    local_steps: int = 10
    # The lower level's local step size (> 0).
    lr: float = 0.1
    # The lower level's minibatch size (>= 1).
    batch_size: int = 64
    # Where each call starts: zeros (y = 0, the paper's) or warm (the previous round's y at x_r).
    init: Literal["zeros", "warm"] = "zeros"
    # common (a round's two calls use the same minibatches, so y+ - y0 reflects the query points) or
    # independent.
    randomness: Literal["common", "independent"] = "common"

    def validate_as(self, key: str) -> None:
        for name in ("rounds0", "rounds_every", "rounds_max", "local_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{key}.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.rounds_max < self.rounds0:
            raise ConfigError(f"{key}.rounds_max", f"must be >= rounds0 = {self.rounds0}, got {self.rounds_max}")
        if not self.lr > 0:
            raise ConfigError(f"{key}.lr", f"must be > 0, got {self.lr}")


def lower_rounds(cfg: LowerLevelConfig, upper_round: int) -> int:
    """R~_r, the lower-level communication rounds of one oracle call in upper round r."""
    if cfg.kind == "constant":
        return cfg.rounds0
    return min(cfg.rounds_max, cfg.rounds0 + upper_round // cfg.rounds_every)


@dataclass
class OracleCall:
    """What one call cost and returned: y_eps(x), its lower rounds, bytes moved, simulated
    seconds on the clock, the clients' mean lower-level loss in the last round and how many
    client steps clamped a parameter (hyperparam's regularisation floor)."""

    y: np.ndarray
    rounds: int
    bytes: int
    sim_seconds: float
    loss: float
    clamped: int


def fl_oracle_client(
    ctx: Any,
    y: np.ndarray,
    steps: int,
    lr: float,
    batch_size: int,
    problem: Any,
    call: str,
    lower_round: int,
    randomness: str = "common",
    query: np.ndarray | None = None,
) -> dict[str, Any]:
    """Alg. 3 lines 3-6 on client i: H^ steps of y <- y - lr grad_y h~_i(x, y; zeta) from the
    broadcast y. The query point x arrives with the first lower round of a call and stays in
    the client's state for the rest of it (it is sent once)."""
    key = f"{QUERY_KEY}.{call}"
    if query is not None:
        ctx.state[key] = np.asarray(query, dtype=np.float64)
    x = ctx.state[key]
    prob = problem.for_client(ctx)
    purpose = f"fl_oracle.{lower_round}" if randomness == "common" else f"fl_oracle.{call}.{lower_round}"
    n = len(prob.lower["v"])
    idx = minibatch_indices(ctx.rng(purpose), n, batch_size, steps)
    yt = torch.tensor(np.array(y, dtype=np.float64))
    losses, clamped = [], 0
    for t in range(len(idx)):
        loss, grad, hit = prob.lower_gradient(x, yt, {k: v.index_select(0, idx[t]) for k, v in prob.lower.items()})
        yt = yt - lr * grad
        losses.append(loss)
        clamped += int(hit)
        ctx.work.gradient_step(len(idx[t]))
    return {"y": yt.numpy(), "loss": float(np.mean(losses)) if losses else float("nan"), "clamped": clamped}


def run_fl_oracle(
    fed: Any,
    query: np.ndarray,
    upper_round: int,
    call: str,
    cfg: LowerLevelConfig,
    y_start: np.ndarray,
    problem: Any,
    clients: list[int],
) -> OracleCall:
    """One oracle call LL(x, r) at query point `query`: R~_r FedAvg rounds over `clients`
    (the same ones the upper level uses), uniform 1/m averaging as in h = (1/m) sum_i h_i."""
    y = np.asarray(y_start, dtype=np.float64)
    start, nbytes, loss, clamped = fed.clock.now, 0, float("nan"), 0
    rounds = lower_rounds(cfg, upper_round)
    for s in range(rounds):
        extra = {"query": np.asarray(query, dtype=np.float64)} if s == 0 else {}
        results = fed.call(
            clients, fl_oracle_client, round=upper_round, phase=f"lower_{call}",
            y=y, steps=cfg.local_steps, lr=cfg.lr, batch_size=cfg.batch_size, problem=problem,
            call=call, lower_round=s, randomness=cfg.randomness, **extra,
        )
        nbytes += sum(r.bytes_up + r.bytes_down for r in results)
        if results:
            y = np.mean([r["y"] for r in results], axis=0)
            loss = float(np.mean([r["loss"] for r in results]))
            clamped += sum(int(r["clamped"]) for r in results)
    return OracleCall(y=y, rounds=rounds, bytes=nbytes, sim_seconds=fed.clock.now - start, loss=loss, clamped=clamped)
