"""Runs that differ only by their seed are repetitions of one setting: group them, and report
mean ± std over the seeds with how many there were.

A setting is the experiment plus every config value except those that cannot change what is
measured or that name the repetition: `run.seed`, `run.run_id`, `output.*` and `engine.*`
(results are identical for any host layout). Curves are averaged on their common x values;
runs whose x values differ (simulated time) are interpolated onto a shared grid over the range
all of them cover."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from rayfl.config import SECTIONS
from rayfl.results.load import Results

RUN = ["experiment", "run_id"]
NOT_A_SETTING = ("run.seed", "run.run_id", "output.", "engine.")
GRID_POINTS = 100


def setting_columns(manifests: pd.DataFrame) -> list[str]:
    """The manifest's config columns that define a setting (see the module docstring)."""
    return [
        c for c in manifests.columns
        if "." in c and c.split(".", 1)[0] in SECTIONS and not c.startswith(NOT_A_SETTING)
    ]


def seed_groups(results: Results, by: str = "algorithm.name") -> pd.DataFrame:
    """experiment, run_id, seed, setting (a readable label, unique per setting): one row per
    run. The label is `by`'s value plus the config keys that differ between settings of the
    same `by` value."""
    m = results.manifests
    if m.empty:
        return pd.DataFrame(columns=[*RUN, "seed", "setting"])
    cols = setting_columns(m)
    key = m[["experiment", *cols]].map(str).agg("|".join, axis=1)
    settings = m[cols].map(str).groupby(key).first()
    family = settings[by] if by in settings.columns else pd.Series("", index=settings.index)
    # keys that tell settings of the same `by` apart (an algorithm's own hyper-parameters
    # differ from another's only by existing: the algorithm's name already says that)
    varying = [c for c in cols if c != by and (settings[c].groupby(family).nunique() > 1).any()]
    def label(first: pd.Series, skip_missing: bool) -> str:
        parts = [str(first[by])] if by in m.columns and pd.notna(first[by]) else []
        parts += [f"{c.split('.', 1)[1]}={first[c]}" for c in varying if not (skip_missing and pd.isna(first[c]))]
        return ", ".join(parts) or str(first["run_id"])

    firsts = {k: rows.iloc[0] for k, rows in m.groupby(key, sort=False)}
    # a key another setting's entry has and this one's lacks (a model without `hidden`) says
    # nothing about this setting: left out, unless that makes two settings' labels equal
    labels = {k: label(first, skip_missing=True) for k, first in firsts.items()}
    if len(set(labels.values())) < len(labels):
        labels = {k: label(first, skip_missing=False) for k, first in firsts.items()}
    if len(set(labels.values())) < len(labels):  # the same setting in several experiments
        labels = {k: f"{k.split('|', 1)[0]}/{v}" for k, v in labels.items()}
    seed = m["run.seed"] if "run.seed" in m.columns else pd.Series(np.nan, index=m.index)
    return pd.DataFrame({"experiment": m["experiment"], "run_id": m["run_id"], "seed": seed, "setting": key.map(labels)})


def aggregate_curves(frame: pd.DataFrame, groups: pd.DataFrame, y: str, x: str = "round") -> pd.DataFrame:
    """setting, x, mean, std, n: `frame` (experiment, run_id, x, y, as `metric_frame` gives)
    averaged over the seeds of each setting; std is 0 for a single seed."""
    data = frame.merge(groups, on=RUN)
    out = []
    for setting, rows in data.groupby("setting", sort=False):
        curves = [(c[x].to_numpy(dtype=float), c[y].to_numpy(dtype=float)) for _, c in rows.groupby(RUN, sort=True)]
        xs, ys = _common_grid(curves)
        if len(xs) == 0:
            continue
        std = ys.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(xs))
        out.append(pd.DataFrame({"setting": setting, x: xs, "mean": ys.mean(axis=0), "std": std, "n": len(curves)}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["setting", x, "mean", "std", "n"])


def seed_table(
    results: Results, frame: pd.DataFrame, metric: str, x: str = "round", mode: Literal["max", "min"] = "max"
) -> pd.DataFrame:
    """One row per setting: seeds (how many), the seeds' final and best values of `metric` as
    mean and std. `frame` is `metric_frame(results, metric, x)`."""
    groups = seed_groups(results)
    rows = []
    for setting, runs in frame.merge(groups, on=RUN).groupby("setting", sort=False):
        finals, bests = [], []
        for _, curve in runs.groupby(RUN):
            curve = curve.sort_values(x)
            finals.append(float(curve[metric].iloc[-1]))
            bests.append(float(curve[metric].max() if mode == "max" else curve[metric].min()))
        rows.append({
            "setting": setting,
            "seeds": len(finals),
            f"final_{metric}_mean": float(np.mean(finals)),
            f"final_{metric}_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
            f"{mode}_{metric}_mean": float(np.mean(bests)),
            f"{mode}_{metric}_std": float(np.std(bests, ddof=1)) if len(bests) > 1 else 0.0,
        })
    return pd.DataFrame(rows)


def _common_grid(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(xs, ys [runs, points]): the runs' own x values when they all share them, else a grid
    over the range every run covers, each run linearly interpolated onto it."""
    first = curves[0][0]
    if all(len(cx) == len(first) and np.array_equal(cx, first) for cx, _ in curves):
        return first, np.stack([cy for _, cy in curves])
    lo, hi = max(cx.min() for cx, _ in curves), min(cx.max() for cx, _ in curves)
    if not lo <= hi:
        return np.zeros(0), np.zeros((len(curves), 0))
    xs = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.array([lo])
    return xs, np.stack([np.interp(xs, cx, cy) for cx, cy in curves])
