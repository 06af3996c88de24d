"""Saved state as data: a tree of plain values and arrays written as JSON plus raw arrays, so
that reading it back can never run code (unlike pickle, which runs whatever the file says).

A tree may hold None, bools, ints, floats, strings, bytes, numpy arrays and scalars, torch
tensors (any dtype, bfloat16 included: their bytes are kept, so a resume is bit-identical) and
dicts, lists, tuples and sets of them. Where the caller allows it, it may also hold dataclass
instances and functions, both stored by `module:qualname`; reading them back looks the name up
only through a `Resolver`, which knows the modules the run's own code lives in and never
imports anything. Anything else cannot be saved: `UnsavableState` names its key path."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from rayfl.errors import ConfigError

TAG = "$"  # the key of a JSON object that stands for a value JSON has no type for
SAVABLE = "arrays, tensors, numbers, strings, bools, None and dicts, lists and tuples of them"


class UnsavableState(ConfigError):
    """A state holds something that cannot be saved as data; the key is its path
    (e.g. `ctx.state['opt']['fn']`)."""

    def __init__(self, key: str, message: str):
        super().__init__(key, message)
        self.why = message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # raised on a host, it crosses to the driver whole
        return UnsavableState, (self.key, self.why)


class UnreadableState(ValueError):
    """Saved state that does not decode (a damaged file, or a name no Resolver allows)."""


@dataclasses.dataclass(frozen=True)
class Resolver:
    """Which names a saved tree may refer to: classes and functions of modules already
    imported whose names start with one of `prefixes` (rayfl itself and the packages of the
    algorithm and callbacks the run's config names). Nothing is imported from a saved name."""

    prefixes: tuple[str, ...] = ("rayfl",)

    def allows(self, module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in self.prefixes)

    def find(self, name: str) -> Any:
        """The object `module:qualname` names; UnreadableState unless it is allowed."""
        module, _, qualname = name.partition(":")
        if not self.allows(module) or module not in sys.modules or not qualname or "<" in qualname:
            raise UnreadableState(f"{name!r} is not code this run uses")
        obj: Any = sys.modules[module]
        for i, part in enumerate(qualname.split(".")):
            if i and not isinstance(obj, type):  # through classes only, never another module
                raise UnreadableState(f"{name!r} is not defined there")
            obj = vars(obj).get(part)
            if obj is None:
                raise UnreadableState(f"{name!r} is not defined")
        inner = obj.__func__ if isinstance(obj, staticmethod) else obj
        if not self.allows(getattr(inner, "__module__", None) or ""):  # imported there from elsewhere
            raise UnreadableState(f"{name!r} is not code this run uses")
        return obj

    def dataclass(self, name: str) -> type:
        cls = self.find(name)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise UnreadableState(f"{name!r} is not a dataclass")
        return cls

    def function(self, name: str) -> Callable[..., Any]:
        fn = self.find(name)
        fn = fn.__func__ if isinstance(fn, staticmethod) else fn
        if not isinstance(fn, types.FunctionType):
            raise UnreadableState(f"{name!r} is not a function")
        return fn


def module_prefixes(objects: Iterable[Any]) -> tuple[str, ...]:
    """The top-level packages `objects` (classes, functions) were defined in, for a Resolver."""
    return tuple(sorted({getattr(o, "__module__", "").partition(".")[0] for o in objects} - {""}))


# ---------------------------------------------------------------------------- writing


class Encoder:
    """Turns trees into JSON-able nodes, collecting their arrays in `arrays` (npz names a0, a1...)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, value: Any, where: str, *, dataclasses_ok: bool = False, functions_ok: bool = False) -> Any:
        self._dc, self._fn = dataclasses_ok, functions_ok
        return self._node(value, where)

    def _array(self, arr: np.ndarray) -> str:
        name = f"a{len(self.arrays)}"
        self.arrays[name] = arr
        return name

    def _node(self, v: Any, where: str) -> Any:
        kind = type(v)
        if v is None or kind in (bool, int, str):
            return v
        if kind is float:
            return v if v == v and v not in (float("inf"), float("-inf")) else {TAG: "float", "repr": repr(v)}
        if kind is list:
            return [self._node(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if kind is tuple:
            return {TAG: "tuple", "items": [self._node(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if kind in (set, frozenset):
            items = sorted(v, key=repr)
            return {TAG: kind.__name__, "items": [self._node(x, f"{where}{{{x!r}}}") for x in items]}
        if kind is dict:
            return self._dict(v, where)
        if isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise UnsavableState(where, f"holds a numpy array of Python objects; a saved state holds {SAVABLE}")
            return {TAG: "array", "ref": self._array(np.ascontiguousarray(v))}
        if isinstance(v, np.generic):
            if isinstance(v, np.object_):
                raise UnsavableState(where, f"holds a numpy object scalar; a saved state holds {SAVABLE}")
            return {TAG: "scalar", "ref": self._array(np.asarray(v))}
        if isinstance(v, torch.Tensor):
            return self._tensor(v, where)
        if kind is bytes:
            return {TAG: "bytes", "ref": self._array(np.frombuffer(v, dtype=np.uint8))}
        if self._dc and dataclasses.is_dataclass(v) and not isinstance(v, type):
            return self._dataclass(v, where)
        if self._fn and isinstance(v, types.FunctionType):
            return {TAG: "function", "name": _function_name(v, where)}
        raise UnsavableState(where, f"holds {describe(v)}; a saved state holds {SAVABLE}")

    def _dict(self, v: dict[Any, Any], where: str) -> Any:
        if all(type(k) is str and k != TAG for k in v):
            return {k: self._node(x, f"{where}[{k!r}]") for k, x in v.items()}
        return {TAG: "dict", "items": [[self._node(k, f"{where} key {k!r}"), self._node(x, f"{where}[{k!r}]")]
                                       for k, x in v.items()]}

    def _tensor(self, t: torch.Tensor, where: str) -> dict[str, Any]:
        if t.layout != torch.strided or t.is_quantized:
            raise UnsavableState(where, f"holds a {t.layout} tensor; a saved state holds dense tensors")
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat  # its bytes, whatever the dtype
        node = {TAG: "tensor", "ref": self._array(raw.numpy().copy()), "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape)}
        if t.device.type != "cpu":
            node["device"] = str(t.device)
        if t.requires_grad:
            node["requires_grad"] = True
        return node

    def _dataclass(self, v: Any, where: str) -> dict[str, Any]:
        cls = type(v)
        names = list(vars(v)) if hasattr(v, "__dict__") else [f.name for f in dataclasses.fields(v)]
        return {TAG: "dataclass", "class": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {n: self._node(getattr(v, n), f"{where}.{n}") for n in names}}


def _function_name(fn: types.FunctionType, where: str) -> str:
    """`module:qualname` of a module-level function (or a class's static one)."""
    name = f"{fn.__module__}:{fn.__qualname__}"
    try:
        found = Resolver((fn.__module__,)).function(name)
    except UnreadableState:
        found = None
    if found is not fn:
        raise UnsavableState(where, f"holds {describe(fn)}, which its name {name!r} does not find again; a task's "
                                    "function must be defined at module level (or as a class's staticmethod)")
    return name


def describe(v: Any) -> str:
    """What `v` is, for an error: 'a function (<lambda>)', 'a threading.Lock'."""
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return f"a function ({getattr(v, '__qualname__', v)})"
    cls = type(v)
    return f"a {cls.__qualname__ if cls.__module__ == 'builtins' else cls.__module__ + '.' + cls.__qualname__}"


def check_savable(value: Any, where: str, *, dataclasses_ok: bool = False, context: str = "") -> None:
    """Raise UnsavableState naming the first key path of `value` that cannot be saved, and
    `context` (whose code put it there). Cheap: it walks the containers, copying no array."""
    enc = Encoder()
    enc._array = lambda arr: ""  # type: ignore[method-assign]  # only the walk is wanted
    try:
        enc.encode(value, where, dataclasses_ok=dataclasses_ok)
    except UnsavableState as e:
        if not context:
            raise
        raise UnsavableState(e.key, f"{e.why} ({context})") from None


# ---------------------------------------------------------------------------- reading


def decode(node: Any, arrays: Callable[[str], np.ndarray], resolver: Resolver) -> Any:
    """The tree `node` stands for; `arrays(name)` reads one stored array."""
    if isinstance(node, list):
        return [decode(x, arrays, resolver) for x in node]
    if not isinstance(node, dict):
        return node
    tag = node.get(TAG)
    if tag is None:
        return {k: decode(x, arrays, resolver) for k, x in node.items()}
    if tag == "dict":
        return {_hashable(decode(k, arrays, resolver)): decode(x, arrays, resolver) for k, x in node["items"]}
    if tag in ("tuple", "set", "frozenset"):
        items = [decode(x, arrays, resolver) for x in node["items"]]
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](
            items if tag == "tuple" else map(_hashable, items))
    if tag == "float":
        return float(node["repr"])
    if tag == "array":
        return arrays(node["ref"])
    if tag == "scalar":
        return arrays(node["ref"])[()]
    if tag == "bytes":
        return arrays(node["ref"]).tobytes()
    if tag == "tensor":
        return _tensor(node, arrays(node["ref"]))
    if tag == "dataclass":
        return _rebuild(resolver.dataclass(node["class"]), {k: decode(x, arrays, resolver) for k, x in node["fields"].items()})
    if tag == "function":
        return resolver.function(node["name"])
    raise UnreadableState(f"unknown value kind {tag!r}")


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, dict, set, np.ndarray, torch.Tensor)):
        raise UnreadableState("a dict key or set item that is not hashable")
    return v


