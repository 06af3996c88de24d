"""What every driver does around an algorithm's parts, written once: pick a round's clients,
weigh and sum what they sent, summarise the step, refuse a diverged model and evaluate on the
run's cadence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.config import AlgorithmConfig, RunConfig

if TYPE_CHECKING:
    from rayfl.engine import ClientResult, Federation


def eval_due(round: int, run: RunConfig) -> bool:
    """Whether round `round` (0-based) evaluates: every `run.eval_every` rounds and always
    after the last one, so a run's final accuracy is always measured."""
    return (round + 1) % run.eval_every == 0 or round == run.rounds - 1


def clients_this_round(fed: Federation, cfg: AlgorithmConfig, round: int) -> list[int]:
    """The round's cohort: `participation` of the clients, or `clients_per_round` of them."""
    if cfg.participation is not None:
        return fed.sample(round, fraction=cfg.participation)
    return fed.sample(round, k=cfg.clients_per_round)


def normalized(relative: np.ndarray, mean: bool, staleness: np.ndarray | None = None) -> np.ndarray:
    """Weights from relative ones: w_k / sum w (a weighted mean; all zero if they sum to 0)
    or w_k (a plain sum), each multiplied by its staleness factor s_k first, as in
    (s_k w_k) / sum w: FedBuff's s(t_k) / K when every w_k is 1."""
    w = np.asarray(relative, dtype=np.float64)
    scaled = w if staleness is None else staleness * w
    if not mean:
        return scaled
    total = w.sum()
    return scaled / total if total > 0 else np.zeros(len(w))


def ordered_sum(results: Sequence[Any], key: str, weights: np.ndarray) -> np.ndarray:
    """sum_k w_k v_k in float64, client by client in id order: identical for any host layout.
    One scratch vector for the products: fresh model-sized temporaries per client cost more
    in page faults than the arithmetic."""
    acc = np.zeros_like(np.asarray(results[0][key]), dtype=np.float64)
    term = np.empty_like(acc)
    for r, w in zip(results, weights, strict=True):
        np.multiply(r[key], w, out=term, dtype=np.float64)  # float64(value) * w
        acc += term
    return acc


def round_metrics(results: Sequence[ClientResult], weights: np.ndarray) -> dict[str, float]:
    """The round's weighted training loss over the clients that reported a finite one."""
    losses = np.array([r["loss"] for r in results], dtype=np.float64)
    ok = np.isfinite(losses)
    train_loss = float(np.sum(weights[ok] * losses[ok]) / max(np.sum(weights[ok]), 1e-12)) if ok.any() else float("nan")
    return {"train_loss": train_loss, "num_updates": len(results)}


def check_finite(x: np.ndarray, round: int, what: str = "global model", lower: str = "algorithm.lr") -> None:
    """Stop a diverged run at the round it diverged, naming the step size to lower."""
    if not np.all(np.isfinite(x)):
        raise FloatingPointError(f"{what} diverged (non-finite parameters) at round {round}; lower {lower}")


def evaluate_global(fed: Federation, x: np.ndarray, round: int) -> dict[str, float]:
    """The global model on the global test set, logged as an `evals` row."""
    m = fed.evaluate(x)
    fed.log_eval(round, m)
    return m
