"""The round drivers: an algorithm is its parts (rayfl.driver.parts); the synchronous and the
asynchronous driver own the round (sampling, dispatch, the round policy, the pipeline,
evaluation, logging, checkpoints, failures). Names load on first use, so the config module
can import the `asynchrony:` section (rayfl.driver.settings) without the drivers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "Algorithm": "rayfl.driver.parts",
    "Phase": "rayfl.driver.parts",
    "Round": "rayfl.driver.parts",
    "Uploads": "rayfl.driver.parts",
    "is_algorithm": "rayfl.driver.checks",
    "drive": "rayfl.driver.run",
}

__all__ = ["Algorithm", "Phase", "Round", "Uploads", "drive", "is_algorithm"]

if TYPE_CHECKING:
    from rayfl.driver.checks import is_algorithm
    from rayfl.driver.parts import Algorithm, Phase, Round, Uploads
    from rayfl.driver.run import drive


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
