"""The clients' learning rate across rounds (constant within a round): a global scheduler.

The FFGG paper's Table 2 and App. E.4 ("a global scheduler that applies a schedule to the client
learning rates across multiple rounds"): "Linear" warms the client LR up linearly over the first
10% of rounds, then decays it linearly towards 0; "Exponential" (PyTorch's StepLR) halves it
every fixed number of rounds (EMNIST's "LR decay rounds" cell is missing from the paper's text;
500 is Pillutla et al.'s scripts' value). The schedule scales the client LR only, as App. E.4
says; the server LR stays constant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config import ConfigError


@dataclass
class RoundLRConfig:
    """kind: constant, linear (warm-up over warmup_fraction of the rounds, then linear decay to
    0 at the last round) or step (times `factor` every `step_rounds` rounds)."""

    # The clients' lr across rounds: constant; linear (warm-up over warmup_fraction of the rounds,
    # then linear decay towards 0 at the last); step (times factor every step_rounds rounds).
    kind: Literal["constant", "linear", "step"] = "constant"
    # linear only: the fraction of rounds spent warming up, in [0, 1).
    warmup_fraction: float = 0.1
    # step only: rounds between two multiplications by factor (>= 1).
    step_rounds: int = 500
    # step only: the multiplier applied every step_rounds rounds (> 0; 0.5 halves).
    factor: float = 0.5

    def validate_as(self, key: str) -> None:
        if self.kind not in ("constant", "linear", "step"):
            raise ConfigError(f"{key}.kind", f"unknown {self.kind!r}; allowed: constant, linear, step")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError(f"{key}.warmup_fraction", f"must be in [0, 1), got {self.warmup_fraction}")
        if self.step_rounds < 1:
            raise ConfigError(f"{key}.step_rounds", f"must be >= 1, got {self.step_rounds}")
        if not self.factor > 0:
            raise ConfigError(f"{key}.factor", f"must be > 0, got {self.factor}")


def round_lr(cfg: RoundLRConfig, lr: float, round: int, rounds: int) -> float:
    """The client LR of round `round` (0-based) of `rounds`.

    linear, W = round(warmup_fraction * rounds) warm-up rounds: lr (r + 1) / W for r < W, then
    lr (rounds - r) / (rounds - W): lr at r = W, lr / (rounds - W) at the last round.
    step: lr * factor ** (r // step_rounds)."""
    if cfg.kind == "constant":
        return lr
    if cfg.kind == "step":
        return lr * cfg.factor ** (round // cfg.step_rounds)
    warmup = int(cfg.warmup_fraction * rounds + 0.5)  # rounded half up
    if round < warmup:
        return lr * (round + 1) / warmup
    return lr * (rounds - round) / max(rounds - warmup, 1)
