"""Cross-check for Fig. 1(b-d), NOT a rayfl run: FFGG with the GD fine-tuner of Alg. 2 (fresh
w ~ N(0, I) every round, tau steps of 1/L_w, then theta <- theta - (1/L) mean grad_theta f_m)
re-simulated in plain numpy on the same cached Example-1 instance, for horizons the shared
machine could not afford through Ray. It reproduces rayfl's ffgg_tau{100,200,500} curves at
round 200 to three digits (0.432 / 0.433 / 0.434) and shows the floor each tau settles on.

Usage (after any rayfl run has cached the instance under ~/.rayfl/data/ffgg_quadratic):
    python jobs/ffgg/gd_floor_check.py 2000 100 200 500     # rounds, then the taus
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from rayfl.papers.ffgg.quadratic import QuadraticOracle

CACHE = Path("~/.rayfl/data/ffgg_quadratic/M32_n10000_t100_w50_p1_seed0.npy").expanduser()
MARKS = (200, 500, 1000, 1500, 2000, 3000)


def main(rounds: int, taus: list[int]) -> None:
    rows = np.load(CACHE)
    oracle = QuadraticOracle.from_factors(list(rows), 100)
    k = np.stack(oracle.grams)
    t, w = slice(0, 100), slice(100, 150)
    k_tt, k_tw, k_ww, k_tc, k_wc = k[:, t, t], k[:, t, w], k[:, w, w], k[:, t, 150], k[:, w, 150]
    for tau in taus:
        rng, theta, seen = np.random.default_rng(0), np.zeros(100), {}
        for r in range(1, rounds + 1):
            w_m = rng.standard_normal((len(k), 50))
            shift = np.einsum("mji,j->mi", k_tw, theta) + k_wc
            for _ in range(tau):
                w_m = w_m - (np.einsum("mij,mj->mi", k_ww, w_m) + shift) / oracle.L_w
            grads = np.einsum("mij,j->mi", k_tt, theta) + np.einsum("mij,mj->mi", k_tw, w_m) + k_tc
            theta = theta - grads.mean(axis=0) / oracle.L
            if r in MARKS:
                seen[r] = float(np.linalg.norm(oracle.operator(theta)))
        print(f"tau={tau}: " + "  ".join(f"r{r}: {v:.3g}" for r, v in seen.items()), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(x) for x in sys.argv[2:]])
