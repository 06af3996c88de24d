"""The repository cites only what a reader with a clone has: the papers, by title and by their
own numbering (section, algorithm, equation, figure, table, page, appendix). Notes kept outside
it (a sibling `shared/` directory, "spec §5.6", "spec A6", "spec D-9", "spec zo-nondiff.md 7.4",
confidence tags such as [R+]) would leave that reader with references they cannot follow. Each
replication page also opens with the data its jobs need, so a reader knows what to fetch first."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
PAGES = sorted((ROOT / "docs" / "replications").glob("*.md"))

# A reference to notes outside the repository. "spec" alone is fine (a config spec, a task spec,
# `spec: ProblemSpec`); "spec" followed by a section, label or file of the notes is not, nor is a
# path into a `shared/` folder. The notes' confidence tags ([S], [R], [R+], [U], ...) are told
# apart from code by what surrounds them: `Generic[S]` is a type argument, `int64 [P]: rows` and
# `null: [D], or` are array shapes.
OUTSIDE = re.compile(
    r"(?i:\.\./shared|\bshared/|\bspecs/|\bthe spec\b|\bspec's\b|\baddendum\b|\bspec\s+(?:§"
    r"|sec\b|sec\.|section|app\b|app\.|alg\b|alg\.|key fact|check\b|[A-Z]?-?\d|[\w-]+\.md\b))"
    r"|\bD-\d+\b|\[R[+-]\]|(?<![\w\]])(?<!: )\[[SRUDP]\](?!:)"
)
# Every match of OUTSIDE holds one of these, lower-cased; a line with none skips the pattern,
# which keeps the scan of some 400 files well under a second.
MARKERS = ("spec", "shared", "addendum", "d-", "[r", "[s]", "[u]", "[d]", "[p]")


def cites_outside(line: str, next_word: str = "") -> bool:
    """Whether `line` points outside the repository. `next_word`, the first word of the line
    below, catches a label that a line break cut off ("... spec" / "A15: ...")."""
    text = f"{line} {next_word}"
    low = text.lower()
    if not any(marker in low for marker in MARKERS):
        return False
    match = OUTSIDE.search(text)
    return match is not None and match.start() < len(line)


def first_word(line: str) -> str:
    """The first word of a line, past comment and list markers."""
    words = line.lstrip(" \t#*>-/\"'").split(maxsplit=1)
    return words[0] if words else ""


def scanned_files() -> Iterator[Path]:
    """Every file a reader of the repository reads for what rayfl does and why."""
    yield from (p for p in (ROOT / "rayfl").rglob("*") if p.suffix in (".py", ".csv", ".yaml"))
    yield from (p for p in (ROOT / "jobs").rglob("*") if p.is_file() and p.suffix != ".pyc")
    yield from (ROOT / "docs").rglob("*.md")
    yield from (ROOT / "README.md", ROOT / "CHANGELOG.md")
    yield from (p for p in (ROOT / "tests").rglob("*.py") if p != THIS)


def outside_references(path: Path) -> list[str]:
    """Each line of `path` that points outside the repository, as `file:line: text`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    below = [*map(first_word, lines[1:]), ""][: len(lines)]
    where = path.relative_to(ROOT).as_posix()
    pairs = enumerate(zip(lines, below, strict=True), 1)
    return [f"{where}:{n}: {line.strip()}" for n, (line, nxt) in pairs if cites_outside(line, nxt)]


def test_the_pattern_finds_what_it_is_meant_to_and_nothing_else() -> None:
    """Labels of the notes in every form the repository once had, and look-alikes from code."""
    bad = ["see spec §5.6", "(spec D-9)", "the spec's rule", "(spec 6.11)", "(spec A6)", "spec A14",
           "(spec Sec. 3.2)", "spec zo-nondiff.md 7.4", "spec Key fact 4", "Spec 2.4: the mean",
           "(spec Alg. 1 and 2)", "Spec check 3: g = identity",
           "spec `../shared/specs/zo-hfl.md`", "specs/comfedl.md", "/work/shared/data/mnist",
           "eta <= mu / 2 (D-10)", "[R+]", "[R-]", "a reconstruction [R] (see", "| [P] |",
           "Remark 6 [S]. this", "addendum C1"]
    fine = ["a picklable spec whose `for_client`", "spec: ProblemSpec", "dimensions(spec, n)",
            "a task spec", "a job spec", "upload_spec(keys)", "App. D.1", "the unit sphere S^{d-1}",
            "one [d] vector", "class MAML(Algorithm[S]):", "int64 [P]: rows of each part",
            "null: [D], or a nested list", "shared storage", "--set output.dir=/mnt/nfs/results"]
    found = [cites_outside(line) for line in bad + fine]
    assert found == [True] * len(bad) + [False] * len(fine)
    # a label cut by a line break belongs to the first line; one wholly on the second, to that one
    cut = [("(rho = 0.1 is IID; spec", "# A15: {0.1, 0.28}"), ("as in spec", "  §3.7 of")]
    whole = [("a picklable", "spec whose `for_client`"), ("the values (see", "# [R+] below)")]
    found = [cites_outside(line, first_word(below)) for line, below in cut + whole]
    assert found == [True, True, False, False]


def test_nothing_cites_outside_the_repository() -> None:
    hits = [hit for path in sorted(scanned_files()) for hit in outside_references(path)]
    assert not hits, "references outside the repository:\n" + "\n".join(hits)


def test_every_paper_has_a_replication_page() -> None:
    assert {page.stem for page in PAGES} >= {"zo-hfl", "fedrzo", "ffgg", "comfedl"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_page_opens_with_the_data_its_jobs_need(page: Path) -> None:
    """The first section is "Data": which files, where rayfl looks for them, how to work offline;
    the page's commands rely on that default or the environment variable, never a path of ours."""
    lines = page.read_text(encoding="utf-8").splitlines()
    where = page.relative_to(ROOT).as_posix()
    headings = [n for n, line in enumerate(lines) if line.startswith("## ")]
    assert headings, f"{where}: no ## section"
    first = headings[0]
    assert lines[first] == "## Data", f"{where}:{first + 1}: the first section is {lines[first]!r}"
    end = headings[1] if len(headings) > 1 else len(lines)
    data = "\n".join(lines[first:end])
    for fact in ("data.data_dir", "$RAYFL_DATA_DIR", "~/.rayfl/data", "data.download",
                 "export RAYFL_DATA_DIR="):
        assert fact in data, f"{where}:{first + 1}: the Data section does not say {fact}"
    pinned = [f"{where}:{n}" for n, line in enumerate(lines, 1) if "data.data_dir=" in line]
    assert not pinned, f"commands that pin data.data_dir instead of the default: {pinned}"
