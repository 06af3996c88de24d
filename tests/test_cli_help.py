"""`rayfl --help` teaches: it names every built-in algorithm, and nothing that is not one."""

from __future__ import annotations

import re

from rayfl.algorithms.catalog import BUILTIN
from rayfl.cli import EPILOG


def test_help_lists_exactly_the_registered_algorithms() -> None:
    block = EPILOG.split("algorithms (algorithm.name", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in block.splitlines()[1:] if not line.strip().startswith("(")]
    listed = {name for row in rows for name in re.split(r"\s{2,}", row.strip(), maxsplit=1)[1].split()}
    assert listed == {name for name, *_ in BUILTIN}
