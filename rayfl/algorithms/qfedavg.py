"""q-FedAvg (Li, Sanjabi, Beirami & Smith, ICLR 2020, Alg. 2): fair resource allocation.

It minimises sum_k F_k^{q+1} / (q+1), so clients with a higher loss pull harder. Each selected
client runs local SGD from w_t to w_k, and with L = 1 / lr sends

    Delta_k = F_k(w_t)^q L (w_t - w_k),
    h_k     = q F_k(w_t)^{q-1} ||L (w_t - w_k)||^2 + L F_k(w_t)^q,

where F_k(w_t) is its full local training loss at w_t; the server steps
w_{t+1} = w_t - sum_k Delta_k / sum_k h_k. q = 0 is FedAvg with a uniform average."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfl.algorithms.client_eval import evaluate_global_and_clients
from rayfl.algorithms.kernels import CrossEntropyGrad
from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.algorithms.server_opt import ModelState
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
from rayfl.engine import ClientContext


@dataclass
class QFedAvgConfig(AlgorithmConfig):
    """q-FedAvg. `q` the fairness exponent (ComFedL's MNIST: 0.2), `lr` the local lr (L = 1/lr)."""

    name: str = "qfedavg"
    local_epochs: int | None = None
    local_steps: int | None = 5
    # The local SGD step size; also sets L = 1 / lr in Delta_k and h_k.
    lr: float = 0.01
    # The fairness exponent (>= 0): the objective is sum_k F_k^(q+1) / (q+1); 0 is FedAvg with a
    # uniform average.
    q: float = 0.2
    # At each evaluation, also measure every client's train and validation accuracy (average and
    # worst).
    client_eval: bool = True

    def validate(self) -> None:
        super().validate()
        if not self.q >= 0:
            raise ConfigError("algorithm.q", f"must be >= 0, got {self.q}")


def qfedavg_client(ctx: ClientContext, params: np.ndarray, lr: float, q: float, schedule: LocalSchedule) -> dict[str, Any]:
    """F_k(w_t) on all local data, local SGD, then (Delta_k, h_k) in float64."""
    w0 = torch.tensor(params, device=ctx.device)
    kernel = CrossEntropyGrad(ctx.model)
    xs, ts = kernel.prepare(ctx.x, ctx.y)
    with torch.no_grad():
        f = float(kernel(w0[None], xs, ts)[0][0])
    ctx.work.forward(ctx.num_samples)
    wk, loss = local_sgd(ctx, w0, lr, schedule)
    big_l = 1.0 / lr
    dw = big_l * (w0.double() - wk.double())
    fq = f**q
    h = q * f ** (q - 1) * float(dw @ dw) + big_l * fq if q > 0 else big_l
    return {"delta_q": (fq * dw).numpy(), "h": h, "loss": loss, "f": f}


def qfedavg_step(x: np.ndarray, total: np.ndarray, hs: np.ndarray) -> np.ndarray:
    """w_{t+1} = w_t - (sum_k Delta_k) / (sum_k h_k), in float64."""
    return (x.astype(np.float64) - total / float(np.sum(hs))).astype(np.float32)


class QFedAvg(Algorithm[ModelState]):
    """q-FedAvg's server: the plain sum of the Delta_k (float64, in client order) over the sum
    of the h_k."""

    config = QFedAvgConfig
    client = staticmethod(qfedavg_client)
    uploads = ("delta_q",)
    weighting = "sum"
    exact_sums = False
    pipeline_refusal = ("q-FedAvg divides its step by sum_k h_k, scalars the clients report unclipped: no clip bounds "
                        "one client's effect on the update")

    def setup(self) -> None:
        self.schedule = LocalSchedule(self.cfg.batch_size, self.cfg.local_epochs, self.cfg.local_steps)

    def init(self) -> ModelState:
        return ModelState(x=self.fed.initial_params())

    def payload(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        return {"params": state.x, "lr": self.cfg.lr, "q": self.cfg.q, "schedule": self.schedule}

    def server_update(self, state: ModelState, uploads: Uploads, rnd: Round) -> ModelState:
        return ModelState(x=qfedavg_step(state.x, uploads["delta_q"], uploads.values("h")), moments=state.moments)

    def metrics(self, state: ModelState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        out: dict[str, Any] = {"num_updates": len(uploads)}
        if uploads:
            out["train_loss"] = float(np.mean(uploads.values("f")))
        return out

    def evaluate(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        return evaluate_global_and_clients(self.fed, state.x, rnd.index, self.cfg.client_eval)
