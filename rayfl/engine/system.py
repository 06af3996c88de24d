"""The device / network model behind the simulated clock.

A client task's simulated duration is computed from the work it reports and the bytes it moves,
never from wall-clock time, so simulated time is deterministic and independent of the hardware
running the simulation:

    duration = flops / speed + bytes_down / down_bw + bytes_up / up_bw + latency

with flops = forward_flops_per_sample * (forward_samples + backward_cost * backward_samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rayfl.config import SystemConfig
from rayfl.rng import numpy_rng


@dataclass(frozen=True)
class TaskTiming:
    compute: float
    download: float
    upload: float
    latency: float

    @property
    def total(self) -> float:
        return self.compute + self.download + self.upload + self.latency


class SystemModel:
    """Per-client device profiles (speed in FLOP/s, bandwidths in bytes/s, latency in s)."""

    def __init__(self, cfg: SystemConfig, num_clients: int, forward_flops: float, seed: int):
        self.cfg = cfg
        self.forward_flops = float(forward_flops)
        self.speed = client_speeds(cfg, num_clients, seed)

    def timing(
        self,
        client: int,
        forward_samples: int,
        backward_samples: int,
        bytes_down: int,
        bytes_up: int,
    ) -> TaskTiming:
        flops = self.forward_flops * (forward_samples + self.cfg.backward_cost * backward_samples)
        return TaskTiming(
            compute=flops / self.speed[client],
            download=bytes_down / self.cfg.down_bandwidth,
            upload=bytes_up / self.cfg.up_bandwidth,
            latency=self.cfg.latency,
        )


def client_speeds(cfg: SystemConfig, num_clients: int, seed: int) -> np.ndarray:
    """Compute speeds in FLOP/s; lognormal speeds keep `compute_speed` as their median."""
    if cfg.speed_distribution == "constant":
        return np.full(num_clients, cfg.compute_speed)
    rng = numpy_rng(seed, "system.speed")
    return cfg.compute_speed * rng.lognormal(0.0, cfg.speed_sigma, size=num_clients)


def forward_flops_per_sample(model: torch.nn.Module, input_shape: tuple[int, ...]) -> float:
    """Multiply-adds x 2 of one forward pass, counted from Linear and Conv2d layers by hooks.
    (Activations, pooling and normalisation are cheap next to these and are ignored.)"""
    total = 0.0

    def linear_hook(mod: torch.nn.Linear, inp, out) -> None:
        nonlocal total
        total += 2.0 * mod.in_features * mod.out_features

    def conv_hook(mod: torch.nn.Conv2d, inp, out) -> None:
        nonlocal total
        k = mod.kernel_size[0] * mod.kernel_size[1]
        total += 2.0 * k * (mod.in_channels // mod.groups) * out.shape[1] * out.shape[2] * out.shape[3]

    handles = []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
        elif isinstance(m, torch.nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            model(torch.zeros((2, *input_shape), device=device))  # hooks count per sample
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return total
