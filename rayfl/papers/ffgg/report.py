"""FFGG's Fig. 1 and the async / Byzantine studies from Parquet results.

Runs are recognised from their manifests: `data.dataset == ffgg_quadratic`. Every such run
logs ||F(theta)|| (`F_norm`, exact w*) per round. Written: `ffgg_quadratic_runs.csv` (one row
per run: algorithm, solver, tau, aggregator, attack, final and best ||F||, final ||theta -
theta*||^2), `ffgg_fig1a.png` (FFGG with CG, one line per tau), `ffgg_fig1bcd.png` (one panel
per tau: FFGG vs the baselines), `ffgg_async.png` and `ffgg_byzantine.png` (BR-FFGG, and FFGG's
plain mean under the same attacks). A setting's seeds are one line, their median, in a band from
the smallest to the largest seed's ||F||. The aggregator and attack are the job's `robust:` section
(`algorithm.aggregator` / `algorithm.attack` in runs recorded before the round pipeline)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from rayfl.results.load import Results

RUN = ["experiment", "run_id"]
LABELS = {"ffgg": "FFGG", "local_ffgg": "Local FFGG", "local_gd": "Local GD", "scaffold_quadratic": "Scaffold",
          "l2gd": "L2GD", "async_ffgg": "Async FFGG", "br_ffgg": "BR-FFGG"}


def _get(run: pd.Series, key: str, default: object = None) -> object:
    value = run.get(key, default)
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _robust(run: pd.Series, key: str) -> object:
    """robust.<key>.name; a run recorded while FFGG had its own algorithm.<key> (its robust
    section then held the unused defaults) by that key."""
    return _get(run, f"algorithm.{key}.name") or _get(run, f"robust.{key}.name", "")


def quadratic_runs(results: Results) -> pd.DataFrame:
    m = results.manifests
    if m.empty or "data.dataset" not in m.columns or results.rounds.empty or "F_norm" not in results.rounds.columns:
        return pd.DataFrame()
    m = m[m["data.dataset"] == "ffgg_quadratic"]
    rows = []
    for _, run in m.iterrows():
        r = results.rounds[(results.rounds["experiment"] == run["experiment"]) & (results.rounds["run_id"] == run["run_id"])]
        if r.empty:
            continue
        r = r.sort_values("round")
        rows.append({
            "experiment": run["experiment"], "run_id": run["run_id"], "algorithm": run.get("algorithm.name"),
            "solver": _get(run, "algorithm.solver", ""), "tau": _get(run, "algorithm.tau"),
            "aggregator": _robust(run, "aggregator"), "attack": _robust(run, "attack"),
            "dispatch": _get(run, "algorithm.dispatch", ""), "alpha_scale": _get(run, "algorithm.alpha_scale", 1.0),
            "seed": run.get("run.seed"), "rounds": len(r),
            "F_norm_final": float(r["F_norm"].iloc[-1]), "F_norm_min": float(r["F_norm"].min()),
            "dist_sq_final": float(r["dist_sq"].iloc[-1]) if "dist_sq" in r else math.nan,
        })
    return pd.DataFrame(rows)


def seed_bands(results: Results, runs: pd.DataFrame, label_of) -> list[tuple[str, pd.DataFrame]]:
    """(legend label, ||F|| by round with one column per seed) for each curve to draw: the runs
    of one label are the seeds of one setting (a label whose runs have different lengths is
    split by length, e.g. tau = 40 over 2000 and 4000 rounds). Overflowed values become NaN."""
    labels = [str(label_of(run)) for _, run in runs.iterrows()]
    runs = runs.assign(label=labels)
    lengths = runs.groupby("label")["rounds"].nunique()
    runs["label"] = [f"{label}, {n} rounds" if lengths[label] > 1 else label for label, n in zip(runs.label, runs.rounds, strict=True)]
    bands = []
    for label, group in runs.groupby("label", sort=False):
        columns = {}
        for _, run in group.iterrows():
            r = results.rounds[(results.rounds["experiment"] == run["experiment"]) & (results.rounds["run_id"] == run["run_id"])]
            f = r.set_index("round")["F_norm"].sort_index().astype(float)
            columns[run["run_id"]] = f.where(f.abs() < float("inf"))
        bands.append((label, pd.DataFrame(columns)))
    return bands


def _curves(results: Results, runs: pd.DataFrame, ax: object, label_of) -> None:
    """One line per setting: the median ||F|| over its seeds, shaded from the smallest to the
    largest seed's value."""
    for label, frame in seed_bands(results, runs, label_of):
        seeds = frame.shape[1]
        line, = ax.semilogy(frame.index, frame.median(axis=1),  # type: ignore[attr-defined]
                            label=label if seeds == 1 else f"{label} (median of {seeds} seeds)")
        if seeds > 1:
            ax.fill_between(frame.index, frame.min(axis=1), frame.max(axis=1), color=line.get_color(),  # type: ignore[attr-defined]
                            alpha=0.2, linewidth=0)
    ax.set_xlabel("round (server step)")  # type: ignore[attr-defined]
    ax.set_ylabel("||F(theta)||")  # type: ignore[attr-defined]
    ax.legend(fontsize=7)  # type: ignore[attr-defined]


