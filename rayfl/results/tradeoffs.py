"""The round pipeline's trade-offs, for `rayfl report`: accuracy against the privacy spent
(epsilon), against the bytes clients uploaded and the simulated time (compression), and the
robust aggregators' table. Each part is written only when some loaded run turned its section on.

Runs that differ only by seed are averaged (rayfl.results.seeds): mean ± std over seeds, with
how many there were. For privacy, a *line* is a setting with its noise (noise_multiplier or
target_epsilon) set aside, so one line holds the same job at several noise levels; a run without
privacy whose config equals a line's on every key outside `privacy:` (and the experiment's name)
is that line's noise-free reference."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.results.load import Results
from rayfl.results.plots import draw_curves, metric_frame, new_figure, save_figure
from rayfl.results.seeds import RUN, aggregate_curves, seed_groups, seed_table, setting_columns

NOISE_KEYS = ("privacy.noise_multiplier", "privacy.target_epsilon")
NOT_COMPARED = ("privacy.", "run.experiment")  # what a noise-free reference may differ in
TARGET_STEP = 0.01  # the default target accuracy is a multiple of this


# ---------------------------------------------------------------------- selecting runs


def subset(results: Results, runs: pd.DataFrame) -> Results:
    """The tables of the runs (experiment, run_id rows) in `runs` only."""
    keys = runs[RUN].drop_duplicates()

    def keep(frame: pd.DataFrame) -> pd.DataFrame:
        if frame.empty or not set(RUN) <= set(frame.columns):
            return frame
        return frame.merge(keys, on=RUN).reset_index(drop=True)

    return Results(rounds=keep(results.rounds), clients=keep(results.clients), evals=keep(results.evals),
                   manifests=keep(results.manifests))


def _column(m: pd.DataFrame, name: str, default: object) -> pd.Series:
    return m[name] if name in m.columns else pd.Series(default, index=m.index)


def private_runs(m: pd.DataFrame) -> pd.Series:
    """Which manifest rows had privacy on."""
    return _column(m, "privacy.mode", "off").fillna("off").astype(str) != "off"


def compressed_runs(m: pd.DataFrame) -> pd.Series:
    """Which manifest rows compressed their uploads."""
    return _column(m, "compression.name", "none").fillna("none").astype(str) != "none"


def robust_runs(m: pd.DataFrame) -> pd.Series:
    """Which manifest rows had Byzantine clients or a robust aggregator."""
    aggregator = _column(m, "robust.aggregator.name", "mean").fillna("mean").astype(str) != "mean"
    bucket = pd.to_numeric(_column(m, "robust.aggregator.bucket_size", 1), errors="coerce").fillna(1) != 1
    attack = _column(m, "robust.attack.name", "none").fillna("none").astype(str) != "none"
    return aggregator | bucket | attack


def experiments_with(results: Results, which: pd.Series) -> Results:
    """Every run of the experiments in which some run is in `which`: the compared runs (a
    compressed run's uncompressed twin in the same sweep included)."""
    m = results.manifests
    names = set(m.loc[which, "experiment"])
    return subset(results, m[m["experiment"].isin(names)])


# ---------------------------------------------------------------------- per-run numbers


def cumulative_uplink(results: Results) -> pd.DataFrame:
    """experiment, run_id, round, uplink_bytes: the `bytes_up` of every accepted training task
    (phase train, outcome ok) in rounds <= round, summed. Rounds in which no task was accepted
    (but that were logged or evaluated) carry the previous total."""
    c = results.clients
    if c.empty or "bytes_up" not in c.columns:
        return pd.DataFrame(columns=[*RUN, "round", "uplink_bytes"])
    accepted = pd.Series(True, index=c.index)
    if "phase" in c.columns:
        accepted &= c["phase"] == "train"
    if "outcome" in c.columns:
        accepted &= c["outcome"] == "ok"
    per_round = c[accepted].groupby([*RUN, "round"])["bytes_up"].sum()
    rounds = [f[[*RUN, "round"]] for f in (results.rounds, results.evals) if {*RUN, "round"} <= set(f.columns)]
    every = pd.concat([per_round.reset_index()[[*RUN, "round"]], *rounds]).drop_duplicates()
    out = every.merge(per_round.rename("uplink_bytes").reset_index(), on=[*RUN, "round"], how="left")
    out = out.fillna({"uplink_bytes": 0}).sort_values([*RUN, "round"], kind="stable")
    out["uplink_bytes"] = out.groupby(RUN)["uplink_bytes"].cumsum().astype("float64")
    return out.reset_index(drop=True)


def uplink_frame(results: Results, metric: str) -> pd.DataFrame:
    """experiment, run_id, uplink_bytes, metric: each evaluation at the uplink spent by then."""
    data = metric_frame(results, metric, "round").merge(cumulative_uplink(results), on=[*RUN, "round"])
    return data[[*RUN, "uplink_bytes", metric]]


def final_values(results: Results, metric: str) -> pd.DataFrame:
    """One row per run: experiment, run_id, metric (its last value), round (where), sim_time,
    uplink_bytes (in all) and epsilon (the last round's; NaN without privacy)."""
    finals = metric_frame(results, metric, "round").sort_values("round").groupby(RUN).tail(1)
    r = results.rounds
    last = r.sort_values("round").groupby(RUN).tail(1) if {"round", *RUN} <= set(r.columns) else pd.DataFrame(columns=RUN)
    extra = last[[*RUN, *[c for c in ("sim_time", "epsilon") if c in last.columns]]]
    uplink = cumulative_uplink(results).groupby(RUN, as_index=False)["uplink_bytes"].last()
    out = finals.merge(extra, on=RUN, how="left").merge(uplink, on=RUN, how="left")
    for name in ("sim_time", "epsilon", "uplink_bytes"):
        if name not in out.columns:
            out[name] = np.nan
    return out.reset_index(drop=True)


def minimised(metric: str) -> bool:
    """Whether lower is better, by the name (as `summary_table` decides): loss, error."""
    return any(word in metric for word in ("loss", "error"))


def time_to_target(results: Results, metric: str, target: float) -> pd.DataFrame:
    """experiment, run_id, sim_time_to_target, uplink_to_target: the simulated time and the
    uplink bytes at the first evaluation whose metric reaches target (>=, or <= for a loss;
    NaN: never reached)."""
    data = metric_frame(results, metric, "round")
    source = results.evals if "sim_time" in results.evals.columns else results.rounds
    clock = source.groupby([*RUN, "round"], as_index=False)["sim_time"].max()
    data = data.merge(clock, on=[*RUN, "round"], how="left").merge(cumulative_uplink(results), on=[*RUN, "round"], how="left")
    reached = data[metric] <= target if minimised(metric) else data[metric] >= target
    hits = data[reached].sort_values("round").groupby(RUN).head(1)
    out = data[RUN].drop_duplicates().merge(hits[[*RUN, "sim_time", "uplink_bytes"]], on=RUN, how="left")
    return out.rename(columns={"sim_time": "sim_time_to_target", "uplink_bytes": "uplink_to_target"}).reset_index(drop=True)


def default_target(best: pd.Series, lower_is_better: bool = False) -> float:
    """The multiple of TARGET_STEP every run reaches (`best`: each run's best value), the
    hardest one: the largest, or the smallest for a loss."""
    if lower_is_better:
        steps = math.ceil(float(best.max()) / TARGET_STEP - 1e-9)
    else:
        steps = math.floor(float(best.min()) / TARGET_STEP + 1e-9)
    return round(steps * TARGET_STEP, 12)  # 70 * 0.01 is 0.7000000000000001, above a run's 0.7


# ---------------------------------------------------------------------- mean ± std over seeds


def _mean_std(values: pd.Series) -> tuple[float, float]:
    v = values.dropna().to_numpy(dtype=float)
    if len(v) == 0:
        return np.nan, np.nan
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def privacy_lines(results: Results) -> pd.DataFrame:
    """experiment, run_id, line, noise_multiplier: each private run's line (its setting with the
    noise set aside, labelled as `seed_groups` labels settings) and its noise multiplier (the
    resolved one, so target_epsilon runs count too); each noise-free reference once per line it
    matches, noise NaN. Runs that are neither are left out."""
    m = results.manifests
    dp = m[private_runs(m)]
    if dp.empty:
        return pd.DataFrame(columns=[*RUN, "line", "noise_multiplier"])
    noiseless = dp.drop(columns=[c for c in NOISE_KEYS if c in dp.columns])
    lines = seed_groups(Results(results.rounds, results.clients, results.evals, noiseless))  # indexed as dp
    noise = _column(dp, "pipeline.noise_multiplier", np.nan).fillna(_column(dp, "privacy.noise_multiplier", np.nan))
    lines = lines.assign(line=lines["setting"], noise_multiplier=noise.astype(float))[[*RUN, "line", "noise_multiplier"]]
    compared = [c for c in setting_columns(m) if not c.startswith(NOT_COMPARED)]
    key = m[compared].map(str).agg("|".join, axis=1) if compared else pd.Series("", index=m.index)
    line_keys = pd.DataFrame({"key": key[dp.index], "line": lines["line"]}).drop_duplicates()
    plain = m[~private_runs(m)][RUN].assign(key=key)
    refs = plain.merge(line_keys, on="key").drop(columns="key").assign(noise_multiplier=np.nan)
    return pd.concat([lines, refs], ignore_index=True)


def privacy_table(results: Results, metric: str) -> pd.DataFrame:
    """One row per line and noise level (private rows by decreasing noise, then the line's
    noise-free reference, epsilon inf): seeds, epsilon (final round; the same for every seed
    under one setting) at delta, the final metric's mean and std over seeds."""
    lines = privacy_lines(results)
    if lines.empty:
        return pd.DataFrame()
    data = lines.merge(final_values(results, metric), on=RUN)
    m = results.manifests
    data = data.merge(m[RUN].assign(delta=_column(m, "pipeline.delta", np.nan)), on=RUN, how="left")
    rows = []
    for (line, noise), runs in data.groupby(["line", data["noise_multiplier"].fillna(-1.0)], sort=False):
        mean, std = _mean_std(runs[metric])
        private = noise >= 0
        rows.append({"line": line, "private": private, "noise_multiplier": noise if private else np.nan,
                     "seeds": len(runs), "delta": float(runs["delta"].mean()) if private else np.nan,
                     "epsilon": float(runs["epsilon"].mean()) if private else math.inf,
                     f"{metric}_mean": mean, f"{metric}_std": std})
    table = pd.DataFrame(rows)
    order = table.assign(_noise=table["noise_multiplier"].fillna(-1.0)).sort_values(["line", "_noise"], ascending=[True, False])
    return order.drop(columns="_noise").reset_index(drop=True)


def compression_table(results: Results, metric: str, target: float | None = None) -> tuple[pd.DataFrame, float]:
    """One row per compression setting (labelled by `compression.name` and what differs):
    seeds, the final metric, the uplink bytes in all, the simulated time at the end and to
    reach `target` (default: `default_target` over these runs), each as mean and std over
    seeds, and how many seeds reached the target. Returns the table and the target."""
    groups = seed_groups(results, "compression.name")
    finals = final_values(results, metric)
    curves = metric_frame(results, metric, "round").groupby(RUN)[metric]
    lower = minimised(metric)
    target = default_target(curves.min() if lower else curves.max(), lower) if target is None else float(target)
    data = groups.merge(finals, on=RUN).merge(time_to_target(results, metric, target), on=RUN, how="left")
    rows = []
    for setting, runs in data.groupby("setting", sort=True):
        row: dict[str, object] = {"setting": setting, "seeds": len(runs)}
        for name, column in ((metric, metric), ("uplink_bytes", "uplink_bytes"), ("sim_time", "sim_time"),
                             ("sim_time_to_target", "sim_time_to_target"), ("uplink_to_target", "uplink_to_target")):
            row[f"{name}_mean"], row[f"{name}_std"] = _mean_std(runs[column])
        row["reached_target"] = int(runs["sim_time_to_target"].notna().sum())
        rows.append(row)
    return pd.DataFrame(rows), target


def robust_table(results: Results, metric: str) -> pd.DataFrame:
    """`seed_table` (final and best metric, mean and std over seeds) of the compared runs."""
    return seed_table(results, metric_frame(results, metric), metric)


# ---------------------------------------------------------------------- figures


def plot_accuracy_vs_epsilon(table: pd.DataFrame, metric: str, *, path: str | Path) -> Path:
    """One line per `privacy_table` line: the final metric (mean ± std over seeds as error
    bars) against epsilon, log scale, each point labelled with its z; a noise-free reference as
    a dashed line in its line's colour (once, when several lines share the same runs)."""
    fig = new_figure((10.0, 4.5))
    ax = fig.add_subplot()
    drawn_refs: set[tuple[float, int]] = set()
    for line, rows in table.groupby("line", sort=True):
        private = rows[rows["private"]].sort_values("epsilon")
        drawn = ax.errorbar(private["epsilon"], private[f"{metric}_mean"], yerr=private[f"{metric}_std"], marker="o",
                            capsize=3, label=f"{line} ({int(private['seeds'].max())} seeds)")
        for _, point in private.iterrows():
            ax.annotate(f"z={point['noise_multiplier']:.3g}", (point["epsilon"], point[f"{metric}_mean"]),
                        textcoords="offset points", xytext=(4, -10), fontsize="x-small")
        for _, ref in rows[~rows["private"]].iterrows():
            same = (round(float(ref[f"{metric}_mean"]), 12), int(ref["seeds"]))
            if same not in drawn_refs:
                drawn_refs.add(same)
                ax.axhline(ref[f"{metric}_mean"], color=drawn.lines[0].get_color(), linestyle="--", linewidth=1,
                           label=f"no privacy: {line}")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon after the last round")
    ax.set_ylabel(f"final {metric.replace('_', ' ')}")
    ax.set_title(f"final {metric} against privacy spent (mean ± std over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


# ---------------------------------------------------------------------- the report's part


def write_tradeoffs(results: Results, out: Path, metric: str = "test_accuracy", target: float | None = None) -> list[str]:
    """The figures, CSV tables and `tradeoffs.md` for every pipeline section some run that
    logged `metric` turned on; the lines `rayfl report` prints (none when no run did)."""
    if results.manifests.empty or not (metric in results.evals.columns or metric in results.rounds.columns):
        return []
    results = subset(results, metric_frame(results, metric))  # a run refused at its start has no curve
    m = results.manifests
    lines: list[str] = []
    markdown: list[str] = []
    if private_runs(m).any():
        table = privacy_table(results, metric)
        lines.append(f"figure: {plot_accuracy_vs_epsilon(table, metric, path=out / 'accuracy_vs_epsilon.png')}")
        markdown += _section("privacy: final metric against epsilon", table, out / "tradeoff_privacy.csv", lines)
    if compressed_runs(m).any():
        compared = experiments_with(results, compressed_runs(m))
        groups = seed_groups(compared, "compression.name")
        uplink = aggregate_curves(uplink_frame(compared, metric), groups, metric, "uplink_bytes")
        clock = aggregate_curves(metric_frame(compared, metric, "sim_time"), groups, metric, "sim_time")
        for curves, x, name, label in (
            (uplink, "uplink_bytes", "accuracy_vs_uplink.png", "uplink bytes (accepted training uploads, cumulative)"),
            (clock, "sim_time", "accuracy_vs_sim_time.png", "simulated time (s)"),
        ):
            lines.append(f"figure: {draw_curves(curves, metric, x, path=out / name, xlabel=label, logx=True)}")
        table, target = compression_table(compared, metric, target)
        title = f"compression: final metric, uplink and simulated time to {metric} {'<=' if minimised(metric) else '>='} {target:g}"
        markdown += _section(title, table, out / "tradeoff_compression.csv", lines)
    if robust_runs(m).any():
        table = robust_table(experiments_with(results, robust_runs(m)), metric)
        markdown += _section("robust aggregation: final and best metric", table, out / "tradeoff_robust.csv", lines)
    if markdown:
        md = out / "tradeoffs.md"
        md.write_text("\n".join(markdown))
        lines += ["", *markdown, f"table: {md}"]
    return lines


def _section(title: str, table: pd.DataFrame, csv: Path, lines: list[str]) -> list[str]:
    """Write `table` to `csv` (noted in `lines`); its markdown block for tradeoffs.md."""
    table.to_csv(csv, index=False)
    lines.append(f"table: {csv}")
    return [f"## {title}", "", markdown_table(table), ""]


def markdown_table(table: pd.DataFrame) -> str:
    """A table as markdown: each `<name>_mean` / `<name>_std` pair becomes one "mean ± std"
    column; floats get 4 decimals (bytes none, times and epsilon 3 digits), NaN shows as "-"."""
    columns: list[tuple[str, list[str]]] = []
    for name in table.columns:
        if name.endswith("_std") and f"{name[:-4]}_mean" in table.columns:
            continue
        if name.endswith("_mean") and f"{name[:-5]}_std" in table.columns:
            base = name[:-5]
            cells = [_pair(a, b, base) for a, b in zip(table[name], table[f"{base}_std"], strict=True)]
            columns.append((base, cells))
        else:
            columns.append((name, [_cell(v, name) for v in table[name]]))
    head = "| " + " | ".join(name for name, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cells[i] for _, cells in columns) + " |" for i in range(len(table))]
    return "\n".join([head, rule, *body])


def _digits(name: str) -> str:
    if "noise" in name:
        return "g"
    if "bytes" in name or "uplink" in name:
        return ",.0f"
    if "time" in name or "epsilon" in name or name == "delta":
        return ".3g"
    return ".4f"


def _cell(value: object, name: str) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if isinstance(value, (int, np.integer)):
        return str(value)
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf"
        return format(float(value), _digits(name))
    return str(value)


def _pair(mean: float, std: float, name: str) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    return f"{format(mean, _digits(name))} ± {format(std, _digits(name))}"
