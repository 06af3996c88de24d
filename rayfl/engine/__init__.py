"""The execution engine: client hosts on Ray, the Federation driver, the simulated clock."""

from rayfl.engine.asyncpool import AsyncPool
from rayfl.engine.context import ClientContext, WorkMeter
from rayfl.engine.federation import Federation, ServerData
from rayfl.engine.tasks import ClientResult

__all__ = ["AsyncPool", "ClientContext", "ClientResult", "Federation", "ServerData", "WorkMeter"]
