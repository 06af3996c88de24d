"""Evaluation counts shared by every evaluator, so a sequence model is scored per real token.

Cross-entropy's `ignore_index` (-100) marks padding targets of sequence models (logits [N, V, T],
targets [N, T]); dividing by the number of samples, or counting padding as a wrong prediction,
would report a next-token model's accuracy per sequence. For classification (targets [N], all
>= 0) the counts are the usual per-sample ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def loss_correct_count(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, int, int]:
    """(summed cross-entropy, correct predictions, counted targets), padding targets excluded."""
    valid = targets != IGNORE_INDEX
    loss_sum = float(F.cross_entropy(logits, targets, reduction="sum", ignore_index=IGNORE_INDEX).item())
    correct = int(((logits.argmax(1) == targets) & valid).sum().item())
    return loss_sum, correct, int(valid.sum().item())
