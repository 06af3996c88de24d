"""`rayfl bench memory`: a real run of the 19.2M-parameter MLP on 2 hosts in its own process,
and the figures the benchmarks page reads from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rayfl.cli import main

MODEL_MB = 19_184_010 * 4 / 2**20  # 784-4000-4000-10 in float32


@pytest.mark.slow
def test_the_bench_reports_each_hosts_peak_and_the_trees(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    assert main(["bench", "memory", "--clients", "2", "--rounds", "1", "--vectorize", "off", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (point,) = result["curves"]["off"]
    assert point["clients_per_round"] == 2 and point["tree_above_first_mb"] == 0.0
    hosts = point["host_peak_rss_mb"]
    assert len(hosts) == 2
    for peak in hosts:  # each host holds its model, the broadcast and its client's output at least
        assert MODEL_MB < peak < point["tree_peak_rss_mb"]
    assert point["tree_peak_rss_mb"] > sum(hosts)  # the driver and Ray's processes besides
    rows = pd.read_parquet(out.with_suffix(".parquet"))
    assert list(rows["clients_per_round"]) == [2] and list(rows["vectorize"]) == ["off"]
    assert result["provenance"]["commit"]
