"""Algorithm 2 of ZO-HFL: projected SGD on a client's lower-level problem, K solves at once.

y_{t+1} = Pi_{Y(x)}[y_t - gamma~_t (grad L(y_t; zeta_t) + mu (y_t - x))], t = 0..H-1, with
gamma~_t = gamma~ / (t + Gamma) restarting every call (arXiv 2504.01839, Alg. 2 and Sec. IV).
ZO-HFL solves it twice per round, at x = x_r + eta v and x = x_r - eta v; stacking the two as a
[2, d] batch costs little more than one solve when they share minibatches (common random
numbers), because the minibatch's matmul is shared.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rayfl.zo.projection import ConstraintConfig, project_
from rayfl.zo.schedules import step_size

DataGrad = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def minibatch_indices(rng: np.random.Generator, n: int, batch_size: int, steps: int) -> torch.Tensor:
    """[steps, b] sample indices, b = min(batch_size, n): passes over a fresh permutation, a
    pass ending when fewer than b unused samples are left (the same sequence as
    `ClientContext.batches(steps=...)` draws from the same generator)."""
    b = min(batch_size, n)
    if steps <= 0 or b <= 0:
        return torch.zeros((0, max(b, 0)), dtype=torch.int64)
    per_pass = n // b
    passes = -(-steps // per_pass)
    blocks = [rng.permutation(n)[: per_pass * b].reshape(per_pass, b) for _ in range(passes)]
    return torch.from_numpy(np.concatenate(blocks)[:steps])


def epoch_indices(rng: np.random.Generator, n: int, batch_size: int, epochs: int) -> list[torch.Tensor]:
    """Index batches of `epochs` full passes, the last batch of a pass possibly short (the
    sequence of `ClientContext.batches(epochs=...)`)."""
    b = min(batch_size, n)
    out: list[torch.Tensor] = []
    for _ in range(epochs if n else 0):
        perm = torch.from_numpy(rng.permutation(n))
        out.extend(perm[start : start + b] for start in range(0, n, b))
    return out


def projected_sgd(
    starts: torch.Tensor,
    centers: torch.Tensor,
    *,
    steps: int,
    lr: float,
    lr_offset: float | None,
    mu: float,
    constraint: ConstraintConfig,
    data_grad: DataGrad | None,
    client: int = 0,
    affords_step: Callable[[], bool] | None = None,
) -> tuple[torch.Tensor, float, int]:
    """Run Alg. 2 from `starts` [K, d] with prox centres `centers` [K, d] (row k solves around
    centers[k]). `data_grad(y, t) -> (loss [K], grad [K, d])` is the stochastic gradient of the
    data term at step t (None: no data term, e.g. h = mu/2 ||y - x||^2 alone).
    Returns (y_H, mean data loss over steps and rows, steps done); `affords_step` may stop early
    (a deadline's work budget)."""
    y = starts.clone()
    loss_sum: torch.Tensor | None = None
    done = 0
    for t in range(steps):
        if affords_step is not None and not affords_step():
            break
        a = step_size(lr, t, lr_offset)
        if data_grad is not None:
            loss, grad = data_grad(y, t)
            loss_sum = loss if loss_sum is None else loss_sum + loss
        else:
            grad = None
        if mu:  # y - a mu (y - x) = (1 - a mu) y + a mu x
            y.mul_(1.0 - a * mu).add_(centers, alpha=a * mu)
        if grad is not None:
            y.add_(grad, alpha=-a)
        project_(y, centers, constraint, client)
        done += 1
    mean_loss = float(loss_sum.mean()) / done if loss_sum is not None and done else float("nan")
    return y, mean_loss, done
