"""FFGG's Table 1 layout (arXiv 2305.18285, §3.3) from Parquet results: test accuracy after
local fine-tuning, weighted by client test size, for FedAvg, FedAvg + fine-tuning and FFGG with
input / output / adapter personalization, one column per dataset, measured (mean +- std over
seeds) next to the paper's number (`table1.csv`).

Rows are recognised from the manifests, not from directory names: every `local_finetune` run
is a cell; its row is read from the run it started from (`model.init_from`): a FedAvg model
fine-tuned on nothing is "FedAvg", on everything "FedAvg + FT (all)", on a scheme's w "FedAvg +
FT (<scheme>)"; an FFGG / Local FFGG model fine-tuned on its w is "FFGG (<scheme>)". The runs of
`rayfl.papers.ffgg.pipeline` are laid out this way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.results.load import Results

FEDAVG_LIKE = ("fedavg", "fedprox", "scaffold")
FFGG_LIKE = ("ffgg", "local_ffgg")
ROW_ORDER = [
    "FedAvg", "FedAvg + FT (all)", "FedAvg + FT (input)", "FedAvg + FT (output)", "FedAvg + FT (adapter)",
    "FFGG (input)", "FFGG (output)", "FFGG (adapter)",
]


def row_label(source_algorithm: str, scheme: str) -> str | None:
    """The Table 1 row of a fine-tuning run, or None when it is not one."""
    if source_algorithm in FEDAVG_LIKE:
        return {"none": "FedAvg", "all": "FedAvg + FT (all)"}.get(scheme, f"FedAvg + FT ({scheme})")
    if source_algorithm in FFGG_LIKE and scheme not in ("none", "all"):
        return f"FFGG ({scheme})"
    return None


def cells(results: Results) -> pd.DataFrame:
    """One row per fine-tuning run: row, dataset, seed, accuracy and accuracy before
    fine-tuning (percent)."""
    m = results.manifests
    cols = ["row", "dataset", "seed", "accuracy", "before", "run_id"]
    if m.empty or "algorithm.name" not in m.columns or "model.init_from" not in m.columns:
        return pd.DataFrame(columns=cols)
    by_dir = {str(Path(d).resolve()): a for d, a in zip(m["run_dir"], m["algorithm.name"], strict=True)}
    rounds = results.rounds
    out = []
    for _, run in m[m["algorithm.name"] == "local_finetune"].iterrows():
        source = run.get("model.init_from")
        if not isinstance(source, str) or not source:
            continue
        label = row_label(by_dir.get(str(Path(source).resolve()), ""), str(run.get("algorithm.personal_scheme")))
        mine = rounds[(rounds["experiment"] == run["experiment"]) & (rounds["run_id"] == run["run_id"])] if not rounds.empty else rounds
        if label is None or mine.empty or "test_accuracy" not in mine.columns:
            continue
        last = mine.sort_values("round").iloc[-1]
        dataset = str(run.get("data.dataset"))
        if str(run.get("data.source", "full")) == "test_only":
            dataset += " (offline)"
        out.append({
            "row": label, "dataset": dataset, "seed": int(run.get("run.seed", 0)),
            "accuracy": 100 * float(last["test_accuracy"]),
            "before": 100 * float(last.get("test_accuracy_before", np.nan)), "run_id": run["run_id"],
        })
    return pd.DataFrame(out, columns=cols)


def table1(results: Results) -> pd.DataFrame:
    """row x dataset: 'mean +- std (n)' measured, with the paper's value where it has one."""
    c = cells(results)
    if c.empty:
        return pd.DataFrame()
    from rayfl.papers import paper_table

    paper = paper_table("ffgg", "table1")
    stats = c.groupby(["row", "dataset"]).agg(mean=("accuracy", "mean"), std=("accuracy", "std"), n=("accuracy", "size"),
                                              before=("before", "mean")).reset_index()
    rows = []
    for _, s in stats.iterrows():
        pub = paper[(paper["row"] == s["row"]) & (paper["dataset"] == s["dataset"].split(" ")[0])]
        rows.append({
            "row": s["row"], "dataset": s["dataset"],
            "rayfl": _fmt(s["mean"], s["std"], int(s["n"])),
            "before_ft": f"{s['before']:.2f}",
            "paper": _fmt(float(pub["accuracy"].iloc[0]), float(pub["std"].iloc[0]), 0) if len(pub) else "",
        })
    df = pd.DataFrame(rows)
    order = {r: i for i, r in enumerate(ROW_ORDER)}
    return df.sort_values(["dataset", "row"], key=lambda col: col.map(order) if col.name == "row" else col).reset_index(drop=True)


def write_ffgg_table1(results: Results, out: Path) -> list[str]:
    """Write ffgg_table1.csv / .md under `out` and return the table's lines ([] without runs)."""
    t = table1(results)
    if t.empty:
        return []
    out.mkdir(parents=True, exist_ok=True)
    t.to_csv(out / "ffgg_table1.csv", index=False)
    lines = ["FFGG Table 1: test accuracy (%) after local fine-tuning, weighted by client test size",
             "| row | dataset | rayfl | before FT | paper |", "|---|---|---|---|---|"]
    lines += [f"| {r.row} | {r.dataset} | {r.rayfl} | {r.before_ft} | {r.paper} |" for r in t.itertuples()]
    (out / "ffgg_table1.md").write_text("\n".join(lines) + "\n")
    return lines


def _fmt(mean: float, std: float, n: int) -> str:
    if n == 1 or not np.isfinite(std):
        return f"{mean:.2f}" + (" (1 seed)" if n == 1 else "")
    return f"{mean:.2f} ± {std:.2f}" + (f" ({n} seeds)" if n else "")
