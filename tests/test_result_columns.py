"""The writer's columns (rayfl.results.columns) are the arrays `pa.array` makes, built without
it: a run's driver must not import pandas to write its tables (0.3-0.45 s of a short run)."""

from __future__ import annotations

import math
import subprocess
import sys

import pyarrow as pa
import pytest

from rayfl.results.columns import column

CASES = {
    "float64": (pa.float64(), [[1.0, None, math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324], [], [None, None], [2.5] * 17]),
    "int64": (pa.int64(), [[1, None, -(2**63), 2**63 - 1, 0], [None] * 9, [5]]),
    # more than a byte of values, so the bit order of both bitmaps matters
    "bool": (pa.bool_(), [[True, False, None, True, True, False, False, True, True, None, False], [False] * 33, [True], []]),
    "string": (pa.string(), [["a", None, "", "héllo ☃", "x" * 1000, "tab\tnl\n"], [None], [], ["", ""]]),
    "null": (pa.null(), [[None, None, None], []]),
}


def same(a: pa.Array, b: pa.Array) -> bool:
    """Equal types, lengths, nulls and values, NaN equal to NaN and -0.0 told from 0.0."""
    def key(v: object) -> object:
        if isinstance(v, float):
            return ("nan",) if math.isnan(v) else (v, math.copysign(1.0, v))
        return (type(v).__name__, v)

    return (a.type == b.type and len(a) == len(b) and a.null_count == b.null_count
            and [key(v) for v in a.to_pylist()] == [key(v) for v in b.to_pylist()])


@pytest.mark.parametrize("name", sorted(CASES))
def test_columns_equal_pa_array(name):
    type_, lists = CASES[name]
    for values in lists:
        got = column(values, type_)
        got.validate(full=True)
        assert same(got, pa.array(values, type=type_)), (name, values, got)


def test_a_value_too_large_for_int64_is_refused_as_pa_array_refuses_it():
    with pytest.raises((OverflowError, pa.ArrowInvalid)):
        pa.array([2**63], type=pa.int64())
    with pytest.raises(OverflowError):
        column([2**63], pa.int64())


def test_writing_a_run_s_tables_imports_no_pandas(tmp_path):
    code = f"""
import sys
from rayfl.results.writer import RunWriter
w = RunWriter({str(tmp_path)!r}, "exp", "r1", {{"config": {{}}}})
w.append("rounds", {{"round": 0, "loss": 0.5, "name": "a", "ok": True, "missing": None}})
w.append("clients", {{"round": 0, "client": 3, "loss": None}})
w.flush()
w.close("completed")
assert "pandas" not in sys.modules, "pandas was imported"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
