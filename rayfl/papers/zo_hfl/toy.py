"""The appendix toy problem of ZO-HFL, and its Fig. 3: an implicit function that is
nondifferentiable and nonconvex, minimised by ZO-HFL's server step.

    min_x f(x) = 1/2 ||x + 1 - y(x)||^2,   y(x) = argmin_{y >= 0} ||y - x||^2 = Pi_{R^n_+}[x]

so f(x) = sum_i g(x_i) with g(t) = 1/2 for t >= 0 and 1/2 (t + 1)^2 for t < 0: kinks wherever
some x_i = 0 and a flat, nonconvex plateau on the orthant (arXiv 2504.01839, appendix; f1 = 0,
one client). `run_toy` solves the lower level with the same projected-SGD solver (Alg. 2, the
orthant as constraint) and steps with the same two-point estimator as `rayfl.algorithms.zo_hfl`.

    python -m rayfl.papers.zo_hfl.toy --plot fig3.png      # Fig. 3 (n = 2) and a ZO-HFL run on the toy
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rayfl.zo.estimator import two_point_estimate
from rayfl.zo.lower_level import projected_sgd
from rayfl.zo.projection import ConstraintConfig
from rayfl.zo.sphere import direction_seed, sphere_from_seed

ORTHANT = ConstraintConfig(kind="box", low=0.0)


def implicit_value(x: np.ndarray) -> float:
    """f(x) in closed form: sum_i g(x_i)."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.where(x >= 0, 0.5, 0.5 * (x + 1.0) ** 2).sum())


def upper(x: np.ndarray, y: np.ndarray) -> float:
    """The upper-level function 1/2 ||x + 1 - y||^2."""
    e = np.asarray(x, dtype=np.float64) + 1.0 - np.asarray(y, dtype=np.float64)
    return 0.5 * float(e @ e)


def lower_level(x: np.ndarray, steps: int, lr: float = 0.75, lr_offset: float = 1.0) -> np.ndarray:
    """y(x) approximately: `steps` projected gradient steps on ||y - x||^2 over y >= 0 from
    y = 0 (Alg. 2 with a deterministic gradient; mu_h lr = 1.5 > 1, as Prop. 1 asks)."""
    xt = torch.as_tensor(np.asarray(x, dtype=np.float64))[None]
    y, _, _ = projected_sgd(
        torch.zeros_like(xt), xt, steps=steps, lr=lr, lr_offset=lr_offset, mu=2.0,
        constraint=ORTHANT, data_grad=None,
    )
    return y[0].numpy()


@dataclass
class ToyRun:
    x: np.ndarray  # [rounds + 1, n] iterates
    f: np.ndarray  # [rounds + 1] f(x_r) in closed form


def run_toy(
    x0: np.ndarray, rounds: int = 200, eta: float = 0.1, gamma0: float = 0.1, power: float = 0.5,
    steps: int = 30, seed: int = 0,
) -> ToyRun:
    """ZO-HFL (Alg. 1) with one client, f1 = 0 and w = 1: x_{r+1} = x_r - gamma_r (n / 2 eta)
    (f(x_r + eta v, y+) - f(x_r - eta v, y-)) v, y+- from `steps` lower-level steps."""
    x = np.asarray(x0, dtype=np.float64).copy()
    xs, fs = [x.copy()], [implicit_value(x)]
    for r in range(rounds):
        v = sphere_from_seed(direction_seed(seed, r, 0), x.size)
        plus, minus = x + eta * v, x - eta * v
        diff = upper(plus, lower_level(plus, steps)) - upper(minus, lower_level(minus, steps))
        x = x - gamma0 / (r + 1) ** power * two_point_estimate(diff, 0.0, v, eta)
        xs.append(x.copy())
        fs.append(implicit_value(x))
    return ToyRun(np.array(xs), np.array(fs))


def plot_implicit_surface(path: str | Path, run: ToyRun | None = None, limit: float = 2.0) -> Path:
    """Fig. 3: the surface f(x) for n = 2 on [-limit, limit]^2, with a toy run's iterates."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    grid = np.linspace(-limit, limit, 81)
    xx, yy = np.meshgrid(grid, grid)
    zz = np.vectorize(lambda a, b: implicit_value(np.array([a, b])))(xx, yy)
    fig = Figure(figsize=(6.0, 5.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(projection="3d")
    ax.plot_surface(xx, yy, zz, cmap="viridis", linewidth=0, antialiased=True, alpha=0.85)
    if run is not None and run.x.shape[1] == 2:
        ax.plot(run.x[:, 0], run.x[:, 1], run.f, color="red", marker=".", markersize=3, label="ZO-HFL iterates")
        ax.legend(loc="upper left", fontsize="small")
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.set_zlabel("$f(x)$")
    ax.set_title(r"$f(x)=\frac{1}{2}\|x+\mathbf{1}-\Pi_{\mathbb{R}^2_+}[x]\|^2$ (ZO-HFL Fig. 3)")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="ZO-HFL's toy implicit function (Fig. 3) and a ZO-HFL run on it")
    p.add_argument("--plot", default="fig3_toy_implicit.png", help="where to write the figure")
    p.add_argument("--x0", type=float, nargs=2, default=[-1.8, 1.5])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    run = run_toy(np.array(args.x0), rounds=args.rounds, seed=args.seed)
    print(f"f(x_0) = {run.f[0]:.4f} at {run.x[0].round(3).tolist()}; f(x_R) = {run.f[-1]:.4f} at {run.x[-1].round(3).tolist()}")
    print(f"figure: {plot_implicit_surface(args.plot, run)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
