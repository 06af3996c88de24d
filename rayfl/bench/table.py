"""`rayfl bench table FILE.json ...`: the Markdown table docs/benchmarks.md shows for
workloads timed against the plain loop, straight from their JSON results, so each figure in
the docs is what a bench command wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = ("workload", "variant", "loop s/round", "rayfl s/round", "speed-up (median, range)", "max abs diff",
           "float32 rounding", "peak MB (all / one process)")


def workload_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per rayfl variant of one `rayfl bench WORKLOAD` result: the speed-up is
    loop / rayfl (the inverse of the recorded ratio), its range over the repeats."""
    rows = []
    settings = "".join(f" {o}" for o in summary.get("overrides", []))  # `--set`: every run of the result
    for variant, run in summary["runs"].items():
        ups = sorted(1.0 / r for r in run.get("ratios", [run["ratio_to_loop"]]))
        spread = f" ({ups[0]:.2f}-{ups[-1]:.2f})" if len(ups) > 1 else ""
        rows.append([
            summary["workload"], variant + settings, f"{run.get('loop_seconds_per_round', summary['loop']['seconds_per_round']):.3f}",
            f"{run['seconds_per_round']:.3f}", f"{1.0 / run['ratio_to_loop']:.2f}x{spread}", f"{run['max_abs_diff']:.1e}",
            f"{summary.get('loop_float32_rounding', float('nan')):.1e}",
            f"{run['peak_rss_mb']:.0f} / {run.get('peak_process_mb', float('nan')):.0f}",
        ])
    return rows


def markdown_table(paths: list[Path]) -> str:
    """The table of every result in `paths`, then one line per result: machine and date."""
    summaries = [json.loads(Path(p).read_text()) for p in paths]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for s in summaries:
        lines += ["| " + " | ".join(row) + " |" for row in workload_rows(s)]
    lines.append("")
    for s in summaries:
        m = s["machine"]
        lines.append(f"- `{s['workload']}`: {s.get('date', 'date not recorded')}, {m.get('processor', m['platform'])}, "
                     f"{m['cpus']} CPUs, torch {m['torch']}, {s['repeat']} repeat(s), rounds {s['timed_rounds']}")
    return "\n".join(lines) + "\n"
