"""The FFGG page's BR-FFGG table comes from one script (jobs/ffgg/byzantine.sh): every row of
the table at every seed asked for, each run under its own id, each command a valid job."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from rayfl.config import load_config

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "jobs" / "ffgg" / "byzantine.sh"
# the table's rows: 13 of one run each, and the row of four other aggregators under Gaussian noise
ROWS = 17


def planned_runs(seeds: str, *extra: str) -> list[list[str]]:
    """The `rayfl run` commands the script would run, as argument lists."""
    done = subprocess.run(["bash", str(SCRIPT), *extra], env={**os.environ, "DRY_RUN": "1", "SEEDS": seeds},
                          capture_output=True, text=True, timeout=60, check=True)
    return [shlex.split(line) for line in done.stdout.splitlines()]


def overrides(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--set"]


def test_the_byzantine_script_runs_every_row_at_every_seed_under_its_own_id() -> None:
    runs = planned_runs("0 1 2", "--set", "run.rounds=600")
    assert len(runs) == ROWS * 3
    ids = [next(o.split("=", 1)[1] for o in overrides(r) if o.startswith("run.run_id=")) for r in runs]
    assert len(set(ids)) == len(ids)  # no seed overwrites another (output.overwrite is on)
    by_seed = {s: [i for i in ids if i.endswith(f"_s{s}")] for s in "012"}
    assert all(len(v) == ROWS for v in by_seed.values())
    for args in runs:
        assert args[:3] == ["rayfl", "run", "jobs/ffgg/quadratic_byzantine.yaml"]
        cfg = load_config(REPO / args[2], overrides(args))
        assert cfg.run.rounds == 600 and cfg.run.run_id.endswith(f"_s{cfg.run.seed}")
        mean = cfg.robust.aggregator.name == "mean"
        assert (cfg.algorithm.name == "ffgg") == mean  # the plain mean is FFGG itself
    names = {(load_config(REPO / r[2], overrides(r)).robust.attack.name) for r in runs}
    assert names == {"sign_flip", "alie", "gaussian", "none"}


def test_the_table_script_reports_each_rows_points_and_rate_against_the_attack_free_run() -> None:
    import sys

    import numpy as np
    import pandas as pd

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from ffgg_byzantine_table import per_run, table
    finally:
        sys.path.remove(str(REPO / "scripts"))
    r = np.arange(600)
    rounds = pd.concat([
        pd.DataFrame({"run_id": f"{run}_s{seed}", "round": r, "F_norm": 2.0 * np.exp(-rate * r), "dist_sq": 0.5})
        for run, rate in (("none_mean", 0.01), ("gaussian1_mean", 0.005)) for seed in (0, 1)])
    runs = per_run(rounds).set_index(["row", "seed"])
    assert runs.loc[("gaussian1_mean", 1), "F100"] == 2.0 * np.exp(-0.005 * 99)  # after 100 rounds
    assert runs.loc[("none_mean", 0), "Ffinal"] == 2.0 * np.exp(-0.01 * 599)
    text = table(per_run(rounds))
    assert "| `gaussian1_mean` | 600 | 2 → 1.22 → 0.448 → **0.1** | 0.5 | × 0.50 | 0.1 / 0.1 |" in text, text
    assert "| `none_mean` | 600 |" in text and "× 1.00" in text
