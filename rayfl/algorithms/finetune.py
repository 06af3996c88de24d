"""Split objectives f_m(theta, w) and the local solvers FFGG fine-tunes w with (Alg. 2, the CG
solver of Sec. 3.1 and the exact minimizer of Theorem 1).

A client's objective is seen through one small interface, so the same FFGG code runs on
(a) the synthetic quadratic, whose training rows are the factor R_m of
`rayfl.papers.ffgg.quadratic` (loss 1/2 ||R_m (theta, w, 1)||^2, float64, full batch), and
(b) a network whose flat parameter vector is split by `rayfl.models.personal.personal_mask`
(theta = flat[~mask] global, w = flat[mask] personal; minibatch cross-entropy).

Every gradient evaluation is charged on the client's work meter (`ctx.work`), so the simulated
clock sees what fine-tuning really cost."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.engine import ClientContext
from rayfl.models.params import functional_logits, get_flat

Batch = tuple[torch.Tensor, torch.Tensor] | None
Solver = Literal["gd", "cg", "exact"]
WInit = Literal["random", "zero", "warm"]
W_STATE = "w"  # where a client keeps its personal parameters (never uploaded)


@dataclass(frozen=True)
class SplitSpec:
    """How a client rebuilds its split objective: `quadratic` (FFGG's Example 1 rows) or
    `network` with the personalization scheme of `rayfl.models.personal`. Travels as a few
    strings, never as the mask itself."""

    problem: Literal["quadratic", "network"] = "quadratic"
    scheme: str = "output"
    patterns: tuple[str, ...] = ()
    batch_size: int = 32


@dataclass(frozen=True)
class FineTune:
    """Alg. 2: `steps` iterations of `solver` on w from `init` with step `lr` (GD only); with
    `epochs` (networks) the step count is epochs x ceil(n / batch_size) instead."""

    solver: Solver = "gd"
    steps: int = 10
    lr: float = 0.02
    init: WInit = "random"
    epochs: int | None = None


class QuadraticObjective:
    """f(theta, w) = 1/2 ||T (theta, w, 1)||^2 over the client's factor rows T (float64).

    grad f = T^T (T z); the w-subproblem's matrix T_w^T T_w is formed only when a solver asks.
    Each gradient is charged on the work meter as one pass over the client's rows."""

    def __init__(self, ctx: ClientContext, d_theta: int):
        self.ctx = ctx
        t = ctx.x.to(torch.float64)
        self.d_theta = d_theta
        self.d_w = t.shape[1] - d_theta - 1
        if self.d_w < 1:
            raise ValueError(f"client rows of width {t.shape[1]} cannot hold d_theta={d_theta} and a personal w")
        self.rows = int(t.shape[0])
        self.t = t
        self.w = slice(d_theta, d_theta + self.d_w)
        self._kww: torch.Tensor | None = None

    def batch(self) -> Batch:
        return None  # deterministic: every step sees the whole (exact) objective

    def steps_per_epoch(self, batch_size: int) -> int:
        return 1

    def _z(self, theta: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.cat([theta, w, torch.ones(1, dtype=torch.float64)])

    def grads(self, theta: torch.Tensor, w: torch.Tensor, batch: Batch = None) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(grad_theta, grad_w, loss) at (theta, w)."""
        res = self.t @ self._z(theta, w)
        g = self.t.T @ res
        self.ctx.work.gradient_step(self.rows)
        return g[: self.d_theta], g[self.w], 0.5 * float(res @ res)

    def full_grads(self, theta: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        return self.grads(theta, w)

    def w_gradient(self, theta: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """w -> grad_w f(theta, w) at a fixed theta: K_ww w - rhs(theta) (the GD fast path)."""
        kww, rhs = self.w_matrix(), self.w_rhs(theta)

        def grad_w(w: torch.Tensor) -> torch.Tensor:
            self.ctx.work.gradient_step(self.rows)
            return kww @ w - rhs

        return grad_w

    # the w-subproblem as a linear system K_ww w = rhs(theta), for CG and the exact solver
    def w_matvec(self, p: torch.Tensor) -> torch.Tensor:
        self.ctx.work.gradient_step(self.rows)
        return self.w_matrix() @ p

    def w_rhs(self, theta: torch.Tensor) -> torch.Tensor:
        """-(K_w,theta theta + k_w): minus the w-gradient at w = 0."""
        t_w = self.t[:, self.w]
        return -(t_w.T @ (self.t[:, : self.d_theta] @ theta + self.t[:, -1]))

    def w_matrix(self) -> torch.Tensor:
        if self._kww is None:
            t_w = self.t[:, self.w]
            self._kww = t_w.T @ t_w
        return self._kww

    def random_w(self) -> torch.Tensor:
        """w^0 ~ N(0, I), from the client's own stream (Alg. 2, line 1, says "randomly" with no law;
        N(0, I) is the authors' public code's)."""
        return torch.from_numpy(self.ctx.rng("ffgg.w_init").standard_normal(self.d_w))


class NetworkObjective:
    """Mean cross-entropy of the client's model, with flat = theta at ~mask and w at mask."""

    def __init__(self, ctx: ClientContext, mask: np.ndarray, batch_size: int):
        self.ctx = ctx
        self.mask = torch.from_numpy(np.asarray(mask, dtype=bool)).to(ctx.device)
        self.batch_size = batch_size
        self.y = ctx.y  # a label-flipping Byzantine client's are flipped already (rayfl.pipeline)
        self._stream: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.d_w = int(self.mask.sum())

    def steps_per_epoch(self, batch_size: int) -> int:
        return max(1, math.ceil(self.ctx.num_samples / batch_size))

    def batch(self) -> Batch:
        if self._stream is None:
            self._stream = self._indices()
        idx = next(self._stream)
        return self.ctx.x[idx], self.y[idx]

    def _indices(self) -> Iterator[torch.Tensor]:
        rng = self.ctx.rng("ffgg.batches")
        n, b = self.ctx.num_samples, min(self.batch_size, self.ctx.num_samples)
        while True:
            perm = torch.from_numpy(rng.permutation(n))
            for start in range(0, n - b + 1, b):
                yield perm[start : start + b]

    def flat(self, theta: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.mask.numel(), dtype=theta.dtype, device=theta.device)
        out = out.masked_scatter(~self.mask, theta)
        return out.masked_scatter(self.mask, w)

    def grads(self, theta: torch.Tensor, w: torch.Tensor, batch: Batch = None) -> tuple[torch.Tensor, torch.Tensor, float]:
        x, y = batch if batch is not None else self.batch()
        th, ww = theta.detach().requires_grad_(True), w.detach().requires_grad_(True)
        loss = F.cross_entropy(functional_logits(self.ctx.model, self.flat(th, ww), x), y)
        g_theta, g_w = torch.autograd.grad(loss, [th, ww], allow_unused=True)
        self.ctx.work.gradient_step(len(y))
        g_theta = torch.zeros_like(th) if g_theta is None else g_theta
        g_w = torch.zeros_like(ww) if g_w is None else g_w
        return g_theta.detach(), g_w.detach(), float(loss.detach())

    def full_grads(self, theta: torch.Tensor, w: torch.Tensor, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Gradients of the mean loss over all the client's samples (Alg. 1 line 6 on the
        client's empirical risk), in chunks; charged as one pass, not as optimizer steps."""
        n = self.ctx.num_samples
        g_t, g_w, total = torch.zeros_like(theta), torch.zeros_like(w), 0.0
        steps = self.ctx.work.steps
        for start in range(0, n, chunk):
            sl = slice(start, min(n, start + chunk))
            gt, gw, loss = self.grads(theta, w, (self.ctx.x[sl], self.y[sl]))
            frac = (sl.stop - sl.start) / n
            g_t, g_w, total = g_t + frac * gt, g_w + frac * gw, total + frac * loss
        self.ctx.work.steps = steps  # one evaluation pass, not optimizer steps
        return g_t, g_w, total

    def random_w(self) -> torch.Tensor:
        """The module's default initialisation of the personal entries, redrawn from the
        client's own stream (Alg. 2, line 1: "initialize randomly", with no law)."""
        from rayfl.models.networks import init_params

        model = copy.deepcopy(self.ctx.model)
        init_params(model, self.ctx.generator("ffgg.w_init"))
        return get_flat(model).to(self.ctx.device)[self.mask]


Objective = QuadraticObjective | NetworkObjective


def make_objective(ctx: ClientContext, spec: SplitSpec, d_theta: int) -> Objective:
    if spec.problem == "quadratic":
        return QuadraticObjective(ctx, d_theta)
    from rayfl.models.personal import personal_mask

    return NetworkObjective(ctx, personal_mask(ctx.model, spec.scheme, spec.patterns), spec.batch_size)


def initial_w(obj: Objective, ctx: ClientContext, init: WInit, dtype: torch.dtype) -> torch.Tensor:
    """w^{r,0}: random (Alg. 2 line 1), zero (the Thm 6 proof), or warm (the client's last
    committed w, a stateful variant; random at a client's first participation)."""
    if init == "warm" and ctx.state.get(W_STATE) is not None:
        return torch.as_tensor(ctx.state[W_STATE]).to(dtype)
    if init == "zero":
        return torch.zeros(obj.d_w, dtype=dtype)
    return obj.random_w().to(dtype)


def gd(obj: Objective, theta: torch.Tensor, w: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
    """Alg. 2: w <- w - gamma_w grad_w f(theta, w), `steps` times (a minibatch each on networks)."""
    if isinstance(obj, QuadraticObjective):
        grad_w = obj.w_gradient(theta)
        for _ in range(steps):
            w = w - lr * grad_w(w)
        return w
    for _ in range(steps):
        _, g_w, _ = obj.grads(theta, w, obj.batch())
        w = w - lr * g_w
    return w


def cg(obj: QuadraticObjective, theta: torch.Tensor, w: torch.Tensor, steps: int) -> torch.Tensor:
    """Conjugate gradients on K_ww w = -(K_w,theta theta + k_w) from w, exactly `steps`
    iterations (SciPy's cg with maxiter = steps and tolerance 0, the paper's Fig. 1a solver),
    stopping early only at an exactly zero residual."""
    r = obj.w_rhs(theta) - obj.w_matvec(w)
    p, rr = r.clone(), float(r @ r)
    for _ in range(steps):
        if rr == 0.0:
            break
        ap = obj.w_matvec(p)
        alpha = rr / float(p @ ap)
        w = w + alpha * p
        r = r - alpha * ap
        rr_new = float(r @ r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return w


def exact(obj: QuadraticObjective, theta: torch.Tensor) -> torch.Tensor:
    """w*(theta) in closed form (the theory's exact fine-tuning)."""
    obj.ctx.work.gradient_step(obj.rows)
    return torch.linalg.solve(obj.w_matrix(), obj.w_rhs(theta))


def finetune(obj: Objective, ctx: ClientContext, theta: torch.Tensor, tune: FineTune) -> torch.Tensor:
    """w ~ argmin_w f(theta, w) by the configured local solver."""
    w = initial_w(obj, ctx, tune.init, theta.dtype)
    if tune.solver in ("cg", "exact") and not isinstance(obj, QuadraticObjective):
        raise ValueError(f"fine-tuner {tune.solver!r} needs a quadratic objective; use gd on networks")
    if tune.solver == "exact":
        return exact(obj, theta)  # type: ignore[arg-type]
    steps = tune.steps if tune.epochs is None else tune.epochs * obj.steps_per_epoch(getattr(obj, "batch_size", 1))
    if tune.solver == "cg":
        return cg(obj, theta, w, steps)  # type: ignore[arg-type]
    return gd(obj, theta, w, steps, tune.lr)


def to_tensor(x: Any, ctx: ClientContext, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(np.asarray(x), dtype=dtype, device=ctx.device)  # a copy: payloads are read-only
