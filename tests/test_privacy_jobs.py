"""The privacy / compression / robustness jobs (jobs/privacy/, results in
docs/guides/privacy-compression-robustness.md) validate: each base job as `rayfl run` reads it,
and every trial of its sweep, with the seeds the guide's tables average over."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.sweep import build_spec, load_base_config, plan_trials, read_job

JOBS = sorted((Path(__file__).resolve().parents[1] / "jobs" / "privacy").glob("*.yaml"))
ON_ANY_MACHINE = ["data.download=true"]  # the offline MNIST files may be absent here


def test_there_are_privacy_jobs():
    assert {p.stem for p in JOBS} >= {"dp_fedavg", "dp_fedavg_baseline", "topk", "robust"}


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.stem)
def test_privacy_job_and_every_trial_validate(job, tmp_path):
    cfg, is_sweep = load_base_config(job, ON_ANY_MACHINE)
    assert is_sweep and cfg.data.dataset == "mnist" and cfg.data.source == "test_only"
    raw, block = read_job(job)
    spec = build_spec(block)
    assert spec.seeds == [0, 1, 2]
    trials = plan_trials(raw, ON_ANY_MACHINE, spec, str(tmp_path), spec.name or job.stem)
    assert len(trials) == 3 * len({t.run_id.rsplit(",", 1)[0] for t in trials})
