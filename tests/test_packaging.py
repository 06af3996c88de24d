"""rayfl as a user gets it from a wheel: built from the repository, installed without `-e` into
a fresh virtual environment, and run from an empty directory (the default job, a shipped
example job, `rayfl --version`), so nothing may depend on the repository's layout.

The new environment has only the wheel installed; rayfl's dependencies (torch, Ray, ...) are
borrowed from this environment's site-packages through a path file, not its own copy of rayfl
(that editable install's import hook lives in a .pth file, which a path file does not run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from guide_blocks import environment

import rayfl

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ directory of a fresh venv holding rayfl's wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split())
    for name in tracked:  # the repository as a clone has it: tracked files only
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target, follow_symlinks=False)
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(source)], check=True, timeout=600, capture_output=True)
    (wheel,) = dist.glob("rayfl-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    site = Path(sysconfig.get_paths(vars={"base": str(env_dir), "platbase": str(env_dir)})["purelib"])
    (site / "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "--quiet",
                    "--no-deps", str(wheel)], check=True, timeout=600, capture_output=True)
    shutil.rmtree(source)  # nothing of the repository is left to lean on
    return env_dir / "bin"


def run(bin_dir: Path, cwd: Path, *args: str) -> str:
    env = environment()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = subprocess.run([str(bin_dir / "rayfl"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


@pytest.mark.slow
def test_the_wheel_runs_from_an_empty_directory(installed: Path, tmp_path: Path) -> None:
    assert run(installed, tmp_path, "--version").strip() == f"rayfl {rayfl.__version__}"
    where = subprocess.run([str(installed / "python"), "-c", "import rayfl; print(rayfl.__file__)"], cwd=tmp_path,
                           env=environment(), capture_output=True, text=True, check=True).stdout
    assert str(REPO) not in where and str(installed.parent) in where, where
    assert "digits_fedavg" in run(installed, tmp_path, "list", "examples")
    out = run(installed, tmp_path, "run", "--quiet", "--set", "run.rounds=3")
    assert "results: results/default/" in out
    out = run(installed, tmp_path, "run", "--example", "digits_fedavg", "--quiet", "--set", "run.rounds=3")
    assert "results: results/digits/" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


def test_license_citation_and_changelog_agree_with_the_package() -> None:
    """LICENSE is the license pyproject names, CITATION.cff cites this version under it, and
    the changelog has a section for it (or for the unreleased changes after it)."""
    import re

    import yaml

    project = {"license": re.search(r'^license = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)}
    assert project["license"] == "Apache-2.0"
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["version"] == rayfl.__version__ and citation["license"] == project["license"]
    assert citation["cff-version"] == "1.2.0" and citation["authors"] and citation["title"].startswith("rayfl")
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## {rayfl.__version__}" in changelog
