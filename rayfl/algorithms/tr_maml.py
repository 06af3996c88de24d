"""Federated TR-MAML (Collins, Mokhtari, Shakkottai, NeurIPS 2020; ComFedL's baseline [9]):
the task-robust min-max  min_w max_{p in simplex} sum_i p_i l_i(w - alpha grad l_i(w))
(ComFedL eq. 8), each client a task, the weights p kept on the server.

The paper does not say how TR-MAML was federated; rayfl uses a DRFA-style loop over Per-FedAvg
local steps (the DRFL baseline's loop, with the client-weight lr 0.08 of Sec. 5.2). Round s:

    1. sample clients C_s (m of n; ComFedL runs full participation, m = n);
    2. each runs tau MAML steps from w_s (`per_fedavg.maml_client`) and returns its delta and
       L_i = l_Q(w_s - alpha grad l_S(w_s)), its post-adaptation loss at w_s on one batch;
    3. w_{s+1} = w_s + sum_{i in C_s} (p_i / sum_{C_s} p) delta_i   (descent on sum_i p_i f_i);
    4. v_i = (n / m) L_i for i in C_s, 0 otherwise (unbiased for the full loss vector);
       p <- Proj_simplex(p + weight_lr * tau * v)                   (DRFA's ascent step, x tau
       because p moves once per tau local steps)

p starts uniform. `weight_lr` is ComFedL's "client-weights lr" 0.08."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.algorithms.per_fedavg import MAML, MAMLConfig
from rayfl.config import ConfigError
from rayfl.driver import Round, Uploads
from rayfl.zo.projection import project_simplex_array as project_simplex


@dataclass
class TRMAMLConfig(MAMLConfig):
    """Federated TR-MAML at ComFedL's CIFAR setting: alpha = 0.05, beta = 0.1, weight lr 0.08."""

    name: str = "tr_maml"
    # beta, the outer (meta) step size.
    lr: float = 0.1
    inner_lr: float = 0.05
    # The step size of the task weights p: p <- Proj_simplex(p + weight_lr * tau * v).
    weight_lr: float = 0.08

    def validate(self) -> None:
        super().validate()
        if not self.weight_lr >= 0:
            raise ConfigError("algorithm.weight_lr", f"must be >= 0, got {self.weight_lr}")


@dataclass
class TRMAMLState:
    """The server's state: the global model and the task weights p on the simplex."""

    x: np.ndarray
    p: np.ndarray



def task_weights(p: np.ndarray, clients: list[int]) -> np.ndarray:
    """Step 3's relative weights p_i of the answering clients (uniform if they are all 0)."""
    q = p[np.asarray(clients, dtype=np.int64)]
    return q if q.sum() > 0 else np.ones(len(clients))


def task_weight_step(p: np.ndarray, clients: list[int], losses: np.ndarray, num_sampled: int, lr: float, tau: int) -> np.ndarray:
    """Step 4: v_i = (n / m) L_i for the answering clients (a non-finite L_i counts 0), 0
    otherwise; p <- Proj_simplex(p + lr * tau * v)."""
    v = np.zeros(len(p), dtype=np.float64)
    v[np.asarray(clients, dtype=np.int64)] = len(p) / num_sampled * np.where(np.isfinite(losses), losses, 0.0)
    return project_simplex(p + lr * tau * v)


class TRMAML(MAML[TRMAMLState]):
    """Federated TR-MAML: descent on sum_i p_i f_i, ascent of the task weights p."""

    config = TRMAMLConfig

    def init(self) -> TRMAMLState:
        n = self.fed.num_clients
        return TRMAMLState(x=self.fed.initial_params(), p=np.full(n, 1.0 / n))

    def weights(self, state: Any, key: str, results: Sequence[Any], rnd: Round) -> np.ndarray:
        return task_weights(state.p, [r.client for r in results])

    def server_update(self, state: TRMAMLState, uploads: Uploads, rnd: Round) -> TRMAMLState:
        """Steps 3 and 4."""
        x = (state.x + uploads["delta"]).astype(np.float32)
        p = task_weight_step(state.p, uploads.clients, uploads.values("adapted_loss"), len(rnd.cohort),
                             self.cfg.weight_lr, self.cfg.local_steps)
        return TRMAMLState(x=x, p=p)

    def metrics(self, state: TRMAMLState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        return {**super().metrics(state, uploads, rnd), "p_max": float(state.p.max()), "p_min": float(state.p.min())}

    def summary(self, state: TRMAMLState, metrics: dict[str, Any]) -> dict[str, Any]:
        return {**super().summary(state, metrics), "final_weights": state.p}
