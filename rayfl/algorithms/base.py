"""What an algorithm is to the rest of rayfl: a config dataclass and a server loop.

The server loop is an ordinary function `run(fed, cfg, run_cfg) -> summary` that reads like the
paper's pseudocode; everything about Ray, time and logging lives behind the Federation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayfl.config import AlgorithmConfig, RunConfig

ServerLoop = Callable[[Any, AlgorithmConfig, RunConfig], dict[str, Any]]


def eval_due(round: int, run: RunConfig) -> bool:
    """Evaluate every `run.eval_every` rounds and always after the last one."""
    return (round + 1) % run.eval_every == 0 or round == run.rounds - 1
