"""A short version of jobs/soak.yaml: FedBuff on 1,000 clients with hosts killed every 150
launched tasks. Every task is accounted for exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.config import load_config
from rayfl.results import load
from rayfl.runner import run_experiment

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_soak_accounts_for_every_task_once(ray_local, results_dir):
    cfg = load_config(
        REPO / "jobs" / "soak.yaml",
        ["run.rounds=60", "run.eval_every=30", "engine.kill_host_every=150", "engine.num_cpus_per_host=0.5",
         f"output.dir={results_dir}"],
    )
    out = run_experiment(cfg)
    res = load(out.run_dir)
    clients, summary = res.clients, out.summary
    assert clients["task"].is_unique  # nothing counted twice, re-runs included
    assert set(clients["task"]) <= set(range(summary["tasks_issued"]))
    assert len(clients) + summary["tasks_discarded"] == summary["tasks_issued"]  # nothing lost
    assert set(clients["outcome"]) <= {"ok", "stale", "dropped", "offline"}
    assert (clients["outcome"] == "ok").sum() == 60 * cfg.algorithm.buffer_size
    assert summary["host_failures"] >= 3 and res.rounds["host_failures"].sum() == summary["host_failures"]
    assert clients["rerun"].sum() >= 1
