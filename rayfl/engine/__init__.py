"""The execution engine: client hosts on Ray, the Federation driver, the simulated clock.

The names below load on first use (PEP 562): a ClientHost actor imports `rayfl.engine.host`,
and importing this package eagerly would pull the driver's whole stack (pandas, pyarrow, the
Parquet writer) into every host process at start-up."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "AsyncPool": "rayfl.engine.asyncpool",
    "ClientContext": "rayfl.engine.context",
    "WorkMeter": "rayfl.engine.context",
    "Federation": "rayfl.engine.federation",
    "ServerData": "rayfl.engine.evaluation",
    "ClientResult": "rayfl.engine.tasks",
}

__all__ = ["AsyncPool", "ClientContext", "ClientResult", "Federation", "ServerData", "WorkMeter"]

if TYPE_CHECKING:
    from rayfl.engine.asyncpool import AsyncPool
    from rayfl.engine.context import ClientContext, WorkMeter
    from rayfl.engine.evaluation import ServerData
    from rayfl.engine.federation import Federation
    from rayfl.engine.tasks import ClientResult


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
