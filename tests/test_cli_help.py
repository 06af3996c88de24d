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


def _parsers(parser, path=()):
    """Every (sub)command's parser with its command path, depth first."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_commands_help_renders() -> None:
    """`--help` of every command and subcommand prints (argparse formats help with %: a help
    text with a bare % crashed `rayfl bench --help`)."""
    from rayfl.cli import build_parser

    seen = 0
    for path, parser in _parsers(build_parser()):
        assert parser.format_help(), path
        seen += 1
    assert seen > 10
