"""ComFedL's MAML comparison (arXiv 2106.11264 Sec. 5.2) from Parquet results: Fig. 4 (the
five personalized methods' validation loss and accuracy after one adaptation step, against
the round) with the worst client beside the average, a final-value table (mean +- std over
seeds), and Fig. 5 (ComFedL-DAMAML's tau and gamma ablations).

Runs are recognised from their manifests: `per_fedavg`, `tr_maml`, `ditto`, `fedavg_adapt`
and `comfedl` with `objective: maml`. Curves come from the `rounds` columns
pers_avg_val_{accuracy,loss} and pers_worst_val_accuracy (`algorithm.personalized_eval`); a
ComFedL run without them falls back to avg_val_* (no adaptation step) and is marked so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.results.load import Results

METHODS = {
    "comfedl": "ComFedL-DAMAML",
    "per_fedavg": "FedMAML (Per-FedAvg)",
    "tr_maml": "TR-MAML",
    "ditto": "Ditto",
    "fedavg_adapt": "FedAvg (+1 step)",
}
RUN = ["experiment", "run_id"]
METRICS = {"avg_acc": "val_accuracy", "avg_loss": "val_loss", "worst_acc": "val_accuracy"}


def _get(run: pd.Series, key: str, default=None):
    v = run.get(key, default)
    return default if v is None or (isinstance(v, float) and np.isnan(v)) else v


def runs_table(results: Results) -> pd.DataFrame:
    """One row per MAML-comparison run: method, setting (dataset, source, model, rho), seed,
    tau, gamma."""
    m = results.manifests
    if m.empty or "algorithm.name" not in m.columns:
        return pd.DataFrame()
    rows = []
    for _, run in m.iterrows():
        name = run["algorithm.name"]
        if name not in METHODS or (name == "comfedl" and _get(run, "algorithm.objective") != "maml"):
            continue
        if _get(run, "status", "completed") != "completed":  # a failed or unfinished run is no seed
            continue
        rows.append({
            "experiment": run["experiment"], "run_id": run["run_id"], "method": METHODS[name],
            "setting": f"{_get(run, 'data.dataset')}/{_get(run, 'data.source', 'full')}/{_get(run, 'model.name')}"
                       f"/rho={_get(run, 'partition.rho')}",
            "seed": _get(run, "run.seed"), "tau": _get(run, "algorithm.local_steps"),
            "gamma": _get(run, "algorithm.gamma"),
        })
    return pd.DataFrame(rows)


def curves(results: Results, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run and evaluated round: avg_acc, avg_loss, worst_acc, and whether it was adapted."""
    r = results.rounds.merge(runs[RUN], on=RUN)
    out = r[[*RUN, "round"]].copy()
    adapted = "pers_avg_val_accuracy" in r.columns
    for key, col in (("avg_acc", "avg_val_accuracy"), ("avg_loss", "avg_val_loss"), ("worst_acc", "worst_val_accuracy")):
        pers = r[f"pers_{col}"] if f"pers_{col}" in r.columns else pd.Series(np.nan, index=r.index)
        plain = r[col] if col in r.columns else pd.Series(np.nan, index=r.index)
        out[key] = pers.where(pers.notna(), plain)
    out["adapted"] = r["pers_avg_val_accuracy"].notna() if adapted else False
    return out.dropna(subset=["avg_acc"])


def final_table(cur: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Last evaluation of each run, then mean +- std over seeds per (setting, method, tau, gamma)."""
    last = cur.sort_values("round").groupby(RUN, as_index=False).last().merge(runs, on=RUN)
    keys = ["setting", "method", "tau", "gamma"]
    last[["tau", "gamma"]] = last[["tau", "gamma"]].astype(str)
    g = last.groupby(keys, dropna=False)
    table = g.agg(seeds=("seed", "nunique"), round=("round", "max"), adapted=("adapted", "all"),
                  avg_acc_mean=("avg_acc", "mean"), avg_acc_std=("avg_acc", "std"),
                  worst_acc_mean=("worst_acc", "mean"), worst_acc_std=("worst_acc", "std"),
                  avg_loss_mean=("avg_loss", "mean"), avg_loss_std=("avg_loss", "std")).reset_index()
    return table.fillna({"avg_acc_std": 0.0, "worst_acc_std": 0.0, "avg_loss_std": 0.0})


def _band(ax, c: pd.DataFrame, metric: str, label: str) -> None:
    s = c.groupby("round")[metric].agg(["mean", "std"]).fillna(0.0)
    ax.plot(s.index, s["mean"], label=label)
    ax.fill_between(s.index, s["mean"] - s["std"], s["mean"] + s["std"], alpha=0.2)


def _figure(cur: pd.DataFrame, runs: pd.DataFrame, by: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    data = cur.merge(runs, on=RUN)
    for label, c in data.groupby(by):
        tag = "" if c["adapted"].all() else " (no adaptation)"
        for ax, metric in zip(axes, ("avg_loss", "avg_acc", "worst_acc"), strict=True):
            _band(ax, c, metric, f"{label}{tag}")
    for ax, name in zip(axes, ("average validation loss", "average validation accuracy",
                               "worst-client validation accuracy"), strict=True):
        ax.set_xlabel("communication round")
        ax.set_title(name)
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_comfedl_maml_report(results: Results, out: Path) -> list[str]:
    """Fig. 4 (methods) and Fig. 5 (ComFedL-DAMAML tau / gamma) per setting, and
    comfedl_maml_final.csv; [] when the results hold no such runs."""
    runs = runs_table(results)
    if runs.empty:
        return []
    cur = curves(results, runs)
    if cur.empty:
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = final_table(cur, runs)
    table.to_csv(out / "comfedl_maml_final.csv", index=False)
    lines = ["ComFedL MAML comparison (Fig. 4): personalized validation accuracy after one adaptation step "
             "(Ditto: personal models), last evaluation, mean +- std over seeds"]
    for _, row in table.iterrows():
        note = "" if row["adapted"] else "  [no adaptation step logged]"
        lines.append(
            f"  {row['setting']:<32} {row['method']:<22} tau={row['tau']:<4} gamma={row['gamma']:<5} "
            f"round {int(row['round'])}, {int(row['seeds'])} seed(s): avg {100 * row['avg_acc_mean']:.2f} "
            f"± {100 * row['avg_acc_std']:.2f}, worst {100 * row['worst_acc_mean']:.2f} ± "
            f"{100 * row['worst_acc_std']:.2f}, loss {row['avg_loss_mean']:.4f}{note}"
        )
    for i, (setting, r) in enumerate(runs.groupby("setting")):
        main = r[r["experiment"] != "comfedl_maml_ablation"]
        if not main.empty:
            path = out / f"comfedl_fig4_{i}.png"
            _figure(cur, main, "method", path, f"ComFedL Fig. 4, {setting}")
            lines.append(f"  figure: {path}")
        abl = r[(r["experiment"] == "comfedl_maml_ablation")].copy()
        for param in ("tau", "gamma"):
            other = "gamma" if param == "tau" else "tau"
            sub = abl[abl[other] == abl[other].mode().iloc[0]].copy() if not abl.empty else abl
            if sub.empty or sub[param].nunique() < 2:
                continue
            sub["label"] = f"{param}=" + sub[param].astype(str)
            path = out / f"comfedl_fig5_{param}_{i}.png"
            _figure(cur, sub.drop(columns=["method"]).rename(columns={"label": "method"}), "method", path,
                    f"ComFedL Fig. 5 ({param}), {setting}")
            lines.append(f"  figure: {path}")
    return lines
