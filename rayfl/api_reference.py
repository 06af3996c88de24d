"""The Python API reference (docs/reference/api.md) as Markdown, read from the source.

Every name in `rayfl.__all__` gets a heading, its signature in a ```python block and its
docstring; a class also gets its fields (with the `#` comment above or beside each), its own
attributes and its own public methods. Signatures, types and defaults are the source text
(`ast.unparse`), not `repr`s of live objects, so the page has no memory addresses and does not
change with the torch, Ray or Python version. `python -m rayfl.api_reference` prints the page;
tests/test_api_reference.py compares it with the committed one. A user without a checkout
reads the same docstrings with `help(rayfl.NAME)`."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any

from rayfl.config_reference import comment_above, module_tree
from rayfl.docstrings import literal_names, parse, to_markdown

COMMAND = "python -m rayfl.api_reference > docs/reference/api.md"
WIDTH = 96  # a signature longer than this is written one parameter a line

INTRO = f"""\
# Python API

The public API is what `rayfl` exports (`rayfl.__all__`); every other name in the package is
private and may change between versions. `import rayfl` is cheap: each name below loads its
module (torch, Ray) on first use. Each entry is used as `rayfl.<name>` and says which module
defines it; `rayfl.__version__` is the installed version.

This page is generated from the source by `{COMMAND}`;
the test suite regenerates it and fails when it differs from the committed page. In Python,
`help(rayfl.<name>)` prints the same docstrings. What a client function receives and may do is stated in [the client-side
contract](client-contract.md).
"""


@dataclass(frozen=True)
class Section:
    """One part of the page: its heading, the hand-written text under it, its names in order."""

    title: str
    intro: str
    names: tuple[str, ...]


SECTIONS = (
    Section("Running and reading runs", "", ("run", "resume", "Run", "load", "Results")),
    Section(
        "Configuration",
        "A job's sections are typed dataclasses. `algorithm`, `model`, `data` and `partition` take the\n"
        "keys of the entry they name, declared by a subclass of the section's base class below; every key\n"
        "is listed in the [configuration reference](config.md).",
        ("load_config", "Config", "ConfigError", "RunConfig", "AlgorithmConfig", "ModelConfig", "DataConfig",
         "PartitionConfig", "CallbackConfig"),
    ),
    Section(
        "Registering your own parts",
        "A job names a registered entry by its name, or any object by its import path\n"
        '`"package.module:attr"`; see [Bring your own algorithm, model and data](../guides/extending.md).',
        ("register_algorithm", "register_model", "register_dataset", "register_partitioner", "register_callback"),
    ),
    Section("Callbacks", "", ("Callback", "RunInfo")),
    Section(
        "Writing an algorithm",
        "An algorithm is its parts (a subclass of `Algorithm`, or of a built-in such as `FedAvg`); the\n"
        "round drivers own the round. Client functions receive a `ClientContext`; what they may read,\n"
        "keep and return is [the client-side contract](client-contract.md). See [Bring your own\n"
        "algorithm, model and data](../guides/extending.md) and [the engine's patterns](../architecture.md).",
        ("Algorithm", "Phase", "Round", "Uploads", "AsynchronyConfig", "FedAvg", "FedAvgConfig", "fedavg_client",
         "ModelState", "Federation", "ClientContext", "ClientResult", "eval_due", "local_sgd", "local_sgd_batched",
         "LocalSchedule", "batched", "stateless"),
    ),
    Section("Data and models", "", ("ArrayDataset", "FederatedDataset", "build_model", "get_flat", "set_flat")),
)


# --------------------------------------------------------------------------- the source


def source_node(obj: Any) -> tuple[ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, tuple[str, ...]]:
    """The `class` or `def` statement of `obj` in its module, found by its qualified name."""
    target = inspect.unwrap(obj)
    tree, lines = module_tree(inspect.getsourcefile(target) or "")
    body: list[ast.stmt] = tree.body
    node: Any = None
    for part in target.__qualname__.split("."):
        node = next(n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.name == part)
        body = node.body
    return node, lines


def comment_of(stmt: ast.stmt, lines: tuple[str, ...]) -> str:
    """The `#` comment lines directly above a statement, else the comment at the end of its line."""
    if above := comment_above(stmt, lines):
        return above
    last = lines[(stmt.end_lineno or stmt.lineno) - 1]
    code, hash_, after = last.partition("  #")
    return after.strip() if hash_ and code.strip() else ""


def _is_classvar(stmt: ast.AnnAssign) -> bool:
    return ast.unparse(stmt.annotation).startswith(("ClassVar", "typing.ClassVar"))


# --------------------------------------------------------------------------- signatures


def _parameters(args: ast.arguments) -> list[str]:
    """Each parameter as the source writes it, with `/` and `*` where the source has them."""
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = []
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        out.append(_param(arg, default))
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            out.append("/")
    if args.vararg is not None:
        out.append("*" + _param(args.vararg, None))
    elif args.kwonlyargs:
        out.append("*")
    out += [_param(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        out.append("**" + _param(args.kwarg, None))
    return out


def _param(arg: ast.arg, default: ast.expr | None) -> str:
    text = arg.arg
    if arg.annotation is not None:
        text += f": {ast.unparse(arg.annotation)}"
    if default is not None:
        text += (" = " if arg.annotation is not None else "=") + ast.unparse(default)
    return text


def signature(node: ast.FunctionDef | ast.AsyncFunctionDef, indent: str = "") -> list[str]:
    """`def name(params) -> returns` as lines: one line, or one parameter a line when long."""
    params = _parameters(node.args)
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    head = f"{indent}{'async ' if isinstance(node, ast.AsyncFunctionDef) else ''}def {node.name}"
    one = f"{head}({', '.join(params)}){returns}"
    if len(one) <= WIDTH:
        return [one]
    return [f"{head}(", *(f"{indent}    {p}," for p in params), f"{indent}){returns}"]


def decorators(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, indent: str = "") -> list[str]:
    return [f"{indent}@{ast.unparse(d)}" for d in node.decorator_list]


def arg_types(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
    """Each annotated parameter's type, and the return type under "return", as source text."""
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a)]
    types = {a.arg: ast.unparse(a.annotation) for a in every if a.annotation is not None}
    if node.returns is not None:
        types["return"] = ast.unparse(node.returns)
    return types


