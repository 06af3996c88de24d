"""Every guide's code runs as written: docs/guides/*.md's blocks, files written and commands
run in order in a fresh directory (see guide_blocks), so a guide cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest
from guide_blocks import blocks, run_page

GUIDES = sorted((Path(__file__).resolve().parents[1] / "docs" / "guides").glob("*.md"))


def test_there_are_guides_with_code() -> None:
    assert GUIDES and all(any(b.runs for b in blocks(g.read_text())) for g in GUIDES)


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES, ids=[g.stem for g in GUIDES])
def test_a_guides_code_runs(guide: Path, tmp_path: Path) -> None:
    outputs = run_page(guide, tmp_path)
    assert outputs
    if guide.stem == "extending":
        commands = outputs[1]  # rayfl validate, the same with a mistake, rayfl run
        assert "server_lr: 1.0" in commands and "conv1: 4" in commands
        assert "rayfl: error: algorithm.server_lr: must be > 0" in commands and "exit status 2" in commands
