"""Config keys with their meanings in the terminal: `rayfl config` and `rayfl validate --explain`.

The meanings are those of rayfl.config_reference (the comment above each field), so the terminal,
the generated reference page and the code never disagree."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from rayfl.config import ConfigError
from rayfl.config_reference import (
    ENTRY_KINDS,
    Key,
    core_sections,
    entry_class,
    entry_keys,
    meaning_of,
    registry_of,
    render_value,
    section_keys,
    summary_of,
)

WIDTH = 100
# What a reader may call the sections that name an entry (`rayfl config dataset=mnist`).
ALIASES = {"dataset": "data", "partitioner": "partition", "callback": "callbacks"}


def format_key(k: Key, indent: str = "  ") -> list[str]:
    """One key as two or more lines: `key: type = default  [allowed]`, then its meaning."""
    head = f"{indent}{k.key}: {k.type}"
    if k.default:
        head += f" = {k.default}"
    if k.allowed:
        head += f"  [{', '.join(k.allowed)}]"
    body = textwrap.wrap(k.meaning or "(no meaning given)", WIDTH, initial_indent=indent + "    ",
                         subsequent_indent=indent + "    ")
    return [head, *body]


def _section_name(text: str) -> str:
    section = ALIASES.get(text, text)
    if section not in core_sections():
        raise ConfigError("config", f"unknown section {text!r}; sections are {list(core_sections())}")
    return section


def describe_section(section: str) -> list[str]:
    """A core section's keys with their base defaults, and the entries it may name."""
    out = [f"{section}:"]
    for k in section_keys(section):
        out += format_key(k)
    if section in ENTRY_KINDS:
        selector = registry_of(section).key
        names = ", ".join(registry_of(section).names())
        out += [f"  ({selector} picks the {ENTRY_KINDS[section]}: {names}; "
                f"`rayfl config {section}=NAME` lists its own keys)"]
    return out


def describe_entry(section: str, name: str) -> list[str]:
    """Every key of entry `name`: first those it adds or whose default it changes, then the
    section's shared ones."""
    cls = entry_class(section, name)  # a ConfigError listing the registered ones when unknown
    own = entry_keys(section, name, changed_only=True)
    changed = {k.key for k in own}
    shared = [k for k in entry_keys(section, name) if k.key not in changed]
    out = [f"{section}={name}: {summary_of(section, name)}", f"  config class {cls.__module__}.{cls.__qualname__}"]
    out += ["", "its own keys (and shared keys whose default it changes):"]
    for k in own:
        out += format_key(k)
    if not own:
        out.append("  (none)")
    out += ["", f"shared keys of {section}:"]
    for k in shared:
        out += format_key(k)
    return out


def describe(targets: list[str]) -> str:
    """What `rayfl config TARGET...` prints: every core section (no target), a section
    (`privacy`), or an entry (`algorithm=scaffold`, `dataset=mnist`)."""
    blocks = []
    for target in targets or list(core_sections()):
        section, sep, name = target.partition("=")
        section = _section_name(section.strip())
        if not sep:
            blocks.append(describe_section(section))
            continue
        if section not in ENTRY_KINDS:
            raise ConfigError("config", f"section {section!r} names no entry; these do: {list(ENTRY_KINDS)}")
        blocks.append(describe_entry(section, name.strip()))
    return "\n\n".join("\n".join(b) for b in blocks) + "\n"


# --------------------------------------------------------------------------- validate --explain


def explain_yaml(cfg: Any) -> str:
    """The resolved job as YAML, each key preceded by its meaning as a comment; it loads back
    to `cfg.to_dict()`."""
    lines = ["# The resolved job: every key with its value or default, its meaning above it."]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, list):
            lines += _list_lines(f.name, value, "")
        else:
            lines.append(f"{f.name}:")
            lines += _mapping_lines(value, "  ")
    return "\n".join(lines) + "\n"


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - len(indent) - 2, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def _mapping_lines(obj: Any, indent: str) -> list[str]:
    out: list[str] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out += _comment(meaning_of(type(obj), f.name)[0], indent)
        if dataclasses.is_dataclass(value):
            out.append(f"{indent}{f.name}:")
            out += _mapping_lines(value, indent + "  ")
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            out += _list_lines(f.name, value, indent)
        else:
            out.append(f"{indent}{f.name}: {render_value(value)}")
    return out


def _list_lines(name: str, items: list[Any], indent: str) -> list[str]:
    if not items:
        return [f"{indent}{name}: []"]
    out = [f"{indent}{name}:"]
    for item in items:
        out.append(f"{indent}  -")
        out += _mapping_lines(item, indent + "    ")
    return out
