"""Synchronous rounds, a deadline and buffered asynchrony for FedAvg, FedProx and FFGG under
heavy-tailed device speeds: simulated seconds to a target accuracy, over seeds.

Every run does the same client work (the same number of client updates applied) on the same
population, whose speeds are 2e6 FLOP/s over a Pareto(1.2) factor: most clients are fast, a
few are 10-100x slower. The three round policies:

- sync: 20 clients a round, the round waits for the slowest;
- deadline: 20 clients a round, closed after `--deadline` simulated seconds, late clients
  sending what they have (`late_policy: partial`);
- async: the algorithm's own parts under the asynchronous driver, 20 clients in flight, a
  server step every 10 arrivals weighted by (1 + staleness)^-1/2.

Writes under `--out`: runs/ (every run's Parquet tables), summary.csv (one row a run),
summary.md (mean ± std over seeds) and accuracy_vs_time.png.

    python scripts/asynchrony_study.py                      # 3 seeds, about 10 minutes on 2 cores
    python scripts/asynchrony_study.py --seeds 0 --rounds 20  # a quick look"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

COMMON = [
    "data.dataset=synthetic", "data.alpha=0.1", "data.beta=0.1", "data.size_mu=4.0", "data.size_sigma=0.8",
    "data.max_client_samples=300", "partition.method=natural", "partition.num_clients=200",
    "partition.client_test=proportional", "model.name=mlp", "model.hidden=[32]",
    "algorithm.local_epochs=1", "algorithm.batch_size=16", "algorithm.lr=0.1", "algorithm.clients_per_round=20",
    "system.speed={dist: inverse_pareto, value: 2.0e+6, shape: 1.2}",
    "system.latency={dist: lognormal, value: 0.2, sigma: 0.5}",
    "output.log_clients=true", "engine.num_hosts=2",
]
METHODS: dict[str, list[str]] = {
    "fedavg": ["algorithm.name=fedavg"],
    "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.01"],
    "ffgg": ["algorithm.name=ffgg", "algorithm.personal_scheme=output", "algorithm.tau=2"],
}
BUFFER, CONCURRENCY = 10, 20


def policies(deadline: float) -> dict[str, list[str]]:
    return {
        "sync": ["system.policy=sync"],
        "deadline": ["system.policy=deadline", f"system.deadline={deadline}", "system.late_policy=partial"],
        "async": ["asynchrony.enabled=true", f"asynchrony.concurrency={CONCURRENCY}", f"asynchrony.buffer_size={BUFFER}",
                  "asynchrony.staleness=polynomial", "asynchrony.staleness_a=0.5"],
    }


def run_all(out: Path, seeds: list[int], rounds: int, deadline: float, eval_every: int) -> pd.DataFrame:
    """Every method x policy x seed; one summary row each."""
    import rayfl

    rows = []
    for method, keys in METHODS.items():
        for policy, extra in policies(deadline).items():
            # an asynchronous step applies BUFFER updates, a synchronous round 20: the same work
            steps = rounds * 20 // BUFFER if policy == "async" else rounds
            every = eval_every * 20 // BUFFER if policy == "async" else eval_every
            for seed in seeds:
                run_id = f"{method}-{policy}-s{seed}"
                print(f"== {run_id}", file=sys.stderr, flush=True)
                run = rayfl.run(None, [*COMMON, *keys, *extra, f"run.seed={seed}", f"run.rounds={steps}",
                                       f"run.eval_every={every}", "run.experiment=asynchrony", f"run.run_id={run_id}",
                                       f"output.dir={out / 'runs'}", "output.overwrite=true"])
                rows.append({"method": method, "policy": policy, "seed": seed, "run_id": run_id,
                             **measures(run.rounds, run.clients)})
    return pd.DataFrame(rows)


def measures(rounds: pd.DataFrame, clients: pd.DataFrame) -> dict[str, Any]:
    evals = rounds.dropna(subset=["test_accuracy"]).sort_values("sim_time")
    return {
        "final_accuracy": float(evals["test_accuracy"].iloc[-1]),
        "best_accuracy": float(evals["test_accuracy"].max()),
        "sim_seconds": float(rounds["sim_time"].max()),
        "updates_applied": int(rounds["num_updates"].sum()),
        "tasks": int(len(clients)),
    }


def time_to(rounds_by_run: dict[str, pd.DataFrame], run_id: str, target: float) -> float:
    """Simulated seconds until the run's test accuracy first reaches `target` (NaN: never)."""
    evals = rounds_by_run[run_id].dropna(subset=["test_accuracy"]).sort_values("sim_time")
    hit = evals[evals["test_accuracy"] >= target]
    return float(hit["sim_time"].iloc[0]) if len(hit) else float("nan")


