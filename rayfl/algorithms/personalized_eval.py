"""Personalized evaluation for the MAML comparison (ComFedL Sec. 5.2, Fig. 4; the paper states only
"one step at test time", the batch and its lr are rayfl's choice): every
client adapts the global model with one SGD step on a batch of its own training data, then
measures it on its own validation set; the run logs each client and the unweighted mean and
worst client.

"For fair comparison, FedAvg is trained with one step at test time": the same step is applied
to every method (FedAvg, Per-FedAvg, TR-MAML, ComFedL-DAMAML), each with its own inner lr.
Ditto is the exception the paper names: it evaluates its persistent personal model v_k (a
`state_key`, no extra step).

The per-client work is `client_eval.evaluate_clients` (shared with ComFedL's worst-client
evaluation) with prefix `pers_`: `evals` rows of split `pers_train` / `pers_val` per client and
the round metrics pers_avg_val_accuracy, pers_worst_val_accuracy (and _loss, and train)."""

from __future__ import annotations

import numpy as np

from rayfl.algorithms.client_eval import evaluate_clients
from rayfl.config import ConfigError
from rayfl.driver.rounds import evaluate_global
from rayfl.engine import Federation

PREFIX = "pers_"


def require_client_validation(fed: Federation) -> None:
    """Personalized evaluation needs per-client validation sets; say so before round 0."""
    if fed.dataset.client_test is None:
        raise ConfigError(
            "partition.client_test",
            "personalized evaluation needs per-client validation sets; set partition.client_test=proportional",
        )


def evaluate_personalized(
    fed: Federation,
    params: np.ndarray,
    round: int,
    adapt_lr: float,
    adapt_steps: int = 1,
    batch_size: int = 32,
    state_key: str | None = None,
) -> dict[str, float]:
    """The global model on the global test set and every client's personalized model
    (`adapt_steps` SGD steps of `adapt_lr` on `batch_size` of its training samples, or its
    `ctx.state[state_key]`) on its own train and validation split."""
    m = evaluate_global(fed, params, round)
    m.update(evaluate_clients(fed, params, round, adapt_steps=adapt_steps, adapt_lr=adapt_lr,
                              adapt_batch_size=batch_size, state_key=state_key, prefix=PREFIX))
    return m
