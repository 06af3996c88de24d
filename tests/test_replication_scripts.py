"""The replication pages' tables come from scripts (jobs/ffgg/*.sh and jobs/fedrzo/*.sh on
jobs/grid.sh): every row of a table at every seed asked for, each run under its own id, each
command a valid job; and the table scripts (scripts/seed_table.py,
scripts/ffgg_byzantine_table.py) read the runs right."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl.config import load_config

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "jobs" / "ffgg" / "byzantine.sh"
# the table's rows: 13 of one run each, and the row of four other aggregators under Gaussian noise
ROWS = 17


def planned_runs(seeds: str, *extra: str, script: Path = SCRIPT, env: dict[str, str] | None = None) -> list[list[str]]:
    """The `rayfl run` commands the script would run, as argument lists."""
    done = subprocess.run(["bash", str(script), *extra], env={**os.environ, "DRY_RUN": "1", "SEEDS": seeds, **(env or {})},
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


# the other grids of the pages: script -> (runs a seed, the rounds of some of its rows)
GRIDS = {"ffgg/fig1a.sh": (8, {"cg_tau10": 2000, "cg_tau40_long": 4000}),
         "ffgg/fig1bcd.sh": (16, {"ffgg_tau500": 200, "scaffold_tau500": 100, "ffgg_tau100_long": 2000}),
         "ffgg/async.sh": (9, {"async_small_k4_worker": 1500, "async_full_k4": 10000, "async_full_k4_worker": 10000}),
         "fedrzo/fig1.sh": (12, {"eta0.001_H20": 300, "eta0.1_H1": 300}),
         "fedrzo/fig2.sh": (4, {"hyper_H1": 150, "hyper_H10": 60, "fair_H1": 100, "fair_H10": 100}),
         "fedrzo/fig3.sh": (29, {"fedrzo_nn_H5": 300, "fedmspp_H20_beta10": 300}),
         "fedrzo/fig3_lr.sh": (13, {"fedavg_lr0.03": 300}),
         "fedrzo/fig4.sh": (36, {"N100_eta0.01_H10": 300}),
         "zo_hfl/ablations.sh": (15, {"a0.1_b0.1_zo_hfl_lam0": 500, "a1000_b0.9_fedavg_multiplier2": 500})}


@pytest.mark.parametrize("script", sorted(GRIDS))
def test_each_figure_script_runs_every_row_at_every_seed_under_its_own_id(script: str) -> None:
    per_seed, rounds = GRIDS[script]
    runs = planned_runs("0 1 2", "--set", "output.dir=/tmp/x", script=REPO / "jobs" / script)
    assert len(runs) == 3 * per_seed
    configs = [load_config(REPO / args[2], overrides(args)) for args in runs]
    ids = [c.run.run_id for c in configs]
    assert len(set(ids)) == len(ids)
    assert all(c.run.run_id.endswith(f"_s{c.run.seed}") and c.output.dir == "/tmp/x" for c in configs)
    assert {c.run.seed for c in configs} == {0, 1, 2}
    for c in configs:
        row = c.run.run_id.rsplit("_s", 1)[0]
        if row in rounds:
            assert c.run.rounds == rounds[row], row


def test_fedrzo_scripts_run_the_rows_the_page_reads() -> None:
    runs = planned_runs("0", script=REPO / "jobs" / "fedrzo" / "fig3.sh")
    configs = {c.run.run_id: c for c in (load_config(REPO / a[2], overrides(a)) for a in runs)}
    # FedMSPP at H = 20 twice: in the figure at the grid's lr, and at lr = 0.1 in its own experiment
    assert configs["fedmspp_H20_beta1_s0"].run.experiment == "fedrzo_fig3"
    assert configs["fedmspp_lr0.1_H20_beta1_s0"].run.experiment == "fedrzo_fig3_fedmspp_h20"
    assert configs["fedmspp_lr0.1_H20_beta1_s0"].algorithm.lr == 0.1
    assert configs["fedrzo_nn_H5_s0"].algorithm.name == "fedrzo_nn" and configs["fedrzo_nn_H5_s0"].run.experiment == "fedrzo_fig3"
    assert configs["fedprox_H5_beta100_s0"].model.softplus_beta == 100
    lr = planned_runs("0", script=REPO / "jobs" / "fedrzo" / "fig3.sh", env={"LR_FEDAVG": "0.3"})
    fedavg = [load_config(REPO / a[2], overrides(a)) for a in lr if "algorithm.name=fedavg" in a]
    assert len(fedavg) == 6 and all(c.algorithm.lr == 0.3 for c in fedavg)
    # an H without its own job keeps the H = 10 job's local-step budget
    extra = planned_runs("0", script=REPO / "jobs" / "fedrzo" / "fig2.sh", env={"HS": "5 20", "PROBLEMS": "hyper"})
    assert [(c.algorithm.local_steps, c.run.rounds) for c in (load_config(REPO / a[2], overrides(a)) for a in extra)] == \
        [(5, 120), (20, 30)]


def run_grid(tmp_path: Path, run_body: str, rows: list[str]) -> tuple[int, list[str]]:
    """Source jobs/grid.sh, define `run` (a stand-in for rayfl that logs its arguments), add
    `rows` (grid_add lines), run the grid at SEEDS="0 1", PARALLEL=2: (exit status, logged calls)."""
    log = tmp_path / "log"
    log.touch()
    driver = tmp_path / "grid_test.sh"
    lines = "\n".join(rows)
    driver.write_text(f"""source {REPO / "jobs" / "grid.sh"}
