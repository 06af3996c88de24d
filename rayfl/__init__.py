"""rayfl: federated-learning simulation on Ray, with a simulated clock and Parquet results.

The public API is what this module exports (`__all__`); every other name in the package is
private by convention and may change between versions.

    import rayfl
    run = rayfl.run("jobs/digits_fedavg.yaml", ["algorithm.lr=0.1"])
    run.rounds.test_accuracy.max()

Bring your own algorithm, model, dataset or partitioner with `rayfl.register_*` (or name it by
import path, "package.module:attr", in a job); see docs/guides/extending.md. Names resolve
lazily, so `import rayfl` stays cheap (no torch, no Ray)."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS = {
    "run": "rayfl.api",
    "resume": "rayfl.api",
    "Run": "rayfl.api",
    "load": ("rayfl.results", "load"),
    "Results": "rayfl.results",
    "load_config": "rayfl.config",
    "Config": "rayfl.config",
    "ConfigError": "rayfl.config",
    "AlgorithmConfig": "rayfl.config",
    "ModelConfig": "rayfl.config",
    "DataConfig": "rayfl.config",
    "PartitionConfig": "rayfl.config",
    "RunConfig": "rayfl.config",
    "register_algorithm": "rayfl.registry",
    "register_model": "rayfl.registry",
    "register_dataset": "rayfl.registry",
    "register_partitioner": "rayfl.registry",
    "register_callback": "rayfl.registry",
    "Callback": ("rayfl.callbacks.base", "Callback"),
    "RunInfo": ("rayfl.callbacks.base", "RunInfo"),
    "CallbackConfig": "rayfl.config",
    "Federation": "rayfl.engine",
    "ClientContext": "rayfl.engine",
    "ClientResult": "rayfl.engine",
    "ArrayDataset": "rayfl.data",
    "FederatedDataset": "rayfl.data",
    "eval_due": ("rayfl.driver.rounds", "eval_due"),
    "Algorithm": ("rayfl.driver.parts", "Algorithm"),
    "Phase": ("rayfl.driver.parts", "Phase"),
    "Round": ("rayfl.driver.parts", "Round"),
    "Uploads": ("rayfl.driver.parts", "Uploads"),
    "AsynchronyConfig": ("rayfl.driver.settings", "AsynchronyConfig"),
    "FedAvg": ("rayfl.algorithms.fedavg", "FedAvg"),
    "FedAvgConfig": ("rayfl.algorithms.fedavg", "FedAvgConfig"),
    "ModelState": ("rayfl.algorithms.server_opt", "ModelState"),
    "fedavg_client": ("rayfl.algorithms.fedavg", "fedavg_client"),
    "local_sgd": ("rayfl.algorithms.local", "local_sgd"),
    "local_sgd_batched": ("rayfl.algorithms.local", "local_sgd_batched"),
    "LocalSchedule": ("rayfl.algorithms.local", "LocalSchedule"),
    "batched": ("rayfl.engine.vectorized", "batched"),
    "stateless": ("rayfl.engine.balance", "stateless"),
    "get_flat": ("rayfl.models.params", "get_flat"),
    "set_flat": ("rayfl.models.params", "set_flat"),
    "build_model": ("rayfl.models.networks", "build_model"),
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'rayfl' has no attribute {name!r}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
