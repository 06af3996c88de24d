"""Scaffnew (ProxSkip for federated learning; Mishchenko, Malinovsky, Stich, Richtarik, ICML 2022).

A first-order baseline of FedRZO's App. D.1 (Fig. 3; ref. [35]). Each client keeps a control
variate h_i (persistent, in its committed state) and steps

    x^_i = x_i - gamma (grad f_i(x_i) - h_i);

with probability p all clients communicate: x_i <- (1/m) sum_j (x^_j - (gamma/p) h_j),
otherwise x_i <- x^_i; then h_i <- h_i + (p/gamma)(x_i - x^_i) (so h_i moves only at a
communication). The coin is common to all clients, so a round (one communication) is a
Geometric(p) number of local steps H_r, drawn by the server from (seed, 'scaffnew.coin', r).
The client sends w_i = x^_i - (gamma/p) h_i and keeps x^_i; on the next round's broadcast of
the average x_{r+1} it finishes the h_i update before stepping again. Default p = 1/H with
H = `local_steps` (rayfl's default: App. D.1 reports no p), so the expected local work matches
FedAvg's H steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfl.algorithms.fedmspp import minibatch_gradient
from rayfl.algorithms.fedrzo_nn import FedRZOState, ModelAverage
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Round, Uploads
from rayfl.engine import ClientContext
from rayfl.rng import numpy_rng

COIN_PURPOSE = "scaffnew.coin"
BATCH_PURPOSE = "scaffnew.batches"


@dataclass
class ScaffnewConfig(AlgorithmConfig):
    """Scaffnew: step `lr` gamma, communication probability `p` (null: 1 / local_steps),
    minibatch `batch_size` per local step; full participation (the method needs every
    client's h_i at each communication)."""

    name: str = "scaffnew"
    clients_per_round: int | None = None
    participation: float | None = 1.0
    local_epochs: int | None = None
    # H: the expected local steps per communication when p is null (p = 1 / H).
    local_steps: int | None = 5
    # The minibatch of each local step.
    batch_size: int = 64
    # The probability, common to all clients, of communicating after each local step, in (0, 1];
    # null: 1 / local_steps.
    p: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.local_epochs is not None:
            raise ConfigError("algorithm.local_epochs", "Scaffnew's local work is Geometric(p) steps; set local_epochs to null")
        if self.participation != 1.0:
            raise ConfigError("algorithm.participation", "Scaffnew needs every client at each communication: use 1.0")
        if self.p is not None and not 0 < self.p <= 1:
            raise ConfigError("algorithm.p", f"must be in (0, 1] (or null for 1 / local_steps), got {self.p}")
        if self.p is None and not (self.local_steps or 0) >= 1:
            raise ConfigError("algorithm.local_steps", "p = 1 / local_steps needs local_steps >= 1")

    def probability(self) -> float:
        return float(self.p) if self.p is not None else 1.0 / float(self.local_steps or 1)


def coin_steps(seed: int, round: int, p: float) -> int:
    """H_r ~ Geometric(p) on {1, 2, ...}: local steps until the common coin says communicate."""
    return int(numpy_rng(seed, COIN_PURPOSE, round).geometric(p))


def scaffnew_client(
    ctx: ClientContext, params: np.ndarray, steps: int, lr: float, p: float, batch_size: int,
    weight_decay: float = 0.0,
) -> dict[str, Any]:
    """Finish h_i's update with the broadcast average (if the client has sent before), run
    H_r local steps, and send w_i - x_r (w_i = x^_i - (gamma/p) h_i); x^_i and h_i stay in
    ctx.state."""
    start = torch.tensor(params, dtype=torch.float32, device=ctx.device)
    x = start
    h = ctx.state.get("h")
    h = torch.zeros_like(x) if h is None else h.clone()
    if "x_hat" in ctx.state:
        h = h + (p / lr) * (x - ctx.state["x_hat"])
    losses = []
    for xb, yb in ctx.batches(batch_size, steps=steps, purpose=BATCH_PURPOSE):
        loss, g = minibatch_gradient(ctx, x, xb, yb, weight_decay)
        x = x - lr * (g - h)
        losses.append(loss)
    ctx.state["h"] = h
    ctx.state["x_hat"] = x
    return {"delta": (x - (lr / p) * h - start).cpu().numpy(), "loss": float(np.mean(losses)) if losses else float("nan")}


class Scaffnew(ModelAverage):
    """A Geometric(p) number of local steps per communication, common to all clients; the
    average of the w_i. Every client must answer: a missing one's h_i would go stale."""

    config = ScaffnewConfig
    client = staticmethod(scaffnew_client)
    update_without_uploads = True
    asynchrony_refusal = "Scaffnew's communication step averages every client's w_i at once (its h_i update needs it)"

    def payload(self, state: FedRZOState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x, "steps": coin_steps(self.fed.seed, rnd.index, cfg.probability()), "lr": cfg.lr,
                "p": cfg.probability(), "batch_size": cfg.batch_size, "weight_decay": cfg.weight_decay}

    def server_update(self, state: FedRZOState, uploads: Uploads, rnd: Round) -> FedRZOState:
        if len(uploads) != len(rnd.cohort):
            raise RuntimeError(f"Scaffnew lost {len(rnd.cohort) - len(uploads)} client(s) in round {rnd.index}: "
                               "their h_i would go stale")
        return super().server_update(state, uploads, rnd) if uploads else state

    def metrics(self, state: FedRZOState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        return {**super().metrics(state, uploads, rnd),
                "local_steps_round": coin_steps(self.fed.seed, rnd.index, self.cfg.probability())}
