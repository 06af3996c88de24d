"""Which driver runs an algorithm."""

from __future__ import annotations

from typing import Any

from rayfl.config import AlgorithmConfig, RunConfig
from rayfl.driver.checks import is_algorithm


def drive(fed: Any, target: Any, cfg: AlgorithmConfig, run: RunConfig) -> dict[str, Any]:
    """Run one algorithm on a Federation: a parts-built one under the synchronous driver, or
    the asynchronous one when it asks for asynchrony; a plain server loop
    `fn(fed, cfg, run) -> dict` as it is written."""
    if not is_algorithm(target):
        return target(fed, cfg, run)
    alg = target(fed, cfg, run)
    settings = alg.asynchrony()
    if settings is not None:
        from rayfl.driver.asynchronous import run_async

        return run_async(fed, alg, settings)
    from rayfl.driver.sync import run_sync

    return run_sync(fed, alg)
