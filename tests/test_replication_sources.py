"""The FFGG and ComFedL replication pages and code cite only what a clone has: the papers by
title and their own numbering, never notes or data outside the repository, and each page
says first what data it needs and how to get it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "docs" / "replications" / name for name in ("ffgg.md", "comfedl.md")]
ALGORITHMS = ["ffgg", "async_ffgg", "finetune", "local_finetune", "comfedl", "drfa", "qfedavg", "maml",
              "per_fedavg", "tr_maml", "ditto", "l2gd", "fedavg_adapt", "personalized_eval",
              "round_lr", "server_opt"]
CODE = sorted(
    [REPO / "rayfl" / "algorithms" / f"{name}.py" for name in ALGORITHMS]
    + [p for folder in ("models", "data", "robust", "papers/ffgg", "papers/comfedl")
       for p in (REPO / "rayfl" / folder).rglob("*") if p.suffix in (".py", ".csv")]
)

# A path into the shared folder beside the checkout, or a section of our own notes on a paper
# ("spec §6.24", "spec A14", "the spec's check"), which a reader with a clone cannot open.
OUTSIDE = re.compile(
    r"\.\./shared|shared/(?:specs|papers|data)|specs/"
    r"|\bspec(?:'s)?\s+(?:§|Sec\.|App\.|Key fact|A?\d)|\bthe spec\b|\bspec's\b"
)


def outside_references(path: Path) -> list[str]:
    """The lines of `path` that point outside the repository, as `line: text`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{i}: {line.strip()}" for i, line in enumerate(lines, 1) if OUTSIDE.search(line)]


def test_the_pattern_catches_what_it_must() -> None:
    for text in ("spec `../shared/specs/partial-personalization.md`", "(spec §6.24)", "spec A14",
                 "(spec 6.11)", "the spec's own check", "spec Key fact 4", "spec Sec. 3.5"):
        assert OUTSIDE.search(text), text
    for text in ("def f(spec: SplitSpec)", "upload_spec(keys)", "Split(spec, theta)", "a job spec"):
        assert not OUTSIDE.search(text), text


@pytest.mark.parametrize("path", PAGES + CODE, ids=lambda p: p.relative_to(REPO).as_posix())
def test_cites_nothing_outside_the_repository(path: Path) -> None:
    assert outside_references(path) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_starts_with_its_data(page: Path) -> None:
    """The first section is `## Data`, and it says where the files go and how to work offline."""
    text = page.read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert sections[0] == "Data"
    data = text.split("## Data", 1)[1].split("\n## ", 1)[0]
    for fact in ("data.data_dir", "$RAYFL_DATA_DIR", "~/.rayfl/data", "data.download",
                 "export RAYFL_DATA_DIR="):
        assert fact in data, fact
    assert "data.data_dir=" not in text  # commands rely on the default or the environment variable
