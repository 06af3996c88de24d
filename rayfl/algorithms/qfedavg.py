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

from rayfl.algorithms.client_eval import evaluate_clients
from rayfl.algorithms.kernels import CrossEntropyGrad
from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.algorithms.rounds import ModelState, check_finite, clients_this_round, evaluate_if_due
from rayfl.config import AlgorithmConfig, ConfigError, RunConfig
from rayfl.engine import ClientContext, Federation


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


def qfedavg_step(x: np.ndarray, deltas: list[np.ndarray], hs: list[float]) -> np.ndarray:
    """w_{t+1} = w_t - sum_k Delta_k / sum_k h_k (sums in client-id order, float64)."""
    total = np.zeros_like(x, dtype=np.float64)
    for d in deltas:
        total += d
    return (x.astype(np.float64) - total / float(np.sum(hs))).astype(np.float32)


def run_qfedavg(fed: Federation, cfg: QFedAvgConfig, run: RunConfig) -> dict[str, Any]:
    s = fed.track(ModelState(x=fed.initial_params()))
    schedule = LocalSchedule(cfg.batch_size, cfg.local_epochs, cfg.local_steps)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        ids = clients_this_round(fed, cfg, r)
        results = fed.call(ids, qfedavg_client, round=r, params=s.x, lr=cfg.lr, q=cfg.q, schedule=schedule)
        metrics = {"num_updates": len(results)}
        if results:
            s.x = qfedavg_step(s.x, [res["delta_q"] for res in results], [res["h"] for res in results])
            check_finite(s.x, r)
            metrics.update(train_loss=float(np.mean([res["f"] for res in results])))
        metrics.update(evaluate_if_due(fed, s.x, r, run))
        if cfg.client_eval and "test_accuracy" in metrics:
            metrics.update(evaluate_clients(fed, s.x, r))
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}
