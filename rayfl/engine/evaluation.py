"""The global model on the driver: its initial parameters, its loss and accuracy on a data set,
and the data the server owns itself. Pure functions of their inputs (and the run seed), so the
benchmarks' reference loop and tests draw and score models exactly as a run does."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from rayfl.models import build_model
from rayfl.models.metrics import loss_correct_count
from rayfl.models.params import get_flat, set_flat
from rayfl.rng import derive_seed, numpy_rng

if TYPE_CHECKING:
    from rayfl.config import Config
    from rayfl.data import FederatedDataset


@dataclass
class ServerData:
    """Data the server itself owns (ZO-HFL's f1 term), sampled with its own seeded stream."""

    x: torch.Tensor
    y: torch.Tensor
    seed: int

    @classmethod
    def of(cls, dataset: FederatedDataset, rows: np.ndarray | None, seed: int) -> ServerData | None:
        """The dataset's server split (`rows`: its features when already read from their
        files), or None when it has none."""
        idx = dataset.server_train
        if idx is None or len(idx) == 0:
            return None
        x = rows if rows is not None else dataset.train_x[idx]
        return cls(torch.from_numpy(x), torch.from_numpy(dataset.train_y[idx]), seed)

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def batch(self, batch_size: int, round: int, purpose: str = "server.batch") -> tuple[torch.Tensor, torch.Tensor]:
        rng = numpy_rng(self.seed, purpose, round)
        idx = torch.from_numpy(rng.choice(self.num_samples, size=min(batch_size, self.num_samples), replace=False))
        return self.x[idx], self.y[idx]


def initial_model_params(cfg: Config, dataset: FederatedDataset, seed: int) -> np.ndarray:
    """The initial global model: the model's own default initialisation under a torch seed
    derived from (seed, 'model.init'), so every run with the same seed starts equal (and so does
    the benchmarks' reference loop)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model.init"))
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        if getattr(cfg.model, "init_from", None):  # another run's model (rayfl.models.init_from)
            from rayfl.models.init_from import initial_vector

            return initial_vector(model, get_flat(model).numpy(), cfg.model.init_from, dataset.input_shape, dataset.num_classes)
    return get_flat(model).numpy()


def evaluate_arrays(
    model: torch.nn.Module,
    params: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 2048,
    prefix: str = "",
) -> dict[str, float]:
    """Mean cross-entropy and accuracy of `params` on (x, y), per target (padding excluded)."""
    set_flat(model, torch.as_tensor(params))
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for xb, yb in iterate(x, y, batch_size):
            batch_loss, batch_correct, batch_count = loss_correct_count(model(xb), yb)
            loss_sum, correct, count = loss_sum + batch_loss, correct + batch_correct, count + batch_count
    n = max(count, 1)  # targets, not samples: a sequence model is scored per real (non-padding) token
    return {f"{prefix}loss": loss_sum / n, f"{prefix}accuracy": correct / n}


def iterate(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(x, y) in consecutive batches of `batch_size` rows, as tensors."""
    for start in range(0, len(y), batch_size):
        yield torch.from_numpy(x[start : start + batch_size]), torch.from_numpy(y[start : start + batch_size])
