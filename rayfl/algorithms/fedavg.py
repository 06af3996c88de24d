"""FedAvg, FedProx and SCAFFOLD: the first-order baselines every FL paper compares against.

Each is a plain server loop over the Federation. Client functions are module-level so Ray ships
them by reference; they are pure functions of (client context, payload) apart from SCAFFOLD's
persistent control variate, which stays in the client's host-side state.

For ZO-HFL's comparison (arXiv 2504.01839, Sec. IV: "the same total number of local steps")
each baseline can run a per-client, per-round schedule H_{i,r} (`local_schedule`) with the
decaying local step lr / (t + lr_offset), and can train on the server's data as an extra,
always-on client (`server_as_client`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from rayfl.algorithms.local import LocalSchedule, local_sgd, local_sgd_batched, lr_sum
from rayfl.algorithms.round_lr import RoundLRConfig, round_lr
from rayfl.algorithms.server_client import ServerClient
from rayfl.algorithms.server_opt import ModelState, ServerOptimizerConfig, server_step
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
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
    papers' baselines do not use it). `server_optimizer: {name: momentum}` is FedAvgM,
    `adam` FedAdam and `yogi` FedYogi (Reddi et al. 2021) on the pseudo-gradient -mean delta
    at `server_lr`; `round_lr` schedules the
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
    # The server's step on the mean delta at server_lr: sgd, momentum (FedAvgM), adam (FedAdam) or
    # yogi (FedYogi), on the pseudo-gradient -mean delta; sub-keys below.
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    # A schedule of the clients' lr across rounds (warm-up and linear decay, or step halving);
    # sub-keys below.
    round_lr: RoundLRConfig = field(default_factory=RoundLRConfig)

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
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
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
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
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
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
    """FedAvg's client: local SGD from the global model (with FedProx's proximal term when
    prox_mu > 0), answering with the model delta, which the server averages.

    Args:
        ctx: the client's context.
        params: the global model, a flat float32 vector (read, never written).
        lr: this round's step size.
        schedule: the local epochs or steps and the batch size.
        weight_decay: `algorithm.weight_decay`.
        prox_mu: FedProx's mu (0: FedAvg).

    Returns:
        `{"delta": y - x, "loss": mean minibatch loss}`."""
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


# ---------------------------------------------------------------- the algorithms


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


class FedAvg(Algorithm[ModelState]):
    """FedAvg (McMahan et al. 2017, Alg. 1): local SGD from x, then
    x <- x + server_lr * sum_k w_k delta_k, w_k by samples (n_k) or uniform; with a server
    optimizer the step is FedAdam's on the pseudo-gradient -sum_k w_k delta_k (Reddi et al. 2021)."""

    config = FedAvgConfig
    client = staticmethod(fedavg_client)
    uploads = ("delta",)

    def setup(self) -> None:
        """The server-as-client (`server_as_client`), when the job asks for one."""
        self.server_client = ServerClient(self.fed) if getattr(self.cfg, "server_as_client", False) else None

    def init(self) -> ModelState:
        """The model's initial parameters, no server-optimizer moments yet."""
        return ModelState(x=self.fed.initial_params())

    prox_mu: float | None = 0.0  # FedProx's mu; None: the client function takes none

    def payload(self, state: ModelState, rnd: Round) -> dict[str, Any]:
        """The global model, this round's lr (`round_lr`), weight decay, the local schedule
        (unless it differs by client) and FedProx's mu: `fedavg_client`'s arguments."""
        cfg = self.cfg
        common, _ = local_plan(self.fed, cfg, [], rnd.index)
        lr = round_lr(cfg.round_lr, cfg.lr, rnd.index, rnd.total)
        out = {"params": state.x, "lr": lr, "weight_decay": cfg.weight_decay, **common}
        if self.prox_mu is not None:
            out["prox_mu"] = self.prox_mu
        return out

    def per_client(self, state: ModelState, rnd: Round, ids: list[int]) -> dict[int, dict[str, Any]] | None:
        """Each client's own `schedule` under `local_schedule` (H_{i,r} steps), else None."""
        return local_plan(self.fed, self.cfg, ids, rnd.index)[1]

    def weighting_of(self, key: str) -> str:
        """The job's `algorithm.weighting` (samples or uniform)."""
        return self.cfg.weighting

    def server_update(self, state: ModelState, uploads: Uploads, rnd: Round) -> ModelState:
        """x + server_lr * delta (or FedAdam's step on -delta)."""
        moments = copy.copy(state.moments)
        x = server_step(state.x, uploads["delta"], self.cfg.server_lr, self.cfg.server_optimizer, moments)
        return ModelState(x=x.astype(np.float32), moments=moments)


class FedProx(FedAvg):
    """FedProx (Li et al. 2020, Alg. 2): FedAvg whose clients add mu/2 ||w - x||^2."""

    config = FedProxConfig

    @property
    def prox_mu(self) -> float:  # type: ignore[override]
        return self.cfg.mu


class Scaffold(FedAvg):
    """SCAFFOLD (Karimireddy et al. 2020, Alg. 1, option II): x <- x + server_lr * mean delta,
    c <- c + |S|/N * mean delta_control (uniform), keeping c the mean of all N clients' c_i."""

    config = ScaffoldConfig
    client = staticmethod(scaffold_client)
    uploads = ("delta", "delta_control")
    prox_mu = None

    def setup(self) -> None:
        self.server_client = None  # made at start: its c_i lives in the server state

    def init(self) -> ScaffoldState:
        x0 = self.fed.initial_params()
        return ScaffoldState(x=x0, control=np.zeros_like(x0))

    def start(self, state: ScaffoldState) -> None:
        if self.cfg.server_as_client:
            self.server_client = ServerClient(self.fed, state.server_client)

    def payload(self, state: ScaffoldState, rnd: Round) -> dict[str, Any]:
        return {**super().payload(state, rnd), "control": state.control}

    def weighting_of(self, key: str) -> str:
        return "uniform" if key == "delta_control" else self.cfg.weighting

    def server_update(self, state: ScaffoldState, uploads: Uploads, rnd: Round) -> ScaffoldState:
        num_clients = self.fed.num_clients + (self.server_client is not None)
        x = (state.x + self.cfg.server_lr * uploads["delta"]).astype(np.float32)
        control = (state.control + len(uploads) / num_clients * uploads["delta_control"]).astype(np.float32)
        return ScaffoldState(x=x, control=control, server_client=state.server_client)
