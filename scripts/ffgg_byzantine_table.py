"""The BR-FFGG table of docs/replications/ffgg.md from the runs of jobs/ffgg/byzantine.sh.

    python scripts/ffgg_byzantine_table.py results/ffgg/ffgg_byzantine

prints one Markdown row per run id (without its seed suffix): ‖F‖ after 1, 100, 300 and the
last round, as the mean over the seeds found; ‖θ − θ*‖² after the last round; the rate, the
slope of log ‖F‖ over the rounds relative to the attack-free run of the same seed (mean over
seeds; "diverges" where ‖F‖ overflowed); and the final ‖F‖ at each seed."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SEED = re.compile(r"^(?P<row>.+)_s(?P<seed>\d+)$")
CONTROL = "none_mean"


def per_run(rounds: pd.DataFrame) -> pd.DataFrame:
    """One line per run: row, seed, ‖F‖ at the logged points, final distance, log-slope."""
    out = []
    for run_id, t in rounds.groupby("run_id"):
        m = SEED.match(str(run_id))
        if not m:
            continue
        t = t.dropna(subset=["F_norm"]).sort_values("round")
        f = t["F_norm"].to_numpy()
        last = len(f) - 1
        slope = np.polyfit(t["round"].to_numpy(), np.log(f), 1)[0] if np.isfinite(f).all() and (f > 0).all() else np.nan
        out.append({"row": m["row"], "seed": int(m["seed"]), "F1": f[0], "F100": f[min(99, last)],
                    "F300": f[min(299, last)], "Ffinal": f[last], "dist": t["dist_sq"].to_numpy()[-1],
                    "slope": slope, "rounds": last + 1})
    return pd.DataFrame(out)


def number(v: float) -> str:
    """Three significant digits; a run that overflowed (diverged) shows as ∞."""
    return f"{v:.3g}" if np.isfinite(v) else "∞"


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
