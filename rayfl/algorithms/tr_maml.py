"""Federated TR-MAML (Collins, Mokhtari, Shakkottai, NeurIPS 2020; ComFedL's baseline [9]):
the task-robust min-max  min_w max_{p in simplex} sum_i p_i l_i(w - alpha grad l_i(w))
(ComFedL eq. 8), each client a task, the weights p kept on the server.

The paper does not say how TR-MAML was federated; spec Sec. 3.5 / A19 recommends a DRFA-style
loop over Per-FedAvg local steps. Round s:

    1. sample clients C_s (m of n; ComFedL runs full participation, m = n);
    2. each runs tau MAML steps from w_s (`per_fedavg.maml_client`) and returns its delta and
       L_i = l_Q(w_s - alpha grad l_S(w_s)), its post-adaptation loss at w_s on one batch;
    3. w_{s+1} = w_s + sum_{i in C_s} (p_i / sum_{C_s} p) delta_i   (descent on sum_i p_i f_i);
    4. v_i = (n / m) L_i for i in C_s, 0 otherwise (unbiased for the full loss vector);
       p <- Proj_simplex(p + weight_lr * tau * v)                   (DRFA's ascent step, x tau
       because p moves once per tau local steps)

p starts uniform. `weight_lr` is ComFedL's "client-weights lr" 0.08."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.algorithms.per_fedavg import MAMLConfig, maml_client, maml_payload
from rayfl.algorithms.personalized_eval import (
    evaluate_personalized_if_due,
    require_client_validation,
)
from rayfl.algorithms.rounds import check_finite, clients_this_round, round_metrics, weighted_mean
from rayfl.config import ConfigError, RunConfig
from rayfl.engine import ClientResult, Federation
from rayfl.zo.projection import project_simplex_array as project_simplex


@dataclass
class TRMAMLConfig(MAMLConfig):
    """Federated TR-MAML at ComFedL's CIFAR setting: alpha = 0.05, beta = 0.1, weight lr 0.08."""

    name: str = "tr_maml"
    # beta, the outer (meta) step size.
    lr: float = 0.1
    inner_lr: float = 0.05
    # The step size of the task weights p: p <- Proj_simplex(p + weight_lr * tau * v).
    weight_lr: float = 0.08

    def validate(self) -> None:
        super().validate()
        if not self.weight_lr >= 0:
            raise ConfigError("algorithm.weight_lr", f"must be >= 0, got {self.weight_lr}")


@dataclass
class TRMAMLState:
    """The server's state: the global model and the task weights p on the simplex."""

    x: np.ndarray
    p: np.ndarray



def tr_maml_step(
    x: np.ndarray, p: np.ndarray, results: list[ClientResult], num_sampled: int, cfg: TRMAMLConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 3 and 4 above: (new x, new p, the aggregation weights used)."""
    ids = np.array([res.client for res in results], dtype=np.int64)
    q = p[ids]
    weights = q / q.sum() if q.sum() > 0 else np.full(len(ids), 1.0 / len(ids))
    x_new = (x + weighted_mean(results, "delta", weights)).astype(np.float32)
    v = np.zeros(len(p), dtype=np.float64)
    losses = np.array([res["adapted_loss"] for res in results], dtype=np.float64)
    v[ids] = len(p) / num_sampled * np.where(np.isfinite(losses), losses, 0.0)
    p_new = project_simplex(p + cfg.weight_lr * cfg.local_steps * v)
    return x_new, p_new, weights


def run_tr_maml(fed: Federation, cfg: TRMAMLConfig, run: RunConfig) -> dict[str, Any]:
    require_client_validation(fed)
    n = fed.num_clients
    s = fed.track(TRMAMLState(x=fed.initial_params(), p=np.full(n, 1.0 / n)))
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        ids = clients_this_round(fed, cfg, r)
        results = fed.call(ids, maml_client, round=r, params=s.x, **maml_payload(cfg))
        metrics = {"num_updates": 0}
        if results:
            s.x, s.p, weights = tr_maml_step(s.x, s.p, results, len(ids), cfg)
            check_finite(s.x, r)
            metrics = round_metrics(fed, results, weights)
        metrics.update(p_max=float(s.p.max()), p_min=float(s.p.min()))
        metrics.update(evaluate_personalized_if_due(fed, s.x, r, run, cfg.adapt_lr, cfg.eval_adapt_steps, cfg.batch_size))
        fed.log_round(r, **metrics)
    return {"final_params": s.x, "final_weights": s.p, **metrics}
