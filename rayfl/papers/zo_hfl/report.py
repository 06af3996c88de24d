"""ZO-HFL's Table I and Fig. 2 (arXiv 2504.01839, Sec. IV) from Parquet results.

Table I: the final test accuracy of the global model for each method x (dataset, alpha, beta)
cell, measured next to the paper's (`rayfl/papers/zo_hfl/table1.csv`), mean +- std over
seeds; ablation variants (server data for the baselines, lam = 0, 2H steps, independent
randomness) get rows of their own. Fig. 2: ZO-HFL's global loss f1 + penalty against the
round, one panel per (dataset, alpha, beta), one line per tau. Runs are recognised from their
manifests (algorithm, dataset, partition.alpha, algorithm.participation, local schedule), not
from directory names, so any results tree works.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.papers import paper_table
from rayfl.results.load import Results

METHODS = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "zo_hfl": "ZO-HFL"}
DATASETS = {"mnist": "MNIST", "fashion_mnist": "Fa.-MNIST", "cifar10": "CIFAR-10"}
SETTINGS = [(1000.0, 0.9), (1.0, 0.5), (0.1, 0.1)]
TABLE1_TAU = 20.0
RUN = ["experiment", "run_id"]


def final_accuracy(results: Results) -> pd.DataFrame:
    """experiment, run_id, final_round, accuracy: the global model's last evaluation."""
    ev = results.evals
    if ev.empty or "test_accuracy" not in ev.columns:
        return pd.DataFrame(columns=[*RUN, "final_round", "accuracy"])
    ev = ev[(ev["client"] == -1) & ev["test_accuracy"].notna()] if "client" in ev.columns else ev
    last = ev.sort_values("round").groupby(RUN, as_index=False).last()
    return last[[*RUN, "round", "test_accuracy"]].rename(columns={"round": "final_round", "test_accuracy": "accuracy"})


def runs_table(results: Results) -> pd.DataFrame:
    """One row per run of a Table I method: method, variant, dataset, alpha, beta, tau, seed,
    rounds, final accuracy (percent)."""
    m = results.manifests
    if m.empty or "algorithm.name" not in m.columns:
        return pd.DataFrame()
    m = m[m["algorithm.name"].isin(list(METHODS))].copy()
    if m.empty:
        return pd.DataFrame()
    rows = []
    for _, run in m.iterrows():
        rows.append({
            "experiment": run["experiment"],
            "run_id": run["run_id"],
            "method": run["algorithm.name"],
            "variant": variant(run),
            "dataset": str(run.get("data.dataset")),
            "source": str(run.get("data.source", "full")),
            "alpha": float(run.get("partition.alpha", math.nan)),
            "beta": participation(run),
            "schedule": _get(run, "algorithm.local_schedule.kind"),
            "tau": float(_get(run, "algorithm.local_schedule.tau", math.nan)),
            "seed": run.get("run.seed"),
            "rounds": run.get("run.rounds"),
            "status": run.get("status"),
        })
    table = pd.DataFrame(rows).merge(final_accuracy(results), on=RUN, how="left")
    table["accuracy"] = 100.0 * table["accuracy"]
    return table


def variant(run: pd.Series) -> str:
    """What sets a run apart from the Table I configuration of its method ('' for none): the
    ablations, and ZO-HFL's lam / mu or FedProx's mu away from the jobs' values (1, 0.1; 0.01)."""
    tags = []
    if bool(_get(run, "algorithm.server_as_client", False)):
        tags.append("+server data")
    if run["algorithm.name"] == "zo_hfl":
        lam, mu = float(_get(run, "algorithm.lam", 1.0)), float(_get(run, "algorithm.mu", 0.1))
        if lam != 1.0:
            tags.append("lam=0 (server only)" if lam == 0 else f"lam={lam:g}")
        if mu != 0.1:
            tags.append(f"mu={mu:g}")
        tags += _zo_hfl_readings(run)
    if run["algorithm.name"] == "fedprox" and float(_get(run, "algorithm.mu", 0.01)) != 0.01:
        tags.append(f"mu={float(_get(run, 'algorithm.mu')):g}")
    if run["algorithm.name"] != "zo_hfl" and _get(run, "algorithm.lr_schedule", "harmonic") == "constant":
        tags.append("constant local lr")
    mult = int(_get(run, "algorithm.local_schedule.multiplier", 1))
    if mult != 1:
        tags.append(f"{mult}H steps")
    if _get(run, "algorithm.randomness") == "independent":
        tags.append("independent +- batches")
    if run["algorithm.name"] != "zo_hfl" and _get(run, "model.init_from") is not None:
        tags.append("x0=" + ("0" if "zeros" in str(_get(run, "model.init_from")) else str(_get(run, "model.init_from"))))
    if float(_get(run, "data.server_fraction", 0.3)) != 0.3:
        tags.append(f"server share={float(_get(run, 'data.server_fraction')):g}")
    return ", ".join(tags)


