"""What every peer runner shares: the exported `fedavg-mlp` workload (its arrays and its
settings, written by scripts/compare_peers.py), the model it trains, its test accuracy and
the one JSON line a runner prints. It needs numpy and torch only, so it runs in each peer's
own virtual environment, where rayfl is not installed."""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass
class Workload:
    """The arrays and settings of one exported workload: client c trains on rows
    offsets[c]:offsets[c + 1] of train_x / train_y; every system starts from `initial`."""

    train_x: np.ndarray
    train_y: np.ndarray
    offsets: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    initial: np.ndarray
    settings: dict[str, Any]

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    def client(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self.offsets[c]), int(self.offsets[c + 1])
        return self.train_x[lo:hi], self.train_y[lo:hi]

    def __getattr__(self, key: str) -> Any:  # rounds, clients_per_round, batch_size, lr, ...
        try:
            return self.__dict__["settings"][key]
        except KeyError:
            raise AttributeError(key) from None


@functools.cache
def load_workload(path: Path) -> Workload:
    """The workload at `path`, read once per process: a simulator that runs many clients in
    one worker process reads the arrays once, as rayfl's hosts map them once."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in ("train_x", "train_y", "offsets", "test_x", "test_y", "initial")}
    return Workload(**arrays, settings=json.loads(Path(path).with_suffix(".json").read_text()))


def build_model(w: Workload) -> nn.Sequential:
    """The workload's MLP with the exported initial weights (rayfl's flat order: each Linear's
    weight, then its bias)."""
    layers: list[nn.Module] = []
    width = w.features
    for h in w.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.Sequential(*layers, nn.Linear(width, w.classes))
    nn.utils.vector_to_parameters(torch.from_numpy(w.initial.astype(np.float32)), model.parameters())
    return model


def accuracy(model: nn.Module, w: Workload) -> float:
    """Test accuracy on the held-out rows of every client, as rayfl's final evaluation counts it."""
    with torch.no_grad():
        logits = model(torch.from_numpy(w.test_x))
    return float((logits.argmax(1).numpy() == w.test_y).mean())


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", type=Path, required=True, help="the .npz written by scripts/compare_peers.py")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="processes (or parallel clients) the library may use; default: every core")
    return parser.parse_args()


def seconds_per_round(starts: list[float], end: float) -> tuple[list[float], float]:
    """Each round's wall seconds from the rounds' start times and the last round's end, and
    their median over rounds 1..R-2, as `rayfl bench` times them (round 0 holds the warm-up,
    the last round rayfl's final evaluation)."""
    seconds = [b - a for a, b in zip(starts, [*starts[1:], end], strict=True)]
    timed = seconds[1:-1] or seconds
    return seconds, statistics.median(timed)


def report(system: str, versions: dict[str, str], starts: list[float], end: float, total: float,
           accuracy_value: float | None, **extra: Any) -> None:
    """Print the runner's result: one JSON line, the last line of its output. `starts` and
    `end` time the rounds; `total` is the whole training call, the library's start and stop
    included."""
    seconds, median = seconds_per_round(starts, end)
    print(json.dumps({"system": system, "versions": versions, "seconds_per_round": round(median, 4),
                      "round_seconds": [round(s, 4) for s in seconds], "total_seconds": round(total, 3),
                      "final_accuracy": accuracy_value, "torch_threads": torch.get_num_threads(), **extra}),
          flush=True)


def now() -> float:
    return time.perf_counter()
