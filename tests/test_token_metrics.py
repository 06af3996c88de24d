"""Sequence models are scored per real token: padding targets (-100) count neither as samples
nor as wrong predictions, in the engine's global evaluation and in per-client evaluations."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.engine.evaluation import evaluate_arrays
from rayfl.models.metrics import loss_correct_count
from rayfl.models.params import get_flat


class TokenLinear(torch.nn.Module):
    """x [N, T, F] -> logits [N, V, T], the layout of rayfl's transformer."""

    def __init__(self, features: int, vocab: int):
        super().__init__()
        self.out = torch.nn.Linear(features, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x).permute(0, 2, 1)


def test_counts_skip_padding_targets():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]])  # [N=1, V=2, T=3]
    targets = torch.tensor([[0, 0, -100]])
    loss_sum, correct, count = loss_correct_count(logits, targets)
    assert (correct, count) == (1, 2)  # token 0 right, token 1 wrong, token 2 padding
    hand = -np.log(np.exp(2) / (np.exp(2) + 1)) - np.log(1 / (1 + np.exp(3)))
    assert np.isclose(loss_sum, hand, rtol=1e-6)


def test_classification_counts_are_per_sample():
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    loss_sum, correct, count = loss_correct_count(logits, torch.tensor([0, 0, 0]))
    assert (correct, count) == (2, 3)
    assert np.isclose(loss_sum, float(F.cross_entropy(logits, torch.tensor([0, 0, 0]), reduction="sum")))


def test_global_evaluation_of_a_sequence_model_is_per_token():
    torch.manual_seed(0)
    model = TokenLinear(4, 5)
    x = np.random.default_rng(0).normal(size=(7, 6, 4)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 5, size=(7, 6)).astype(np.int64)
    y[:, 4:] = -100  # the last two positions of every sequence are padding
    y[0, 2:] = -100
    out = evaluate_arrays(model, get_flat(model).numpy(), x, y, batch_size=3)
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
    t = torch.from_numpy(y)
    valid = t != -100
    expected_acc = float(((logits.argmax(1) == t) & valid).sum()) / int(valid.sum())
    expected_loss = float(F.cross_entropy(logits, t))  # mean over non-ignored targets
    assert np.isclose(out["accuracy"], expected_acc) and 0.0 <= out["accuracy"] <= 1.0
    assert np.isclose(out["loss"], expected_loss, rtol=1e-5)
