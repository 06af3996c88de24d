"""The global (or a personalized) model on every client's own train and validation data.

Robust and personalized FL judge a model by its worst client, not by the pooled test set:
ComFedL's Fig. 2 plots the average and the worst client accuracy on each client's train and
validation split (`partition.client_test: proportional` gives every client a validation set).
One `fed.call` off the simulated clock runs `client_eval` on all clients, so each host answers
in one batched call; the server logs one `evals` row per client and split and returns the
aggregates for the `rounds` row.

Personalized evaluation (Per-FedAvg, ComFedL-DAMAML, FedAvg "with one step at test time") adapts
first: `adapt_steps` SGD steps of `adapt_lr` on training minibatches of `adapt_batch_size`
drawn from the client's `eval.adapt` stream. Ditto evaluates a personal model kept in client
state (`state_key`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rayfl.algorithms.kernels import CrossEntropyGrad
from rayfl.engine import ClientContext, Federation
from rayfl.models.metrics import loss_correct_count
from rayfl.models.params import functional_logits
from rayfl.zo.lower_level import minibatch_indices

SPLITS = ("train", "val")


def _loss_accuracy(ctx: ClientContext, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean CE and accuracy of the flat vector `w` on (x, y)."""
    with torch.no_grad():
        loss_sum, correct, count = loss_correct_count(functional_logits(ctx.model, w, x), y)
    ctx.work.forward(len(y))
    return loss_sum / max(count, 1), correct / max(count, 1)


def adapt(ctx: ClientContext, w: torch.Tensor, steps: int, lr: float, batch_size: int) -> torch.Tensor:
    """`steps` plain SGD steps on the client's training minibatches (stream `eval.adapt`)."""
    if steps <= 0 or ctx.num_samples == 0:
        return w
    kernel = CrossEntropyGrad(ctx.model)
    xs, ts = kernel.prepare(ctx.x, ctx.y)
    w = w.clone()
    for idx in minibatch_indices(ctx.rng("eval.adapt"), ctx.num_samples, batch_size, steps):
        idx = idx.to(xs.device)
        _, grad = kernel(w[None], xs.index_select(0, idx), ts.index_select(0, idx))
        w -= lr * grad[0]
    return w


def client_eval(
    ctx: ClientContext,
    params: np.ndarray,
    adapt_steps: int = 0,
    adapt_lr: float = 0.0,
    adapt_batch_size: int = 32,
    state_key: str | None = None,
) -> dict[str, Any]:
    """Loss and accuracy on this client's train and validation split of `params` (or of the
    personal vector `ctx.state[state_key]` when it exists), after optional adaptation; an
    empty or missing split is left out (a NaN would mark the task non-finite). Changes no
    client state."""
    personal = ctx.state.get(state_key) if state_key else None
    source = personal if personal is not None else params  # a committed tensor, or the broadcast array
    w = source.detach().clone() if isinstance(source, torch.Tensor) else torch.tensor(source)
    w = w.to(device=ctx.device, dtype=torch.float32)
    w = adapt(ctx, w, adapt_steps, adapt_lr, adapt_batch_size)
    out: dict[str, Any] = {}
    for split, x, y in (("train", ctx.x, ctx.y), ("val", ctx.test_x, ctx.test_y)):
        if x is not None and y is not None and len(y) > 0:
            out[f"{split}_loss"], out[f"{split}_accuracy"] = _loss_accuracy(ctx, w, x, y)
    return out


def summarize(per_client: dict[int, dict[str, float]], prefix: str = "") -> dict[str, float]:
    """avg_ (unweighted mean over clients) and worst_ (min accuracy, max loss) of every split,
    ignoring clients without that split."""
    out: dict[str, float] = {}
    for split in SPLITS:
        for metric in ("accuracy", "loss"):
            vals = np.array([m[f"{split}_{metric}"] for m in per_client.values() if f"{split}_{metric}" in m],
                            dtype=np.float64)
            if len(vals) == 0:
                continue
            out[f"{prefix}avg_{split}_{metric}"] = float(vals.mean())
            out[f"{prefix}worst_{split}_{metric}"] = float(vals.min() if metric == "accuracy" else vals.max())
    return out


def evaluate_clients(
    fed: Federation,
    params: np.ndarray,
    round: int,
    *,
    adapt_steps: int = 0,
    adapt_lr: float = 0.0,
    adapt_batch_size: int = 32,
    state_key: str | None = None,
    prefix: str = "",
) -> dict[str, float]:
    """Evaluate on every client (one call per host, off the simulated clock), log one `evals`
    row per client and split (`split` = prefix + "train" / "val", columns test_loss and
    test_accuracy as for the global model) and return the avg_ / worst_ aggregates."""
    results = fed.call(
        list(range(fed.num_clients)), client_eval, round=round, phase="eval", timed=False, params=params,
        adapt_steps=adapt_steps, adapt_lr=adapt_lr, adapt_batch_size=adapt_batch_size, state_key=state_key,
    )
    per_client = {r.client: {k: float(v) for k, v in r.values.items()} for r in results}
    for c, m in per_client.items():
        for split in SPLITS:
            if f"{split}_accuracy" in m:
                fed.log_eval(round, {"test_loss": m[f"{split}_loss"], "test_accuracy": m[f"{split}_accuracy"]},
                             client=c, split=prefix + split)
    return summarize(per_client, prefix)


def evaluate_global_and_clients(fed: Federation, params: np.ndarray, round: int, clients: bool) -> dict[str, float]:
    """The global model on the global test set and, with `clients`, on every client's own
    train and validation data (the avg_ and worst_ columns): what the fairness methods report
    at each evaluation (ComFedL, DRFA, q-FedAvg)."""
    from rayfl.driver.rounds import evaluate_global

    m = evaluate_global(fed, params, round)
    if clients:
        m.update(evaluate_clients(fed, params, round))
    return m
