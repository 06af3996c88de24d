"""The documentation site builds: `mkdocs build --strict` (broken links and anchors and pages left
out of the navigation fail it), its navigation has the parts a reader looks for, the generated
CLI reference equals what is committed (the API reference: tests/test_api_reference.py), and the
getting-started tour runs as written."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from guide_blocks import run_page

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PARTS = ["Getting started", "Guides", "Reference", "Explanation", "Benchmarks", "Replications"]


def nav() -> list[dict]:
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]


def pages(entry: object) -> list[str]:
    """Every page file under a navigation entry."""
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [p for item in entry for p in pages(item)]
    assert isinstance(entry, dict)
    return [p for value in entry.values() for p in pages(value)]


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    for page in pages(nav()):
        # a page is built as its path without the suffix: .md pages and the .ipynb notebook alike
        stem = Path(page).with_suffix("").as_posix()
        built = tmp_path / "site" / ("index.html" if page == "index.md" else stem + "/index.html")
        assert built.is_file(), page


def test_the_navigation_has_its_parts() -> None:
    sections = {title: value for item in nav() for title, value in item.items()}
    assert list(sections) == PARTS
    guides = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "guides").glob("*.md"))
    assert set(guides) <= set(pages(sections["Guides"]))
    replications = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "replications").glob("*.md"))
    assert sorted(pages(sections["Replications"])) == replications
    assert {"reference/api.md", "reference/client-contract.md", "reference/config.md",
            "reference/cli.md"} <= set(pages(sections["Reference"]))
    assert "architecture.md" in pages(sections["Explanation"])


def test_the_cli_reference_is_generated_from_the_parser() -> None:
    spec = importlib.util.spec_from_file_location("gen_cli_reference", REPO / "scripts" / "gen_cli_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    committed = (DOCS / "reference" / "cli.md").read_text()
    assert gen.render() == committed, "docs/reference/cli.md is out of date: python scripts/gen_cli_reference.py"


@pytest.mark.slow
def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    outputs = run_page(DOCS / "getting-started" / "tour.md", tmp_path)
    assert "algorithm.lr: must be > 0" in outputs[1]
    assert (tmp_path / "results" / "digits_sweep").is_dir()
