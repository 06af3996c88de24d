"""`ClientHost`: one Ray actor that hosts a shard of clients.

A torch process costs seconds to start and hundreds of MB, so a host keeps many clients: their
index partitions, their persistent state and one model instance they share. The dataset arrays
arrive once through the object store (zero-copy numpy views); per-client state never leaves the
host, unlike Flower's context round-trip."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from rayfl.config import ModelConfig
from rayfl.engine.context import ClientContext
from rayfl.engine.payload import payload_nbytes, to_numpy_tree
from rayfl.models import build_model

ClientFn = Callable[..., dict]


class ClientHostImpl:
    """The host's logic, kept free of Ray so it can be unit-tested and run in-process."""

    def __init__(
        self,
        host_id: int,
        arrays: Mapping[str, np.ndarray],
        client_train: Mapping[int, np.ndarray],
        client_test: Mapping[int, np.ndarray] | None,
        model_cfg: ModelConfig,
        input_shape: tuple[int, ...],
        num_classes: int,
        seed: int,
        torch_threads: int = 1,
        device: str = "auto",
        flops_per_sample: float = 0.0,
        backward_cost: float = 3.0,
    ):
        torch.set_num_threads(torch_threads)
        self.host_id = host_id
        self.arrays = arrays
        self.client_train = dict(client_train)
        self.client_test = dict(client_test) if client_test is not None else None
        self.seed = seed
        self.flops_per_sample = flops_per_sample
        self.backward_cost = backward_cost
        self.device = resolve_device(device)
        self.model = build_model(model_cfg, tuple(input_shape), num_classes).to(self.device)
        self.states: dict[int, dict[str, Any]] = {cid: {} for cid in self.client_train}

    def client_ids(self) -> list[int]:
        return sorted(self.client_train)

    def run(
        self,
        fn: ClientFn,
        client_ids: list[int],
        round: int,
        broadcast: Mapping[str, Any],
        per_client: Mapping[int, Mapping[str, Any]] | None = None,
        budgets: Mapping[int, float] | None = None,
    ) -> list[dict[str, Any]]:
        """Run `fn` for each client in `client_ids` (one after another, in id order) and return
        one record per client: the function's output plus the work it did and bytes it sends.
        `budgets` caps a client's FLOPs (a deadline with partial work)."""
        records = []
        for cid in sorted(client_ids):
            if cid not in self.client_train:
                raise KeyError(f"host {self.host_id} does not host client {cid}")
            ctx = self._context(cid, round)
            if budgets is not None and cid in budgets:
                ctx.work.budget_flops = budgets[cid]
            extra = dict(per_client.get(cid, {})) if per_client else {}
            out = fn(ctx, **broadcast, **extra)
            if not isinstance(out, Mapping):
                raise TypeError(f"client function {getattr(fn, '__name__', fn)} must return a dict")
            values = to_numpy_tree(dict(out))
            records.append(
                {
                    "client": cid,
                    "host": self.host_id,
                    "values": values,
                    "num_samples": ctx.num_samples,
                    "forward_samples": ctx.work.forward_samples,
                    "backward_samples": ctx.work.backward_samples,
                    "local_steps": ctx.work.steps,
                    "truncated": ctx.work.truncated,
                    "bytes_up": payload_nbytes(values),
                    "bytes_down": payload_nbytes(broadcast) + payload_nbytes(extra),
                }
            )
        return records

    def _context(self, cid: int, round: int) -> ClientContext:
        idx = self.client_train[cid]
        x = torch.from_numpy(self.arrays["train_x"][idx]).to(self.device)
        y = torch.from_numpy(self.arrays["train_y"][idx]).to(self.device)
        test_x = test_y = None
        if self.client_test is not None:
            tidx = self.client_test[cid]
            test_x = torch.from_numpy(self.arrays["test_x"][tidx]).to(self.device)
            test_y = torch.from_numpy(self.arrays["test_y"][tidx]).to(self.device)
        ctx = ClientContext(
            id=cid,
            round=round,
            seed=self.seed,
            model=self.model,
            device=self.device,
            x=x,
            y=y,
            test_x=test_x,
            test_y=test_y,
            state=self.states[cid],
        )
        ctx.work.flops_per_sample = self.flops_per_sample
        ctx.work.backward_cost = self.backward_cost
        return ctx

    def get_state(self, client_ids: list[int], key: str) -> dict[int, Any]:
        """Read one state entry of some clients (personalized models, for evaluation/export)."""
        return {cid: to_numpy_tree(self.states[cid].get(key)) for cid in client_ids}

    def info(self) -> dict[str, Any]:
        return {
            "host": self.host_id,
            "pid": os.getpid(),
            "clients": len(self.client_train),
            "device": str(self.device),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "torch_threads": torch.get_num_threads(),
        }


def resolve_device(device: str) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("engine.device is 'cuda' but this host sees no GPU (set engine.num_gpus_per_host > 0)")
        return torch.device("cuda")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def remote_host_class():
    """The Ray actor class, created lazily so importing rayfl does not import ray's workers."""
    import ray

    return ray.remote(ClientHostImpl)
