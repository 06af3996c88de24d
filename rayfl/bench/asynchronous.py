"""`rayfl bench async`: what stragglers cost, on the simulated clock and on the wall clock.

1. Simulated time to a target accuracy for synchronous FedAvg, a deadline policy and FedBuff,
   with the same heavy-tailed (Pareto) device speeds over `clients` synthetic clients.
2. Wall-clock seconds per 1,000 applied client updates of the same client work (an MLP, three
   local epochs) with 1 and with 2 ClientHosts, asynchronously (FedBuff, concurrency 20,
   buffer 10) and synchronously (FedAvg, 20 clients a round): the parallel speed-up of each
   engine, and what the exact simulated-time order of the asynchronous engine costs over
   synchronous rounds, in wall time and in the whole machine's busy CPU (which, over the
   cores, bounds how fast any schedule could be); `--vectorize auto,off` repeats this part
   under each mode.
Writes a JSON summary and a Parquet table of the runs."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rayfl.bench.common import write_result
from rayfl.callbacks.base import Callback

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


def wall_seconds_per_1000(run_dir: Path) -> float:
    """Wall seconds per 1,000 applied client updates, from the end of the first round (or
    server step) to the end of the last: actor start-up and the first round's warm-up excluded."""
    from rayfl.results import load

    steps = load(run_dir).rounds.sort_values("round")
    wall, applied = steps["wall_time"].to_numpy(), steps["num_updates"].to_numpy()
    return 1000.0 * (wall[-1] - wall[0]) / max(1, applied[1:].sum())


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (Linux /proc/stat: all
    processes, the hosts, Ray's daemons and the driver alike), or None elsewhere."""
    import os

    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


class BusyAtRounds(Callback):
    """The machine's busy CPU seconds as each round is logged: with the rounds' wall times,
    what the engine costs in CPU beside what it costs in time (start-up excluded)."""

    def __init__(self) -> None:
        self.busy: dict[int, float | None] = {}

    def on_round(self, row: Mapping[str, Any], run: Any) -> None:
        self.busy[int(row["round"])] = machine_busy_seconds()


def cpu_seconds_per_1000(run_dir: Path, busy: BusyAtRounds) -> float | None:
    """Busy CPU seconds of the whole machine per 1,000 applied updates, over the same span
    as `wall_seconds_per_1000`; None without /proc/stat."""
    from rayfl.results import load

    steps = load(run_dir).rounds.sort_values("round")
    first, last = int(steps["round"].iloc[0]), int(steps["round"].iloc[-1])
    start, end = busy.busy.get(first), busy.busy.get(last)
    if start is None or end is None:
        return None
    return 1000.0 * (end - start) / max(1, steps["num_updates"].to_numpy()[1:].sum())


def wall_speeds(clients: int, updates: int, results_dir: Path, rows: list[dict[str, Any]],
                vectorize: str = "auto", stamp: str = "") -> dict[str, Any]:
    """`updates` client updates of the same work (WALL) on 1 and 2 hosts, asynchronously
    (FedBuff) and in synchronous rounds (FedAvg, 20 clients a round), timed on the wall clock
    under `engine.vectorize: vectorize`; appends one row per run to `rows`."""
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    per_step = {"async": 10, "sync": 20}  # updates per server step: FedBuff's buffer, FedAvg's cohort
    policy = {"async": POLICIES["fedbuff"], "sync": POLICIES["sync"]}
    wall: dict[str, dict[str, float]] = {"async": {}, "sync": {}}
    cpu: dict[str, dict[str, float | None]] = {"async": {}, "sync": {}}
    for kind in ("async", "sync"):
        steps = max(2, updates // per_step[kind])
        for hosts in (1, 2):
            cfg = load_config(None, [*COMMON, *policy[kind], *WALL, f"partition.num_clients={clients}",
                                     f"run.rounds={steps}", f"run.eval_every={steps}", f"engine.num_hosts={hosts}",
                                     f"engine.vectorize={vectorize}", f"output.dir={results_dir}",
                                     "run.experiment=bench_async", f"run.run_id={kind}-hosts-{hosts}-{vectorize}{stamp}"])
            busy = BusyAtRounds()
            run_dir = run_experiment(cfg, callbacks=[busy]).run_dir
            per_1000, cpu_1000 = wall_seconds_per_1000(run_dir), cpu_seconds_per_1000(run_dir, busy)
            wall[kind][f"{hosts}_hosts"] = round(per_1000, 3)
            cpu[kind][f"{hosts}_hosts"] = None if cpu_1000 is None else round(cpu_1000, 3)
            rows.append({"part": "wall" if kind == "async" else "sync_wall", "name": f"{hosts}_hosts",
                         "vectorize": vectorize, "wall_seconds_per_1000_updates": per_1000,
                         "cpu_seconds_per_1000_updates": cpu_1000})
    a, s = wall["async"], wall["sync"]
    return {
        "wall_seconds_per_1000_updates": a,
        "sync_wall_seconds_per_1000_updates": s,
        # the whole machine's busy CPU over the same span: with `cores`, a floor on the wall time
        "cpu_seconds_per_1000_updates": cpu["async"],
        "sync_cpu_seconds_per_1000_updates": cpu["sync"],
        "cores": os.cpu_count(),
        "parallel_speedup_2_vs_1_hosts": round(a["1_hosts"] / a["2_hosts"], 3),
        "sync_parallel_speedup": round(s["1_hosts"] / s["2_hosts"], 3),
        "async_over_sync_wall": {k: round(a[k] / s[k], 3) for k in a},
    }


def run_async_bench(clients: int, target: float, rounds: int, updates: int, out: Path,
                    vectorize: tuple[str, ...] = ("auto",)) -> dict[str, Any]:
    """The policies' simulated times, then the wall-clock part once per `engine.vectorize`
    mode: the summary's wall figures are the first mode's, and with several modes
    `by_vectorize` holds each one's."""
    from rayfl.config import load_config
    from rayfl.results import load
    from rayfl.runner import run_experiment

    results_dir = out.parent / "results"
    stamp = time.strftime("-%Y%m%d-%H%M%S")  # a run id of its own for each invocation
    rows, summary = [], {"clients": clients, "target_accuracy": target, "policies": {}}
    for name, extra in POLICIES.items():
        n_rounds = rounds * 2 if name == "fedbuff" else rounds  # 10 arrivals per FedBuff step
        cfg = load_config(None, [*COMMON, *extra, f"partition.num_clients={clients}", f"run.rounds={n_rounds}",
                                 "run.eval_every=2", f"output.dir={results_dir}", "run.experiment=bench_async",
                                 f"run.run_id=policy-{name}{stamp}"])
        res = load(run_experiment(cfg).run_dir)
        t = time_to_accuracy(res.evals, target)
        final = res.evals[res.evals["client"] == -1].sort_values("round").iloc[-1]
        entry = {"sim_seconds_to_target": t, "final_accuracy": float(final["test_accuracy"]),
                 "sim_seconds_total": float(res.rounds["sim_time"].max()),
                 "updates_applied": int(res.rounds["num_updates"].sum())}
        summary["policies"][name] = entry
        rows.append({"part": "policy", "name": name, **entry})

    walls = {mode: wall_speeds(clients, updates, results_dir, rows, mode, stamp) for mode in vectorize}
    summary.update(walls[vectorize[0]])
    if len(vectorize) > 1:
        summary["by_vectorize"] = walls
    sync_t = summary["policies"]["sync"]["sim_seconds_to_target"]
    for name in ("deadline", "fedbuff"):
        t = summary["policies"][name]["sim_seconds_to_target"]
        summary["policies"][name]["speedup_vs_sync"] = None if (t is None or sync_t is None) else round(sync_t / t, 3)
    write_result(out, summary, rows)
    return summary
