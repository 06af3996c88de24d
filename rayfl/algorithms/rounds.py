"""What every synchronous server loop does around its own update, written once: pick the
round's clients, average what they sent, summarise the round, refuse a diverged model and
evaluate on the run's cadence. An algorithm module keeps only what its paper specifies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayfl.algorithms.base import eval_due
from rayfl.algorithms.server_opt import AdamMoments
from rayfl.config import AlgorithmConfig, RunConfig
from rayfl.engine import ClientResult, Federation


@dataclass
class ModelState:
    """A server that carries one global model between rounds (and FedAdam's moments)."""

    x: np.ndarray
    moments: AdamMoments = field(default_factory=AdamMoments)


def clients_this_round(fed: Federation, cfg: AlgorithmConfig, round: int) -> list[int]:
    """The round's cohort: `participation` of the clients, or `clients_per_round` of them."""
    if cfg.participation is not None:
        return fed.sample(round, fraction=cfg.participation)
    return fed.sample(round, k=cfg.clients_per_round)


def weighted_mean(results: list[ClientResult], key: str, weights: np.ndarray) -> np.ndarray:
    """Sum in client-id order in float64: identical whatever the host layout. One scratch
    vector for the products: fresh model-sized temporaries per client cost more in page
    faults than the arithmetic."""
    acc = np.zeros_like(results[0][key], dtype=np.float64)
    term = np.empty_like(acc)
    for r, w in zip(results, weights, strict=True):
        np.multiply(r[key], w, out=term, dtype=np.float64)  # float64(value) * w, as w * value.astype(float64)
        acc += term
    return acc


def round_metrics(fed: Federation, results: list[ClientResult], weights: np.ndarray) -> dict[str, float]:
    """The round's weighted training loss over the clients that reported a finite one."""
    losses = np.array([r["loss"] for r in results], dtype=np.float64)
    ok = np.isfinite(losses)
    train_loss = float(np.sum(weights[ok] * losses[ok]) / max(np.sum(weights[ok]), 1e-12)) if ok.any() else float("nan")
    return {"train_loss": train_loss, "num_updates": len(results)}


def check_finite(x: np.ndarray, round: int, what: str = "global model", lower: str = "algorithm.lr") -> None:
    """Stop a diverged run at the round it diverged, naming the step size to lower."""
    if not np.all(np.isfinite(x)):
        raise FloatingPointError(f"{what} diverged (non-finite parameters) at round {round}; lower {lower}")


def evaluate_if_due(fed: Federation, x: np.ndarray, round: int, run: RunConfig) -> dict[str, float]:
    """The global model on the global test set, every `run.eval_every` rounds and at the end."""
    if not eval_due(round, run):
        return {}
    m = fed.evaluate(x)
    fed.log_eval(round, m)
    return m
