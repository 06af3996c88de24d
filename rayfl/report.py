"""`rayfl report`: final metrics per run as a table, and the curves people would rather see."""

from __future__ import annotations

from pathlib import Path

from rayfl.results import load
from rayfl.results.plots import plot_client_timeline, plot_curves, summary_table
from rayfl.results.zo_hfl import write_zo_hfl_report

MAX_TIMELINES = 8


def write_report(path: Path, out: Path | None = None, metric: str = "test_accuracy") -> list[str]:
    """Load every run under `path`, print a summary table and write figures to `out`."""
    results = load(path)
    out = out or (path / "report")
    out.mkdir(parents=True, exist_ok=True)
    lines = [summary_table(results, metric).to_string(index=False), ""]
    has_metric = metric in results.evals.columns or metric in results.rounds.columns
    if has_metric:
        for x in ("round", "sim_time"):
            lines.append(f"figure: {plot_curves(results, y=metric, x=x, path=out / f'{metric}_vs_{x}.png')}")
    if "train_loss" in results.rounds.columns:
        lines.append(f"figure: {plot_curves(results, y='train_loss', x='round', path=out / 'train_loss_vs_round.png')}")
    runs = results.clients[["experiment", "run_id"]].drop_duplicates().head(MAX_TIMELINES)
    for experiment, run_id in runs.itertuples(index=False):
        mine = results.clients[(results.clients["experiment"] == experiment) & (results.clients["run_id"] == run_id)]
        rounds = sorted(mine["round"].unique().tolist())[:3]
        path = out / f"timeline_{experiment}_{run_id}.png"
        lines.append(f"figure: {plot_client_timeline(results, str(run_id), rounds, path=path, experiment=str(experiment))}")
    lines += write_zo_hfl_report(results, out)  # Table I grid and Fig. 2 when there are such runs
    return lines
