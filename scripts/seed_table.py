"""A replication table over seeds, from runs named `<row>_s<seed>` (jobs/grid.sh's run ids).

    python scripts/seed_table.py results/ffgg/ffgg_fig1a --metric F_norm --at 500 1000 1500 \\
        --final dist_sq --min

prints one Markdown row per run id without its seed suffix:
- the metric after rounds --at and after the last round, mean over the seeds found (the last in
  bold); "after round k" is the k-th logged round (round index k - 1), as `rayfl report` counts;
- with --min, its smallest value over the run; with --tail N, its mean over the last N logged
  rounds (the plateau of a noisy curve); both as means over seeds;
- with --reach X, at each seed the rounds it took the metric to reach X or below (the first
  logged round at or under it, counted as --at counts; "> R" when it never did);
- with --staleness, the mean and largest staleness of the run's accepted updates (its clients
  table): the mean over seeds, the largest at any seed; and how many clients made them;
- the last value of each --final column, mean over seeds;
- the metric's last value at each seed, so that the spread is in the table.
A run that ended earlier (still going, or cut) shows its last value at later points, and its
row's rounds become a range. A value that overflowed shows as ∞."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

SEED = re.compile(r"^(?P<row>.+)_s(?P<seed>\d+)$")


def per_run(rounds: pd.DataFrame, metric: str, at: Sequence[int], finals: Sequence[str] = (),
            extra: Callable[[pd.DataFrame], dict[str, Any]] | None = None, tail: int = 0,
            reach: float | None = None) -> pd.DataFrame:
    """One line per run named `<row>_s<seed>`: row, seed, rounds run, the metric after each
    round of `at` (columns `at<k>`), its last value (`final`), minimum (`min`) and mean over
    the last `tail` logged rounds (`tail`, with tail > 0), the rounds it took to reach `reach`
    or below (`reach`, NaN when it never did), the last
    value of each column of `finals`, and what `extra` computes from the run's rows (those
    with the metric, in round order); runs without a seed suffix are left out."""
    out = []
    for run_id, t in rounds.groupby("run_id"):
        m = SEED.match(str(run_id))
        if not m:
            continue
        t = t.dropna(subset=[metric]).sort_values("round")
        if t.empty:
            continue
        values = t[metric].to_numpy(dtype=float)
        index = t["round"].to_numpy()
        line = {"row": m["row"], "seed": int(m["seed"]), "rounds": int(index[-1]) + 1, "final": values[-1],
                "min": np.nanmin(values), "tail": values[-tail:].mean() if tail > 0 else np.nan, "reach": np.nan}
        if reach is not None and (values <= reach).any():
            line["reach"] = int(index[np.argmax(values <= reach)]) + 1
        for k in at:
            line[f"at{k}"] = values[min(np.searchsorted(index, k - 1), len(values) - 1)]
        for col in finals:
            line[col] = t[col].dropna().to_numpy(dtype=float)[-1] if t[col].notna().any() else np.nan
        out.append(line | (extra(t) if extra is not None else {}))
    return pd.DataFrame(out)


def staleness(clients: pd.DataFrame) -> pd.DataFrame:
    """row, seed, stale_mean, stale_max, clients: the staleness of each run's accepted updates,
    and how many distinct clients made them."""
    ok = clients[clients.outcome == "ok"] if "outcome" in clients.columns else clients
    out = []
    for run_id, t in ok.groupby("run_id"):
        m = SEED.match(str(run_id))
        if m and "staleness" in t.columns and t.staleness.notna().any():
            out.append({"row": m["row"], "seed": int(m["seed"]), "stale_mean": t.staleness.mean(),
                        "stale_max": t.staleness.max(), "clients": t.client.nunique()})
    return pd.DataFrame(out, columns=["row", "seed", "stale_mean", "stale_max", "clients"])


def number(v: float) -> str:
    """Three significant digits; a value that overflowed shows as ∞."""
    return f"{v:.3g}" if np.isfinite(v) else "∞"


def table(runs: pd.DataFrame, metric: str, at: Sequence[int], finals: Sequence[str] = (), show_min: bool = False,
          rows: Sequence[str] | None = None, tail: int = 0, reach: float | None = None) -> str:
    """The Markdown table of `per_run`'s lines (in the order of `rows` when given)."""
    seeds = sorted(runs.seed.unique())
    points = " → ".join([*map(str, at), "final"])
    head = ["run", "rounds", f"{metric} after {points} (mean over seeds)" if at else f"final {metric} (mean over seeds)"]
    head += ["min (mean)"] if show_min else []
    head += [f"mean of the last {tail}"] if tail > 0 else []
    head += [f"rounds to {metric} ≤ {reach:g}, at each seed"] if reach is not None else []
    head += [f"{col} final" for col in finals]
    stale = "stale_mean" in runs.columns
    head += ["staleness mean / max", "clients updating"] if stale else []
    head += [f"final {metric} at seed " + " / ".join(map(str, seeds))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = list(rows) if rows is not None else sorted(runs.row.unique())
    for row in order:
        g = runs[runs.row == row].sort_values("seed")
        if g.empty:
            continue
        mean = g.drop(columns=["row"]).mean(numeric_only=True)
        low, high = int(g.rounds.min()), int(g.rounds.max())
        cells = [f"`{row}`", str(high) if low == high else f"{low}–{high}",
                 " → ".join([*(number(mean[f"at{k}"]) for k in at), f"**{number(mean.final)}**"])]
        cells += [number(mean["min"])] if show_min else []
        cells += [number(mean["tail"])] if tail > 0 else []
        if reach is not None:
            cells += [" / ".join(f"> {r}" if np.isnan(k) else f"{k:.0f}" for k, r in zip(g.reach, g.rounds, strict=True))]
        cells += [number(mean[col]) for col in finals]
        if stale:
            low, high = int(g.clients.min()), int(g.clients.max())
            cells += [f"{mean.stale_mean:.1f} / {g.stale_max.max():.0f}", str(high) if low == high else f"{low}–{high}"]
        cells += [" / ".join(number(v) for v in g.final)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", type=Path, help="the runs' experiment directory, e.g. results/ffgg/ffgg_fig1a")
    parser.add_argument("--metric", default="F_norm", help="the rounds-table column to report (default F_norm)")
    parser.add_argument("--at", type=int, nargs="*", default=[], help="rounds after which to report it")
    parser.add_argument("--final", nargs="*", default=[], help="other columns whose last value to report")
    parser.add_argument("--min", action="store_true", help="also the metric's minimum over the run")
    parser.add_argument("--tail", type=int, default=0, help="also the metric's mean over the last N logged rounds")
    parser.add_argument("--reach", type=float, help="also the rounds each seed took to bring the metric to this value or below")
    parser.add_argument("--staleness", action="store_true", help="also the staleness of the accepted updates (async runs)")
    parser.add_argument("--rows", nargs="*", help="the rows to show, in this order (default: all, sorted)")
    args = parser.parse_args(argv)
    import rayfl

    results = rayfl.load(args.experiment)
    runs = per_run(results.rounds, args.metric, args.at, args.final, tail=args.tail, reach=args.reach)
    if args.staleness and not runs.empty:
        runs = runs.merge(staleness(results.clients), on=["row", "seed"], how="left")
    if runs.empty:
        print(f"seed_table: no run named <row>_s<seed> with {args.metric!r} under {args.experiment}", file=sys.stderr)
        return 2
    print(table(runs, args.metric, args.at, args.final, args.min, args.rows, args.tail, args.reach))
    return 0


if __name__ == "__main__":
    sys.exit(main())
