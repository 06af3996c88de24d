"""FedRZO's Fig. 2 (NeurIPS 2023, Sec. 5.2 left, 5.3 right) from Parquet results.

The paper's axes and captions were lost in extraction; rayfl draws the log of the average
upper-level loss against communication rounds, one line per H, mean +- std over seeds. Each
panel is drawn twice: against *upper* rounds (the paper's likely axis) and against *total*
rounds, lower-level FedAvg rounds of both oracle calls included, which is where the delay
mechanism's saving shows. Left: hyperparameter learning (`fedrzo_bl`, problem hyperparam),
metric `upper_loss` (the loss at y0_r, every round). Right: fair classification
(`fedrzo_minimax`), metric `implicit_obj` (exact inner max, eval rounds). `delay_saving`
tabulates the total rounds each H needed to reach a common loss.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.results.load import Results

RUN = ["experiment", "run_id"]
PANELS = {"hyperparam": ("fedrzo_bl", "upper_loss", "Fig. 2 left: hyper-parameter learning"),
          "fair": ("fedrzo_minimax", "implicit_obj", "Fig. 2 right: fair classification (minimax)")}


def fig2_runs(results: Results, problem: str, metric: str | None = None) -> pd.DataFrame:
    """The `rounds` rows of every run of `problem` where `metric` (default: the panel's) was
    measured, with H and seed from the manifests and its log as `log_loss`."""
    m = results.manifests
    alg, default, _ = PANELS[problem]
    metric = metric or default
    if m.empty or "algorithm.name" not in m.columns or results.rounds.empty:
        return pd.DataFrame()
    m = m[(m["algorithm.name"] == alg) & (m.get("algorithm.problem", problem) == problem)]
    if m.empty:
        return pd.DataFrame()
    meta = m[[*RUN, "algorithm.local_steps", "run.seed"]].rename(columns={"algorithm.local_steps": "H", "run.seed": "seed"})
    rows = results.rounds.merge(meta, on=RUN)
    if metric not in rows.columns:
        return pd.DataFrame()
    rows = rows[rows[metric].notna()].copy()
    rows["log_loss"] = np.log(rows[metric].astype(float))
    return rows.sort_values([*RUN, "round"])


def delay_saving(rows: pd.DataFrame, target: float | None = None) -> pd.DataFrame:
    """Per run: the first upper round and total rounds (upper + lower) at which the loss reaches
    `target` (default: the largest final loss over the runs, so every run reaches it)."""
    if rows.empty:
        return pd.DataFrame()
    metric = "loss"
    rows = rows.assign(loss=np.exp(rows["log_loss"]))
    finals = rows.groupby(RUN)[metric].last()
    target = float(finals.max()) if target is None else target
    out = []
    for (exp, rid), run in rows.groupby(RUN):
        hit = run[run[metric] <= target]
        first = hit.iloc[0] if len(hit) else None
        out.append({
            "experiment": exp, "run_id": rid, "H": int(run["H"].iloc[0]), "seed": run["seed"].iloc[0], "target": target,
            "upper_rounds": int(first["upper_rounds_cum"]) if first is not None else None,
            "lower_rounds": int(first["lower_rounds_cum"]) if first is not None else None,
            "total_rounds": int(first["total_rounds"]) if first is not None else None,
            "lower_bytes": int(first["lower_bytes_cum"]) if first is not None else None,
            "final_loss": float(run[metric].iloc[-1]),
        })
    return pd.DataFrame(out).sort_values(["H", "seed"])


def write_fedrzo_fig2(results: Results, out: Path) -> list[str]:
    """fedrzo_fig2_<problem>.png (two axes: upper rounds, total rounds) and
    fedrzo_fig2_<problem>_saving.csv per problem with runs; [] when there are none."""
    lines: list[str] = []
    for problem, (_, metric, title) in PANELS.items():
        rows = fig2_runs(results, problem)
        if rows.empty:
            continue
        out.mkdir(parents=True, exist_ok=True)
        png = out / f"fedrzo_fig2_{problem}.png"
        _plot(rows, png, title, metric)
        # the saving on the plotted metric and, where it differs, on the exact implicit objective
        savings = [delay_saving(rows).assign(metric=metric)]
        if metric != "implicit_obj":
            exact = fig2_runs(results, problem, "implicit_obj")
            if not exact.empty:
                savings.append(delay_saving(exact).assign(metric="implicit_obj"))
        saving = pd.concat(savings, ignore_index=True)
        csv = out / f"fedrzo_fig2_{problem}_saving.csv"
        saving.to_csv(csv, index=False)
        lines.append(f"{title}: {png.name}, {csv.name}")
        for (name, h), grp in saving.groupby(["metric", "H"], sort=False):
            lines.append(f"  {name}, H = {h}: <= {grp['target'].iloc[0]:.4f} after "
                         f"{grp['upper_rounds'].mean():.0f} upper / {grp['total_rounds'].mean():.0f} total rounds "
                         f"(final {grp['final_loss'].mean():.4f}, {len(grp)} run(s))")
    return lines


def _plot(rows: pd.DataFrame, path: Path, title: str, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for (h,), grp in rows.groupby(["H"]):
        for ax, x in zip(axes, ("upper_rounds_cum", "total_rounds"), strict=True):
            # mean +- std over seeds, on the rounds every seed reached (x is the same across seeds)
            stats = grp.groupby(x)["log_loss"].agg(["mean", "std", "count"]).reset_index()
            line = ax.plot(stats[x], stats["mean"], label=f"H = {h}")[0]
            if stats["count"].max() > 1:
                ax.fill_between(stats[x], stats["mean"] - stats["std"].fillna(0), stats["mean"] + stats["std"].fillna(0),
                                color=line.get_color(), alpha=0.2)
    axes[0].set_xlabel("upper-level communication rounds")
    axes[1].set_xlabel("total communication rounds (upper + lower)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel(f"log {metric}")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
