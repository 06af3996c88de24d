"""`rayfl report`: final metrics per run as a table, and the curves people would rather see."""

from __future__ import annotations

from pathlib import Path

from rayfl.papers import paper_reports
from rayfl.results import load
from rayfl.results.plots import (
    is_asynchronous,
    metric_frame,
    plot_client_timeline,
    plot_curves,
    plot_task_window,
    summary_table,
)
from rayfl.results.seeds import seed_table
from rayfl.results.storage import Location
from rayfl.results.tradeoffs import write_tradeoffs

MAX_TIMELINES = 8


def write_report(
    path: str | Path, out: Path | None = None, metric: str = "test_accuracy", target: float | None = None
) -> list[str]:
    """Load every run under `path` (local or a URI such as `s3://bucket/results`), print a
    summary table and write figures to `out`: by default `<path>/report` for a local path, and
    `./report/<last name of the URI>` for a remote one (figures are for looking at, here).
    Runs with privacy, compression or robust aggregation on also get their trade-offs
    (rayfl.results.tradeoffs); `target` is the metric value compressed runs are timed to."""
    results = load(path)
    out = out or default_report_dir(path)
    out.mkdir(parents=True, exist_ok=True)
    lines = [summary_table(results, metric).to_string(index=False), ""]
    has_metric = metric in results.evals.columns or metric in results.rounds.columns
    if has_metric:
        over_seeds = seed_table(results, metric_frame(results, metric), metric)
        if (over_seeds["seeds"] > 1).any():
            lines += ["over seeds (mean ± std):", over_seeds.to_string(index=False, float_format="%.4f"), ""]
    if has_metric:
        for x in ("round", "sim_time"):
            lines.append(f"figure: {plot_curves(results, y=metric, x=x, path=out / f'{metric}_vs_{x}.png')}")
    if has_metric:
        lines += write_tradeoffs(results, out, metric, target)
    if "train_loss" in results.rounds.columns:
        lines.append(f"figure: {plot_curves(results, y='train_loss', x='round', path=out / 'train_loss_vs_round.png')}")
    runs = results.clients[["experiment", "run_id"]].drop_duplicates().head(MAX_TIMELINES)
    for experiment, run_id in runs.itertuples(index=False):
        png = out / f"timeline_{experiment}_{run_id}.png"
        if is_asynchronous(results, str(run_id), str(experiment)):  # a window of tasks in flight
            lines.append(f"figure: {plot_task_window(results, str(run_id), path=png, experiment=str(experiment))}")
            continue
        mine = results.clients[(results.clients["experiment"] == experiment) & (results.clients["run_id"] == run_id)]
        rounds = sorted(mine["round"].unique().tolist())[:3]
        lines.append(f"figure: {plot_client_timeline(results, str(run_id), rounds, path=png, experiment=str(experiment))}")
    for paper_report in paper_reports():  # each paper's tables and figures, when it has runs here
        lines += paper_report(results, out)
    return lines


def default_report_dir(path: str | Path) -> Path:
    """Where figures go when `--out` is not given: beside the runs on local disk, else here."""
    where = Location.parse(path)
    if isinstance(where.name, Path):
        return where.name / "report"
    return Path("report") / (where.path.rstrip("/").rsplit("/", 1)[-1] or "results")