def _zo_hfl_readings(run: pd.Series) -> list[str]:
    """ZO-HFL's settings away from the Table I job (the tuning screen, jobs/zo_hfl/screen.sh)."""
    tags = []
    if float(_get(run, "algorithm.eta", 0.1)) != 0.1:
        tags.append(f"eta={float(_get(run, 'algorithm.eta')):g}")
    if int(_get(run, "algorithm.batch_size", 64)) != 64:
        tags.append(f"batch={int(_get(run, 'algorithm.batch_size'))}")
    if _get(run, "algorithm.aggregation", "participants") != "participants":
        tags.append(str(_get(run, "algorithm.aggregation")))
    if _get(run, "algorithm.init", "zeros") != "zeros":
        tags.append("x0=model init")
    if _get(run, "algorithm.zo_dimension") is not None:
        tags.append(f"n={int(_get(run, 'algorithm.zo_dimension'))}")
    if _get(run, "algorithm.direction_radius", "unit") == "eta":
        tags.append("v in eta S")
    return tags


def participation(run: pd.Series) -> float:
    beta = _get(run, "algorithm.participation")
    if beta is not None:
        return float(beta)
    k, m = _get(run, "algorithm.clients_per_round"), _get(run, "partition.num_clients")
    return float(k) / float(m) if k is not None and m else math.nan


