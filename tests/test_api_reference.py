"""The Python API reference (docs/reference/api.md) is generated from the source and committed:
it must equal a fresh render, name every public name, and hold nothing that changes from one
process or library version to the next."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import rayfl
from rayfl import api_reference
from rayfl.api_reference import COMMAND, SECTIONS, Section, render_markdown, source_node
from rayfl.docstrings import parse, to_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "api.md"
PUBLIC = [name for name in rayfl.__all__ if name != "__version__"]


def test_the_committed_page_equals_a_fresh_render() -> None:
    assert PAGE.read_text() == render_markdown(), f"docs/reference/api.md is out of date: {COMMAND}"


def test_every_public_name_has_one_heading_and_a_docstring() -> None:
    text = PAGE.read_text()
    headings = [line.removeprefix("### ") for line in text.splitlines() if line.startswith("### ")]
    assert sorted(headings) == sorted(f"`rayfl.{name}`" for name in PUBLIC)
    undocumented = [name for name in PUBLIC if not ast.get_docstring(source_node(getattr(rayfl, name))[0])]
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_a_public_name_no_section_places_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    shorter = tuple(Section(s.title, s.intro, tuple(n for n in s.names if n != "local_sgd")) for s in SECTIONS)
    monkeypatch.setattr(api_reference, "SECTIONS", shorter)
    with pytest.raises(ValueError, match="local_sgd"):
        render_markdown()


def test_the_page_holds_source_text_not_runtime_reprs() -> None:
    text = PAGE.read_text()
    for runtime in (" at 0x", "<factory>", "<function", "<class ", "\n::: "):
        assert runtime not in text, runtime
    # a dataclass default made by a factory is written as the source writes it
    assert "work: WorkMeter = field(default_factory=WorkMeter)" in text


def test_every_field_of_a_rendered_dataclass_is_in_its_block() -> None:
    text = PAGE.read_text()
    for name in PUBLIC:
        obj = getattr(rayfl, name)
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            block = text.split(f"### `rayfl.{name}`", 1)[1].split("```", 2)[1]
            missing = [f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")
                       and f"\n    {f.name}:" not in block]
            assert not missing, (name, missing)


def sample(job: str, overrides: list[str] | None = None) -> int:
    """Count a job's runs.

    Args:
        job: the job file,
            read as YAML.
        overrides: `section.key=value` strings.

    Returns:
        How many runs
        it makes.

    Raises:
        ConfigError: a bad key."""
    return 1


def test_google_sections_become_lists_with_the_signatures_types() -> None:
    node = ast.parse(Path(__file__).read_text()).body
    func = next(n for n in node if isinstance(n, ast.FunctionDef) and n.name == "sample")
    text = to_markdown(parse(ast.get_docstring(func)), api_reference.arg_types(func))
    assert text == (
        "Count a job's runs.\n\n"
        "**Arguments**\n\n"
        "- `job` (`str`): the job file, read as YAML.\n"
        "- `overrides` (`list[str] | None`): `section.key=value` strings.\n\n"
        "**Returns**\n\n"
        "- `int`: How many runs it makes.\n\n"
        "**Raises**\n\n"
        "- `ConfigError`: a bad key."
    )