def _tensor(node: dict[str, Any], raw: np.ndarray) -> torch.Tensor:
    dtype = getattr(torch, str(node["dtype"]), None)
    if not isinstance(dtype, torch.dtype) or raw.dtype != np.uint8 or raw.ndim != 1:
        raise UnreadableState(f"a tensor of dtype {node['dtype']!r} stored as {raw.dtype}")
    if raw.size == 0:  # no bytes to view as `dtype`
        t = torch.empty(0, dtype=dtype)
    else:
        t = torch.from_numpy(raw.copy())
        t = t.view(dtype) if dtype != torch.uint8 else t
    t = t.reshape([int(n) for n in node["shape"]])
    device = torch.device(str(node.get("device", "cpu")))
    if device.type == "cuda" and torch.cuda.is_available():  # a GPU's tensor goes back to a GPU, if there is one
        index = device.index if device.index is not None and device.index < torch.cuda.device_count() else 0
        t = t.to(torch.device("cuda", index))
    return t.requires_grad_() if node.get("requires_grad") else t


def _rebuild(cls: type, values: dict[str, Any]) -> Any:
    """An instance of dataclass `cls` holding `values`, made without calling its code."""
    known = {f.name for f in dataclasses.fields(cls)}
    missing = known - set(values)
    if missing:
        raise UnreadableState(f"{cls.__qualname__} without {sorted(missing)}")
    if any(not isinstance(k, str) or k.startswith("__") for k in values):  # never __class__, __dict__, ...
        raise UnreadableState(f"{cls.__qualname__} with an attribute that is not data")
    obj = object.__new__(cls)
    for k, v in values.items():
        object.__setattr__(obj, k, v)
    return obj


def to_json(tree: Any) -> bytes:
    return json.dumps(tree, separators=(",", ":"), allow_nan=False).encode()


def from_json(data: bytes) -> Any:
    return json.loads(data.decode())
