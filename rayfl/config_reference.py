"""Every config key with its type, default, allowed values and meaning, read from the dataclasses.

A field's meaning is the `#` comment on the line(s) directly above its declaration, so the
text lives beside the code it describes and a new field without one fails the test suite
(tests/test_config_reference.py). A subclass that re-declares a field only to change its
default inherits the meaning of the nearest declaration with a comment.

    python -m rayfl.config_reference > docs/reference/config.md

writes the Markdown reference; `rayfl config` and `rayfl validate --explain` print the same
meanings in the terminal (rayfl.config_explain)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

# The sections whose entry a job names, with the word the CLI and the page use for them.
ENTRY_KINDS: dict[str, str] = {
    "algorithm": "algorithm",
    "model": "model",
    "data": "dataset",
    "partition": "partitioner",
    "callbacks": "callback",
}


@dataclass(frozen=True)
class Key:
    """One config key: where it sits, what it holds, and why it is there."""

    key: str  # dotted, e.g. "system.availability.kind"; list items as "callbacks[].name"
    type: str  # readable, e.g. "float | None"; a Literal shows its values' type
    default: str  # as YAML writes it ("null", "0.05", "[64, 64]"); "" for a mapping of sub-keys
    allowed: tuple[str, ...]  # a Literal's values (empty: any value of the type)
    meaning: str  # the comment above the field ("" when there is none)
    declared_in: str  # "module.Class" where the field is declared, to name a missing meaning


# --------------------------------------------------------------------------- meanings


@functools.cache
@functools.cache
def module_tree(path: str) -> tuple[ast.Module, tuple[str, ...]]:
    """A source file's syntax tree and lines (also rayfl.api_reference's)."""
    source = Path(path).read_text()
    return ast.parse(source), tuple(source.splitlines())


def comment_above(stmt: ast.stmt, lines: tuple[str, ...]) -> str:
    """The `#` comment lines directly above a statement, joined into one line ("" for none)."""
    text = []
    row = stmt.lineno - 2  # the line above, 0-based
    while row >= 0 and lines[row].strip().startswith("#"):
        text.append(lines[row].strip().lstrip("#").strip())
        row -= 1
    return " ".join(reversed(text)).strip()


def _class_node(cls: type) -> tuple[ast.ClassDef, tuple[str, ...]] | None:
    """The `class` statement of `cls` in its module's source, found by its qualified name."""
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        return None
    if path is None:
        return None
    tree, lines = module_tree(path)
    body: list[ast.stmt] = tree.body
    node = None
    for part in cls.__qualname__.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node, lines


def comments_above_fields(cls: type) -> dict[str, str]:
    """The fields `cls` itself declares, each with the `#` comment lines directly above it
    (joined into one line; "" where there is none)."""
    found = _class_node(cls)
    if found is None:
        return {}
    node, lines = found
    out = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        out[stmt.target.id] = comment_above(stmt, lines)
    return out


def meaning_of(cls: type, name: str) -> tuple[str, str]:
    """(meaning, where declared) of field `name` of dataclass `cls`: the comment of its nearest
    declaration in the class hierarchy that has one, else "" and its nearest declaration."""
    declared = ""
    for klass in cls.__mro__:
        if name not in vars(klass).get("__annotations__", {}):
            continue
        where = f"{klass.__module__}.{klass.__qualname__}"
        declared = declared or where
        text = comments_above_fields(klass).get(name, "")
        if text:
            return text, where
    return "", declared


# --------------------------------------------------------------------------- types and defaults


