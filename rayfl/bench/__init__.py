"""`rayfl bench`: the benchmark workloads, one small module each, sharing the timing, peak
memory, result-writing (`common`) and reference-loop (`reference`) machinery.

    scale          many registered clients, seconds per round and peak memory
    asynchronous   stragglers: sync vs deadline vs FedBuff, async wall-clock speed-up
    zo             a ZO-HFL round against FedAvg rounds
    workloads      the workloads timed against a plain PyTorch loop: fedavg-mlp / fedavg-linear /
                   fedprox-mlp, and the literature's femnist-cnn / cifar-resnet / shakespeare-lstm
    fedavg         runs one of them: the loop, then rayfl under each (vectorize, preaggregate,
                   hosts), back to back
    startup        a short job as a whole process: the seconds outside its rounds, by phase"""

from typing import Any

# imported when first used: `rayfl --help` lists the workloads (rayfl.bench.workloads) without
# importing torch or Ray
_EXPORTS = {
    "PeakMemory": "rayfl.bench.common", "run_async_bench": "rayfl.bench.asynchronous",
    "run_fedavg_bench": "rayfl.bench.fedavg", "run_scale_bench": "rayfl.bench.scale",
    "run_startup_bench": "rayfl.bench.startup", "run_zo_bench": "rayfl.bench.zo",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rayfl.bench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
