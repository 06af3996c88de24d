"""ComFedL's robust-FL figures (arXiv 2106.11264, Sec. 5) from Parquet results.

- Fig. 2: average (top) and worst-client (bottom) train / validation accuracy against the round
  for ComFedL, DRFL, q-FedAvg and FedAvg on the quantity-skewed MNIST, mean +- std over seeds,
  and `comfedl_fig2.csv`: the final values of every method (mean +- std), worst client first.
- Fig. 3: ComFedL's average train / validation accuracy for each tau (top, gamma = 0.2) and each
  gamma (bottom, tau = 5), plus the worst-client validation accuracy of each; and
  `comfedl_fig3.csv` / `.md`: average / worst-client validation after rounds 19, 49, 99 and 199,
  means over seeds.
- Fig. 6: the final personalized validation accuracy (average and worst client) of
  ComFedL-DAMAML and FedAvg against the dominant-class fraction rho, and `comfedl_fig6.md`: the
  same as a table, mean ± std over seeds.

The paper has curves only (no numbers), so nothing is compared with published values here; the
replication notes (docs/replications/comfedl.md) compare with the paper's claims. Runs are
recognised from their manifests (algorithm, its options, partition), not from directory names.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.results.load import Results

RUN = ["experiment", "run_id"]
CURVES = [("avg_train_accuracy", "average train"), ("avg_val_accuracy", "average validation"),
          ("worst_train_accuracy", "worst-client train"), ("worst_val_accuracy", "worst-client validation")]
FIG2_ORDER = ["ComFedL", "DRFL", "q-FedAvg", "FedAvg"]


def _get(run: pd.Series, key: str, default=None):
    v = run.get(key, default)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def method_of(run: pd.Series) -> str | None:
    """The Fig. 2 / Fig. 6 label of a run, or None for runs this report does not draw."""
    name = _get(run, "algorithm.name")
    if name == "comfedl":
        if _get(run, "algorithm.outer", "exp") == "identity":
            return "FedAvg" if _get(run, "algorithm.average", "uniform") == "samples" else "FedAvg (uniform)"
        if _get(run, "algorithm.objective", "loss") == "maml":
            return "ComFedL-DAMAML"
        return "ComFedL" if _get(run, "algorithm.weighting", "normalized") == "normalized" else "ComFedL (literal)"
    return {"drfa": "DRFL", "qfedavg": "q-FedAvg", "fedavg": "FedAvg", "fedavg_adapt": "FedAvg"}.get(str(name))


def runs_table(results: Results) -> pd.DataFrame:
    """One row per recognised run: experiment, run_id, method, partition, tau, gamma, rho, seed."""
    m = results.manifests
    if m.empty or "algorithm.name" not in m.columns:
        return pd.DataFrame()
    rows = []
    for _, run in m.iterrows():
        method = method_of(run)
        if method is None:
            continue
        rows.append({
            "experiment": run["experiment"], "run_id": run["run_id"], "method": method,
            "partition": _get(run, "partition.method"), "tau": _get(run, "algorithm.local_steps"),
            "gamma": float(_get(run, "algorithm.gamma", math.nan)), "rho": float(_get(run, "partition.rho", math.nan)),
            "seed": _get(run, "run.seed"), "variant": _get(run, "algorithm.variant"),
        })
    return pd.DataFrame(rows)


def curves(results: Results, runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """experiment, run_id, round, value of `metric` from the rounds table (evaluated rounds)."""
    r = results.rounds
    if r.empty or metric not in r.columns:
        return pd.DataFrame(columns=[*RUN, "round", "value"])
    r = r[[*RUN, "round", metric]].dropna().rename(columns={metric: "value"})
    return r.merge(runs[RUN], on=RUN)


def final_values(results: Results, runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """runs plus the last evaluated value of each metric."""
    out = runs.copy()
    for metric in metrics:
        c = curves(results, runs, metric)
        last = c.sort_values("round").groupby(RUN, as_index=False).last()[[*RUN, "round", "value"]]
        out = out.merge(last.rename(columns={"value": metric, "round": f"{metric}_round"}), on=RUN, how="left")
    return out


def _band(ax, c: pd.DataFrame, label: str) -> None:
    g = c.groupby("round")["value"]
    mean, std = g.mean(), g.std(ddof=0).fillna(0.0)
    ax.plot(mean.index, 100 * mean.to_numpy(), label=f"{label} (n={c['run_id'].nunique()})")
    ax.fill_between(mean.index, 100 * (mean - std).to_numpy(), 100 * (mean + std).to_numpy(), alpha=0.2)


def _fig2(results: Results, runs: pd.DataFrame, out: Path) -> list[str]:
    runs = runs[(runs["partition"] == "quantity_skew") & runs["method"].isin(FIG2_ORDER)]
    base = runs[(runs["method"] != "ComFedL") | ((runs["tau"] == 5) & np.isclose(runs["gamma"], 0.2))]
    if base.empty:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, (metric, title) in zip(axes.ravel(), CURVES, strict=True):
        for method in FIG2_ORDER:
            sel = base[base["method"] == method]
            c = curves(results, sel, metric)
            if not c.empty:
                _band(ax, c, method)
        ax.set_title(title)
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("communication round")
    axes[0, 0].legend()
    fig.suptitle("ComFedL Fig. 2: imbalanced MNIST (worst client in the bottom row)")
    fig.tight_layout()
    path = out / "comfedl_fig2.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    metrics = [m for m, _ in CURVES]
    finals = final_values(results, base, metrics)
    rows = []
    for method in FIG2_ORDER:
        f = finals[finals["method"] == method]
        if f.empty:
            continue
        row = {"method": method, "seeds": len(f), "round": int(f[f"{metrics[0]}_round"].max())}
        for metric in ["worst_val_accuracy", "worst_train_accuracy", "avg_val_accuracy", "avg_train_accuracy"]:
            row[f"{metric}_mean"] = 100 * f[metric].mean()
            row[f"{metric}_std"] = 100 * f[metric].std(ddof=0)
        rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(out / "comfedl_fig2.csv", index=False)
    lines = [f"ComFedL Fig. 2 -> {path}", "method     seeds  worst val     worst train   avg val       avg train"]
    for _, row in table.iterrows():
        cells = "  ".join(f"{row[f'{m}_mean']:5.1f}±{row[f'{m}_std']:4.1f}" for m in
                          ["worst_val_accuracy", "worst_train_accuracy", "avg_val_accuracy", "avg_train_accuracy"])
        lines.append(f"{row['method']:<10} {row['seeds']:>5}  {cells}")
    return lines


def _fig3(results: Results, runs: pd.DataFrame, out: Path) -> list[str]:
    c = runs[(runs["partition"] == "quantity_skew") & (runs["method"] == "ComFedL")]
    taus = c[np.isclose(c["gamma"], 0.2)]
    gammas = c[c["tau"] == 5]
    if taus["tau"].nunique() < 2 and gammas["gamma"].nunique() < 2:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("avg_train_accuracy", "average train"), ("avg_val_accuracy", "average validation"),
              ("worst_val_accuracy", "worst-client validation")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharex=True)
    for row, (sel, key, sym) in enumerate([(taus, "tau", "τ"), (gammas, "gamma", "γ")]):
        for ax, (metric, title) in zip(axes[row], panels, strict=True):
            for value in sorted(sel[key].unique()):
                cur = curves(results, sel[sel[key] == value], metric)
                if not cur.empty:
                    _band(ax, cur, f"{sym}={value:g}")
            ax.set_title(f"{title} ({sym})")
            ax.set_ylabel("accuracy (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("communication round")
    fig.suptitle("ComFedL Fig. 3: synchronization gap τ (top, γ=0.2) and γ (bottom, τ=5)")
    fig.tight_layout()
    path = out / "comfedl_fig3.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    table = fig3_table(results, [("τ", "tau", taus), ("γ", "gamma", gammas)])
    table.to_csv(out / "comfedl_fig3.csv", index=False)
    (out / "comfedl_fig3.md").write_text(fig3_markdown(table) + "\n")
    return [f"ComFedL Fig. 3 -> {path}", *fig3_markdown(table).splitlines()]


FIG3_ROUNDS = (19, 49, 99, 199)  # the logged rounds the replication page reports


def fig3_table(results: Results, groups: list[tuple[str, str, pd.DataFrame]]) -> pd.DataFrame:
    """One row per ablation value: its average and worst-client validation accuracy (%) after
    each round of FIG3_ROUNDS that was logged, means over its seeds (runs of the same setting
    and seed count once), and how many seeds."""
    rows = []
    for symbol, key, sel in groups:
        for value in sorted(sel[key].unique()):
            runs = sel[sel[key] == value].drop_duplicates("seed")
            row: dict[str, object] = {"setting": f"{symbol} = {value:g}", "seeds": len(runs)}
            for metric in ("avg_val_accuracy", "worst_val_accuracy"):
                c = curves(results, runs, metric)
                means = c.groupby("round")["value"].mean()
                for r in FIG3_ROUNDS:
                    row[f"{metric}@{r}"] = 100 * means.get(r, math.nan)
            rows.append(row)
    return pd.DataFrame(rows)


def fig3_markdown(table: pd.DataFrame) -> str:
    """The table as the replication page shows it: average / worst-client validation per round."""
    lines = ["| setting | seeds | " + " | ".join(f"round {r}" for r in FIG3_ROUNDS) + " |",
             "|---|---|" + "---|" * len(FIG3_ROUNDS)]
    for _, row in table.iterrows():
        cells = [f"{row[f'avg_val_accuracy@{r}']:.1f} / {row[f'worst_val_accuracy@{r}']:.1f}"
                 if not math.isnan(row[f"avg_val_accuracy@{r}"]) else "—" for r in FIG3_ROUNDS]
        lines.append(f"| {row['setting']} | {row['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


FIG6_EXPERIMENT = "comfedl_fig6"  # jobs/comfedl/fig6.sh


def _fig6(results: Results, runs: pd.DataFrame, out: Path) -> list[str]:
    sel = runs[(runs["partition"] == "dominant_class") & runs["method"].isin(["ComFedL-DAMAML", "FedAvg"])]
    if (sel["experiment"] == FIG6_EXPERIMENT).any():  # fig6.sh's runs only, not the tau / gamma ablation's
        sel = sel[sel["experiment"] == FIG6_EXPERIMENT]
    if sel.empty or sel["rho"].nunique() < 2:
        return []
    metrics = ["pers_avg_val_accuracy", "pers_worst_val_accuracy"]
    finals = final_values(results, sel, metrics)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    lines = []
    for ax, metric in zip(axes, metrics, strict=True):
        for method, f in finals.groupby("method"):
            g = f.groupby("rho")[metric]
            ax.errorbar(g.mean().index, 100 * g.mean(), yerr=100 * g.std(ddof=0).fillna(0), marker="o", capsize=3,
                        label=method)
            for rho, v in g:
                lines.append(f"  {method:<15} rho={rho:<5g} {metric}: {100 * v.mean():5.1f}±{100 * v.std(ddof=0):.1f} (n={len(v)})")
        ax.set_xlabel("ρ (dominant-class fraction)")
        ax.set_ylabel("accuracy after one adaptation step (%)")
        ax.set_title(metric.replace("pers_", "personalized ").replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out / "comfedl_fig6.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    (out / "comfedl_fig6.md").write_text(fig6_markdown(finals) + "\n")
    return [f"ComFedL Fig. 6 -> {path}", *lines, *fig6_markdown(finals).splitlines()]


def fig6_markdown(finals: pd.DataFrame) -> str:
    """The replication page's table: per rho, each method's final personalized average /
    worst-client validation accuracy (%), mean ± std (ddof 0) over its seeds."""
    methods = ["ComFedL-DAMAML", "FedAvg"]
    lines = ["| ρ | seeds | " + " | ".join(f"{m}: avg / worst" for m in methods) + " |", "|---|---|---|---|"]
    for rho, at in finals.groupby("rho"):
        cells = []
        for method in methods:
            f = at[at["method"] == method]
            avg, worst = 100 * f["pers_avg_val_accuracy"], 100 * f["pers_worst_val_accuracy"]
            cells.append(f"{avg.mean():.2f} ± {avg.std(ddof=0):.2f} / {worst.mean():.2f} ± {worst.std(ddof=0):.2f}"
                         if len(f) else "—")
        lines.append(f"| {rho:g} | {at['seed'].nunique()} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_comfedl_report(results: Results, out: Path) -> list[str]:
    """Figs. 2, 3 and 6 (and the Fig. 2 final-value table) for the runs these figures use;
    [] when there are none."""
    runs = runs_table(results)
    if runs.empty:
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return _fig2(results, runs, out) + _fig3(results, runs, out) + _fig6(results, runs, out)