run() {{ echo "$*" >> {log}; {run_body}; }}
{lines}
grid_run
""")
    done = subprocess.run(["bash", str(driver)], env={**os.environ, "SEEDS": "0 1", "PARALLEL": "2"},
                          capture_output=True, text=True, timeout=60)
    return done.returncode, log.read_text().splitlines()


def run_ids(calls: list[str]) -> list[str]:
    return sorted(line.split("run.run_id=")[1].split()[0] for line in calls)


def test_grid_runs_every_command_parallel_and_retries_a_failed_run_once(tmp_path: Path) -> None:
    status, calls = run_grid(tmp_path, '[[ "$*" != *bad_s1* ]]', ["grid_add good run a", "grid_add bad run b"])
    assert status == 1  # bad_s1 failed twice
    assert run_ids(calls) == ["bad_s0", "bad_s1", "bad_s1", "good_s0", "good_s1"]
    assert all("output.overwrite=true" in line for line in calls)


@pytest.mark.parametrize("first_bad", [True, False])
def test_grid_stops_at_a_run_that_exits_2_without_retrying_it(tmp_path: Path, first_bad: bool) -> None:
    # exit 2 is bad input or missing data (one line from rayfl): retrying it, or starting the
    # other runs, would print that line once per run
    rows = ["grid_add bad run b", "grid_add later run c"]
    status, calls = run_grid(tmp_path, '[[ "$*" == *bad_s* ]] && return 2; sleep 0.5',
                             rows if first_bad else ["grid_add good run a", *rows])
    assert status == 2
    # the first run goes alone; then good_s1 and bad_s0 side by side, and nothing after bad_s0
    assert run_ids(calls) == (["bad_s0"] if first_bad else ["bad_s0", "good_s0", "good_s1"])


def test_a_grid_without_its_data_stops_in_one_line_naming_the_files(tmp_path: Path) -> None:
    # the FedRZO page's first command, with an empty data directory: rayfl's one line, once
    empty = tmp_path / "data"
    empty.mkdir()
    done = subprocess.run(
        ["bash", str(REPO / "jobs" / "fedrzo" / "fig1.sh"), "--set", "data.source=test_only",
         "--set", "data.download=false", "--set", f"output.dir={tmp_path / 'results'}"],
        env={**os.environ, "RAYFL_DATA_DIR": str(empty), "SEEDS": "0 1 2", "PARALLEL": "2"},
        capture_output=True, text=True, timeout=120)
    out = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2
    assert len(out) == 1 and "t10k-images-idx3-ubyte" in out[0] and str(empty / "mnist") in out[0]


def test_seed_table_reports_points_minimum_finals_and_every_seed() -> None:
    seed_table = scripts_module("seed_table")
    r = np.arange(0, 2000, 1)
    rounds = pd.concat([
        pd.DataFrame({"run_id": f"cg_tau{tau}_s{seed}", "round": r, "F_norm": (1.0 + seed) * np.exp(-rate * r) + 0.01,
                      "dist_sq": np.where(r == r[-1], 0.25 * (seed + 1), np.nan)})
        for tau, rate in ((1, 0.001), (5, 0.004)) for seed in (0, 1)]
        + [pd.DataFrame({"run_id": ["no_seed_suffix"], "round": [0], "F_norm": [1.0], "dist_sq": [1.0]})])
    runs = seed_table.per_run(rounds, "F_norm", (500, 1000), ("dist_sq",), tail=2).set_index(["row", "seed"])
    assert runs.loc[("cg_tau1", 0), "tail"] == pytest.approx(np.exp(-0.001 * 1998.5) * np.cosh(0.0005) + 0.01, rel=1e-12)
    assert runs.loc[("cg_tau5", 1), "at500"] == 2.0 * np.exp(-0.004 * 499) + 0.01  # after 500 rounds
    assert runs.loc[("cg_tau1", 0), "dist_sq"] == 0.25 and runs.loc[("cg_tau1", 1), "rounds"] == 2000
    assert "no_seed_suffix" not in runs.index.get_level_values("row")
    text = seed_table.table(runs.reset_index(), "F_norm", (500, 1000), ("dist_sq",), show_min=True,
                            rows=["cg_tau5", "cg_tau1"])
    lines = text.splitlines()
    assert lines[0] == ("| run | rounds | F_norm after 500 → 1000 → final (mean over seeds) | min (mean) | dist_sq final"
                        " | final F_norm at seed 0 / 1 |")
    assert lines[2] == ("| `cg_tau5` | 2000 | 0.214 → 0.0376 → **0.0105** | 0.0105 | 0.375 | 0.0103 / 0.0107 |")
    assert lines[3].startswith("| `cg_tau1` |")
    # rounds to F <= 0.1: (1 + seed) e^(-rate r) + 0.01 <= 0.1 first at r = ceil(ln((1 + seed) / 0.09) / rate),
    # i.e. round index 602 / 776 for tau = 5 (603 / 777 rounds); tau = 1 at seed 0 needs r = 2408 > 2000
    reach = seed_table.per_run(rounds, "F_norm", (), reach=0.1)
    assert seed_table.table(reach, "F_norm", (), rows=["cg_tau5", "cg_tau1"], reach=0.1).splitlines()[2:] == [
        "| `cg_tau5` | 2000 | **0.0105** | 603 / 777 | 0.0103 / 0.0107 |",
        "| `cg_tau1` | 2000 | **0.213** | > 2000 / > 2000 | 0.145 / 0.281 |"]


def test_seed_table_reports_the_staleness_of_accepted_updates() -> None:
    seed_table = scripts_module("seed_table")
    clients = pd.DataFrame({"run_id": ["a_s0"] * 4 + ["a_s1"] * 2, "outcome": ["ok", "ok", "ok", "late", "ok", "ok"],
                            "staleness": [0, 2, 4, 40, 1, 9], "client": [3, 3, 5, 7, 1, 2]})
    stale = seed_table.staleness(clients).set_index("seed")
    assert stale.loc[0, "stale_mean"] == 2.0 and stale.loc[0, "stale_max"] == 4  # the late task is not applied
    rounds = pd.DataFrame({"run_id": ["a_s0", "a_s1"], "round": [0, 0], "F_norm": [1.0, 3.0]})
    runs = seed_table.per_run(rounds, "F_norm", ()).merge(stale.reset_index(), on=["row", "seed"])
    assert seed_table.table(runs, "F_norm", ()).splitlines()[2] == "| `a` | 1 | **2** | 3.5 / 9 | 2 | 1 / 3 |"


def scripts_module(name: str):
    import importlib
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "scripts"))


def test_the_table_script_reports_each_rows_points_and_rate_against_the_attack_free_run() -> None:
    byzantine = scripts_module("ffgg_byzantine_table")
    per_run, table = byzantine.per_run, byzantine.table
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
