"""FedAvg evaluated as a personalized method: ComFedL's MAML comparison (Sec. 5.2, Fig. 4)
trains FedAvg unchanged and, "for fair comparison, FedAvg is trained with one step at test
time": the same one-step adaptation on each client's data that the meta-learning methods get,
at FedAvg's lr (the paper gives none for the step). Training is exactly `fedavg`'s (same client
function, size-weighted average: "FedAvg assigns weights proportional to the number of samples",
Sec. 5.1); only the evaluation differs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayfl.algorithms.fedavg import FedAvg, FedAvgConfig
from rayfl.algorithms.personalized_eval import evaluate_personalized, require_client_validation
from rayfl.algorithms.server_opt import ModelState
from rayfl.config import ConfigError
from rayfl.driver import Round


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


class FedAvgAdapt(FedAvg):
    """FedAvg's training (the client sends no proximal weight); each client's model is
    measured after `eval_adapt_steps` SGD steps."""

    config = FedAvgAdaptConfig
    prox_mu = None  # fedavg_client's default 0.0, not sent

    def setup(self) -> None:
        require_client_validation(self.fed)
        super().setup()

    def evaluate(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        adapt_lr = cfg.lr if cfg.eval_adapt_lr is None else cfg.eval_adapt_lr
        return evaluate_personalized(self.fed, state.x, rnd.index, adapt_lr, cfg.eval_adapt_steps, cfg.batch_size)
