"""Ditto (Li, Hu, Beirami, Smith, ICML 2021; ComFedL's baseline [28]): a global model trained
by FedAvg, and on every client a persistent personal model pulled towards it.

Client k in round s, from the broadcast w_s (spec Sec. 3.5, A22):

    global:   tau SGD steps  w <- w - lr grad F_k(w)                      -> upload w - w_s
    personal: tau SGD steps  v_k <- v_k - personal_lr (grad F_k(v_k) + lam (v_k - w_s))

on the same minibatches. v_k lives in the client's state (`ctx.state["personal"]`), so it is
committed only when the server accepts the task (a late or dropped task leaves the previous
v_k), survives checkpoints and is replayed after a host failure. A client's first v_k starts
from the w_s it first receives (= w_0 under ComFedL's full participation). The server averages
the global deltas uniformly (spec Sec. 4.5). Evaluation uses each client's v_k as it is (no
adaptation step), as the paper does; a client that never trained is measured on w_s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.algorithms.personalized_eval import (
    evaluate_personalized_if_due,
    require_client_validation,
)
from rayfl.algorithms.rounds import (
    ModelState,
    check_finite,
    clients_this_round,
    round_metrics,
)
from rayfl.config import AlgorithmConfig, ConfigError, RunConfig
from rayfl.engine import ClientContext, Federation

PERSONAL = "personal"


@dataclass
class DittoConfig(AlgorithmConfig):
    """Ditto at ComFedL's CIFAR setting: global and personal lr 0.2, lam = 0.1, tau = 5 steps."""

    uploads: ClassVar[tuple[str, ...]] = ("delta",)  # the global model's update; the personal one stays

    name: str = "ditto"
    lr: float = 0.2
    # The step size of each client's personal model (> 0).
    personal_lr: float = 0.2
    # lambda, the pull of the personal model v towards the broadcast w: its step adds lam (v - w)
    # (>= 0).
    lam: float = 0.1
    local_epochs: int | None = None
    local_steps: int | None = 5
    # How the global model's deltas are averaged: uniform or samples (by n_i).
    weighting: Literal["uniform", "samples"] = "uniform"

    def validate(self) -> None:
        super().validate()
        if not self.personal_lr > 0:
            raise ConfigError("algorithm.personal_lr", f"must be > 0, got {self.personal_lr}")
        if not self.lam >= 0:
            raise ConfigError("algorithm.lam", f"must be >= 0, got {self.lam}")


def ditto_client(
    ctx: ClientContext, params: np.ndarray, lr: float, personal_lr: float, lam: float, schedule: LocalSchedule
) -> dict[str, Any]:
    """One Ditto round on client k: the global update (uploaded) and the personal update
    (kept in ctx.state)."""
    x = torch.tensor(params, device=ctx.device)
    w, loss = local_sgd(ctx, x, lr, schedule)
    v = ctx.state.get(PERSONAL)
    v = x.clone() if v is None else torch.as_tensor(v, device=ctx.device)
    v, personal_loss = local_sgd(ctx, v, personal_lr, schedule, prox_mu=lam, prox_center=x)
    ctx.state[PERSONAL] = v
    return {"delta": w - x, "loss": loss, "personal_loss": personal_loss}


def run_ditto(fed: Federation, cfg: DittoConfig, run: RunConfig) -> dict[str, Any]:
    require_client_validation(fed)
    s = fed.track(ModelState(x=fed.initial_params()))
    schedule = LocalSchedule(cfg.batch_size, cfg.local_epochs, cfg.local_steps)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        ids = clients_this_round(fed, cfg, r)
        results = fed.call(ids, ditto_client, round=r, keep=("delta",), params=s.x, lr=cfg.lr,
                           personal_lr=cfg.personal_lr, lam=cfg.lam, schedule=schedule)
        metrics = {"num_updates": 0}
        if results:
            weights = fed.client_weights([res.client for res in results], cfg.weighting)
            s.x = (s.x + fed.weighted_sum(results, "delta", weights)).astype(np.float32)
            check_finite(s.x, r)
            metrics = round_metrics(fed, results, weights)
            metrics["personal_loss"] = float(np.nanmean([res["personal_loss"] for res in results]))
        metrics.update(evaluate_personalized_if_due(fed, s.x, r, run, cfg.lr, 0, cfg.batch_size, state_key=PERSONAL))
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}
