"""Scaffnew (ProxSkip for federated learning; Mishchenko, Malinovsky, Stich, Richtarik, ICML 2022).

A first-order baseline of FedRZO's App. D.1 (spec zo-nondiff.md 7.2). Each client keeps a control
variate h_i (persistent, in its committed state) and steps

    x^_i = x_i - gamma (grad f_i(x_i) - h_i);

with probability p all clients communicate: x_i <- (1/m) sum_j (x^_j - (gamma/p) h_j),
otherwise x_i <- x^_i; then h_i <- h_i + (p/gamma)(x_i - x^_i) (so h_i moves only at a
communication). The coin is common to all clients, so a round (one communication) is a
Geometric(p) number of local steps H_r, drawn by the server from (seed, 'scaffnew.coin', r).
The client sends w_i = x^_i - (gamma/p) h_i and keeps x^_i; on the next round's broadcast of
the average x_{r+1} it finishes the h_i update before stepping again. Default p = 1/H with
H = `local_steps` (spec D-17), so the expected local work matches FedAvg's H steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfl.algorithms.base import eval_due
from rayfl.algorithms.fedmspp import minibatch_gradient
from rayfl.algorithms.fedrzo_nn import FedRZOState, average, objective_metrics
from rayfl.algorithms.rounds import check_finite, clients_this_round, evaluate_if_due
from rayfl.config import AlgorithmConfig, ConfigError, RunConfig
from rayfl.engine import ClientContext, Federation
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
    H_r local steps, and send w_i = x^_i - (gamma/p) h_i; x^_i and h_i stay in ctx.state."""
    x = torch.tensor(params, dtype=torch.float32, device=ctx.device)
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
    return {"w": (x - (lr / p) * h).cpu().numpy(), "loss": float(np.mean(losses)) if losses else float("nan")}


def run_scaffnew(fed: Federation, cfg: ScaffnewConfig, run: RunConfig) -> dict[str, Any]:
    s = fed.track(FedRZOState(x=fed.initial_params()))
    p = cfg.probability()
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        ids = clients_this_round(fed, cfg, r)
        steps = coin_steps(fed.seed, r, p)
        results = fed.call(ids, scaffnew_client, round=r, params=s.x, steps=steps, lr=cfg.lr, p=p,
                           batch_size=cfg.batch_size, weight_decay=cfg.weight_decay)
        metrics = {"num_updates": len(results), "local_steps_round": steps}
        if len(results) != len(ids):
            raise RuntimeError(f"Scaffnew lost {len(ids) - len(results)} client(s) in round {r}: their h_i would go stale")
        if results:
            s.x = average(results, "w")
            check_finite(s.x, r)
            metrics["train_loss"] = float(np.nanmean([res["loss"] for res in results]))
        if eval_due(r, run):
            metrics.update(objective_metrics(fed, s.x, cfg.weight_decay))
        metrics.update(evaluate_if_due(fed, s.x, r, run))
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}
