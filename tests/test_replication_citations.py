"""A replication page and the code of its paper cite only what a reader with a clone has: the
paper, by title and its own numbering. Notes kept outside the repository (paths under a sibling
`shared/` directory, "spec §5.6", "spec D-9", tags such as [R+]) would leave such a reader with
references they cannot follow. Each page also opens with the data its jobs need.

Pages and modules are listed here once they cite only the paper; the list grows page by page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "docs" / "replications" / name for name in ("zo-hfl.md", "fedrzo.md")]
CODE = sorted(
    [ROOT / "rayfl" / "algorithms" / f"{name}.py" for name in ("zo_hfl", "fedrzo_nn", "fedrzo_bl", "fedmspp", "scaffnew")]
    + list((ROOT / "rayfl" / "zo").glob("*.py"))
    + [p for paper in ("zo_hfl", "fedrzo") for p in (ROOT / "rayfl" / "papers" / paper).glob("*.[pc][ys]*")]
)

# What a reference to notes outside the repository looks like; "spec" alone is fine (a config
# spec, a problem spec), "spec §3", "the spec", "spec D-9" or a confidence tag is not.
OUTSIDE = re.compile(
    r"(?i:\.\./shared|shared/(?:specs|papers|data)|\bspecs/|\bspec(?:'s|\s+(?:§|sec|section|\d|D-\d))"
    r"|\bthe spec\b|\baddendum\b)|\bD-\d+\b|\[(?:S|R\+|R-|R|D|U|P)\]"
)


def outside_references(path: Path) -> list[str]:
    """Each line of `path` that points outside the repository, with its line number."""
    lines = path.read_text().splitlines()
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if OUTSIDE.search(line)]


@pytest.mark.parametrize("path", PAGES + CODE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_cites_nothing_outside_the_repository(path: Path) -> None:
    assert outside_references(path) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_page_opens_with_the_data_its_jobs_need(page: Path) -> None:
    """The first section is "Data": which files, where rayfl looks for them, how to get them."""
    sections = re.split(r"^## ", page.read_text(), flags=re.M)
    assert sections[1].startswith("Data\n"), f"{page.name}: the first section is {sections[1].splitlines()[0]!r}"
    data = sections[1]
    for fact in ("data.data_dir", "$RAYFL_DATA_DIR", "~/.rayfl/data", "data.download", "export RAYFL_DATA_DIR="):
        assert fact in data, f"{page.name}'s Data section does not say {fact}"
    assert not re.search(r"data\.data_dir=\S*shared", page.read_text())


def test_the_pattern_finds_what_it_is_meant_to_and_nothing_else() -> None:
    bad = ["see spec §5.6", "(spec D-9)", "the spec's rule", "../shared/specs/zo-hfl.md", "[R+]", "addendum C1"]
    fine = ["a picklable spec whose `for_client`", "spec: ProblemSpec", "dimensions(spec, n)", "App. D.1",
            "the unit sphere S^{d-1}", "one [d] vector"]
    found = [OUTSIDE.search(line) is not None for line in bad + fine]
    assert found == [True] * len(bad) + [False] * len(fine)
