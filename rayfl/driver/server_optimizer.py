"""The `server:` section's optimizer, applied by the drivers to any algorithm's server step.

Reddi et al. ("Adaptive Federated Optimization", ICLR 2021, Alg. 1) read FedAvg's averaged
model change as a pseudo-gradient for any optimizer on the server. The same reading holds for
any method: whatever its server update does to the global model, x -> x', the change
delta = x' - x is the step, and the server may take it with momentum, Adam or Yogi instead
(rayfl.algorithms.server_opt.server_step at `server.lr`). The algorithm's other state (SCAFFOLD's
control variate, Ditto's personal models) is what its own update made it.

One step per server step: after a synchronous round's last phase (from the model the round
started with), or after each asynchronous server step. The optimizer's moments live in the
run's driver state (`fed.driver_state`), which checkpoints carry, so a resumed run continues
the same velocity."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.algorithms.server_opt import AdamMoments, server_step
from rayfl.driver.settings import ServerConfig

if TYPE_CHECKING:
    from rayfl.driver.parts import Algorithm


class ServerOptimizer:
    """Applies the `server:` section's optimizer to one algorithm's steps."""

    def __init__(self, alg: Algorithm, settings: ServerConfig, moments: AdamMoments):
        self.alg, self.settings, self.moments = alg, settings, moments

    @classmethod
    def of(cls, alg: Algorithm) -> ServerOptimizer | None:
        """The run's server optimizer, or None when the `server:` section leaves the step as is.
        Its moments come from the run's driver state (a checkpoint's, on resume)."""
        settings = getattr(getattr(alg.fed, "cfg", None), "server", None)
        if settings is None or not settings.changes_step:
            return None
        moments = alg.fed.driver_state.setdefault("server_optimizer", AdamMoments())
        return cls(alg, settings, moments)

    def start(self, state: Any) -> np.ndarray:
        """A copy of the global model a step starts from (an update may write in place)."""
        return np.array(self.alg.model_of(state), dtype=np.float64)

    def __call__(self, start: np.ndarray, after: Any) -> Any:
        """`after` with its global model replaced by one optimizer step on its change from
        `start` (what `start()` copied)."""
        end = np.asarray(self.alg.model_of(after))
        delta = end.astype(np.float64) - start
        x = server_step(start, delta, self.settings.lr, self.settings, self.moments)
        return self.alg.with_model(after, x.astype(end.dtype))
