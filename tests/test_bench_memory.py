"""`rayfl bench memory`: a real run on 2 hosts in its own process (a small MLP: what is tested
is the measuring, not the model), the figures the benchmarks page reads from its JSON, and the
command line that runs the 19.2M-parameter MLP."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rayfl.bench.memory import run_memory_bench
from rayfl.cli import build_parser

MODEL_MB = 784 * 512 * 4 / 2**20  # the hidden layer's weights in float32


@pytest.mark.slow
def test_the_bench_reports_each_hosts_peak_and_the_trees(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    args = build_parser().parse_args(["bench", "memory", "--clients", "2", "--rounds", "1", "--vectorize", "off",
                                      "--out", str(out)])
    assert (args.clients, args.rounds, args.vectorize) == ([2], 1, ["off"])
    run_memory_bench(args.clients, args.rounds, out, tuple(args.vectorize), hidden="[512]")
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
