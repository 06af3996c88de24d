"""`rayfl report`: final metrics per run as a table, and the curves people would rather see."""

from __future__ import annotations

from pathlib import Path

from rayfl.results import load
from rayfl.results.plots import plot_client_timeline, plot_curves, summary_table


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
    if len(results.clients):
        run_id = str(results.clients["run_id"].iloc[0])
        rounds = sorted(results.clients["round"].unique().tolist())[:3]
        lines.append(f"figure: {plot_client_timeline(results, run_id, rounds, path=out / f'timeline_{run_id}.png')}")
    return lines
