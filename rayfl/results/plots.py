"""Figures and tables for `rayfl report`, drawn from a loaded `Results`.

Figures are rendered with matplotlib's Agg canvas on a `Figure` object rather than through
pyplot, so plotting needs no display (cluster head nodes) and never switches the backend of a
notebook that imports rayfl. Every function writes one PNG (or whatever `path`'s suffix names)
and returns its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rayfl.config import SECTIONS
from rayfl.results.load import Results
from rayfl.results.seeds import aggregate_curves, seed_groups

GLOBAL_CLIENT = -1  # `evals` rows of the global model carry client -1
RUN = ["experiment", "run_id"]  # run ids are unique only within an experiment


def metric_frame(results: Results, y: str, x: str = "round") -> pd.DataFrame:
    """Columns experiment, run_id, x, y: one point per run and x, from `evals` if it has `y`,
    else `rounds`.

    Where a run logged `y` for the global model (client -1) only those rows are used;
    otherwise (per-client metrics only, e.g. personalized models) the clients' mean at each x.
    Rows where x or y is missing are dropped."""
    source = results.evals if y in results.evals.columns else results.rounds
    if y not in source.columns:
        available = sorted(set(results.evals.columns) | set(results.rounds.columns))
        raise ValueError(f"no column {y!r} in evals or rounds; available: {available}")
    if x not in source.columns:
        raise ValueError(f"no column {x!r} next to {y!r}; available: {sorted(source.columns)}")
    frame = source[[*RUN, x, y] + (["client"] if "client" in source.columns else [])]
    frame = frame[frame[x].notna() & frame[y].notna()]
    if "client" in frame.columns:
        is_global = frame["client"] == GLOBAL_CLIENT
        has_global = is_global.groupby([frame[k] for k in RUN]).transform("any")
        frame = frame[is_global | ~has_global]
    frame = frame.astype({y: "float64"})
    return frame.groupby([*RUN, x], as_index=False, sort=True)[y].mean()


def run_labels(results: Results, by: str = "algorithm.name") -> dict[tuple[str, str], str]:
    """A legend label per (experiment, run_id): the manifest column `by` if it exists, else the
    run id. Labels that would repeat get the run id (then the experiment) appended, so every
    line stays identifiable."""
    m = results.manifests
    keys = [(str(e), str(r)) for e, r in zip(m["experiment"], m["run_id"], strict=True)]
    values = m[by] if by in m.columns else m["run_id"]
    labels = {k: str(v) if pd.notna(v) else k[1] for k, v in zip(keys, values, strict=True)}
    for widen in (lambda k, lab: lab if lab == k[1] else f"{lab} ({k[1]})", lambda k, lab: f"{k[0]}/{lab}"):
        counts = pd.Series(list(labels.values())).value_counts()
        labels = {k: widen(k, lab) if counts[lab] > 1 else lab for k, lab in labels.items()}
    return labels


def plot_curves(
    results: Results,
    y: str,
    x: str = "round",
    by: str = "algorithm.name",
    *,
    path: str | Path,
    title: str | None = None,
) -> Path:
    """One line of `y` against `x` per setting: runs that differ only by seed are averaged,
    with a band of ± one standard deviation and the number of seeds in the legend (see
    `rayfl.results.seeds`; `metric_frame` says which rows count)."""
    data = metric_frame(results, y, x)
    if data.empty:
        raise ValueError(f"no values of {y!r} to plot")
    return draw_curves(aggregate_curves(data, seed_groups(results, by), y, x), y, x, path=path, title=title)


def draw_curves(
    curves: pd.DataFrame,
    y: str,
    x: str,
    *,
    path: str | Path,
    title: str | None = None,
    xlabel: str | None = None,
    logx: bool = False,
) -> Path:
    """`aggregate_curves`' frame (setting, x, mean, std, n) as one line per setting, with a band
    of ± one std where a setting has several seeds; `logx` for x spanning decades (bytes)."""
    groups = list(curves.groupby("setting", sort=True))
    labels = [legend_label(f"{setting} (mean of {int(c['n'].iloc[0])} seeds)" if int(c["n"].iloc[0]) > 1 else str(setting))
              for setting, c in groups]
    below = sum(label.count("\n") + 1 for label in labels) * 0.18  # the legend's inches, under the axes
    fig = new_figure((7.0, 4.5 + below))
    ax = fig.add_subplot()
    for (_, curve), label in zip(groups, labels, strict=True):
        n = int(curve["n"].iloc[0])
        (line,) = ax.plot(curve[x], curve["mean"], marker="o" if len(curve) < 20 else None, markersize=3, label=label)
        if n > 1:
            ax.fill_between(curve[x], curve["mean"] - curve["std"], curve["mean"] + curve["std"],
                            color=line.get_color(), alpha=0.2, linewidth=0)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel or x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title or f"{y} by {x}" + (" (mean ± std over seeds)" if (curves["n"] > 1).any() else ""))
    ax.grid(True, alpha=0.3)
    fig.legend(title="setting", fontsize="small", loc="outside lower center")  # long labels never squeeze the axes
    return save_figure(fig, path)


def legend_label(text: str, width: int = 80) -> str:
    """A setting's label broken over lines at commas, so a legend stays as wide as the plot."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width=width, break_long_words=False)) or text


