"""The execution engine: client hosts on Ray, the Federation driver, the simulated clock."""

from rayfl.engine.context import ClientContext, WorkMeter
from rayfl.engine.federation import ClientResult, Federation, ServerData

__all__ = ["ClientContext", "ClientResult", "Federation", "ServerData", "WorkMeter"]