# --------------------------------------------------------------------------- classes


@dataclass(frozen=True)
class Field:
    """A dataclass field as the nearest class declaring it writes it."""

    name: str
    code: str  # "name: type = default", the source's text
    meaning: str


def fields_of(cls: type) -> list[Field]:
    """A dataclass's public fields in order, inherited ones included; each with the source text of
    its nearest declaration and the nearest comment written for it."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        code, meaning = "", ""
        for klass in cls.__mro__:
            if f.name not in vars(klass).get("__annotations__", {}):
                continue
            node, lines = source_node(klass)
            stmt = next(s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                        and s.target.id == f.name)
            code = code or ast.unparse(stmt)
            meaning = meaning or literal_names(comment_of(stmt, lines))
            if meaning:
                break
        out.append(Field(f.name, code, meaning))
    return out


def attributes_of(cls: type, node: ast.ClassDef, lines: tuple[str, ...]) -> list[tuple[str, str]]:
    """The public class attributes `cls` itself declares (not dataclass fields): (code, comment)."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    out = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
        else:
            continue
        if name.startswith("_") or (name in fields and not (isinstance(stmt, ast.AnnAssign) and _is_classvar(stmt))):
            continue
        out.append((ast.unparse(stmt), literal_names(comment_of(stmt, lines))))
    return out


def methods_of(node: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The public methods a class statement defines, in source order."""
    return [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and not s.name.startswith("_")]


def class_block(cls: type, node: ast.ClassDef) -> list[str]:
    """The class statement, its fields and its own constructor, as a reader would write them."""
    bases = ", ".join(ast.unparse(b) for b in [*node.bases, *node.keywords])
    out = [*decorators(node), f"class {node.name}({bases}):" if bases else f"class {node.name}:"]
    if dataclasses.is_dataclass(cls):
        out += [f"    {f.code}" for f in fields_of(cls)]
    init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is not None:
        out += signature(init, "    ")
    if len(out) == len(decorators(node)) + 1:
        out.append("    ...")
    return out


# --------------------------------------------------------------------------- the page


def _docstring(node: ast.AST, types: dict[str, str] | None = None) -> str:
    doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
    return to_markdown(parse(doc), types) if doc else ""


def _code(lines: list[str]) -> list[str]:
    return ["```python", *lines, "```", ""]


def render_name(name: str, obj: Any) -> list[str]:
    """One public name: heading, where it is defined, signature block, docstring, members."""
    node, lines = source_node(obj)
    module = inspect.unwrap(obj).__module__
    out = [f"### `rayfl.{name}`", "", f"Defined in `{module}`.", ""]
    if isinstance(node, ast.ClassDef):
        out += _code(class_block(obj, node))
        text = _docstring(node)
        out += [text, ""] if text else []
        if dataclasses.is_dataclass(obj):
            described = [f for f in fields_of(obj) if f.meaning]
            if described:
                out += ["**Fields**", "", *(f"- `{f.name}`: {f.meaning}" for f in described), ""]
        attributes = attributes_of(obj, node, lines)
        if attributes:
            out += ["**Class attributes**", ""]
            out += [f"- `{code}`" + (f": {meaning}" if meaning else "") for code, meaning in attributes]
            out.append("")
        for method in methods_of(node):
            out += [f"#### `{node.name}.{method.name}`", ""]
            out += _code([*decorators(method), *signature(method)])
            text = _docstring(method, arg_types(method))
            out += [text, ""] if text else []
        return out
    out += _code([*decorators(node), *signature(node)])
    text = _docstring(node, arg_types(node))
    return out + ([text, ""] if text else [])


def public_names() -> list[str]:
    rayfl = importlib.import_module("rayfl")
    return [n for n in rayfl.__all__ if n != "__version__"]


def render_markdown() -> str:
    """The whole page. A public name that no section places is an error, so a new export
    cannot be left out of the reference."""
    rayfl = importlib.import_module("rayfl")
    placed = [n for s in SECTIONS for n in s.names]
    missing = sorted(set(public_names()) - set(placed))
    if missing:
        raise ValueError(f"rayfl.api_reference.SECTIONS places no section for: {', '.join(missing)}")
    out = [INTRO]
    for section in SECTIONS:
        out += [f"## {section.title}", ""] + ([section.intro, ""] if section.intro else [])
        for name in section.names:
            out += render_name(name, getattr(rayfl, name))
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