def plot_client_timeline(
    results: Results,
    run_id: str,
    rounds: Sequence[int] | None = None,
    *,
    path: str | Path,
    experiment: str | None = None,
) -> Path:
    """A Gantt chart of client tasks in simulated time: one row per client, one bar per task
    from `dispatch_time` to `finish_time`, coloured by `outcome` when the column exists, and a
    dotted line where each round's last task finished. `experiment` is needed only when the
    same run id occurs in several loaded experiments."""
    tasks = _run_tasks(results, run_id, experiment)
    if rounds is not None:
        tasks = tasks[tasks["round"].isin(list(rounds))]
    if tasks.empty:
        raise ValueError(f"no client tasks for run {run_id!r} in rounds {list(rounds or [])}")

    outcome = tasks["outcome"].fillna("?").astype(str) if "outcome" in tasks.columns else pd.Series("task", index=tasks.index)
    n_clients = tasks["client"].nunique()
    fig = new_figure((9.0, min(2.0 + 0.22 * n_clients, 14.0)))
    ax = fig.add_subplot()
    palette = _palette(sorted(outcome.unique(), key=lambda o: (o != "ok", o)))
    for name, colour in palette.items():
        sel = tasks[outcome == name]
        ax.barh(
            sel["client"].to_numpy(dtype=float),
            (sel["finish_time"] - sel["dispatch_time"]).to_numpy(dtype=float),
            left=sel["dispatch_time"].to_numpy(dtype=float),
            height=0.8,
            color=colour,
            edgecolor="none",
            label=name,
        )
    for end in tasks.groupby("round")["finish_time"].max():
        ax.axvline(float(end), color="0.4", linestyle=":", linewidth=0.8)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("client")
    which = "" if rounds is None else f", rounds {_span(rounds)}"
    ax.set_title(f"client tasks of {run_id}{which}")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(title="outcome" if "outcome" in tasks.columns else None, fontsize="small",
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def plot_task_window(
    results: Results,
    run_id: str,
    *,
    path: str | Path,
    experiment: str | None = None,
    max_tasks: int = 60,
) -> Path:
    """An asynchronous run's tasks as a Gantt chart over a window of simulated time: one row
    per task in dispatch order, from the first dispatch until `max_tasks` tasks have been
    dispatched, every task in flight in that window shown. Applied tasks are coloured by their
    staleness (colour bar), others by outcome (late, dropped, stale, ...)."""
    tasks = _run_tasks(results, run_id, experiment)
    order = ["dispatch_time", "task"] if "task" in tasks.columns else ["dispatch_time"]
    tasks = tasks.sort_values(order, kind="stable").head(max_tasks).reset_index(drop=True)
    outcome = tasks["outcome"].fillna("?").astype(str) if "outcome" in tasks.columns else pd.Series("ok", index=tasks.index)
    staleness = tasks["staleness"].fillna(0).to_numpy(dtype=float) if "staleness" in tasks.columns else None
    fig = new_figure((9.0, min(2.0 + 0.16 * len(tasks), 14.0)))
    ax = fig.add_subplot()
    rows = np.arange(len(tasks), dtype=float)
    start = tasks["dispatch_time"].to_numpy(dtype=float)
    width = (tasks["finish_time"] - tasks["dispatch_time"]).to_numpy(dtype=float)
    ok = (outcome == "ok").to_numpy()
    if staleness is not None and ok.any():
        norm = Normalize(vmin=0.0, vmax=max(float(staleness[ok].max()), 1.0))
        colours = colormaps["viridis"](norm(staleness[ok]))
        ax.barh(rows[ok], width[ok], left=start[ok], height=0.8, color=colours, edgecolor="none")
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap="viridis"), ax=ax, pad=0.01)
        bar.set_label("staleness of applied updates")
    else:
        ax.barh(rows[ok], width[ok], left=start[ok], height=0.8, color="tab:blue", edgecolor="none", label="ok")
    others = sorted(set(outcome[~ok]))
    for name, colour in _palette(others).items():
        sel = (outcome == name).to_numpy()
        ax.barh(rows[sel], width[sel], left=start[sel], height=0.8, color=colour, edgecolor="none", label=name)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("task (in dispatch order)")
    ax.set_title(f"client tasks of {run_id}: the first {len(tasks)} dispatched, every one in flight")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if others or staleness is None:
        ax.legend(title="outcome", fontsize="small", loc="lower right")
    return save_figure(fig, path)


