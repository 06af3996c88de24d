"""The workloads `rayfl bench` times against a plain PyTorch loop: the small MLP and linear
model of rayfl's own speed work, and the networks and data shapes of the FL literature
(LEAF's FEMNIST CNN and Shakespeare LSTM, a CIFAR-10 ResNet-18), with data generated offline
in the real shapes (`data.dataset: lookalike`), so every benchmark runs without a download."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# 1,000 clients x 75 samples of Synthetic-IID shaped like MNIST, 15 held out: 60 training each
MNIST_SHAPED = (
    "data.dataset=synthetic", "data.iid=true", "data.features=784", "data.classes=10",
    "data.size_mu=0.0", "data.size_sigma=0.0", "data.min_client_samples=75",
    "data.max_client_samples=75", "data.test_fraction=0.2",
    "partition.method=natural", "partition.num_clients=1000",
    "algorithm.name=fedavg", "algorithm.clients_per_round=100", "algorithm.local_epochs=1",
    "algorithm.batch_size=10", "algorithm.lr=0.05",
)
MNIST_DATA = "synthetic IID, 784 features, 10 classes (shaped like MNIST, generated offline); 1,000 clients x 60 training samples"


@dataclass(frozen=True)
class Workload:
    """One benchmark: its job keys, what its data and model are (for the summary), and the
    variants and rounds a plain `rayfl bench NAME` runs."""

    overrides: tuple[str, ...]
    data: str
    model: str
    rounds: int = 12
    vectorize: tuple[str, ...] = ("on", "off")
    hosts: tuple[int, ...] = (1, 2)
    preaggregate: tuple[str, ...] = ("off", "on")

    @property
    def literature(self) -> bool:
        return "lookalike" in " ".join(self.overrides)

    def describe(self) -> dict[str, Any]:
        return {"data": self.data, "model": self.model}


def _literature(*keys: str, data: str, model: str) -> Workload:
    """A literature workload: 8 rounds by default (6 timed: each round takes seconds), the
    defaults (`auto`) beside `on` and `off`, on 2 hosts."""
    return Workload(("algorithm.name=fedavg", "algorithm.local_epochs=1", *keys), data, model, rounds=8,
                    vectorize=("auto", "on", "off"), hosts=(2,), preaggregate=("on",))


WORKLOADS: dict[str, Workload] = {
    "fedavg-mlp": Workload((*MNIST_SHAPED, "model.name=mlp", "model.hidden=[200]"), MNIST_DATA, "MLP 784-200-10"),
    "fedavg-linear": Workload((*MNIST_SHAPED, "model.name=linear"), MNIST_DATA, "linear 784-10"),
    # FedProx's proximal term: the vectorised kernel carries it through its windows of steps
    "fedprox-mlp": Workload((*MNIST_SHAPED, "model.name=mlp", "model.hidden=[200]", "algorithm.name=fedprox",
                             "algorithm.mu=0.01"), MNIST_DATA, "MLP 784-200-10, FedProx mu 0.01"),
    "femnist-cnn": _literature(
        "data.dataset=lookalike", "data.like=femnist", "data.test_fraction=0.1",
        "partition.method=natural", "partition.num_clients=3500",
        "model.name=femnist_cnn", "algorithm.clients_per_round=20", "algorithm.batch_size=20", "algorithm.lr=0.01",
        data="shaped like FEMNIST: 28x28 grayscale, 62 classes, 3,500 writers of lognormal sizes "
             "(mean 228, 10% held out), generated offline",
        model="LEAF's CNN: 5x5 conv 32, pool, 5x5 conv 64, pool, dense 2048, 62 logits (6.6M parameters)"),
    "cifar-resnet": _literature(
        "data.dataset=lookalike", "data.like=cifar10", "data.test_fraction=0.2",
        "partition.method=dirichlet", "partition.alpha=0.3", "partition.num_clients=100",
        "model.name=resnet18", "model.width=16", "algorithm.clients_per_round=10", "algorithm.batch_size=32",
        "algorithm.lr=0.05",
        data="shaped like CIFAR-10: 32x32 RGB, 10 classes, 40,000 training images over 100 clients "
             "(Dirichlet 0.3), generated offline",
        model="ResNet-18 with GroupNorm, width 16 (a quarter of ResNet-18's channels: what a CPU runs)"),
    "shakespeare-lstm": _literature(
        "data.dataset=lookalike", "data.like=shakespeare", "data.test_fraction=0.2",
        "partition.method=natural", "partition.num_clients=700",
        "model.name=char_lstm", "algorithm.clients_per_round=10", "algorithm.batch_size=10", "algorithm.lr=0.8",
        data="shaped like LEAF's Shakespeare: 80-character sequences, next character of 80, 700 clients of "
             "lognormal sizes (mean 108: LEAF's roles hold thousands, one epoch of which takes minutes "
             "per round here), generated offline",
        model="LEAF's character model: embedding 8, 2-layer LSTM of 256, 80 logits (0.82M parameters)"),
}


def workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {sorted(WORKLOADS)}")
    return WORKLOADS[name]


def workload_config(name: str, rounds: int, *extra: str) -> Any:
    """The workload's job for `rounds` rounds (evaluated once, at the end) with `extra` keys."""
    from rayfl.config import load_config

    return load_config(None, [*workload(name).overrides, "output.log_clients=true", f"run.rounds={rounds}",
                              f"run.eval_every={rounds}", *extra])
