"""What an algorithm is to the rest of rayfl: a config dataclass and a server loop.

The server loop is an ordinary function `run(fed, cfg, run_cfg) -> summary` that reads like the
paper's pseudocode; everything about Ray, time and logging lives behind the Federation."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayfl.config import AlgorithmConfig, RunConfig

ServerLoop = Callable[[Any, AlgorithmConfig, RunConfig], dict[str, Any]]


@dataclass(frozen=True)
class Algorithm:
    """A registry entry: where the algorithm's config class and server loop live (imported on
    first use, see rayfl.algorithms), and a one-line summary for listings."""

    name: str
    module: str  # its module under rayfl.algorithms
    config_name: str
    run_name: str
    summary: str

    @property
    def module_path(self) -> str:
        return f"rayfl.algorithms.{self.module}"

    @property
    def config_class(self) -> type[AlgorithmConfig]:
        return getattr(importlib.import_module(self.module_path), self.config_name)

    @property
    def run(self) -> ServerLoop:
        return getattr(importlib.import_module(self.module_path), self.run_name)


def eval_due(round: int, run: RunConfig) -> bool:
    """Evaluate every `run.eval_every` rounds and always after the last one."""
    return (round + 1) % run.eval_every == 0 or round == run.rounds - 1