def _is_dataclass_type(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def type_name(hint: Any) -> str:
    """A type hint as a reader writes it: `float | None`, `list[float]`, `str` for a Literal
    of strings (its values are the allowed ones)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        names: list[str] = []
        for option in get_args(hint):
            name = type_name(option)
            if name not in names:
                names.append(name)
        return " | ".join(names)
    if origin is Literal:
        kinds = []
        for value in get_args(hint):
            kind = "None" if value is None else type(value).__name__
            if kind not in kinds:
                kinds.append(kind)
        return " | ".join(kinds)
    if hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(hint))}]"
    return getattr(hint, "__name__", str(hint))


def allowed_values(hint: Any) -> tuple[str, ...]:
    """The values a Literal (or a union holding one) allows, as YAML writes them; a union's
    other types are added as "any int" and the like."""
    options = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    literals = [v for o in options if get_origin(o) is Literal for v in get_args(o)]
    if not literals:
        return ()
    others = [type_name(o) for o in options if get_origin(o) is not Literal]
    return tuple([v if isinstance(v, str) else render_value(v) for v in literals] + [f"any {o}" if o != "None" else "null" for o in others])


def render_value(value: Any) -> str:
    """A value as it is written in a job file (YAML flow style, one line)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _nested(hint: Any) -> tuple[type | None, bool]:
    """The dataclass a field holds (directly, optionally, or as list items), and whether it is
    a list of them."""
    if get_origin(hint) in (Union, types.UnionType):
        classes = [o for o in get_args(hint) if _is_dataclass_type(o)]
        return (classes[0], False) if len(classes) == 1 else (None, False)
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        return (item, True) if _is_dataclass_type(item) else (None, False)
    return (hint, False) if _is_dataclass_type(hint) else (None, False)


# --------------------------------------------------------------------------- walking


def keys_of(cls: type, prefix: str, instance: Any = None) -> Iterator[Key]:
    """Every key of dataclass `cls` under `prefix`, nested dataclasses' keys after their own
    (`system.availability.kind`), with the defaults of `instance` (default: `cls()`)."""
    if instance is None:
        instance = cls()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        value = getattr(instance, f.name)
        meaning, where = meaning_of(cls, f.name)
        nested, is_list = _nested(hint)
        default = "" if nested is not None and not is_list and dataclasses.is_dataclass(value) else render_value(value)
        key = f"{prefix}.{f.name}"
        yield Key(key, type_name(hint), default, allowed_values(hint), meaning, where)
        if nested is not None:
            child = value if dataclasses.is_dataclass(value) and not isinstance(value, type) else nested()
            yield from keys_of(nested, f"{key}[]" if is_list else key, child)


def core_sections() -> dict[str, type]:
    """Each job section's class: the base class of the sections that name an entry."""
    from rayfl.config import SECTIONS, CallbackConfig

    return {name: (CallbackConfig if name == "callbacks" else cls) for name, cls in SECTIONS.items()}


def section_prefix(section: str) -> str:
    return "callbacks[]" if section == "callbacks" else section


def section_keys(section: str) -> list[Key]:
    """Every key of a core section, with its base defaults."""
    cls = core_sections()[section]
    return list(keys_of(cls, section_prefix(section)))


def registry_of(section: str) -> Any:
    from rayfl.registry import BY_SECTION, CALLBACKS

    return CALLBACKS if section == "callbacks" else BY_SECTION[section]


def builtin_entries(section: str) -> list[str]:
    """The names of rayfl's own entries of a section (installed plug-ins left out)."""
    from rayfl.config import ConfigError

    registry = registry_of(section)
    names = []
    for name in registry.names():
        try:
            entry = registry.get(name)
        except ConfigError:  # an installed plug-in that does not load: not rayfl's own
            continue
        if entry.origin == "built-in":
            names.append(name)
    return names


def entry_class(section: str, name: str) -> type:
    """The config class of entry `name` (a ConfigError listing the registered ones if unknown)."""
    return registry_of(section).config_class(name)


def entry_keys(section: str, name: str, *, changed_only: bool = False) -> list[Key]:
    """Every key of entry `name`'s config, with its defaults; `changed_only`: only the keys
    the entry adds or whose default it changes (its selector, e.g. `algorithm.name`, left out)."""
    cls = entry_class(section, name)
    found = list(keys_of(cls, section_prefix(section), _entry_instance(section, cls, name)))
    if not changed_only:
        return found
    selector = registry_of(section).key.split(".")[1]
    base = {k.key: k for k in section_keys(section)}
    skip = f"{section_prefix(section)}.{selector}"
    return [k for k in found if k.key != skip and (k.key not in base or base[k.key].default != k.default)]


def _entry_instance(section: str, cls: type, name: str) -> Any:
    """The entry's config as a job naming it would get: its selector set to the name."""
    selector = registry_of(section).key.split(".")[1]
    return cls(**{selector: name}) if selector in {f.name for f in dataclasses.fields(cls)} else cls()


def summary_of(section: str, name: str) -> str:
    return registry_of(section).get(name).describe()


def all_keys() -> Iterator[Key]:
    """Every key of every core section and of every built-in entry (all of an entry's keys)."""
    for section in core_sections():
        yield from section_keys(section)
    for section in ENTRY_KINDS:
        for name in builtin_entries(section):
            yield from entry_keys(section, name)


def undocumented(keys: Iterator[Key] | list[Key]) -> list[str]:
    """The fields without a meaning, each once: "module.Class.field (key)"."""
    missing: dict[str, str] = {}
    for k in keys:
        if not k.meaning:
            missing.setdefault(f"{k.declared_in}.{k.key.rpartition('.')[2]}", k.key)
    return [f"{field} ({key})" for field, key in sorted(missing.items())]


# --------------------------------------------------------------------------- the Markdown page

INTRO = """\
# Configuration

A job is a YAML file (or a Python mapping, or a `rayfl.Config`) with the sections below. Each
section is a dataclass; a key missing from the job takes its default, and a key the section does
not declare is an error naming the allowed keys. `--set SECTION.KEY=VALUE` (or an `overrides`
string in `rayfl.run`) replaces one value, in YAML syntax; a nested key is written with its dots,
e.g. `--set system.availability.kind=periodic`.

This page is generated from the config dataclasses by `python -m rayfl.config_reference >
docs/reference/config.md`: each key's meaning is the comment above its declaration. The test
suite regenerates the page and fails when it differs from the committed one, or when a key has
no meaning. In the terminal:

```bash
rayfl config                         # every key of the core sections
rayfl config privacy                 # one section
rayfl config algorithm=scaffold      # an entry's keys: its own and the shared ones
rayfl validate --example digits_fedavg --explain   # a job's resolved values, each key's meaning as a comment
```

`algorithm`, `model`, `data`, `partition` and each item of `callbacks` take the keys of the entry
they name (`algorithm.name`, `model.name`, `data.dataset`, `partition.method`, `callbacks[].name`):
the shared keys of the section's base class, listed under [Sections](#sections), plus the entry's
own, listed under [Entries](#entries). An entry of your own declares its keys the same way
([Bring your own algorithm, model and data](../guides/extending.md)); one registered without a
config class takes the shared keys plus `kwargs`, a mapping handed to its callable as keyword
arguments. A key whose type is a config class (`system.speed`, `robust.aggregator`) is a mapping
of the sub-keys listed after it.
"""


def _cell(text: str) -> str:
    """Prose in a table cell, on one line: outside its `code spans`, characters Markdown would
    read as HTML, emphasis or a column break are escaped; a code span holding a `|` loses its
    backticks (a pipe cannot be escaped inside one)."""
    parts = " ".join(text.split()).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: all prose
        parts = ["'".join(parts)]
    out = []
    for i, part in enumerate(parts):
        if i % 2 and "|" not in part:
            out.append(f"`{part}`")
        else:
            out.append(_escape(part))
    return "".join(out)


def _escape(text: str) -> str:
    """Only what Markdown would misread: `<` that could open a tag, `|`, `*`."""
    text = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)
    return text.replace("|", "\\|").replace("*", "\\*")


