"""The BR-FFGG table of docs/replications/ffgg.md from the runs of jobs/ffgg/byzantine.sh.

    python scripts/ffgg_byzantine_table.py results/ffgg/ffgg_byzantine

prints one Markdown row per run id (without its seed suffix): ‖F‖ after 1, 100, 300 and the
last round, as the mean over the seeds found; ‖θ − θ*‖² after the last round; the rate, the
slope of log ‖F‖ over the rounds relative to the attack-free run of the same seed (mean over
seeds; "diverges" where ‖F‖ overflowed); and the final ‖F‖ at each seed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from seed_table import number
from seed_table import per_run as seed_runs

CONTROL = "none_mean"


def log_slope(t: pd.DataFrame) -> dict[str, float]:
    """The slope of log ‖F‖ over the rounds (NaN where ‖F‖ overflowed or reached 0)."""
    f = t["F_norm"].to_numpy(dtype=float)
    ok = np.isfinite(f).all() and (f > 0).all()
    return {"slope": np.polyfit(t["round"].to_numpy(), np.log(f), 1)[0] if ok else np.nan}


def per_run(rounds: pd.DataFrame) -> pd.DataFrame:
    """One line per run: row, seed, ‖F‖ after rounds 1, 100, 300 and the last, final distance, log-slope."""
    runs = seed_runs(rounds, "F_norm", (1, 100, 300), ("dist_sq",), extra=log_slope)
    return runs.rename(columns={"at1": "F1", "at100": "F100", "at300": "F300", "final": "Ffinal", "dist_sq": "dist"})


def table(runs: pd.DataFrame) -> str:
    control = runs[runs.row == CONTROL].set_index("seed")["slope"]
    runs = runs.assign(rate=runs.slope / runs.seed.map(control))
    seeds = sorted(runs.seed.unique())
    lines = ["| run | rounds | ‖F‖ at 1 → 100 → 300 → final (mean over seeds) | ‖θ − θ*‖² final | rate | final ‖F‖ at seed "
             + " / ".join(map(str, seeds)) + " |", "|---|---|---|---|---|---|"]
    for row, g in runs.groupby("row", sort=True):
        g = g.sort_values("seed")
        mean = g[["F1", "F100", "F300", "Ffinal", "dist"]].mean()
        rate = g.rate.mean()
        lines.append(f"| `{row}` | {int(g.rounds.iloc[0])} | {number(mean.F1)} → {number(mean.F100)} → "
                     f"{number(mean.F300)} → **{number(mean.Ffinal)}** | {number(mean.dist)} | "
                     + (f"× {rate:.2f}" if np.isfinite(rate) else "diverges") + " | "
                     + " / ".join(number(v) for v in g.Ffinal) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", type=Path, help="the runs' experiment directory, e.g. results/ffgg/ffgg_byzantine")
    args = parser.parse_args(argv)
    import rayfl

    print(table(per_run(rayfl.load(args.experiment).rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
