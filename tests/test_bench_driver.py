"""`rayfl bench driver`: real runs on 1 and 2 hosts, each in its own process, and the figures
the benchmarks page reads from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayfl.bench.driver import WARMUP_ROUNDS, per_round
from rayfl.cli import main


def test_per_round_is_the_gaps_between_rounds_after_the_warm_up() -> None:
    marks = {r: float(r * r) for r in range(WARMUP_ROUNDS + 4)}  # gaps 1, 3, 5, 7, ...
    gaps = per_round(marks)
    assert list(gaps) == [2.0 * r + 1 for r in range(WARMUP_ROUNDS, WARMUP_ROUNDS + 3)]


@pytest.mark.slow
def test_the_bench_fits_the_driver_cpu_per_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "driver.json"
    assert main(["bench", "driver", "--hosts", "1,2", "--rounds", str(WARMUP_ROUNDS + 4), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    curve = result["curve"]
    assert [c["hosts"] for c in curve] == [1, 2]
    for c in curve:
        assert c["driver_cpu_ms_per_round"] > 0
        assert c["driver_cpu_ms_per_host_per_round"] == pytest.approx(c["driver_cpu_ms_per_round"] / c["hosts"], abs=1e-3)
    slope = curve[1]["driver_cpu_ms_per_round"] - curve[0]["driver_cpu_ms_per_round"]  # a line through two points
    assert result["marginal_driver_cpu_ms_per_host"] == pytest.approx(slope, abs=2e-3)
    assert result["provenance"]["commit"]
