"""DRFA (Deng, Kamani & Mahdavi, NeurIPS 2020, Alg. 1): distributionally robust federated
averaging, ComFedL's "DRFL" baseline. It solves min_w max_{lambda in simplex} sum_i lambda_i
f_i(w) with an explicit client weight vector lambda on the server:

    local SGD for tau steps from w_s; w_{s+1} = average of the returned models;
    w' = average of the models after a random step t' in {1..tau};
    lambda <- Proj_simplex(lambda + weight_lr * tau * v),  v_i = (n/m) f_i(w') on m clients U.

`variant: sampling` is the paper's Alg. 1: the training clients are sampled according to lambda
(with replacement, a client drawn twice counts twice in the uniform average), lambda_0 uniform,
U a fresh uniform sample. `variant: weighted` (default) is the DRFA authors' FedTorch code, whose
`drfa_gamma` matches ComFedL's "client weights learning rate" 8e-2 (Sec. 5.1; the paper does not
say which DRFA it ran): clients are sampled uniformly and averaged with
their lambda weights, lambda_0 proportional to n_i, the weight lr decays by `weight_lr_decay`
per round, and lambda is floored at `weight_floor` after the projection (then renormalised)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rayfl.algorithms.client_eval import evaluate_global_and_clients
from rayfl.algorithms.kernels import CrossEntropyGrad
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Phase, Round, Uploads
from rayfl.driver.rounds import clients_this_round
from rayfl.engine import ClientContext, Federation
from rayfl.rng import numpy_rng
from rayfl.zo.lower_level import minibatch_indices
from rayfl.zo.projection import project_simplex_array as project_simplex


@dataclass
class DRFAConfig(AlgorithmConfig):
    """DRFA / DRFL. `local_steps` is tau, `weight_lr` the client-weights lr (ComFedL's "gamma"
    of DRFL, 8e-2), `clients_per_round` m."""

    name: str = "drfa"
    local_epochs: int | None = None
    local_steps: int | None = 5
    lr: float = 0.01
    # The step size of the client weights lambda (>= 0; ComFedL's gamma of DRFL): lambda <-
    # Proj_simplex(lambda + weight_lr * tau * v).
    weight_lr: float = 0.08
    # weighted (clients sampled uniformly and averaged with their lambda weights: the authors' code)
    # or sampling (clients sampled by lambda: the paper's Alg. 1).
    variant: Literal["weighted", "sampling"] = "weighted"
    # variant weighted only: weight_lr is multiplied by this every round, in (0, 1].
    weight_lr_decay: float = 0.9
    # variant weighted only: lambda's floor after each projection (then renormalised), in [0, 1).
    weight_floor: float = 1e-3
    # At each evaluation, also measure every client's train and validation accuracy (average and
    # worst).
    client_eval: bool = True

    def validate(self) -> None:
        super().validate()
        if not self.local_steps:
            raise ConfigError("algorithm.local_steps", "DRFA runs tau >= 1 local steps: set local_steps (local_epochs: null)")
        if not self.weight_lr >= 0:
            raise ConfigError("algorithm.weight_lr", f"must be >= 0, got {self.weight_lr}")
        if not 0 < self.weight_lr_decay <= 1:
            raise ConfigError("algorithm.weight_lr_decay", f"must be in (0, 1], got {self.weight_lr_decay}")
        if not 0 <= self.weight_floor < 1:
            raise ConfigError("algorithm.weight_floor", f"must be in [0, 1), got {self.weight_floor}")


@dataclass
class DRFAState:
    """The global model and the client weights lambda (one per client, on the simplex)."""

    x: np.ndarray
    lam: np.ndarray



def lambda_step(lam: np.ndarray, losses: dict[int, float], n: int, m: int, lr: float, tau: int, floor: float) -> np.ndarray:
    """lambda <- Proj(lambda + lr * tau * v), v_i = (n/m) f_i(w') for the reporting clients;
    then floored (a floor of 0 keeps the plain projection) and renormalised."""
    v = np.zeros(len(lam))
    for c, f in losses.items():
        v[c] = n / m * f
    out = project_simplex(lam + lr * tau * v)
    if floor > 0:
        out = np.maximum(out, floor)
        out /= out.sum()
    return out


# ---------------------------------------------------------------- client functions


def drfa_client(ctx: ClientContext, params: np.ndarray, lr: float, steps: int, batch_size: int, snapshot: int) -> dict[str, Any]:
    """tau local SGD steps (the `batches` stream, as FedAvg); uploads w_tau - w_s and
    w_{t'} - w_s, the model after `snapshot` = t' steps."""
    w0 = torch.tensor(params, device=ctx.device)
    w, snap = w0.clone(), w0.clone()
    kernel = CrossEntropyGrad(ctx.model)
    xs, ts = kernel.prepare(ctx.x, ctx.y)
    losses = []
    if ctx.num_samples:
        for t, idx in enumerate(minibatch_indices(ctx.rng("batches"), ctx.num_samples, batch_size, steps)):
            idx = idx.to(xs.device)
            loss, grad = kernel(w[None], xs.index_select(0, idx), ts.index_select(0, idx))
            ctx.work.gradient_step(len(idx))
            w -= lr * grad[0]
            losses.append(float(loss[0]))
            if t + 1 == snapshot:
                snap = w.clone()
    return {"delta": w - w0, "snapshot": snap - w0, "loss": float(np.mean(losses)) if losses else float("nan")}


def drfa_loss(ctx: ClientContext, params: np.ndarray, batch_size: int) -> dict[str, Any]:
    """f_i(w') on one minibatch (stream `drfa.loss`): the client's report for the lambda step."""
    if ctx.num_samples == 0:
        return {"f": 0.0}
    kernel = CrossEntropyGrad(ctx.model)
    xs, ts = kernel.prepare(ctx.x, ctx.y)
    (idx,) = minibatch_indices(ctx.rng("drfa.loss"), ctx.num_samples, batch_size, 1)
    with torch.no_grad():
        loss, _ = kernel(torch.tensor(params, device=ctx.device)[None], xs[idx], ts[idx])
    ctx.work.forward(len(idx))
    return {"f": float(loss[0])}


# ---------------------------------------------------------------- server


def training_clients(fed: Federation, cfg: DRFAConfig, lam: np.ndarray, r: int) -> tuple[list[int], np.ndarray]:
    """(clients, their aggregation weights): m draws by lambda with a count-weighted uniform
    mean (sampling), or a uniform sample with renormalised lambda weights (weighted)."""
    if cfg.variant == "sampling":
        m = cfg.clients_per_round or fed.num_clients
        draws = numpy_rng(fed.seed, "drfa.sample", r).choice(fed.num_clients, size=m, replace=True, p=lam)
        ids, counts = np.unique(draws, return_counts=True)
        return [int(c) for c in ids], counts / m
    ids = clients_this_round(fed, cfg, r)
    w = lam[ids]
    return ids, w / w.sum()


class LossReports(Phase):
    """After the model step: clients U report f_i(w') at the snapshot model w', and the
    server takes lambda's projected ascent step."""

    name = "weights"
    client = staticmethod(drfa_loss)
    update_without_uploads = True  # lambda steps even when no report arrives

    def __init__(self, alg: DRFA):
        self.alg, self.fed, self.cfg = alg, alg.fed, alg.cfg

    def clients(self, state: DRFAState, rnd: Round) -> list[int] | None:
        if not rnd.accepted[DRFA.name]:
            return None  # no model step, no lambda step
        if self.cfg.variant != "sampling":
            return rnd.cohort
        n = self.fed.num_clients
        m = self.cfg.clients_per_round or n
        return sorted(int(c) for c in numpy_rng(self.fed.seed, "drfa.loss_clients", rnd.index).choice(n, size=min(m, n), replace=False))

    def payload(self, state: DRFAState, rnd: Round) -> dict[str, Any]:
        return {"params": rnd.notes["snapshot"], "batch_size": self.cfg.batch_size}

    def server_update(self, state: DRFAState, uploads: Uploads, rnd: Round) -> DRFAState:
        """lambda <- Proj(lambda + lr_r tau v), v_i = (n/m) f_i(w'), floored (weighted variant)."""
        cfg, n = self.cfg, self.fed.num_clients
        weighted = cfg.variant == "weighted"
        m = len(rnd.cohort) if weighted else (cfg.clients_per_round or n)
        lr_r = cfg.weight_lr * (cfg.weight_lr_decay**rnd.index if weighted else 1.0)
        losses = {res.client: res["f"] for res in uploads.results}
        lam = lambda_step(state.lam, losses, n, m, lr_r, int(cfg.local_steps or 0), cfg.weight_floor if weighted else 0.0)
        return DRFAState(x=state.x, lam=lam)

    def metrics(self, state: DRFAState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        return {"max_client_weight": float(state.lam.max())}


class DRFA(Algorithm[DRFAState]):
    """Alg. 1: local SGD, the (lambda-)weighted mean of the models and of their snapshots at a
    random step t', then the loss reports at the snapshot for lambda's step."""

    config = DRFAConfig
    client = staticmethod(drfa_client)
    uploads = ("delta", "snapshot")
    exact_sums = False
    asynchrony_refusal = ("its clients report losses at the round's snapshot model after the model step: two client calls "
                          "a round, where the asynchronous driver applies one call's arrivals")

    def init(self) -> DRFAState:
        n = self.fed.num_clients
        lam0 = self.fed.client_weights(None, "samples") if self.cfg.variant == "weighted" else np.full(n, 1.0 / n)
        return DRFAState(x=self.fed.initial_params(), lam=lam0)

    def phases(self) -> list[Phase]:
        return [self, LossReports(self)]

    def cohort(self, state: DRFAState, rnd: Round) -> list[int]:
        ids, weights = training_clients(self.fed, self.cfg, state.lam, rnd.index)
        rnd.notes["weights"] = dict(zip(ids, weights, strict=True))  # what the average weighs them by
        return ids

    def snapshot_step(self, round: int) -> int:
        """t', uniform in {1..tau}, from (seed, 'drfa.snapshot', round)."""
        return int(numpy_rng(self.fed.seed, "drfa.snapshot", round).integers(1, int(self.cfg.local_steps or 0) + 1))

    def payload(self, state: DRFAState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x, "lr": cfg.lr, "steps": int(cfg.local_steps or 0), "batch_size": cfg.batch_size,
                "snapshot": self.snapshot_step(rnd.index)}

    def weights(self, state: DRFAState, key: str, results: Sequence[Any], rnd: Round) -> np.ndarray:
        return np.array([rnd.notes["weights"][res.client] for res in results])

    def server_update(self, state: DRFAState, uploads: Uploads, rnd: Round) -> DRFAState:
        """w_{s+1} = w_s + weighted mean delta; the snapshot w' = w_s + weighted mean of the
        snapshots' deltas, for the loss reports."""
        rnd.notes["snapshot"] = (state.x + uploads["snapshot"]).astype(np.float32)
        return DRFAState(x=(state.x + uploads["delta"]).astype(np.float32), lam=state.lam)

    def metrics(self, state: DRFAState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        out: dict[str, Any] = {"num_updates": len(uploads)}
        if uploads:
            out.update(train_loss=float(np.sum(uploads.weights("delta") * uploads.values("loss"))),
                       snapshot_step=self.snapshot_step(rnd.index))
        return out

    def evaluate(self, state: DRFAState, rnd: Round) -> dict[str, Any]:
        return evaluate_global_and_clients(self.fed, state.x, rnd.index, self.cfg.client_eval)

    def summary(self, state: DRFAState, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"final_params": state.x, "lambda": state.lam, **metrics}