def table1_grid(results: Results) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(grid, runs): the grid has one row per method (and variant) and one column per
    (dataset, alpha, beta) cell, each 'ours (paper)' in percent; runs are the rows it used."""
    runs = runs_table(results)
    if runs.empty:
        return pd.DataFrame(), runs
    runs = runs[(runs["schedule"] == "sqrt") & np.isclose(runs["tau"], TABLE1_TAU)]
    runs = runs[[(a, b) in {s for s in SETTINGS} for a, b in zip(runs["alpha"], runs["beta"], strict=True)]]
    if runs.empty:
        return pd.DataFrame(), runs
    paper = paper_table("zo_hfl", "table1")
    ref = {(r.method, r.dataset, float(r.alpha), float(r.beta)): float(r.accuracy) for r in paper.itertuples()}
    many_r = runs["rounds"].nunique() > 1  # runs of different lengths never share a cell
    columns = []
    for dataset in [d for d in DATASETS if d in set(runs["dataset"])]:
        for alpha, beta in SETTINGS:
            for source in sorted(set(runs[runs["dataset"] == dataset]["source"])):
                for rounds in sorted(set(runs["rounds"])) if many_r else [None]:
                    ran = runs[(runs["dataset"] == dataset) & (runs["source"] == source) & (runs["alpha"] == alpha)
                               & (runs["beta"] == beta) & ((runs["rounds"] == rounds) if rounds is not None else True)]
                    if not ran.empty or not many_r:  # a round budget gets a column only where it ran
                        columns.append((dataset, source, alpha, beta, rounds))
    labels = []
    for method in METHODS:
        for var in sorted(set(runs[runs["method"] == method]["variant"]), key=lambda v: (v != "", v)):
            labels.append((method, var))
    grid = pd.DataFrame(index=[_row_label(m, v) for m, v in labels], columns=[_column_label(*c) for c in columns], dtype=object)
    for method, var in labels:
        for dataset, source, alpha, beta, rounds in columns:
            cell = runs[(runs["method"] == method) & (runs["variant"] == var) & (runs["dataset"] == dataset)
                        & (runs["source"] == source) & (runs["alpha"] == alpha) & (runs["beta"] == beta)
                        & ((runs["rounds"] == rounds) if rounds is not None else True)]
            paper_value = ref.get((method, dataset, alpha, beta)) if var == "" else None
            # a setting that several sweeps ran (a screen's default in each factor) is one run a seed
            per_seed = cell.groupby("seed", dropna=False)["accuracy"].mean()
            grid.loc[_row_label(method, var), _column_label(dataset, source, alpha, beta, rounds)] = _cell(
                per_seed, paper_value, unfinished=bool((cell["status"] != "completed").any()))
    return grid, runs


def write_zo_hfl_report(results: Results, out: Path) -> list[str]:
    """The Table I grid (printed, and as Markdown and CSV) and Fig. 2 when the results hold
    such runs; nothing otherwise."""
    lines: list[str] = []
    grid, runs = table1_grid(results)
    if not grid.empty:
        out.mkdir(parents=True, exist_ok=True)
        note = (f"ZO-HFL Table I: final test accuracy (%) of the global model, measured (paper); "
                f"R = {_values(runs['rounds'])}, tau = {_values(runs['tau'])}, seeds = {_values(runs['seed'])}; "
                "paper: arXiv 2504.01839 Table I (rayfl/papers/zo_hfl/table1.csv)")
        runs.to_csv(out / "zohfl_table1_runs.csv", index=False)
        grid.to_csv(out / "zohfl_table1.csv")
        (out / "zohfl_table1.md").write_text(f"{note}\n\n{_markdown(grid)}\n")
        lines += ["", note, grid.to_string(), f"table: {out / 'zohfl_table1.md'}"]
    fig2 = out / "zohfl_fig2_global_loss.png"
    if plot_fig2(results, fig2) is not None:
        lines.append(f"figure: {fig2}")
    return lines


def plot_fig2(results: Results, path: Path) -> Path | None:
    """Fig. 2: ZO-HFL's global loss against the round, a panel per (dataset, alpha, beta)
    and a line per tau (the mean over seeds, with a ± one std band when there are several).
    None when no ZO-HFL run logged a global loss."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = runs_table(results)
    rounds = results.rounds
    if runs.empty or "global_loss" not in rounds.columns:
        return None
    runs = runs[(runs["method"] == "zo_hfl") & (runs["variant"] == "")]
    data = rounds[rounds["global_loss"].notna()].merge(runs, on=RUN)
    if data.empty:
        return None
    panels = sorted(set(zip(data["dataset"], data["source"], data["alpha"], data["beta"], strict=True)),
                    key=lambda p: (p[0], p[1], -p[2]))
    fig = Figure(figsize=(4.2 * len(panels), 3.6))
    FigureCanvasAgg(fig)
    for k, (dataset, source, alpha, beta) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        sel = data[(data["dataset"] == dataset) & (data["source"] == source) & (data["alpha"] == alpha) & (data["beta"] == beta)]
        for tau, curve in sel.groupby("tau"):
            by_round = curve.groupby("round")["global_loss"]
            mean, std, seeds = by_round.mean(), by_round.std(ddof=1).fillna(0.0), curve["run_id"].nunique()
            (line,) = ax.plot(mean.index, mean.to_numpy(), label=f"tau = {tau:g}" + (f" ({seeds} seeds)" if seeds > 1 else ""))
            if seeds > 1:  # a band of one standard deviation over the seeds
                ax.fill_between(mean.index, (mean - std).to_numpy(), (mean + std).to_numpy(), color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(_column_label(dataset, source, alpha, beta), fontsize="medium")
        ax.set_xlabel("communication round")
        ax.set_ylabel("global loss f1 + penalty" if k == 0 else "")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("ZO-HFL global loss for different tau (arXiv 2504.01839 Fig. 2)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


# ---------------------------------------------------------------- helpers


def _get(run: pd.Series, key: str, default: object = None) -> object:
    """A manifest value, `default` when the run lacks it (missing, None or NaN)."""
    value = run.get(key, default)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return value


def _cell(values: pd.Series, paper: float | None, unfinished: bool = False) -> str:
    """'mean±std (paper)'; a '~' marks a cell with a run still running or stopped early."""
    values = values.dropna()
    ours = "-" if values.empty else f"{values.mean():.2f}" + (f"±{values.std(ddof=1):.2f}" if len(values) > 1 else "")
    ours += "~" if unfinished and not values.empty else ""
    return ours if paper is None else f"{ours} ({paper:.2f})"


def _row_label(method: str, var: str) -> str:
    return METHODS[method] + (f" [{var}]" if var else "")


def _column_label(dataset: str, source: str, alpha: float, beta: float, rounds: object = None) -> str:
    name = DATASETS.get(dataset, dataset) + ("*" if source == "test_only" else "")
    return f"{name} a={alpha:g} b={beta:.0%}" + (f" R={rounds}" if rounds is not None else "")


def _values(series: pd.Series) -> str:
    vals = sorted({v for v in series.dropna().tolist()})
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in vals) or "?"


def _markdown(grid: pd.DataFrame) -> str:
    header = "| method | " + " | ".join(grid.columns) + " |"
    rule = "|---|" + "---|" * len(grid.columns)
    body = ["| " + str(i) + " | " + " | ".join(str(v) for v in row) + " |" for i, row in zip(grid.index, grid.to_numpy(), strict=True)]
    foot = "\n\n`*`: the offline subset (data.source: test_only: the 10,000 MNIST test images split 90/10)." if any("*" in c for c in grid.columns) else ""
    foot += "\n`~`: a run not completed (still running, failed or interrupted): its last evaluation." if any("~" in str(v) for v in grid.to_numpy().ravel()) else ""
    return "\n".join([header, rule, *body]) + foot
