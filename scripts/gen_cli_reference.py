"""Write docs/reference/cli.md from rayfl's argparse parser (`rayfl.cli.build_parser`).

    python scripts/gen_cli_reference.py           # rewrite the page
    python scripts/gen_cli_reference.py --check   # exit 1 when the page is out of date

The page is built from the parser's actions, not from `--help`'s text, so it does not depend on
the Python version's help formatting. tests/test_docs_site.py regenerates it and compares."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "cli.md"

INTRO = """\
# Command line

This page is generated from rayfl's argument parser by `python scripts/gen_cli_reference.py`;
the test suite regenerates it and fails when it differs from the committed page. `rayfl
COMMAND --help` prints the same options in the terminal.

Every command that takes a job (`run`, `sweep`, `validate`, `partition`) accepts a job file, an
example shipped with rayfl (`--example NAME`, see `rayfl list examples`) or neither (the default
job), and any number of `--set SECTION.KEY=VALUE` overrides in YAML syntax. The keys are listed
in the [configuration reference](config.md).
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """One-line help of each subcommand, as `rayfl --help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    skip = (argparse._HelpAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, skip)]


def _name(action: argparse.Action) -> str:
    if action.option_strings:
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:
            return flag
        return f"{flag} {action.metavar or action.dest.upper()}"
    if action.choices is not None and action.metavar is None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return str(action.metavar or action.dest)


def _usage(prog: str, parser: argparse.ArgumentParser) -> str:
    parts = []
    for action in _arguments(parser):
        name = _name(action)
        optional = action.option_strings or action.nargs == "?"
        parts.append(f"[{name}]" if optional else name)
    if _subparsers(parser):
        parts.append("COMMAND" if prog == "rayfl" else "BENCH")
    return " ".join([prog, *parts])


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS or isinstance(value, bool) or value == []:
        return ""
    if isinstance(value, (list, tuple)):
        return "`" + ",".join(map(str, value)) + "`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _meaning(action: argparse.Action) -> str:
    text = (action.help or "").replace("%%", "%")
    if action.option_strings and action.choices is not None:
        text = f"{text} (one of: {', '.join(map(str, action.choices))})".strip()
    return _cell(text)


def _section(prog: str, parser: argparse.ArgumentParser, summary: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{prog}`", ""]
    text = parser.description or summary
    if text:
        out += [_cell(text), ""]
    out += ["```text", _usage(prog, parser), "```", ""]
    arguments = _arguments(parser)
    if arguments:
        out += ["| argument | default | meaning |", "|---|---|---|"]
        out += [f"| `{_name(a)}` | {_default(a)} | {_meaning(a)} |" for a in arguments]
        out.append("")
    if parser.epilog:
        out += ["```text", parser.epilog.rstrip(), "```", ""]
    helps = _helps(parser)
    for name, sub in _subparsers(parser).items():
        out += _section(f"{prog} {name}", sub, helps.get(name, ""), level + 1)
    return out


def render() -> str:
    from rayfl.cli import build_parser

    parser = build_parser()
    return INTRO + "\n" + "\n".join(_section("rayfl", parser, "", 2)).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    check = args.parse_args(argv).check
    text = render()
    if check:
        if PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: python scripts/gen_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
