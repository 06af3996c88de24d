"""FFGG: Fine-tuning Followed by Global Gradient (Mishchenko, Islamov, Gorbunov, Horvath,
"Partially Personalized Federated Learning", arXiv 2305.18285): Alg. 1 (`ffgg`), Alg. 4
(`local_ffgg`) and Alg. 5 (`br_ffgg`, Byzantine-robust).

The parameters split into global theta (the only thing that travels) and personal w (kept in
the client's host state under "w", never uploaded):

    Alg. 1, round r:  every sampled client fine-tunes w ~ argmin_w f_m(theta^r, w) (Alg. 2: tau
                      GD steps from a fresh random w, or CG / exact on the quadratic) and
                      uploads Delta_m = grad_theta f_m(theta^r, w);
                      theta^{r+1} = theta^r - gamma_theta mean_m Delta_m
    Alg. 4, round r:  fine-tune, then K times  w <- w - gamma_w grad_w f(theta_k, w);
                      theta_{k+1} = theta_k - gamma_theta grad_theta f(theta_k, w_new);
                      uploads Delta_m = theta^r - theta^{r,K};  theta^{r+1} = theta^r - server_lr mean Delta

What the split is: on `data.dataset: ffgg_quadratic` theta is the first d_theta coordinates of
(theta, w) (rayfl.papers.ffgg.quadratic); on a network it is flat[~mask] with mask =
`rayfl.models.personal.personal_mask(model, algorithm.personal_scheme,
algorithm.personal_patterns)`, and w = flat[mask] starts from the module's default init.
Step sizes left null take the quadratic's constants: gamma_theta = 1/L, gamma_w = 1/L_w
(Theorem 6's step sizes; the paper does not state those of Fig. 1); on networks server_lr 1.0 and w_lr = algorithm.lr.

Alg. 5 (BR-FFGG) is Alg. 1 under the job's `robust:` section: Delta is the declared upload, so
the round pipeline (rayfl.pipeline) replaces mean_m by ARAgg and lets the Byzantine clients
attack it; nothing here knows about it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from rayfl.algorithms.finetune import (
    W_STATE,
    FineTune,
    SplitSpec,
    finetune,
    make_objective,
    to_tensor,
)
from rayfl.algorithms.round_lr import RoundLRConfig, round_lr
from rayfl.algorithms.server_opt import AdamMoments, ServerOptimizerConfig, server_step
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
from rayfl.engine import ClientContext, Federation


@dataclass
class FFGGConfig(AlgorithmConfig):
    """FFGG (Alg. 1 + Alg. 2). `tau` fine-tuning steps of `solver` (gd: Alg. 2 with step
    `w_lr`; cg / exact: the quadratic only) from `w_init` (random: N(0, I) on the quadratic,
    the module's init on networks; zero; warm: the client's last committed w). `server_lr` is
    gamma_theta. `tau_epochs` (networks) fine-tunes for that many epochs instead of tau steps.
    `personal_scheme` / `personal_patterns`: which network parameters are personal (see
    rayfl.models.personal; ignored on the quadratic). The upload is Delta (theta's gradient, or
    Local FFGG's model delta): a job's `robust:` / `privacy:` / `compression:` apply to it."""

    uploads: ClassVar[tuple[str, ...]] = ("delta",)
    name: str = "ffgg"
    # How each client fine-tunes its personal w: gd (tau steps of Alg. 2 with step w_lr); cg or
    # exact (the quadratic only).
    solver: Literal["gd", "cg", "exact"] = "gd"
    # Fine-tuning steps of w per round (>= 0), before theta's gradient is taken.
    tau: int = 10
    # Networks: fine-tune w for this many epochs instead of tau steps (>= 1); null: tau steps.
    tau_epochs: int | None = None
    # Where fine-tuning starts: random (N(0, I) on the quadratic, the module's init on networks),
    # zero, or warm (the client's last committed w).
    w_init: Literal["random", "zero", "warm"] = "random"
    # gamma_w, the fine-tuning step size (> 0); null: 1/L_w on the quadratic, algorithm.lr on
    # networks.
    w_lr: float | None = None
    # gamma_theta, the server's step on the mean Delta (> 0); null: 1/L on the quadratic, 1.0 on
    # networks.
    server_lr: float | None = None
    # Which network parameters are personal (w, never uploaded): none, input, output (first / last
    # layer), adapter, adapter_norm, all, or patterns; ignored on the quadratic.
    personal_scheme: str = "output"
    # With personal_scheme patterns: parameter-name globs whose matches are personal.
    personal_patterns: list[str] = field(default_factory=list)

    def validate(self) -> None:
        super().validate()
        if self.tau < 0:
            raise ConfigError("algorithm.tau", f"must be >= 0, got {self.tau}")
        if self.tau_epochs is not None and self.tau_epochs < 1:
            raise ConfigError("algorithm.tau_epochs", f"must be >= 1 or null, got {self.tau_epochs}")
        for key in ("w_lr", "server_lr"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ConfigError(f"algorithm.{key}", f"must be > 0 or null, got {value}")
        from rayfl.models.personal import SCHEMES

        if self.personal_scheme not in SCHEMES:
            raise ConfigError("algorithm.personal_scheme", f"unknown {self.personal_scheme!r}; allowed: {list(SCHEMES)}")
        if self.personal_scheme == "patterns" and not self.personal_patterns:
            raise ConfigError("algorithm.personal_patterns", "the patterns scheme needs at least one parameter-name glob")


@dataclass
class LocalFFGGConfig(FFGGConfig):
    """Local FFGG (Alg. 4): after fine-tuning, K = `local_steps` alternating (w, theta) steps
    (or `local_epochs` epochs of minibatches on networks) with local theta step `theta_lr`
    (null: 1/L on the quadratic, algorithm.lr on networks); the server adds server_lr times
    the mean model delta (server_lr null: 1, Alg. 4 line 11), or takes a FedAdam step on it
    (`server_optimizer: {name: adam}`, the paper's Table 2 for StackOverflow and GLDv2).
    `round_lr` scales both client step sizes (w and theta) across rounds (Table 2's global
    scheduler)."""

    name: str = "local_ffgg"
    # The local theta step of the alternating (w, theta) steps (> 0); null: 1/L on the quadratic,
    # algorithm.lr on networks.
    theta_lr: float | None = None
    # The server's step on the mean model delta at server_lr (null: 1): sgd, momentum (FedAvgM),
    # adam (FedAdam) or yogi (FedYogi); sub-keys below.
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    # A schedule across rounds scaling both client step sizes (w and theta); sub-keys below.
    round_lr: RoundLRConfig = field(default_factory=RoundLRConfig)

    def validate(self) -> None:
        super().validate()
        self.server_optimizer.validate_as("algorithm.server_optimizer")
        self.round_lr.validate_as("algorithm.round_lr")
        if self.theta_lr is not None and not self.theta_lr > 0:
            raise ConfigError("algorithm.theta_lr", f"must be > 0 or null, got {self.theta_lr}")


@dataclass
class BRFFGGConfig(FFGGConfig):
    """BR-FFGG (Alg. 5): full participation (Alg. 5 samples nobody) and a robust aggregator, set
    in the job's `robust:` section; a job that names none gets `{name: median, bucket_size: 2}`
    (the paper runs no Byzantine experiment; this is the authors' public Byzantine notebook's
    aggregator), and the plain mean is refused."""

    robust_variant_of: ClassVar[str] = "ffgg"  # what it is without a robust aggregator
    # the job's robust.aggregator when it names none: the authors' public Byzantine notebook's
    robust_aggregator: ClassVar[dict[str, Any]] = {"name": "median", "bucket_size": 2}
    name: str = "br_ffgg"
    # Full participation by default, as Alg. 5 samples nobody.
    participation: float | None = 1.0
    clients_per_round: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.participation != 1.0:
            raise ConfigError("algorithm.participation", "BR-FFGG uses every client each round (Alg. 5): set 1.0")


@dataclass
class FFGGState:
    """What the server carries between rounds: theta (and Local FFGG's FedAdam moments)."""

    theta: np.ndarray
    moments: AdamMoments = field(default_factory=AdamMoments)  # Local FFGG's FedAdam


# ---------------------------------------------------------------- the split, server side


@dataclass
class Split:
    """The server's view of the split: the problem kind, theta^0 and the dtype theta travels in.
    The quadratic's oracle measures ||F(theta)|| exactly (metrics only)."""

    spec: SplitSpec
    theta0: np.ndarray
    oracle: Any = None

    @property
    def quadratic(self) -> bool:
        return self.spec.problem == "quadratic"


def server_split(fed: Federation, cfg: FFGGConfig) -> Split:
    from rayfl.papers.ffgg.quadratic import is_quadratic, oracle_from_dataset

    if is_quadratic(fed.dataset):
        d_theta = fed.cfg.data.d_theta
        spec = SplitSpec("quadratic", batch_size=cfg.batch_size)
        return Split(spec, np.zeros(d_theta, dtype=np.float64), oracle_from_dataset(fed.dataset, d_theta))
    from rayfl.models.personal import personal_mask

    mask = personal_mask(fed.model, cfg.personal_scheme, tuple(cfg.personal_patterns))
    if not mask.any():
        raise ConfigError("algorithm.personal_scheme", f"{cfg.personal_scheme!r} leaves no personal parameter")
    if mask.all():
        raise ConfigError("algorithm.personal_scheme", f"{cfg.personal_scheme!r} makes every parameter of model "
                                                       f"{fed.cfg.model.name!r} personal: no global theta is left")
    spec = SplitSpec("network", cfg.personal_scheme, tuple(cfg.personal_patterns), cfg.batch_size)
    return Split(spec, fed.initial_params()[~mask].astype(np.float32))


def step_sizes(split: Split, cfg: FFGGConfig) -> tuple[float, float]:
    """(gamma_theta, gamma_w): configured, or 1/L and 1/L_w on the quadratic (Theorem 6),
    1.0 and algorithm.lr on networks."""
    if split.quadratic:
        o = split.oracle
        return (cfg.server_lr or 1.0 / o.L), (cfg.w_lr or 1.0 / o.L_w)
    return (cfg.server_lr or 1.0), (cfg.w_lr or cfg.lr)


def fine_tune_of(cfg: FFGGConfig, w_lr: float) -> FineTune:
    return FineTune(cfg.solver, cfg.tau, w_lr, cfg.w_init, cfg.tau_epochs)


# ---------------------------------------------------------------- client functions


def ffgg_client(ctx: ClientContext, theta: np.ndarray, split: SplitSpec, tune: FineTune) -> dict[str, Any]:
    """Alg. 1 lines 4-6: fine-tune w at theta^r, upload grad_theta f_m(theta^r, w) only."""
    dtype = torch.float64 if split.problem == "quadratic" else torch.float32
    th = to_tensor(theta, ctx, dtype)
    obj = make_objective(ctx, split, th.numel())
    w = finetune(obj, ctx, th, tune)
    g_theta, _, loss = obj.full_grads(th, w)
    ctx.state[W_STATE] = w.detach().cpu()
    return {"delta": g_theta, "loss": loss}


def local_ffgg_client(
    ctx: ClientContext,
    theta: np.ndarray,
    split: SplitSpec,
    tune: FineTune,
    theta_lr: float,
    local_steps: int | None = None,
    local_epochs: int | None = None,
) -> dict[str, Any]:
    """Alg. 4 lines 4-9: fine-tune, then K alternating steps (w first, then theta at the fresh
    w, on the same minibatch); upload Delta = theta^r - theta^{r,K}."""
    dtype = torch.float64 if split.problem == "quadratic" else torch.float32
    th0 = to_tensor(theta, ctx, dtype)
    obj = make_objective(ctx, split, th0.numel())
    w = finetune(obj, ctx, th0, tune)
    steps = local_steps if local_steps is not None else (local_epochs or 1) * obj.steps_per_epoch(split.batch_size)
    th, loss = th0.clone(), float("nan")
    for _ in range(steps):
        batch = obj.batch()
        _, g_w, _ = obj.grads(th, w, batch)
        w = w - tune.lr * g_w
        g_theta, _, loss = obj.grads(th, w, batch)
        th = th - theta_lr * g_theta
    ctx.state[W_STATE] = w.detach().cpu()
    return {"delta": th0 - th, "loss": loss}


# ---------------------------------------------------------------- server loops


def check_solver(cfg: FFGGConfig, split: Split) -> None:
    if cfg.solver != "gd" and not split.quadratic:
        raise ConfigError("algorithm.solver", f"{cfg.solver!r} solves quadratics only; use gd on networks")


def ffgg_metrics(split: Split, theta: np.ndarray, results: list[Any]) -> dict[str, Any]:
    """The updates applied and their mean loss, and on the quadratic the exact ||F(theta)||."""
    losses = [float(r["loss"]) for r in results]
    out: dict[str, Any] = {"num_updates": len(results), "train_loss": float(np.mean(losses)) if losses else float("nan")}
    if split.quadratic:
        out.update(split.oracle.metrics(theta))
    return out


class FFGG(Algorithm[FFGGState]):
    """Alg. 1 (Alg. 5 under a `robust:` section): theta^{r+1} = theta^r - gamma_theta mean_m Delta_m."""

    config = FFGGConfig
    client = staticmethod(ffgg_client)
    uploads = ("delta",)
    weighting = "uniform"
    diverged = ("theta", "algorithm.server_lr")

    def setup(self) -> None:
        self.split = server_split(self.fed, self.cfg)
        check_solver(self.cfg, self.split)
        self.gamma_theta, gamma_w = step_sizes(self.split, self.cfg)
        self.tune = fine_tune_of(self.cfg, gamma_w)

    def init(self) -> FFGGState:
        return FFGGState(theta=self.split.theta0.copy())

    def model_of(self, state: FFGGState) -> np.ndarray:
        return state.theta

    def with_model(self, state: FFGGState, model: np.ndarray) -> FFGGState:
        return replace(state, theta=model)

    def payload(self, state: FFGGState, rnd: Round) -> dict[str, Any]:
        return {"theta": state.theta, "split": self.split.spec, "tune": self.tune}

    def step_size(self, uploads: Uploads) -> float:
        """gamma_theta."""
        return self.gamma_theta

    def server_update(self, state: FFGGState, uploads: Uploads, rnd: Round) -> FFGGState:
        """Alg. 1 line 8: theta - gamma_theta (1/n) sum_m Delta_m (ARAgg under `robust:`)."""
        theta = state.theta.astype(np.float64) - self.step_size(uploads) * uploads["delta"]
        return FFGGState(theta=theta.astype(self.split.theta0.dtype), moments=state.moments)

    def metrics(self, state: FFGGState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        return ffgg_metrics(self.split, state.theta, uploads.results)

    def evaluate(self, state: FFGGState, rnd: Round) -> dict[str, Any]:
        return evaluate_personal(self.fed, self.split, state.theta, rnd.index)


class LocalFFGG(FFGG):
    """Alg. 4: K alternating local (w, theta) steps; the server adds server_lr times the mean
    model delta (or takes FedAdam's step on it); `round_lr` scales both client step sizes."""

    config = LocalFFGGConfig
    client = staticmethod(local_ffgg_client)

    def setup(self) -> None:
        super().setup()
        cfg, split = self.cfg, self.split
        self.theta_lr = cfg.theta_lr or (1.0 / split.oracle.L if split.quadratic else cfg.lr)
        self.server_lr = cfg.server_lr or 1.0

    def payload(self, state: FFGGState, rnd: Round) -> dict[str, Any]:
        scale = round_lr(self.cfg.round_lr, 1.0, rnd.index, rnd.total)  # 1.0 (exactly) without a schedule
        return {"theta": state.theta, "split": self.split.spec, "tune": replace(self.tune, lr=self.tune.lr * scale),
                "theta_lr": self.theta_lr * scale, "local_steps": self.cfg.local_steps, "local_epochs": self.cfg.local_epochs}

    def server_update(self, state: FFGGState, uploads: Uploads, rnd: Round) -> FFGGState:
        """theta + server_lr * mean(theta_m - theta^r) (the mean Delta is its negative), or FedAdam."""
        moments = copy.copy(state.moments)
        theta = server_step(state.theta.astype(np.float64), -uploads["delta"], self.server_lr, self.cfg.server_optimizer,
                            moments)
        return FFGGState(theta=theta.astype(self.split.theta0.dtype), moments=moments)


class BRFFGG(FFGG):
    """Alg. 5: Alg. 1 over every client, its mean replaced by the job's robust aggregator."""

    config = BRFFGGConfig


def evaluate_personal(fed: Federation, split: Split, theta: np.ndarray, round: int) -> dict[str, float]:
    """Networks: the personalized models (global theta + each client's committed w) on the
    clients' own test splits, when the partition gives them some (partition.client_test)."""
    if split.quadratic or fed.dataset.client_test is None:
        return {}
    ids = [int(c) for c in fed.trainable_clients]
    res = fed.call(ids, personal_eval_client, round=round, phase="eval", timed=False, theta=theta, split=split.spec)
    n = np.array([r["n"] for r in res], dtype=np.float64)
    if n.sum() == 0:
        return {}
    m = {
        "test_loss": float(np.dot(n, [r["loss"] for r in res]) / n.sum()),
        "test_accuracy": float(np.dot(n, [r["accuracy"] for r in res]) / n.sum()),
    }
    fed.log_eval(round, m)
    return m


def personal_eval_client(ctx: ClientContext, theta: np.ndarray, split: SplitSpec) -> dict[str, Any]:
    """Test loss / accuracy of (theta, the client's committed w) on its own test split (a
    client that never trained uses the module's init for w)."""
    from rayfl.algorithms.finetune import NetworkObjective, initial_w
    from rayfl.models.metrics import loss_correct_count
    from rayfl.models.params import functional_logits

    th = to_tensor(theta, ctx, torch.float32)
    obj = make_objective(ctx, split, th.numel())
    assert isinstance(obj, NetworkObjective)
    w = initial_w(obj, ctx, "warm", torch.float32)
    if ctx.test_x is None or len(ctx.test_y) == 0:
        return {"n": 0, "loss": 0.0, "accuracy": 0.0}
    with torch.no_grad():
        loss_sum, correct, count = loss_correct_count(functional_logits(ctx.model, obj.flat(th, w), ctx.test_x), ctx.test_y)
    ctx.work.forward(len(ctx.test_y))
    # n = counted targets (a sequence model's real tokens), the weight of this client's mean
    return {"n": count, "loss": loss_sum / max(count, 1), "accuracy": correct / max(count, 1)}
