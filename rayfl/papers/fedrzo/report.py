"""FedRZO's Figs. 1, 3 and 4 (NeurIPS 2023, Sec. 5.1, App. D.1, D.2) from Parquet results.

All three plot the log of the average loss against communication rounds (the paper's axes:
"Log of average loss" survives in the figures' headers, the images were lost in extraction):

* Fig. 1 (experiment `fedrzo_fig1`): FedRZO_nn on the ReLU network, a panel per eta, a line per
  H; y = log of the average training loss at x_r (`log_objective`).
* Fig. 3 (`fedrzo_fig3`): FedRZO_nn against FedAvg, FedProx, FedMSPP and Scaffnew trained on the
  softplus network, a panel per (H, softplus beta), a line per method; y = log of the ReLU test
  loss at x_r (`test_loss`, the metric every method logs, ReLU for all).
* Fig. 4 (`fedrzo_fig4`): FedRZO_nn on CIFAR-10-shaped data, a row per hidden width, a panel per
  eta, a line per H; y = `log_objective`.

Runs are recognised by their experiment name (what jobs/fedrzo/*.sh set) and their manifests'
settings; several seeds give the mean and a band of one standard deviation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.results.load import Results

RUN = ["experiment", "run_id"]
NAMES = {"fedrzo_nn": "FedRZO_nn", "fedavg": "FedAvg", "fedprox": "FedProx", "fedmspp": "FedMSPP", "scaffnew": "Scaffnew"}


def settings(results: Results, experiment: str) -> pd.DataFrame:
    """One row per run of `experiment`: method, eta, H, hidden width, activation, beta, seed."""
    m = results.manifests
    if m.empty or "experiment" not in m.columns:
        return pd.DataFrame()
    m = m[m["experiment"] == experiment]
    rows = [{
        "experiment": run["experiment"], "run_id": run["run_id"],
        "method": str(run.get("algorithm.name")),
        "eta": float(_get(run, "algorithm.eta", math.nan)),
        "H": _steps(run),
        "hidden": _hidden(run),
        "beta": float(_get(run, "model.softplus_beta", math.nan)) if _get(run, "model.activation") == "softplus" else math.nan,
        "seed": run.get("run.seed"),
        "rounds": run.get("run.rounds"),
    } for _, run in m.iterrows()]
    return pd.DataFrame(rows)


def curves(results: Results, experiment: str, y: str) -> pd.DataFrame:
    """Rows of `rounds` with a value of `y`, joined with their run's settings; `log_y` added."""
    runs = settings(results, experiment)
    rounds = results.rounds
    if runs.empty or rounds.empty or y not in rounds.columns:
        return pd.DataFrame()
    data = rounds[rounds[y].notna()][[*RUN, "round", y]].merge(runs, on=RUN)
    data["log_y"] = np.log(data[y].astype(float))
    return data


def final_table(data: pd.DataFrame, keys: list[str], y: str) -> pd.DataFrame:
    """The last logged value of y per run, then mean and std over seeds per setting."""
    last = data.sort_values("round").groupby(RUN, as_index=False).last()
    out = last.groupby(keys, dropna=False)[y].agg(["mean", "std", "count"]).reset_index()  # FedRZO_nn has no beta
    return out.rename(columns={"mean": f"final_{y}", "std": "std_over_seeds", "count": "seeds"})


def write_fedrzo_report(results: Results, out: Path) -> list[str]:
    """Figs. 1, 3 and 4 and their final-loss tables when the results hold such runs."""
    lines: list[str] = []
    specs = [
        ("fedrzo_fig1", "objective", ["eta", "H"], "Fig. 1: FedRZO_nn, ReLU net on MNIST, log of the average training loss"),
        ("fedrzo_fig3", "test_loss", ["H", "beta", "method"], "Fig. 3: FedRZO_nn vs first-order methods on the softplus net, log ReLU test loss"),
        ("fedrzo_fig4", "objective", ["hidden", "eta", "H"], "Fig. 4: FedRZO_nn on CIFAR-10-shaped data, log of the average training loss"),
    ]
    for experiment, y, keys, title in specs:
        data = curves(results, experiment, y)
        if data.empty:
            continue
        out.mkdir(parents=True, exist_ok=True)
        table = final_table(data, keys, y)
        table.to_csv(out / f"{experiment}_final.csv", index=False)
        path = plot(data, experiment, title, out / f"{experiment}.png")
        lines += ["", title, table.to_string(index=False), f"figure: {path}"]
    return lines


def plot(data: pd.DataFrame, experiment: str, title: str, path: Path) -> Path:
    """A grid of panels (rows x columns by the figure's layout), a line per curve setting."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if experiment == "fedrzo_fig3":
        rows, cols, line = "H", "beta", "method"
    elif experiment == "fedrzo_fig4":
        rows, cols, line = "hidden", "eta", "H"
    else:
        rows, cols, line = None, "eta", "H"
    row_values = sorted(data[rows].dropna().unique()) if rows else [None]
    col_values = sorted(data[cols].dropna().unique(), reverse=cols == "eta") or [math.nan]
    fig = Figure(figsize=(4.2 * len(col_values), 3.4 * len(row_values)))
    FigureCanvasAgg(fig)
    for i, rv in enumerate(row_values):
        for j, cv in enumerate(col_values):
            ax = fig.add_subplot(len(row_values), len(col_values), i * len(col_values) + j + 1)
            sel = data if rv is None else data[data[rows] == rv]
            # FedRZO_nn trains the ReLU net (no beta): it belongs in every beta panel of Fig. 3
            sel = sel[(sel[cols] == cv) | sel[cols].isna()] if cols == "beta" else sel[sel[cols] == cv]
            for key, curve in sorted(sel.groupby(line), key=lambda kv: _order(kv[0])):
                by_round = curve.groupby("round")["log_y"]
                mean, std, seeds = by_round.mean(), by_round.std(ddof=1).fillna(0.0), curve["run_id"].nunique()
                label = NAMES.get(key, key) if line == "method" else f"{line} = {key:g}"
                (ln,) = ax.plot(mean.index, mean.to_numpy(), label=label + (f" ({seeds} seeds)" if seeds > 1 else ""))
                if seeds > 1:
                    ax.fill_between(mean.index, (mean - std).to_numpy(), (mean + std).to_numpy(), color=ln.get_color(), alpha=0.2, linewidth=0)
            head = [f"{rows} = {rv:g}"] if rv is not None else []
            head.append(f"{cols} = {cv:g}" if not (isinstance(cv, float) and math.isnan(cv)) else cols)
            ax.set_title(", ".join(head), fontsize="medium")
            ax.set_xlabel("communication round")
            ax.set_ylabel("log of average loss" if j == 0 else "")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _order(key: object) -> tuple[float, str]:
    """Lines in a stable order: methods as in NAMES (FedRZO_nn first), numbers ascending."""
    if isinstance(key, str):
        return (float(list(NAMES).index(key)) if key in NAMES else math.inf, key)
    return (float(key), "")


def _get(run: pd.Series, key: str, default: object = None) -> object:
    value = run.get(key, default)
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _steps(run: pd.Series) -> float:
    steps = _get(run, "algorithm.local_steps")
    if steps is None:
        tau = _get(run, "algorithm.local_schedule.tau")
        return float(tau) if tau is not None else math.nan
    return float(steps)


def _hidden(run: pd.Series) -> float:
    hidden = _get(run, "model.hidden")
    if isinstance(hidden, str):
        hidden = json.loads(hidden)
    return float(hidden[0]) if hidden else math.nan
