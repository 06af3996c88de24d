"""FedAvg evaluated as a personalized method: ComFedL's MAML comparison (Sec. 5.2, Fig. 4)
trains FedAvg unchanged and, "for fair comparison, FedAvg is trained with one step at test
time": the same one-step adaptation on each client's data that the meta-learning methods get,
at FedAvg's lr (spec A14). Training is exactly `fedavg`'s (same client function, size-weighted
average, spec A28); only the evaluation differs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.algorithms.fedavg import FedAvgConfig, call_with_server, fedavg_client, update_weights
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
from rayfl.config import ConfigError, RunConfig
from rayfl.engine import Federation


@dataclass
class FedAvgAdaptConfig(FedAvgConfig):
    """FedAvg at ComFedL's CIFAR setting (lr 0.1, tau = 5 steps), plus `eval_adapt_steps` SGD
    steps at `eval_adapt_lr` (null: lr) before each client's validation measurement."""

    name: str = "fedavg_adapt"
    lr: float = 0.1
    local_epochs: int | None = None
    local_steps: int | None = 5
    # SGD steps each client takes from the global model on its training data before its validation
    # measurement (>= 0): FedAvg "with one step at test time".
    eval_adapt_steps: int = 1
    # The step size of those evaluation steps (> 0); null: lr.
    eval_adapt_lr: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.server_as_client:
            raise ConfigError("algorithm.server_as_client", "fedavg_adapt has no server data; use fedavg for that ablation")
        if self.eval_adapt_steps < 0:
            raise ConfigError("algorithm.eval_adapt_steps", f"must be >= 0, got {self.eval_adapt_steps}")
        if self.eval_adapt_lr is not None and not self.eval_adapt_lr > 0:
            raise ConfigError("algorithm.eval_adapt_lr", f"must be > 0 (or null: lr), got {self.eval_adapt_lr}")


def run_fedavg_adapt(fed: Federation, cfg: FedAvgAdaptConfig, run: RunConfig) -> dict[str, Any]:
    require_client_validation(fed)
    adapt_lr = cfg.lr if cfg.eval_adapt_lr is None else cfg.eval_adapt_lr
    s = fed.track(ModelState(x=fed.initial_params()))
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        ids = clients_this_round(fed, cfg, r)
        results = call_with_server(fed, fedavg_client, ids, cfg, r, None, keep=("delta",), params=s.x, lr=cfg.lr,
                                   weight_decay=cfg.weight_decay)
        metrics = {"num_updates": 0}
        if results:
            weights = update_weights(fed, results, cfg.weighting, None)
            s.x = (s.x + cfg.server_lr * fed.weighted_sum(results, "delta", weights)).astype(np.float32)
            check_finite(s.x, r)
            metrics = round_metrics(fed, results, weights)
        metrics.update(evaluate_personalized_if_due(fed, s.x, r, run, adapt_lr, cfg.eval_adapt_steps, cfg.batch_size))
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}