def is_asynchronous(results: Results, run_id: str, experiment: str | None = None) -> bool:
    """Whether a run's tasks were dispatched one at a time (async: every task its own round
    key) rather than in synchronous rounds."""
    tasks = _run_tasks(results, run_id, experiment)
    return bool(tasks.groupby("round").size().median() <= 1)


def _run_tasks(results: Results, run_id: str, experiment: str | None) -> pd.DataFrame:
    clients = results.clients
    needed = {"run_id", "client", "round", "dispatch_time", "finish_time"}
    missing = needed - set(clients.columns)
    if missing:
        raise ValueError(f"the clients table lacks {sorted(missing)}; was output.log_clients off?")
    tasks = clients[clients["run_id"] == run_id]
    if experiment is not None:
        tasks = tasks[tasks["experiment"] == experiment]
    elif tasks["experiment"].nunique() > 1:
        raise ValueError(f"run {run_id!r} exists in experiments {sorted(tasks['experiment'].unique())}; pass experiment=")
    tasks = tasks.dropna(subset=["client", "dispatch_time", "finish_time"])
    if tasks.empty:
        raise ValueError(f"no client tasks for run {run_id!r}")
    return tasks


def summary_table(
    results: Results,
    metric: str = "test_accuracy",
    x: str = "round",
    mode: Literal["max", "min"] | None = None,
) -> pd.DataFrame:
    """One row per run: experiment, run_id, algorithm.name, status, the config keys that differ
    between the runs, and the metric's final value, best value and where the best occurred.

    `mode` says whether best means max or min; by default min for names containing "loss" or
    "error", max otherwise. Runs that never logged the metric get NaN; a metric no run logged
    raises ValueError (a typo should not look like an empty result)."""
    if mode is None:
        mode = "min" if any(w in metric for w in ("loss", "error")) else "max"
    m = results.manifests
    config_cols = [c for c in m.columns if c.split(".", 1)[0] in SECTIONS and "." in c]
    varying = [c for c in config_cols if m[c].astype(str).nunique(dropna=False) > 1]
    front = [c for c in ("experiment", "run_id", "algorithm.name", "status") if c in m.columns]
    table = m[front + [c for c in varying if c not in front]].copy()

    data = metric_frame(results, metric, x)
    rows = []
    for (experiment, run_id), curve in data.groupby(RUN, sort=False):
        curve = curve.sort_values(x)
        best_at = curve[metric].idxmax() if mode == "max" else curve[metric].idxmin()
        rows.append({
            "experiment": experiment,
            "run_id": run_id,
            f"final_{metric}": float(curve[metric].iloc[-1]),
            f"{mode}_{metric}": float(curve.loc[best_at, metric]),
            f"{mode}_{metric}_{x}": curve.loc[best_at, x],
            f"last_{x}": curve[x].iloc[-1],
        })
    stats = pd.DataFrame(rows, columns=[*RUN, f"final_{metric}", f"{mode}_{metric}", f"{mode}_{metric}_{x}", f"last_{x}"])
    if "wall_seconds" in m.columns:
        table["wall_seconds"] = m["wall_seconds"]
    return table.merge(stats, on=RUN, how="left").reset_index(drop=True)


# ---------------------------------------------------------------------- helpers


def new_figure(size: tuple[float, float]) -> Figure:
    """A figure on its own Agg canvas (no pyplot: see the module docstring)."""
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write `fig` to `path` (its suffix picks the format), creating the folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def _palette(names: Sequence[str]) -> dict[str, tuple[float, ...]]:
    fixed = {"ok": "tab:blue", "late": "tab:orange", "dropped": "tab:red", "failed": "tab:gray", "stale": "tab:gray",
             "offline": "tab:brown", "nonfinite": "black"}
    spare = iter(["tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"] * 4)
    return {n: to_rgba(fixed.get(n) or next(spare)) for n in names}


def _span(rounds: Sequence[int]) -> str:
    values = sorted(int(r) for r in rounds)
    if values and values == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}-{values[-1]}"
    return ", ".join(str(v) for v in values)