def summarise(table: pd.DataFrame, out: Path, targets: dict[str, float]) -> str:
    """summary.md: per method and policy, mean ± std over seeds of the time to target (and how
    many seeds reached it), the final accuracy and the simulated time of the whole run."""
    lines = [
        "| method | target accuracy | policy | simulated s to target | seeds reaching it | final accuracy | simulated s in all |",
        "|---|---|---|---|---|---|---|",
    ]
    for (method, policy), g in table.groupby(["method", "policy"], sort=False):
        t = g["sim_seconds_to_target"].to_numpy()
        reached = t[np.isfinite(t)]
        to_target = f"{reached.mean():,.0f} ± {reached.std():,.0f}" if len(reached) else "not reached"
        lines.append(f"| {method} | {targets[method]:.2f} | {policy} | {to_target} | {len(reached)} of {len(g)} | "
                     f"{g['final_accuracy'].mean():.3f} ± {g['final_accuracy'].std(ddof=0):.3f} | "
                     f"{g['sim_seconds'].mean():,.0f} |")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def plot(rounds_by_run: dict[str, pd.DataFrame], table: pd.DataFrame, out: Path, targets: dict[str, float]) -> Path:
    """Test accuracy against simulated time, one panel per method, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(METHODS)
    fig, axes = plt.subplots(1, len(methods), figsize=(5 * len(methods), 3.8), sharey=True)
    colors = {"sync": "tab:blue", "deadline": "tab:orange", "async": "tab:green"}
    for ax, method in zip(axes, methods, strict=True):
        for _, row in table[table["method"] == method].iterrows():
            r = rounds_by_run[row["run_id"]].dropna(subset=["test_accuracy"]).sort_values("sim_time")
            ax.plot(r["sim_time"], r["test_accuracy"], color=colors[row["policy"]], alpha=0.7,
                    label=row["policy"] if row["seed"] == table["seed"].min() else None)
        ax.axhline(targets[method], color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_title(method)
        ax.set_xlabel("simulated seconds")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend()
    fig.tight_layout()
    path = out / "accuracy_vs_time.png"
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("results/asynchrony"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=60, help="synchronous rounds (asynchronous steps: twice as many)")
    p.add_argument("--deadline", type=float, default=2.0, help="simulated seconds a deadline round stays open")
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--target", type=float, default=0.9,
                   help="the target, as a fraction of the best accuracy any run of the method reached")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    table = run_all(args.out, args.seeds, args.rounds, args.deadline, args.eval_every)
    import rayfl

    results = rayfl.load(args.out / "runs")
    rounds_by_run = {run_id: g for run_id, g in results.rounds.groupby("run_id")}
    targets = {m: round(args.target * float(table[table["method"] == m]["best_accuracy"].max()), 2) for m in METHODS}
    table["target_accuracy"] = table["method"].map(targets)
    table["sim_seconds_to_target"] = [time_to(rounds_by_run, r, targets[m]) for r, m in zip(table["run_id"], table["method"],
                                                                                          strict=True)]
    table.to_csv(args.out / "summary.csv", index=False)
    print(summarise(table, args.out, targets))
    print(plot(rounds_by_run, table, args.out, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
