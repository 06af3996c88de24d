"""The two hierarchical problems of FedRZO's Sec. 5.2 and 5.3 (Fig. 2 left and right).

Both are (FL_bl) instances over the same m clients: an upper-level loss f~_i(x, y, xi) that
clients evaluate (zeroth order, at two points) and a lower-level objective h~_i(x, y, zeta)
whose y-gradient the lower-level FL oracle (`rayfl.zo.fl_oracle`, Alg. 3) follows.

* `hyperparam` (Sec. 5.2, Fig. 2 left): x in R^m, x_i client i's l2 weight; the lower level is
  l2-regularised logistic regression on the clients' *training* rows,
  h_i(x, y) = mean_l log(1 + exp(-v u^T y)) + x_i / 2 ||y||^2; the upper level is the same
  logistic loss on the clients' *test* rows (no direct x-dependence).
* `fair` (Sec. 5.3, Fig. 2 right, Nouiehed et al.): x the 1-hidden-layer ReLU network of
  Sec. 5.1, y in R^c a weight per group j (the original digit, or the binary label),
  f_i(x, y) = sum_j y_j L_ij(x) - lam / 2 ||y||^2 with L_ij the mean squared error of client i on
  its group-j rows; the lower level is ascent in y (h_i = -f_i), whose exact maximiser is
  y_j = L_j(x) / lam.

The extracted text lost both problems' formulas; the forms above are rayfl's reading of the
surviving prose. Labels are binary, v = +1 for the upper half of the classes (digit >= 5) and
-1 otherwise (the paper does not say how MNIST is made binary); losses are per-client means.
Everything is float64: the estimator multiplies a loss difference by n / eta^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

Batch = dict[str, torch.Tensor]
PROBLEMS = ("hyperparam", "fair")


@dataclass(frozen=True)
class ProblemSpec:
    """What a client needs to rebuild the problem: its name and constants (sent each call)."""

    name: Literal["hyperparam", "fair"] = "hyperparam"
    num_classes: int = 10
    reg_floor: float = 1e-4  # hyperparam: lower-level l2 weight clamped at >= this (strong convexity)
    lam: float = 1.0  # fair: strong concavity of the inner max
    hidden: int = 4  # fair: N_1 hidden ReLU units
    groups: Literal["class", "binary"] = "class"  # fair: group j = original class, or binary label
    unit_norm: bool = False  # hyperparam: scale every feature vector to norm 1 (the lower level is then 1/4-smooth)

    def for_client(self, ctx: Any) -> Problem:
        """The problem as client `ctx` sees it (what the client functions of Alg. 2 / 3 call)."""
        return problem_for_client(ctx, self)


def binary_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """v = +1 for classes >= num_classes // 2 (digits 5-9), -1 otherwise (rayfl's choice)."""
    return torch.where(labels >= num_classes // 2, 1.0, -1.0).to(torch.float64)


def make_batch(features: Any, labels: Any, spec: ProblemSpec) -> Batch:
    """Flattened float64 features `u`, binary targets `v` and group ids `g` of some rows."""
    u = torch.as_tensor(np.asarray(features)).reshape(len(labels), -1).to(torch.float64)
    if spec.unit_norm and spec.name == "hyperparam":
        u = u / torch.linalg.vector_norm(u, dim=1, keepdim=True).clamp(min=1e-12)
    lab = torch.as_tensor(np.asarray(labels)).to(torch.int64)
    g = lab if spec.groups == "class" else (lab >= spec.num_classes // 2).to(torch.int64)
    return {"u": u, "v": binary_labels(lab, spec.num_classes), "g": g}


def num_groups(spec: ProblemSpec) -> int:
    return spec.num_classes if spec.groups == "class" else 2


def as_float64(a: Any) -> torch.Tensor:
    """A float64 tensor copy (arrays from Ray's object store are read-only)."""
    return torch.tensor(np.asarray(a, dtype=np.float64))


def take(batch: Batch, idx: torch.Tensor) -> Batch:
    return {k: t.index_select(0, idx) for k, t in batch.items()}


# ---------------------------------------------------------------- hyper-parameter learning


def logistic_loss(y: torch.Tensor, b: Batch) -> torch.Tensor:
    """mean_l log(1 + exp(-v_l u_l^T y))."""
    return torch.nn.functional.softplus(-b["v"] * (b["u"] @ y)).mean()


def logistic_grad(y: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean logistic loss, its gradient -mean_l v_l sigmoid(-v_l u_l^T y) u_l)."""
    margin = b["v"] * (b["u"] @ y)
    loss = torch.nn.functional.softplus(-margin).mean()
    grad = -(b["u"].T @ (b["v"] * torch.sigmoid(-margin))) / len(margin)
    return loss, grad


def regularisation(x: np.ndarray, client: int, spec: ProblemSpec) -> tuple[float, bool]:
    """Client i's effective l2 weight x_i, clamped at reg_floor (and whether it was clamped)."""
    w = float(x[client])
    return max(w, spec.reg_floor), w < spec.reg_floor


# ---------------------------------------------------------------- fair classification


def relu_net_dim(features: int, hidden: int) -> int:
    """n = N1 (N0 + 2) + 1: Z1 [N1, N0], w1 [N1], z2 [N1], w2 (Sec. 5.1's net, scalar output)."""
    return hidden * (features + 2) + 1


def relu_net(x: torch.Tensor, u: torch.Tensor, hidden: int) -> torch.Tensor:
    """NN_x(u) = z2^T relu(Z1 u + w1) + w2, for a flat x laid out as (Z1 row-major, w1, z2, w2)."""
    n0 = u.shape[1]
    z1 = x[: hidden * n0].reshape(hidden, n0)
    w1 = x[hidden * n0 : hidden * (n0 + 1)]
    z2 = x[hidden * (n0 + 1) : hidden * (n0 + 2)]
    return torch.relu(u @ z1.T + w1) @ z2 + x[-1]


def group_losses(x: torch.Tensor, b: Batch, spec: ProblemSpec, weights: torch.Tensor) -> torch.Tensor:
    """Unbiased minibatch estimate of L_ij(x), j = 0..c-1: (1/b) sum_l [g_l = j] (v_l -
    NN_x(u_l))^2 / p_ij, with p_ij = 1 / weights[j] client i's share of group j (weights 0 for
    a group it does not hold: L_ij = 0)."""
    sq = (b["v"] - relu_net(x, b["u"], spec.hidden)) ** 2
    sums = torch.zeros(num_groups(spec), dtype=torch.float64).index_add_(0, b["g"], sq)
    return sums * weights / len(sq)


def group_weights(all_groups: torch.Tensor, spec: ProblemSpec) -> torch.Tensor:
    """1 / p_ij from a client's full group column (0 where it holds no row of group j)."""
    counts = torch.bincount(all_groups, minlength=num_groups(spec)).to(torch.float64)
    return torch.where(counts > 0, len(all_groups) / counts.clamp(min=1), 0.0)


def fair_value(x: torch.Tensor, y: torch.Tensor, b: Batch, spec: ProblemSpec, weights: torch.Tensor) -> torch.Tensor:
    """f~_i(x, y, xi) = sum_j y_j L_ij(x; xi) - lam / 2 ||y||^2."""
    return y @ group_losses(x, b, spec, weights) - 0.5 * spec.lam * (y @ y)


def init_relu_net(seed_rng: np.random.Generator, features: int, hidden: int) -> np.ndarray:
    """PyTorch's default Linear initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights
    and biases of both layers, drawn from a seeded numpy stream (x_0 is not stated in the paper)."""
    a1, a2 = 1.0 / np.sqrt(features), 1.0 / np.sqrt(hidden)
    first = seed_rng.uniform(-a1, a1, size=hidden * (features + 1))
    second = seed_rng.uniform(-a2, a2, size=hidden + 1)
    return np.concatenate([first, second])


# ---------------------------------------------------------------- what the algorithm calls


class Problem:
    """One client's (or the driver's) view of the problem: its upper- and lower-level rows and
    the functions Alg. 2 and 3 evaluate. `upper` / `lower` are the client's full row sets."""

    def __init__(self, spec: ProblemSpec, upper: Batch, lower: Batch, client: int):
        self.spec, self.upper, self.lower, self.client = spec, upper, lower, client
        self.upper_w = group_weights(upper["g"], spec) if spec.name == "fair" else None
        self.lower_w = group_weights(lower["g"], spec) if spec.name == "fair" else None

    def upper_value(self, x: np.ndarray, y: np.ndarray, b: Batch) -> float:
        """f~_i(x, y, xi) on the upper-level minibatch b."""
        yt = as_float64(y)
        if self.spec.name == "hyperparam":
            return float(logistic_loss(yt, b))
        return float(fair_value(as_float64(x), yt, b, self.spec, self.upper_w))

    def lower_gradient(self, x: np.ndarray, y: torch.Tensor, b: Batch) -> tuple[float, torch.Tensor, bool]:
        """(h~_i, grad_y h~_i, clamped) at (x, y) on the lower-level minibatch b. For `fair`,
        h~_i = -f~_i, so a descent step on it is the ascent step of the inner max."""
        if self.spec.name == "hyperparam":
            reg, clamped = regularisation(x, self.client, self.spec)
            loss, grad = logistic_grad(y, b)
            return float(loss) + 0.5 * reg * float(y @ y), grad + reg * y, clamped
        losses = group_losses(as_float64(x), b, self.spec, self.lower_w)
        value = y @ losses - 0.5 * self.spec.lam * (y @ y)
        return -float(value), -(losses - self.spec.lam * y), False


def problem_for_client(ctx: Any, spec: ProblemSpec) -> Problem:
    """The client's rows: upper level on its test rows (hyperparam, Sec. 5.2: "testing samples")
    or its training rows (fair); lower level on its training rows."""
    train = make_batch(ctx.x.cpu().numpy(), ctx.y.cpu().numpy(), spec)
    if spec.name == "hyperparam":
        if ctx.test_x is None:
            raise ValueError("the hyperparam problem needs per-client test rows: set partition.client_test: proportional")
        upper = make_batch(ctx.test_x.cpu().numpy(), ctx.test_y.cpu().numpy(), spec)
    else:
        upper = train
    return Problem(spec, upper, train, ctx.id)


def client_problems(dataset: Any, spec: ProblemSpec) -> list[Problem]:
    """Every client's Problem on the driver (for evaluation outside the communication budget)."""
    out = []
    for i, rows in enumerate(dataset.client_train):
        train = make_batch(dataset.train_x[rows], dataset.train_y[rows], spec)
        if spec.name == "hyperparam":
            if dataset.client_test is None:
                raise ValueError("the hyperparam problem needs per-client test rows: set partition.client_test: proportional")
            t = dataset.client_test[i]
            upper = make_batch(dataset.test_x[t], dataset.test_y[t], spec)
        else:
            upper = train
        out.append(Problem(spec, upper, train, i))
    return out


def dimensions(spec: ProblemSpec, num_clients: int, features: int) -> tuple[int, int]:
    """(n, n~): upper and lower dimensions."""
    if spec.name == "hyperparam":
        return num_clients, features
    return relu_net_dim(features, spec.hidden), num_groups(spec)


def initial_point(spec: ProblemSpec, num_clients: int, features: int, rng: np.random.Generator) -> np.ndarray:
    """x_0: all ones for hyperparam (feasible for x >= mu), the seeded default init for fair."""
    if spec.name == "hyperparam":
        return np.ones(num_clients)
    return init_relu_net(rng, features, spec.hidden)


# ---------------------------------------------------------------- reference solutions (evaluation only)


def reference_lower(problems: list[Problem], x: np.ndarray, spec: ProblemSpec, tol: float = 1e-9) -> np.ndarray:
    """y(x) to high accuracy: for `fair` the closed form L(x) / lam (full data); for
    `hyperparam` L-BFGS on (1/m) sum_i [logistic_i(y) + x_i / 2 ||y||^2] (full data)."""
    if spec.name == "fair":
        xt = as_float64(x)
        losses = sum(group_losses(xt, p.lower, spec, p.lower_w) for p in problems) / len(problems)
        return (losses / spec.lam).numpy()
    from scipy.optimize import minimize

    regs = np.array([regularisation(x, p.client, spec)[0] for p in problems])
    mean_reg = float(regs.mean())

    def fun(y: np.ndarray) -> tuple[float, np.ndarray]:
        yt = torch.as_tensor(y)
        val, grad = 0.0, torch.zeros_like(yt)
        for p in problems:
            loss, g = logistic_grad(yt, p.lower)
            val, grad = val + float(loss), grad + g
        m = len(problems)
        return val / m + 0.5 * mean_reg * float(y @ y), grad.numpy() / m + mean_reg * y

    d = problems[0].lower["u"].shape[1]
    sol = minimize(fun, np.zeros(d), jac=True, method="L-BFGS-B", options={"gtol": tol, "ftol": 1e-15, "maxiter": 1000})
    return sol.x


def upper_objective(problems: list[Problem], x: np.ndarray, y: np.ndarray) -> float:
    """(1/m) sum_i f_i(x, y) on every client's full upper-level rows."""
    return float(np.mean([p.upper_value(x, y, p.upper) for p in problems]))


def mean_squared_loss(problems: list[Problem], x: np.ndarray, spec: ProblemSpec) -> float:
    """fair: the plain mean (v - NN_x(u))^2 over all clients' rows (the Sec. 5.1 loss)."""
    xt = as_float64(x)
    return float(np.mean([float(((p.upper["v"] - relu_net(xt, p.upper["u"], spec.hidden)) ** 2).mean()) for p in problems]))
