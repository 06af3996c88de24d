"""The algorithm registry resolves each entry's module on first use: every entry names a config
class of its own name and a server loop, and a run imports only the algorithm it runs."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from rayfl.algorithms.catalog import BUILTIN
from rayfl.config import AlgorithmConfig, load_config
from rayfl.registry import ALGORITHMS


@pytest.mark.parametrize("name", sorted(name for name, *_ in BUILTIN))
def test_every_entry_resolves_to_its_config_and_server_loop(name):
    algorithm = ALGORITHMS.get(name)
    assert algorithm.name == name and algorithm.origin == "built-in"
    assert isinstance(algorithm.target, str) and algorithm.target.startswith("rayfl.algorithms."), algorithm.target
    cls = algorithm.config_class()
    assert issubclass(cls, AlgorithmConfig) and cls().name == name, (name, cls)
    run = algorithm.load()
    assert callable(run) and list(inspect.signature(run).parameters)[:1] == ["fed"]
    assert load_config(None, [f"algorithm.name={name}"]).algorithm.__class__ is cls


def test_every_builtin_is_registered():
    assert {name for name, *_ in BUILTIN} <= set(ALGORITHMS.names())


def test_loading_a_config_imports_only_its_algorithm():
    code = """
import sys
from rayfl.config import load_config
load_config(None, ["algorithm.name=qfedavg"])
print(sorted(m for m in sys.modules if m.startswith("rayfl.algorithms.")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout.strip().splitlines()[-1])
    assert "rayfl.algorithms.qfedavg" in loaded
    assert not {"rayfl.algorithms.zo_hfl", "rayfl.algorithms.ffgg", "rayfl.algorithms.fedrzo_bl"} & set(loaded), loaded


def test_every_algorithm_is_imported_by_the_workers_preload():
    code = """
import sys
import rayfl.algorithms.all
from rayfl.algorithms.catalog import BUILTIN
from rayfl.registry import ALGORITHMS
modules = {ALGORITHMS.get(name).target.split(":")[0] for name, *_ in BUILTIN}
modules |= {ALGORITHMS.get(name).config.split(":")[0] for name, *_ in BUILTIN}
print(sorted(modules - set(sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
