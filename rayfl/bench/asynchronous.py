"""`rayfl bench async`: what stragglers cost, on the simulated clock and on the wall clock.

1. Simulated time to a target accuracy for synchronous FedAvg, a deadline policy and FedBuff,
   with the same heavy-tailed (Pareto) device speeds over `clients` synthetic clients.
2. Wall-clock seconds per 1,000 applied asynchronous updates (FedBuff, an MLP client task)
   with 1 and with 2 ClientHosts: the ratio is the parallel speed-up of the exact async engine.
Writes a JSON summary and a Parquet table of the runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from rayfl.bench.common import write_result

COMMON = [
    "data.dataset=synthetic",
    "data.iid=true",  # one shared task, so a global accuracy target is meaningful
    "data.size_mu=3.5",
    "data.size_sigma=0.8",
    "data.max_client_samples=300",
    "partition.method=natural",
    "model.name=linear",
    "system.speed={dist: inverse_pareto, value: 2.0e+6, shape: 1.2}",
    "system.latency={dist: lognormal, value: 0.2, sigma: 0.5}",
    "algorithm.local_epochs=1",
    "algorithm.batch_size=32",
    "algorithm.lr=0.1",
    "output.log_clients=true",
]
# The wall-clock part needs client tasks with real compute, or Ray's per-call overhead is all
# that is measured: an MLP and three local epochs (~10-30 ms of work per task).
WALL = ["model.name=mlp", "model.hidden=[256, 256]", "algorithm.local_epochs=3"]

POLICIES = {
    "sync": ["algorithm.name=fedavg", "algorithm.clients_per_round=20", "system.policy=sync"],
    "deadline": ["algorithm.name=fedavg", "algorithm.clients_per_round=20", "system.policy=deadline",
                 "system.deadline=2", "system.late_policy=partial"],
    "fedbuff": ["algorithm.name=fedbuff", "algorithm.concurrency=20", "algorithm.buffer_size=10"],
}


def time_to_accuracy(evals: pd.DataFrame, target: float) -> float | None:
    hit = evals[(evals["client"] == -1) & (evals["test_accuracy"] >= target)].sort_values("sim_time")
    return None if hit.empty else float(hit["sim_time"].iloc[0])


def run_async_bench(clients: int, target: float, rounds: int, updates: int, out: Path) -> dict[str, Any]:
    from rayfl.config import load_config
    from rayfl.results import load
    from rayfl.runner import run_experiment

    results_dir = out.parent / "results"
    rows, summary = [], {"clients": clients, "target_accuracy": target, "policies": {}}
    for name, extra in POLICIES.items():
        n_rounds = rounds * 2 if name == "fedbuff" else rounds  # 10 arrivals per FedBuff step
        cfg = load_config(None, [*COMMON, *extra, f"partition.num_clients={clients}", f"run.rounds={n_rounds}",
                                 "run.eval_every=2", f"output.dir={results_dir}", "run.experiment=bench_async",
                                 f"run.run_id=policy-{name}"])
        res = load(run_experiment(cfg).run_dir)
        t = time_to_accuracy(res.evals, target)
        final = res.evals[res.evals["client"] == -1].sort_values("round").iloc[-1]
        entry = {"sim_seconds_to_target": t, "final_accuracy": float(final["test_accuracy"]),
                 "sim_seconds_total": float(res.rounds["sim_time"].max()),
                 "updates_applied": int(res.rounds["num_updates"].sum())}
        summary["policies"][name] = entry
        rows.append({"part": "policy", "name": name, **entry})

    summary["wall_seconds_per_1000_updates"] = {}
    for hosts in (1, 2):
        cfg = load_config(None, [*COMMON, *POLICIES["fedbuff"], *WALL, f"partition.num_clients={clients}",
                                 f"run.rounds={max(1, updates // 10)}", f"run.eval_every={max(1, updates // 10)}",
                                 f"engine.num_hosts={hosts}", f"output.dir={results_dir}",
                                 "run.experiment=bench_async", f"run.run_id=hosts-{hosts}"])
        res = load(run_experiment(cfg).run_dir)
        wall = res.rounds.sort_values("round")["wall_time"].to_numpy()
        applied = res.rounds.sort_values("round")["num_updates"].to_numpy()
        # from the end of the first server step to the last: excludes actor start-up
        per_1000 = 1000.0 * (wall[-1] - wall[0]) / max(1, applied[1:].sum())
        summary["wall_seconds_per_1000_updates"][f"{hosts}_hosts"] = round(float(per_1000), 3)
        rows.append({"part": "wall", "name": f"{hosts}_hosts", "wall_seconds_per_1000_updates": per_1000})
    w = summary["wall_seconds_per_1000_updates"]
    summary["parallel_speedup_2_vs_1_hosts"] = round(w["1_hosts"] / w["2_hosts"], 3)
    sync_t = summary["policies"]["sync"]["sim_seconds_to_target"]
    for name in ("deadline", "fedbuff"):
        t = summary["policies"][name]["sim_seconds_to_target"]
        summary["policies"][name]["speedup_vs_sync"] = None if (t is None or sync_t is None) else round(sync_t / t, 3)
    write_result(out, summary, rows)
    return summary