def baseline_label(run: pd.Series) -> str:
    """A Fig. 1(b-d) curve's name: the method, and L2GD's step scale where it is not the theory's."""
    label = LABELS.get(run["algorithm"], run["algorithm"])
    scale = _get(run, "alpha_scale", 1.0)
    return label if scale == 1.0 else f"{label}, alpha x {scale:g}"


def write_ffgg_report(results: Results, out: Path) -> list[str]:
    runs = quadratic_runs(results)
    if runs.empty:
        return []
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs.sort_values(["algorithm", "tau", "run_id"]).to_csv(out / "ffgg_quadratic_runs.csv", index=False)
    lines = [f"FFGG quadratic: {len(runs)} runs -> {out / 'ffgg_quadratic_runs.csv'}"]

    def save(fig: Figure, name: str) -> None:
        FigureCanvasAgg(fig)
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        lines.append(f"  {out / name}")

    fig1a = runs[(runs["algorithm"] == "ffgg") & (runs["solver"] == "cg")].sort_values("tau")
    if not fig1a.empty:
        fig = Figure(figsize=(5, 4))
        _curves(results, fig1a, fig.add_subplot(1, 1, 1), lambda r: f"tau = {r['tau']}")
        save(fig, "ffgg_fig1a.png")
    cmp_algs = ["ffgg", "local_gd", "scaffold_quadratic", "l2gd"]
    cmp = runs[runs["algorithm"].isin(cmp_algs) & ((runs["algorithm"] != "ffgg") | (runs["solver"] == "gd"))]
    taus = sorted(t for t in cmp["tau"].dropna().unique() if len(cmp[cmp["tau"] == t]["algorithm"].unique()) > 1)
    if taus:
        fig = Figure(figsize=(5 * len(taus), 4))
        for i, tau in enumerate(taus):
            ax = fig.add_subplot(1, len(taus), i + 1)
            _curves(results, cmp[cmp["tau"] == tau], ax, baseline_label)
            ax.set_title(f"tau = {tau}")
        save(fig, "ffgg_fig1bcd.png")
    attacked = (runs["algorithm"] == "br_ffgg") | ~runs["attack"].isin(["", "none"])
    for sub, name, label in [(runs[runs["algorithm"] == "async_ffgg"], "ffgg_async.png", lambda r: f"dispatch {r['dispatch']}"),
                             (runs[attacked], "ffgg_byzantine.png", lambda r: f"{r['attack']} / {r['aggregator']}")]:
        if not sub.empty:
            fig = Figure(figsize=(5, 4))
            _curves(results, sub, fig.add_subplot(1, 1, 1), label)
            save(fig, name)
    return lines
