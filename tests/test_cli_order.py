"""`rayfl run` says what this machine cannot do (hosts that cannot fit, GPUs it does not have)
before it builds the dataset and before any progress bar: stderr holds the one error line and
nothing else (no dataset summary above it, no bar at 0%), without --quiet."""

from __future__ import annotations

import pytest
from test_user_errors import assert_one_line, finish, left_running, start_cli

CASES = {
    "gpu-share-without-gpu": (["engine.num_gpus_per_host=0.5"], "engine.num_gpus_per_host"),
    "cuda-without-gpu": (["engine.device=cuda"], "engine.device"),
    "a-4-cpu-host-on-2-cpus": (["engine.num_cpus_per_host=4"], "engine.num_cpus_per_host"),
    "one-host-per-client": (["engine.clients_per_host=1", "partition.num_clients=100"], "engine.clients_per_host"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_resource_mistakes_come_before_the_data_and_any_bar(case, tmp_path):
    overrides, field = CASES[case]
    argv = ["run", "--set", f"output.dir={tmp_path / 'results'}", *[a for o in overrides for a in ("--set", o)]]
    (ray_tmp := tmp_path / "ray").mkdir()
    result = finish(start_cli(tmp_path / "cwd", argv, ray_tmp))
    assert_one_line(result.returncode, result.stderr, (field,))  # no "synthetic(1,1): 100 clients ..." line
    assert left_running(ray_tmp) == []
    assert not (tmp_path / "results").exists()
