"""Every command the README shows runs as written: its `bash` and `python` blocks, in order, in
a fresh directory that holds the repository's `jobs/` (see guide_blocks). Three blocks are only
shown: the set-up line (it installs; its last command, `rayfl run`, runs here), the test command
(it is this suite) and the cluster one (it needs a cluster)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from guide_blocks import blocks, environment, run_page

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# The two set-up commands, exactly: CI runs the second (.ci/run) and newcomers paste the first.
SETUP = 'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e ".[test]" && rayfl run'
TESTS = "python -m pytest -n 2 --dist loadfile"


def test_the_readme_is_short_and_its_set_up_commands_are_the_ones_ci_runs() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 200
    shown = [b.code.strip() for b in blocks(text) if not b.runs]
    assert shown[:2] == [SETUP, TESTS]
    assert TESTS in (ROOT / ".ci" / "run").read_text()
    # few blocks are only shown, and every other bash or python block runs
    assert len(shown) <= 3
    assert sum(b.runs and b.lang in ("bash", "python") for b in blocks(text)) >= 5


@pytest.mark.slow
def test_the_readme_commands_run(tmp_path: Path) -> None:
    (tmp_path / "jobs").symlink_to(ROOT / "jobs", target_is_directory=True)
    # the set-up line's own experiment: `rayfl run`, the default job
    default = SETUP.rsplit("&&", 1)[1].strip()
    done = subprocess.run(["bash", "-e", "-c", f"{default} --quiet"], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list((tmp_path / "results" / "default").iterdir())
    outputs = run_page(README, tmp_path)
    assert len(outputs) >= 5
    digits = tmp_path / "results" / "digits"
    assert (digits / "long" / "manifest.json").read_text().count('"completed"') >= 1
    assert len(list((tmp_path / "results" / "digits_sweep").glob("lr=*"))) == 4
