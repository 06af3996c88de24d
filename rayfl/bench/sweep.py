"""`rayfl bench sweep`: what a sweep costs against typing its runs one by one.

The same grid of the shipped `digits_fedavg` job runs twice in one invocation: as one `rayfl
sweep` process, and as a shell-style loop of `rayfl run` processes, one after another. Both
are timed on the wall clock from outside, as a user would. From the runs' own manifests each
also gets its overhead per trial: wall time not spent inside a run (start-up, hosts, data,
scheduling), divided by the trials; with two sizes, the sweep's marginal overhead per trial
(between the sizes, so its one-off start-up cancels out). Grids by size:

      2: lr 0.1, 0.3                                   x seed 0
      6: lr 0.03, 0.1, 0.3                             x seeds 0, 1      (the sweeps guide's grid)
     48: lr 0.01, 0.03, 0.1, 0.3 x fedavg, fedprox     x seeds 0-5
Writes a JSON summary and a Parquet table (one row per grid and way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rayfl.bench.common import load_average, write_result

GRIDS: dict[int, tuple[list[str], str]] = {
    2: (["algorithm.lr=0.1,0.3"], "0"),
    6: (["algorithm.lr=0.03,0.1,0.3"], "0,1"),
    48: (["algorithm.lr=0.01,0.03,0.1,0.3", "algorithm.name=fedavg,fedprox"], "0,1,2,3,4,5"),
}
JOB = "digits_fedavg"


def trials_of(size: int) -> list[list[str]]:
    """Each trial of grid `size` as `rayfl run` overrides (grid values, then the seed)."""
    from rayfl.sweep import build_spec

    grid, seeds = GRIDS[size]
    spec = build_spec(None, grid, seeds)
    keys = list(spec.grid)
    combos: list[list[tuple[str, Any]]] = [[]]
    for key in keys:
        combos = [[*c, (key, v)] for c in combos for v in spec.grid[key]]
    return [[*(f"{k}={json.dumps(v)}" for k, v in combo), f"run.seed={s}"] for combo in combos for s in spec.seeds or [0]]


def rayfl_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "rayfl"), *args]


def timed(cmd: list[str], cwd: Path) -> float:
    """Wall seconds of one command, which must succeed."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # each starts its own local Ray
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {done.returncode}: {done.stderr[-1500:]}")
    return time.perf_counter() - start


def run_seconds(results: Path) -> list[float]:
    """Every run's own wall seconds (its manifest's), under `results`."""
    return [json.loads(m.read_text())["wall_seconds"] for m in sorted(results.rglob("manifest.json"))]


def one_grid(size: int, rounds: int, work: Path) -> dict[str, Any]:
    """The grid as a sweep and as a loop of runs: wall seconds, their ratio, overhead per trial."""
    common = ["--set", f"run.rounds={rounds}"]
    grid, seeds = GRIDS[size]
    sweep_out, loop_out = work / f"sweep-{size}", work / f"loop-{size}"
    sweep = timed(rayfl_command("sweep", "--example", JOB, *common, "--set", f"output.dir={sweep_out}",
                                *(a for g in grid for a in ("--grid", g)), "--seeds", seeds, "--name", f"grid{size}"), work)
    loop = 0.0
    for i, trial in enumerate(trials_of(size)):
        sets = [a for o in [*trial, f"output.dir={loop_out}", f"run.run_id=t{i}"] for a in ("--set", o)]
        loop += timed(rayfl_command("run", "--example", JOB, "--quiet", *common, *sets), work)
    in_sweep, in_loop = run_seconds(sweep_out), run_seconds(loop_out)
    assert len(in_sweep) == len(in_loop) == size, (len(in_sweep), len(in_loop))
    return {
        "trials": size,
        "sweep_seconds": round(sweep, 2),
        "loop_seconds": round(loop, 2),
        "sweep_over_loop": round(sweep / loop, 3),
        "runs_seconds": round(sum(in_sweep), 2),  # inside the sweep's runs, summed
        "sweep_overhead_per_trial": round((sweep - sum(in_sweep)) / size, 3),
        "loop_overhead_per_trial": round((loop - sum(in_loop)) / size, 3),
    }


def run_sweep_bench(sizes: list[int], rounds: int, out: Path) -> dict[str, Any]:
    """Each grid in `sizes` (keys of GRIDS) as a sweep and as a loop, in one invocation."""
    unknown = [s for s in sizes if s not in GRIDS]
    if unknown:
        raise ValueError(f"no grid of {unknown[0]} trials; sizes: {sorted(GRIDS)}")
    with tempfile.TemporaryDirectory(prefix="rayfl-bench-sweep-") as tmp:
        grids = {str(size): one_grid(size, rounds, Path(tmp)) for size in sizes}
    summary = {"job": JOB, "rounds": rounds, "cores": os.cpu_count(), "load_average": load_average(), "grids": grids}
    ordered = [grids[str(size)] for size in sorted(sizes)]
    if len(ordered) > 1:  # what one more trial adds to a sweep beyond its run: the fixed start-up cancels out
        small, big = ordered[0], ordered[-1]
        extra = (big["sweep_seconds"] - small["sweep_seconds"]) - (big["runs_seconds"] - small["runs_seconds"])
        summary["sweep_marginal_overhead_per_trial"] = round(extra / (big["trials"] - small["trials"]), 3)
    write_result(out, summary, [{"grid": size, **row} for size, row in grids.items()])
    return summary
