"""Every config key says what it means, where it is declared: the generated reference, `rayfl
config` and `rayfl validate --explain` read the comment above each dataclass field, so a field
without one fails here, naming it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

import yaml

from rayfl.cli import main
from rayfl.config import config_from_dict
from rayfl.config_explain import explain_yaml
from rayfl.config_reference import (
    ENTRY_KINDS,
    all_keys,
    builtin_entries,
    entry_keys,
    keys_of,
    meaning_of,
    render_markdown,
    section_keys,
    undocumented,
)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"


def test_every_key_of_every_section_and_builtin_entry_has_a_meaning() -> None:
    missing = undocumented(all_keys())
    assert not missing, "config fields without a meaning (a `#` comment on the line above the field): " + ", ".join(missing)


def test_every_field_of_every_config_class_in_rayfl_config_has_a_meaning() -> None:
    """The generic classes (`kwargs`) of entries registered without a config class included."""
    import rayfl.config as module

    classes = [c for c in vars(module).values() if isinstance(c, type) and is_dataclass(c)
               and c.__module__ == module.__name__ and c is not module.Config]
    missing = [f"{c.__name__}.{f.name}" for c in classes for f in fields(c) if not meaning_of(c, f.name)[0]]
    assert len(classes) >= 15 and not missing, missing


def test_every_registered_builtin_is_walked() -> None:
    counts = {section: len(builtin_entries(section)) for section in ENTRY_KINDS}
    assert counts["algorithm"] == 26 and counts["model"] >= 8 and counts["data"] >= 14
    assert counts["partition"] >= 6 and counts["callbacks"] >= 5


@dataclass
class _Inner:
    # the documented one
    documented: int = 1
    undocumented: float | None = None


@dataclass
class _Outer:
    # a nested section
    inner: _Inner = field(default_factory=_Inner)


def test_a_field_without_a_comment_is_named() -> None:
    keys = list(keys_of(_Outer, "demo"))
    assert [k.key for k in keys] == ["demo.inner", "demo.inner.documented", "demo.inner.undocumented"]
    assert keys[1].meaning == "the documented one"
    assert undocumented(keys) == [f"{__name__}._Inner.undocumented (demo.inner.undocumented)"]


def test_nested_keys_have_dotted_paths_and_readable_types() -> None:
    system = {k.key: k for k in section_keys("system")}
    assert system["system.availability.kind"].allowed == ("always", "periodic", "trace")
    assert system["system.deadline"].type == "float | None"
    assert system["system.tiers[].fraction"].meaning
    robust = {k.key for k in section_keys("robust")}
    assert {"robust.aggregator.name", "robust.attack.name"} <= robust
    fedavg = {k.key: k for k in entry_keys("algorithm", "fedavg", changed_only=True)}
    assert "algorithm.server_optimizer.beta1" in fedavg and "algorithm.lr" not in fedavg
    assert {k.key for k in entry_keys("algorithm", "scaffold", changed_only=True)} >= {"algorithm.weighting"}
    engine = {k.key: k for k in section_keys("engine")}
    assert engine["engine.clients_per_host"].allowed == ("auto", "any int")


def test_the_committed_reference_is_what_the_generator_writes() -> None:
    assert render_markdown() == PAGE.read_text(), \
        "docs/reference/config.md is out of date: python -m rayfl.config_reference > docs/reference/config.md"


def test_rayfl_config_prints_an_entrys_keys_with_their_meaning(capsys) -> None:
    assert main(["config", "algorithm=fedavg"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("algorithm.lr: float = 0.05"))
    assert "step size" in lines[at + 1]
    assert "algorithm.server_optimizer.name" in out


def test_rayfl_config_prints_a_section_or_every_section(capsys) -> None:
    assert main(["config", "privacy"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("privacy:\n") and "privacy.noise_multiplier" in out and "engine." not in out
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{section}:\n" in f"\n{out}" for section in ("run", "engine", "system", "robust", "callbacks"))


def test_an_unknown_entry_or_section_is_one_line_and_status_2() -> None:
    for target in ("algorithm=nope", "nosuchsection"):
        done = subprocess.run([sys.executable, "-m", "rayfl.cli", "config", target], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
        assert done.stderr.startswith("rayfl: error: ")


def test_validate_explain_comments_every_key_and_loads_back() -> None:
    cfg = config_from_dict({
        "system": {"tiers": [{"fraction": 0.1, "speed_factor": 0.1}], "speed": {"dist": "lognormal", "value": 1e9}},
        "callbacks": [{"name": "early_stopping", "patience": 3}],
        "robust": {"aggregator": {"name": "median"}},
    })
    text = explain_yaml(cfg)
    assert yaml.safe_load(text) == cfg.to_dict()
    lines = text.splitlines()
    for i, line in enumerate(lines[1:], start=1):
        stripped = line.strip()
        if stripped.startswith("#") or stripped == "-" or ":" not in stripped or line == line.lstrip():
            continue
        assert lines[i - 1].strip().startswith("#"), f"no meaning above {line!r}"


def test_validate_explain_from_the_command_line(capsys) -> None:
    assert main(["validate", "--example", "digits_fedavg", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "# The clients' local SGD step size" in out
    assert main(["validate", "--example", "digits_fedavg"]) == 0
    assert "#" not in capsys.readouterr().out
