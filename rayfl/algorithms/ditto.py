"""Ditto (Li, Hu, Beirami, Smith, ICML 2021; ComFedL's baseline [28]): a global model trained
by FedAvg, and on every client a persistent personal model pulled towards it.

Client k in round s, from the broadcast w_s (ComFedL Sec. 5.2 gives only the two learning rates
and lam; the step pattern is rayfl's reading of Ditto):

    global:   tau SGD steps  w <- w - lr grad F_k(w)                      -> upload w - w_s
    personal: tau SGD steps  v_k <- v_k - personal_lr (grad F_k(v_k) + lam (v_k - w_s))

on the same minibatches. v_k lives in the client's state (`ctx.state["personal"]`), so it is
committed only when the server accepts the task (a late or dropped task leaves the previous
v_k), survives checkpoints and is replayed after a host failure. A client's first v_k starts
from the w_s it first receives (= w_0 under ComFedL's full participation). The server averages
the global deltas uniformly (as ComFedL's Alg. 1, line 17). Evaluation uses each client's v_k as it is (no
adaptation step), as the paper does; a client that never trained is measured on w_s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.algorithms.personalized_eval import evaluate_personalized, require_client_validation
from rayfl.algorithms.server_opt import ModelState
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
from rayfl.engine import ClientContext

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


class Ditto(Algorithm[ModelState]):
    """The global model by FedAvg (no server step size), each client's personal v_k in its
    state; evaluation on the v_k."""

    config = DittoConfig
    client = staticmethod(ditto_client)
    uploads = ("delta",)

    def setup(self) -> None:
        require_client_validation(self.fed)
        cfg = self.cfg
        self.schedule = LocalSchedule(cfg.batch_size, cfg.local_epochs, cfg.local_steps)

    def init(self) -> ModelState:
        return ModelState(x=self.fed.initial_params())

    def weighting_of(self, key: str) -> str:
        return self.cfg.weighting

    def payload(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x, "lr": cfg.lr, "personal_lr": cfg.personal_lr, "lam": cfg.lam, "schedule": self.schedule}

    def server_update(self, state: ModelState, uploads: Uploads, rnd: Round) -> ModelState:
        """w_{s+1} = w_s + the weighted mean global delta."""
        return ModelState(x=(state.x + uploads["delta"]).astype(np.float32), moments=state.moments)

    def metrics(self, state: ModelState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        out = super().metrics(state, uploads, rnd)
        if uploads:
            out["personal_loss"] = float(np.nanmean(uploads.values("personal_loss")))
        return out

    def evaluate(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        return evaluate_personalized(self.fed, state.x, rnd.index, self.cfg.lr, 0, self.cfg.batch_size, state_key=PERSONAL)
