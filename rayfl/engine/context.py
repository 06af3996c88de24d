"""What a client function sees inside its host: its data, its persistent state, its RNG streams
and a work meter. Client functions are plain `fn(ctx, **payload) -> dict`, so they can be tested
without Ray and the host can run many of them in one remote call."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rayfl.rng import numpy_rng, torch_generator


@dataclass
class WorkMeter:
    """Work a client task actually did, in sample-passes, for the simulated clock.

    `forward_samples` count inference-only passes (zeroth-order evaluations, evaluation);
    `backward_samples` count forward+backward passes; `steps` counts optimiser steps.
    `budget_flops` (set by a deadline policy with partial work) caps the work: `batches()`
    stops before a step the client could not finish in time."""

    forward_samples: int = 0
    backward_samples: int = 0
    steps: int = 0
    flops_per_sample: float = 0.0
    backward_cost: float = 3.0
    budget_flops: float | None = None
    truncated: bool = False

    def forward(self, samples: int) -> None:
        self.forward_samples += int(samples)

    def gradient_step(self, samples: int) -> None:
        self.backward_samples += int(samples)
        self.steps += 1

    @property
    def flops(self) -> float:
        return self.flops_per_sample * (self.forward_samples + self.backward_cost * self.backward_samples)

    def affords_step(self, samples: int) -> bool:
        """Whether a gradient step on `samples` still fits the budget (always, without one)."""
        if self.budget_flops is None:
            return True
        ok = self.flops + self.flops_per_sample * self.backward_cost * samples <= self.budget_flops
        self.truncated = self.truncated or not ok
        return ok


@dataclass
class ClientContext:
    """One client's view during one task.

    `state` persists across rounds inside the host, transactionally: the task works on a
    private copy, which becomes the client's state only if the server accepts the task
    (outcome ok). A late, dropped, offline, stale or non-finite task changes nothing, so
    invariants such as SCAFFOLD's c = mean of all c_i hold under every round policy, and a
    failed task can be re-run from the same state."""

    # The client's id, 0 .. num_clients - 1 (the `clients` table's `client`).
    id: int
    # The server round of a synchronous call; an asynchronous task's own number. It keys the
    # random streams of `rng`, `generator` and `batches`.
    round: int
    # The run's seed (run.seed).
    seed: int
    # The host's one network, shared by all its clients: load the parameters you train from the
    # payload (rayfl.set_flat, or local_sgd's flat vector), never rely on what it holds.
    model: torch.nn.Module
    # Where the host computes (engine.device): put the tensors you make here.
    device: torch.device
    # The client's training inputs [n, *input_shape], on `device`.
    x: torch.Tensor
    # The client's int64 training labels [n], on `device`.
    y: torch.Tensor
    # The client's own test rows (partition.client_test), else None.
    test_x: torch.Tensor | None
    # The labels of `test_x`, else None.
    test_y: torch.Tensor | None
    # The client's persistent state: {} the first time the client runs; this task's private copy,
    # committed only when the server accepts the task (docs/reference/client-contract.md).
    state: dict[str, Any]
    # The work this task did, for the simulated clock: `gradient_step(samples)` per optimiser step,
    # `forward(samples)` per inference-only pass; local_sgd calls them for you, a loop of your own
    # over batches() calls them itself.
    work: WorkMeter = field(default_factory=WorkMeter)
    # Train the model's 2-D convolutions with channels-last weights (engine.channels_last, decided
    # once per run by the host: rayfl.models.channels_last); local_sgd reads it.
    channels_last: bool = False
    # Set while the host runs the call's clients in lockstep (rayfl.engine.lockstep): local_sgd
    # then parks here, to run batched with the other clients' local SGD.
    lockstep: Any = None

    @property
    def num_samples(self) -> int:
        """Training samples this client holds (its rows in `x` and `y`)."""
        return int(self.y.shape[0])

    def rng(self, purpose: str) -> np.random.Generator:
        """A numpy stream private to (run seed, purpose, round, client)."""
        return numpy_rng(self.seed, purpose, self.round, self.id)

    def generator(self, purpose: str) -> torch.Generator:
        """A torch CPU generator private to (run seed, purpose, round, client)."""
        return torch_generator(self.seed, purpose, self.round, self.id)

    def batches(
        self,
        batch_size: int,
        *,
        epochs: int | None = None,
        steps: int | None = None,
        purpose: str = "batches",
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Shuffled minibatches: `epochs` full passes, or exactly `steps` batches (reshuffling at
        each pass). Batch size is clipped to the client's sample count. The order depends only
        on (seed, purpose, round, client), never on which host runs the client. Iteration stops
        early when the work budget (partial work under a deadline) would be exceeded."""
        n = self.num_samples
        if n == 0:
            return
        b = min(batch_size, n)
        rng = self.rng(purpose)
        if epochs is not None:
            for _ in range(epochs):
                perm = torch.from_numpy(rng.permutation(n))
                for start in range(0, n, b):
                    idx = perm[start : start + b]
                    if not self.work.affords_step(len(idx)):
                        return
                    yield self.x[idx], self.y[idx]
            return
        assert steps is not None, "give epochs or steps"
        perm, pos = torch.from_numpy(rng.permutation(n)), 0
        for _ in range(steps):
            if pos + b > n:
                perm, pos = torch.from_numpy(rng.permutation(n)), 0
            idx = perm[pos : pos + b]
            pos += b
            if not self.work.affords_step(len(idx)):
                return
            yield self.x[idx], self.y[idx]