def _code(text: str) -> str:
    """A value as inline code in a table cell (as prose when it holds a `|` or a backtick)."""
    if not text:
        return ""
    if "|" in text or "`" in text:
        return _escape(text)
    return f"`{text}`"


def key_table(keys: list[Key], strip: str = "") -> list[str]:
    rows = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for k in keys:
        allowed = ", ".join(_code(v) for v in k.allowed)
        rows.append(f"| `{k.key}` | {_cell(k.type)} | {_code(k.default)} | {allowed} | {_cell(k.meaning)} |")
    return rows


def _doc_summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


# Headings of the entry parts ("Each callback", not "Callbacks": the `callbacks` section's own
# heading has that anchor).
ENTRY_TITLES = {"algorithm": "Each algorithm", "model": "Each model", "data": "Each dataset",
                "partition": "Each partitioner", "callbacks": "Each callback"}


def render_markdown() -> str:
    """The whole reference page."""
    out = [INTRO, "## Sections", ""]
    for section, cls in core_sections().items():
        out += [f"### `{section}`", "", f"{_cell(_doc_summary(cls))} (`{cls.__module__}.{cls.__qualname__}`)", ""]
        if section == "callbacks":
            out += ["`callbacks` is a list; each item names a callback and sets its keys.", ""]
        out += key_table(section_keys(section)) + [""]
    out += ["## Entries", "",
            "Each entry's table lists only the keys it adds or whose default it changes; it takes the",
            "section's shared keys too.", ""]
    for section, title in ENTRY_TITLES.items():
        kind = ENTRY_KINDS[section]
        selector = registry_of(section).key
        out += [f"### {title}", "", f"Named by `{selector}`; the shared keys are those of "
                f"[`{section}`](#{section}).", ""]
        for name in builtin_entries(section):
            cls = entry_class(section, name)
            changed = entry_keys(section, name, changed_only=True)
            out += [f"#### {kind}: `{name}`", "", f"{_cell(summary_of(section, name))} "
                    f"(`{cls.__module__}.{cls.__qualname__}`)", ""]
            out += key_table(changed) if changed else ["No keys of its own: the shared keys only."]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
