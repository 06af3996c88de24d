"""The `fedavg-mlp` workload on pfl-research (Apple's simulator): its `FederatedAveraging`
over a `SimulatedBackend`, with the model as a `PyTorchModel`. Run in pfl's own virtual
environment by scripts/compare_peers.py; prints one JSON line (shared_workload.report).

pfl simulates in one process (its multi-process mode needs Horovod), here on one torch thread,
as the plain loop runs: torch's OpenMP threads on steps of 10 rows cost more than they give on
a machine whose other core is busy."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from shared_workload import Workload, accuracy, arguments, build_model, load_workload, now, report
from torch import nn


class LossAndMetrics(nn.Module):
    """The workload's MLP with the two methods `PyTorchModel` calls on a user's batch."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.eval() if eval else self.train()
        return F.cross_entropy(self.net(x), y.long())

    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> dict[str, Any]:
        self.eval() if eval else self.train()
        with torch.no_grad():
            logits = self.net(x)
        loss = F.cross_entropy(logits, y.long(), reduction="sum").item()
        correct = (logits.argmax(1) == y).sum().item()
        return {"loss": Weighted(loss, len(x)), "accuracy": Weighted(correct, len(x))}


class RoundClock(TrainingProcessCallback):
    """The wall clock at the start of training and at the end of every central iteration."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_begin(self, *, model: Any) -> Metrics:
        self.stamps.append(now())
        return Metrics()

    def after_central_iteration(self, aggregate_metrics: Metrics, model: Any, *,
                                central_iteration: int) -> tuple[bool, Metrics]:
        self.stamps.append(now())
        return False, Metrics()


def federated(w: Workload, clients: range) -> FederatedDataset:
    """Each client's own rows as a pfl user; a cohort draws distinct users where it can."""
    users = {c: Dataset(w.client(c), user_id=c) for c in clients}
    return FederatedDataset(lambda c: users[c], get_user_sampler("minimize_reuse", list(users)))


def main() -> None:
    args = arguments(__doc__)
    torch.set_num_threads(1)
    w = load_workload(args.data)
    began = now()  # the library's own setup onwards, not reading the arrays
    net = LossAndMetrics(build_model(w))
    model = PyTorchModel(net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=federated(w, range(w.num_clients)), val_data=federated(w, range(1)))
    clock = RoundClock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=w.rounds, evaluation_frequency=w.rounds + 1,
                                           train_cohort_size=w.clients_per_round, val_cohort_size=None),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_num_epochs=w.local_epochs, local_learning_rate=w.lr,
                                              local_batch_size=w.batch_size),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[clock])
    total = now() - began
    report("pfl-research", {"pfl": version("pfl"), "torch": torch.__version__, "numpy": np.__version__},
           clock.stamps[:-1], clock.stamps[-1], total, accuracy(net.net, w))


if __name__ == "__main__":
    main()
