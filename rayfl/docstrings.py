"""Docstrings as Markdown for the generated API reference (rayfl.api_reference).

A docstring is prose, optionally followed by Google-style sections (`Args:`, `Returns:`,
`Raises:`, `Yields:`), the form mkdocstrings reads too. The prose is kept as written (it is
Markdown already); each section becomes a bold label and a list, so a reader sees every argument
with its type without a docs toolchain."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SECTIONS = {"Args": "Arguments", "Returns": "Returns", "Yields": "Yields", "Raises": "Raises"}
_ITEM = re.compile(r"^(\*{0,2}[\w.]+)(?:\s*\(([^)]*)\))?:\s*(.*)$")
_DUNDER = re.compile(r"(?<![\w`])(__\w+__)(?![\w`])")


@dataclass
class Docstring:
    """A docstring split into its prose and its sections' items (name, text)."""

    text: str
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def parse(doc: str) -> Docstring:
    """Split a cleaned docstring (`inspect.getdoc`) into prose and sections. An item is
    `name: text` (or `name (type): text`) at the section's first indent; deeper lines continue
    it. `Returns:` and `Yields:` are one item named "", their text."""
    prose: list[str] = []
    sections: dict[str, list[tuple[str, str]]] = {}
    items: list[tuple[str, str]] | None = None
    header, indent = "", -1
    for line in doc.splitlines():
        stripped = line.strip()
        if not line.startswith(" ") and stripped.removesuffix(":") in SECTIONS and stripped.endswith(":"):
            header, indent = stripped.removesuffix(":"), -1
            items = sections.setdefault(header, [])
            continue
        if items is None:
            prose.append(line)
            continue
        if not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if indent < 0:
            indent = depth
        item = _ITEM.match(stripped) if depth == indent and header in ("Args", "Raises") else None
        if item:
            items.append((item.group(1), item.group(3)))
        elif items:
            name, text = items[-1]
            items[-1] = (name, f"{text} {stripped}".strip())
        else:
            items.append(("", stripped))
    return Docstring("\n".join(prose).strip(), sections)


def literal_names(text: str) -> str:
    """`text` with dunder names outside code spans put in backticks: Markdown would read
    `__init__` written bare as bold "init"."""
    parts = text.split("`")
    return "`".join(_DUNDER.sub(r"`\1`", part) if i % 2 == 0 else part for i, part in enumerate(parts))


def to_markdown(doc: Docstring, types: dict[str, str] | None = None) -> str:
    """The prose, then each section as `**Label**` and a list: `- `name` (`type`): text`,
    the type read from `types` (the signature's annotations; "return" for Returns)."""
    types = types or {}
    out = [literal_names(doc.text)] if doc.text else []
    for header, items in doc.sections.items():
        lines = [f"**{SECTIONS[header]}**", ""]
        for name, text in items:
            if header in ("Returns", "Yields"):
                kind = types.get("return", "")
                lines.append(f"- `{kind}`: {text}" if kind else f"- {text}")
            elif header == "Raises":
                lines.append(f"- `{name}`: {text}")
            else:
                kind = types.get(name.lstrip("*"), "")
                lines.append(f"- `{name}`" + (f" (`{kind}`)" if kind else "") + f": {text}")
        out.append(literal_names("\n".join(lines)))
    return "\n\n".join(out)
