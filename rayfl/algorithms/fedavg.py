"""FedAvg, FedProx and SCAFFOLD: the first-order baselines every FL paper compares against.

Each is a plain server loop over the Federation. Client functions are module-level so Ray ships
them by reference; they are pure functions of (client context, payload) apart from SCAFFOLD's
persistent control variate, which stays in the client's host-side state.

For ZO-HFL's comparison (arXiv 2504.01839, Sec. IV: "the same total number of local steps")
each baseline can run a per-client, per-round schedule H_{i,r} (`local_schedule`) with the
decaying local step lr / (t + lr_offset), and can train on the server's data as an extra,
always-on client (`server_as_client`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from rayfl.algorithms.local import LocalSchedule, local_sgd, local_sgd_batched, lr_sum
from rayfl.algorithms.round_lr import RoundLRConfig, round_lr
from rayfl.algorithms.rounds import (
    ModelState,
    check_finite,
    clients_this_round,
    evaluate_if_due,
    round_metrics,
)
from rayfl.algorithms.server_client import ServerClient
from rayfl.algorithms.server_opt import ServerOptimizerConfig, server_step
from rayfl.config import AlgorithmConfig, ConfigError, RunConfig
from rayfl.engine import ClientContext, Federation
from rayfl.engine.balance import stateless
from rayfl.engine.payload import broadcast_tensor
from rayfl.engine.vectorized import batched, per_client, stack_vectors
from rayfl.zo.schedules import StepsSchedule, check_budget_fields, local_steps


@dataclass
class FedAvgConfig(AlgorithmConfig):
    """FedAvg (McMahan et al., AISTATS 2017, Alg. 1): clients run local SGD from the global
    model; the server adds the `weighting`-weighted mean of their model deltas times
    `server_lr` (1.0 is the paper's plain average; `samples` weights by n_k as in the paper).

    `local_schedule` (see `rayfl.zo.schedules.StepsSchedule`) replaces local_epochs /
    local_steps with H_{i,r} steps, e.g. ZO-HFL's ceil(tau sqrt(r + 1)); `lr_schedule:
    harmonic` uses lr / (t + lr_offset) at in-round step t (ZO-HFL's 0.1 / (t + 1)).
    `server_as_client` adds the server's data as an always-on client (an ablation; the
    papers' baselines do not use it). `server_optimizer: {name: adam}` is FedAdam (Reddi et
    al. 2021) on the pseudo-gradient -mean delta at `server_lr`; `round_lr` schedules the
    clients' lr across rounds (linear warm-up and decay, or step halving)."""

    uploads: ClassVar[tuple[str, ...]] = ("delta",)

    name: str = "fedavg"
    # The server's step on the weighted mean client delta (> 0): x <- x + server_lr * mean delta;
    # 1.0 is the plain average.
    server_lr: float = 1.0
    # How client deltas are averaged: samples (by each client's n_k, as in the paper) or uniform.
    weighting: Literal["samples", "uniform"] = "samples"
    # Per-client, per-round local steps H_{i,r} (ZO-HFL's ceil(tau sqrt(r + 1))) replacing
    # local_epochs / local_steps; null: those. Sub-keys below.
    local_schedule: StepsSchedule | None = None
    # The local step size within a round: constant lr, or harmonic lr / (t + lr_offset) at in-round
    # step t.
    lr_schedule: Literal["constant", "harmonic"] = "constant"
    # The offset of the harmonic schedule (> 0): lr / (t + lr_offset).
    lr_offset: float = 1.0
    # Train on the server's data (data.server_fraction > 0) as an extra, always-on client: an
    # ablation.
    server_as_client: bool = False
    # The server's step on the mean delta: sgd, or adam (FedAdam on the pseudo-gradient -mean delta
    # at server_lr); sub-keys below.
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    # A schedule of the clients' lr across rounds (warm-up and linear decay, or step halving);
    # sub-keys below.
    round_lr: RoundLRConfig = field(default_factory=RoundLRConfig)

    def validate(self) -> None:
        check_budget_fields(self, self.local_schedule, "algorithm.local_schedule")
        self.server_optimizer.validate_as("algorithm.server_optimizer")
        self.round_lr.validate_as("algorithm.round_lr")
        if not self.server_lr > 0:
            raise ConfigError("algorithm.server_lr", f"must be > 0, got {self.server_lr}")
        if not self.lr_offset > 0:
            raise ConfigError("algorithm.lr_offset", f"must be > 0, got {self.lr_offset}")


@dataclass
class FedProxConfig(FedAvgConfig):
    """FedProx (Li et al., MLSys 2020, Alg. 2): FedAvg whose local objective adds
    mu/2 * ||w - w_global||^2. Typical mu in {0.001, 0.01, 0.1, 1}; mu = 0 is FedAvg."""

    name: str = "fedprox"
    # The proximal weight: each client minimises its loss + mu/2 ||w - w_global||^2 (>= 0; 0 is
    # FedAvg). Typical: 0.001-1.
    mu: float = 0.01

    def validate(self) -> None:
        super().validate()
        if self.mu < 0:
            raise ConfigError("algorithm.mu", f"must be >= 0, got {self.mu}")


@dataclass
class ScaffoldConfig(FedAvgConfig):
    """SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1, option II): local steps corrected by
    (c - c_i); c_i+ = c_i - c + (x - y_i) / (K * lr); the server moves x by server_lr times the
    mean delta and c by |S|/N times the mean control delta. The paper averages uniformly."""

    uploads: ClassVar[tuple[str, ...]] = ("delta", "delta_control")

    name: str = "scaffold"
    # SCAFFOLD averages uniformly, as the paper does.
    weighting: Literal["samples", "uniform"] = "uniform"

    def validate(self) -> None:
        super().validate()
        if self.server_optimizer.name != "sgd":
            raise ConfigError("algorithm.server_optimizer.name", "SCAFFOLD's server step is SGD (Alg. 1); use sgd")



@dataclass
class ScaffoldState:
    """What SCAFFOLD's server carries between rounds: the global model x and the server control
    variate c, kept equal to the mean of all N clients' committed c_i."""

    x: np.ndarray
    control: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    server_client: dict[str, Any] = field(default_factory=dict)  # its c_i with server_as_client


# ---------------------------------------------------------------- client functions


@stateless
def fedavg_client(
    ctx: ClientContext,
    params: np.ndarray,
    lr: float,
    schedule: LocalSchedule,
    weight_decay: float = 0.0,
    prox_mu: float = 0.0,
) -> dict[str, Any]:
    """Local SGD (with FedProx's proximal term when prox_mu > 0); uploads the model delta."""
    x = broadcast_tensor(params, ctx.device)  # read, never written
    y, loss = local_sgd(ctx, x, lr, schedule, weight_decay=weight_decay, prox_mu=prox_mu, prox_center=x)
    return {"delta": y - x, "loss": loss}


def scaffold_client(
    ctx: ClientContext,
    params: np.ndarray,
    control: np.ndarray,
    lr: float,
    schedule: LocalSchedule,
    weight_decay: float = 0.0,
) -> dict[str, Any]:
    """SCAFFOLD option II; the client's control variate c_i persists in its host state."""
    x = torch.tensor(params, device=ctx.device)
    c = torch.tensor(control, device=ctx.device)
    c_i = ctx.state.get("control")
    c_i = torch.zeros_like(x) if c_i is None else c_i
    y, loss = local_sgd(ctx, x, lr, schedule, weight_decay=weight_decay, correction=c - c_i)
    steps = ctx.work.steps
    if steps == 0:
        return {"delta": torch.zeros_like(x), "delta_control": torch.zeros_like(x), "loss": loss}
    c_new = c_i - c + (x - y) / lr_sum(lr, schedule, steps)
    ctx.state["control"] = c_new
    return {"delta": y - x, "delta_control": c_new - c_i, "loss": loss}


@batched(fedavg_client)
def fedavg_clients(ctxs: list[ClientContext], kwargs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`fedavg_client` for a host's batch of clients at once (rayfl.engine.vectorized)."""
    device = ctxs[0].device
    x = stack_vectors(per_client(kwargs, "params"), device)
    out = local_sgd_batched(
        ctxs, x, per_client(kwargs, "lr"), per_client(kwargs, "schedule"),
        weight_decay=per_client(kwargs, "weight_decay", 0.0), prox_mu=per_client(kwargs, "prox_mu", 0.0), prox_centers=x,
        minus_start=True,
    )
    if out is None:
        return None
    deltas, losses = out
    return [{"delta": deltas[j], "loss": losses[j]} for j in range(len(ctxs))]


@batched(scaffold_client)
def scaffold_clients(ctxs: list[ClientContext], kwargs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`scaffold_client` for a host's batch of clients at once; each c_i stays in its state."""
    device = ctxs[0].device
    x = stack_vectors(per_client(kwargs, "params"), device)
    c = stack_vectors(per_client(kwargs, "control"), device)
    c_i = torch.stack([
        torch.zeros_like(x[0]) if ctx.state.get("control") is None else ctx.state["control"].to(device) for ctx in ctxs
    ])
    schedules, lrs = per_client(kwargs, "schedule"), per_client(kwargs, "lr")
    out = local_sgd_batched(ctxs, x, lrs, schedules, weight_decay=per_client(kwargs, "weight_decay", 0.0), corrections=c - c_i)
    if out is None:
        return None
    y, losses = out
    results = []
    for j, ctx in enumerate(ctxs):
        steps = ctx.work.steps
        if steps == 0:
            results.append({"delta": torch.zeros_like(x[j]), "delta_control": torch.zeros_like(x[j]), "loss": losses[j]})
            continue
        c_new = c_i[j] - c[j] + (x[j] - y[j]) / lr_sum(lrs[j], schedules[j], steps)
        ctx.state["control"] = c_new
        results.append({"delta": y[j] - x[j], "delta_control": c_new - c_i[j], "loss": losses[j]})
    return results


# ---------------------------------------------------------------- server loops



def local_plan(
    fed: Federation, cfg: FedAvgConfig, ids: list[int], round: int
) -> tuple[dict[str, LocalSchedule], dict[int, dict[str, LocalSchedule]] | None]:
    """The `schedule` payload: one broadcast LocalSchedule, or with a `local_schedule` one
    per client carrying its H_{i,r} (the server-as-client's id m included when asked)."""
    offset = cfg.lr_offset if cfg.lr_schedule == "harmonic" else None
    if cfg.local_schedule is None:
        return {"schedule": LocalSchedule(cfg.batch_size, cfg.local_epochs, cfg.local_steps, offset)}, None
    return {}, {
        c: {"schedule": LocalSchedule(cfg.batch_size, None, local_steps(cfg.local_schedule, c, round, fed.seed), offset)}
        for c in ids
    }


def call_with_server(
    fed: Federation, fn: Any, ids: list[int], cfg: FedAvgConfig, round: int, server: ServerClient | None,
    keep: tuple[str, ...] = (), **payload: Any,
) -> list[Any]:
    """fed.call for the sampled clients, then (with `server_as_client`) the server's own
    update on the driver, appended last. `keep`: outputs only ever summed (fed.weighted_sum)."""
    common, per_client = local_plan(fed, cfg, ids, round)
    kept: dict[str, Any] = {"keep": keep} if keep else {}  # only then: stand-in federations in tests need not know it
    if keep and server is None and ids:  # the weights `update_weights` gives if every client is accepted
        kept["expect_weights"] = {"delta": dict(zip(ids, fed.client_weights(ids, cfg.weighting).tolist(), strict=True))}
    results: list[Any] = fed.call(ids, fn, round=round, per_client=per_client, **kept, **common, **payload)
    if server is not None:
        _, mine = local_plan(fed, cfg, [server.id], round)
        schedule = mine[server.id] if mine is not None else common
        results.append(server.run(fn, round, **schedule, **payload))
    return results


def update_weights(fed: Federation, results: list[Any], kind: str, server: ServerClient | None) -> np.ndarray:
    """Aggregation weights over `results`, by sample count or uniform, summing to 1."""
    if server is None:
        return fed.client_weights([res.client for res in results], kind)
    w = np.array([res.num_samples for res in results], dtype=np.float64) if kind == "samples" else np.ones(len(results))
    return w / w.sum()





def run_fedavg(fed: Federation, cfg: FedAvgConfig, run: RunConfig) -> dict[str, Any]:
    """FedAvg and FedProx (prox_mu = cfg.mu for FedProx)."""
    prox_mu = getattr(cfg, "mu", 0.0)
    server = ServerClient(fed) if cfg.server_as_client else None
    s = fed.track(ModelState(x=fed.initial_params()))
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        ids = clients_this_round(fed, cfg, r)
        results = call_with_server(
            fed, fedavg_client, ids, cfg, r, server, keep=("delta",), params=s.x, lr=round_lr(cfg.round_lr, cfg.lr, r, run.rounds),
            weight_decay=cfg.weight_decay, prox_mu=prox_mu,
        )
        metrics = {"num_updates": 0}
        if results:  # late and failed clients are not in `results`: never applied
            weights = update_weights(fed, results, cfg.weighting, server)
            delta = fed.weighted_sum(results, "delta", weights)
            moments = getattr(s, "moments", None)  # a checkpoint from before FedAdam has none (and is SGD)
            s.x = server_step(s.x, delta, cfg.server_lr, cfg.server_optimizer, moments).astype(np.float32)
            check_finite(s.x, r)
            metrics = round_metrics(fed, results, weights)
        metrics.update(evaluate_if_due(fed, s.x, r, run))
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}


def run_scaffold(fed: Federation, cfg: ScaffoldConfig, run: RunConfig) -> dict[str, Any]:
    x0 = fed.initial_params()
    s = fed.track(ScaffoldState(x=x0, control=np.zeros_like(x0)))
    server = ServerClient(fed, s.server_client) if cfg.server_as_client else None
    num_clients = fed.num_clients + (server is not None)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(run.rounds):
        ids = clients_this_round(fed, cfg, r)
        results = call_with_server(
            fed, scaffold_client, ids, cfg, r, server, keep=("delta", "delta_control"), params=s.x,
            control=s.control, lr=round_lr(cfg.round_lr, cfg.lr, r, run.rounds), weight_decay=cfg.weight_decay,
        )
        metrics = {"num_updates": 0}
        if results:  # only accepted tasks: their clients' c_i, and nobody else's, moved
            weights = update_weights(fed, results, cfg.weighting, server)
            s.x = (s.x + cfg.server_lr * fed.weighted_sum(results, "delta", weights)).astype(np.float32)
            uniform = np.full(len(results), 1.0 / len(results))
            dc = fed.weighted_sum(results, "delta_control", uniform)
            s.control = (s.control + len(results) / num_clients * dc).astype(np.float32)
            check_finite(s.x, r)
            metrics = round_metrics(fed, results, weights)
        metrics.update(evaluate_if_due(fed, s.x, r, run))
        fed.log_round(r, **metrics)
    return {"final_params": s.x, **metrics}
