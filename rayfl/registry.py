"""One small registry per extension kind: algorithms, models, datasets, partitioners.

A job names an entry in the section's selector key (`algorithm.name`, `model.name`,
`data.dataset`, `partition.method`) by

- a registered name: rayfl's built-ins, anything `register_*` added in this process, or an
  installed package's entry point (groups `rayfl.algorithms`, `rayfl.models`, `rayfl.datasets`,
  `rayfl.partitioners`), or
- an import path `"package.module:attr"`, imported when the job is loaded. A module that is not
  importable as the process was started is looked for in the current directory (and the job
  file's), as `python -m` would; the directory it came from travels with the run (`Plugins`) so
  hosts, resumed runs and sweep trials import it too.

Each entry carries its own config dataclass, a subclass of the section's base class
(`AlgorithmConfig`, `ModelConfig`, `DataConfig`, `PartitionConfig`), so the section is
validated against that entry's fields. An entry without one gets the base fields plus `kwargs`,
a mapping handed to its callable as keyword arguments (checked against its signature).

Built-ins are registered exactly like a user's, by `"module:attr"` strings imported on first
use, so loading a job imports the one algorithm / model / dataset it names."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayfl.config import ConfigError

ENTRY_ATTR = "__rayfl_entry__"


@dataclass(frozen=True)
class Entry:
    """One registered thing: its callable (or a `"module:attr"` string imported on first use),
    its config dataclass (or a string, or None for the kind's generic config), a one-line
    summary, and where it came from (built-in, registered, entry point, import path)."""

    kind: str
    name: str
    target: Any
    config: Any = None
    summary: str = ""
    origin: str = "registered"

    def load(self) -> Any:
        """The callable itself."""
        return _import_attr(self.target) if isinstance(self.target, str) else self.target

    def config_class(self) -> type | None:
        """Its own config dataclass, or None (the kind's generic config applies)."""
        return _import_attr(self.config) if isinstance(self.config, str) else self.config

    def describe(self) -> str:
        return self.summary or _first_line(self.load())


@dataclass
class Registry:
    """The entries of one kind, by name. `builtin` is the module whose import registers rayfl's
    own entries (imported on first use); `group` the entry-point group installed packages use."""

    kind: str  # "algorithm", "model", "dataset", "partitioner"
    key: str  # the job key that names an entry, e.g. "model.name"
    group: str  # entry-point group
    builtin: str
    base: str  # "module:attr" of the section's base config class
    generic: str  # "module:attr" of the base class with `kwargs`, for entries without a config
    check: Callable[[Entry, Any], str | None] | None = None  # why a target is not of this kind
    _entries: dict[str, Entry] = field(default_factory=dict)
    _loaded_builtins: bool = False
    _entry_points: dict[str, Any] | None = None

    # ---------------------------------------------------------------- registering

    def register(self, name: str, target: Any = None, *, config: Any = None, summary: str = "",
                 origin: str = "registered", replace: bool = False) -> Any:
        """Register `target` under `name`; without a target, a decorator that registers the
        function it decorates (and returns it unchanged, marked so an import path naming it
        finds this entry too)."""
        if target is None:
            def decorate(fn: Any) -> Any:
                self.register(name, fn, config=config, summary=summary, origin=origin, replace=replace)
                return fn

            return decorate
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"a {self.kind} name must be a non-empty string without ':', got {name!r}")
        if origin != "built-in":
            self._load_builtins()
        if config is None and not isinstance(target, str):
            config = getattr(target, "config", None) if _is_algorithm_class(target) else None
        entry = Entry(self.kind, name, target, config, summary, origin)
        why = self.check(entry, target) if self.check is not None and not isinstance(target, str) else None
        if why is not None:
            raise TypeError(f"cannot register {target!r} as {self.kind} {name!r}: {why}")
        old = self._entries.get(name)
        if old is not None and not replace and not _same_definition(old.target, target):
            raise ValueError(f"{self.kind} {name!r} is already registered ({old.origin}); pass replace=True to replace it")
        self._entries[name] = entry
        if not isinstance(target, str):
            # a mark for import paths naming the target; some objects take no attributes
            with contextlib.suppress(AttributeError, TypeError):
                setattr(target, ENTRY_ATTR, entry)
        return target

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def adopt(self, entry: Entry) -> None:
        """Take an entry another process registered (its driver's, shipped by `Plugins`)."""
        self._entries[entry.name] = entry

    # ---------------------------------------------------------------- looking up

    def names(self) -> list[str]:
        """Every registered name, entry points included."""
        self._load_builtins()
        return sorted(set(self._entries) | set(self._points()))

    def get(self, name: str) -> Entry:
        """The entry a job's `name` means, or a one-line ConfigError at `self.key` that lists
        what is registered."""
        self._load_builtins()
        if not isinstance(name, str) or not name:
            raise ConfigError(self.key, f"must name a {self.kind}, got {name!r}")
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            return self._from_import_path(name)
        points = self._points()
        if name in points:
            entry = self._entry_for(points[name].value, name, f"entry point of {_dist_name(points[name])}")
            self._entries[name] = entry
            return entry
        raise ConfigError(
            self.key,
            f"unknown {self.kind} {name!r}; registered: {self.names()} (or give an import path 'package.module:attr')",
        )

    def config_class(self, name: str) -> type:
        """The config dataclass a section naming `name` is built with."""
        entry = self.get(name)
        cls = entry.config_class()
        if cls is None:
            return _import_attr(self.generic)
        base = _import_attr(self.base)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and issubclass(cls, base)):
            raise ConfigError(self.key, f"{entry.name!r}'s config must be a dataclass subclassing rayfl.{base.__name__}, got {cls!r}")
        return cls

    # ---------------------------------------------------------------- internals

    def _load_builtins(self) -> None:
        if not self._loaded_builtins:
            self._loaded_builtins = True
            importlib.import_module(self.builtin)

    def _points(self) -> dict[str, Any]:
        """Installed packages' entry points of this kind's group, read once."""
        if self._entry_points is None:
            from importlib.metadata import entry_points

            self._entry_points = {ep.name: ep for ep in entry_points(group=self.group)}
        return self._entry_points

    def _from_import_path(self, path: str) -> Entry:
        return self._entry_for(path, path, "import path")

    def _entry_for(self, path: str, name: str, origin: str) -> Entry:
        """The entry an import path (or an entry point's value) leads to."""
        obj = import_object(path, self.key)
        marked = getattr(obj, ENTRY_ATTR, None)
        if isinstance(obj, Entry):
            marked = obj
        if isinstance(marked, Entry) and marked.kind == self.kind:
            entry = dataclasses.replace(marked, name=name, origin=origin)
        elif isinstance(marked, Entry):
            raise ConfigError(self.key, f"{path!r} is registered as a {marked.kind}, not a {self.kind}")
        else:
            config = getattr(obj, "config", None) if _is_algorithm_class(obj) else None
            entry = Entry(self.kind, name, obj, config, "", origin)
        why = self.check(entry, entry.load()) if self.check is not None else None
        if why is not None:
            raise ConfigError(self.key, f"{path!r} is not a {self.kind}: {why}")
        return entry


# --------------------------------------------------------------------------- other processes


@dataclass(frozen=True)
class Plugins:
    """What another process (a host, a sweep trial, a resumed run) needs to resolve a run's
    entries as its driver did: the directories the driver added to sys.path, the job keys that
    name user code (import paths, entry points) and, pickled, the entries registered from
    Python in the driver (by value when they live in `__main__`, e.g. a notebook)."""

    roots: tuple[str, ...] = ()
    names: tuple[tuple[str, str], ...] = ()  # (job key, name) of each user entry
    registered: bytes | None = None

    @classmethod
    def of(cls, cfg: Any) -> Plugins:
        """The user code `cfg` names (its registries' non-built-in entries)."""
        names, shipped, roots = [], {}, added_roots()
        named = [(registry, getattr(getattr(cfg, section), registry.key.split(".")[1])) for section, registry in BY_SECTION.items()]
        named += [(CALLBACKS, cb.name) for cb in getattr(cfg, "callbacks", [])]
        for registry, name in named:
            entry = registry.get(name)
            if entry.origin == "built-in":
                continue
            names.append((registry.key, name))
            if entry.origin == "registered":
                shipped[(registry.kind, name)] = entry
            for obj in (entry.load(), entry.config_class()):
                root = module_root(obj)
                if root is not None and root not in roots:
                    roots.append(root)
        blob = None
        if shipped:
            import ray.cloudpickle as cloudpickle

            blob = cloudpickle.dumps(shipped)
        return cls(tuple(roots), tuple(names), blob)

    def to_manifest(self) -> dict[str, Any]:
        return {"roots": list(self.roots), "names": {key: name for key, name in self.names},
                "registered_from_python": self.registered is not None}

    def install(self, where: str = "") -> None:
        """Make the entries resolvable here: the driver's directories that exist here go on
        sys.path, every user entry is imported (a ConfigError naming the job key, the import
        path and `where` when one cannot be), and the driver's registered entries registered."""
        for root in self.roots:
            if Path(root).is_dir():
                add_root(root)
        if self.registered is not None:
            import pickle

            try:
                shipped = pickle.loads(self.registered)
            except Exception as e:
                raise ConfigError("plugins", f"cannot load the entries registered in the driver{_on(where)}: "
                                  f"{type(e).__name__}: {_one_line(e)}") from None
            for where, entry in shipped.items():
                REGISTRIES[where[0] if isinstance(where, tuple) else where].adopt(entry)
        for key, name in self.names:
            registry = next(r for r in REGISTRIES.values() if r.key == key)
            try:
                registry.get(name).load()
            except ConfigError as e:
                raise ConfigError(key, f"{str(e).partition(': ')[2]}{_on(where)}") from None


def module_root(obj: Any) -> str | None:
    """The sys.path directory `obj`'s top-level package was imported from (None for objects
    of `__main__`, which travel by value, or without a file)."""
    module = getattr(obj, "__module__", None)
    if not module or module == "__main__":
        return None
    top = sys.modules.get(module.split(".")[0])
    where = getattr(top, "__file__", None)
    if where is None:
        return None
    path = Path(where).resolve()
    return str(path.parent.parent if path.name == "__init__.py" else path.parent)


def _on(where: str) -> str:
    return f" (on {where})" if where else ""


# --------------------------------------------------------------------------- import paths

# Directories added to sys.path to import a job's import paths (the current directory, the
# job file's): hosts, resumed runs and sweep trials add them too (`Plugins`).
_added_roots: list[str] = []
# Where else to look for a job's modules while it loads (the job file's directory).
_search_dirs: list[str] = []


@contextlib.contextmanager
def searching(directory: str | Path | None) -> Iterator[None]:
    """While a job file loads, its directory is searched for its import paths' modules too."""
    if directory is None:
        yield
        return
    _search_dirs.append(str(directory))
    try:
        yield
    finally:
        _search_dirs.pop()


def import_object(path: str, key: str, search: tuple[str, ...] = ()) -> Any:
    """`"package.module:attr"` imported, or a one-line ConfigError at `key`. A module not
    importable from sys.path is looked for in `search` directories and the current directory."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr or any(not part.isidentifier() for part in module_name.split(".")):
        raise ConfigError(key, f"{path!r} is not an import path 'package.module:attr'")
    module = _import_module(module_name, key, path, search)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(key, f"{path!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _import_module(module_name: str, key: str, path: str, search: tuple[str, ...]) -> Any:
    top = module_name.split(".")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != top:  # the module was found; something it imports was not
            raise ConfigError(key, f"cannot import {path!r}: {_one_line(e)}") from None
        first_error: BaseException = e
    except Exception as e:  # the user's module raised while importing
        raise ConfigError(key, f"cannot import {path!r}: {type(e).__name__}: {_one_line(e)}") from None
    for root in (*search, *reversed(_search_dirs), os.getcwd()):
        if (Path(root) / top).is_dir() or (Path(root) / f"{top}.py").is_file():
            add_root(root)
            try:
                return importlib.import_module(module_name)
            except Exception as e:
                raise ConfigError(key, f"cannot import {path!r}: {type(e).__name__}: {_one_line(e)}") from None
    raise ConfigError(key, f"cannot import {path!r}: {_one_line(first_error)} (looked on sys.path and in {os.getcwd()})")


def add_root(root: str) -> None:
    """Put `root` on sys.path (first) and remember it for the run's other processes."""
    root = str(Path(root).absolute())
    if root not in sys.path:
        sys.path.insert(0, root)
        importlib.invalidate_caches()
    if root not in _added_roots:
        _added_roots.append(root)


def added_roots() -> list[str]:
    return list(_added_roots)


def _import_attr(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _same_definition(old: Any, new: Any) -> bool:
    """The same object, or the same definition made again (a module imported afresh, a
    notebook cell run twice): same module and qualified name."""
    if old is new:
        return True
    return not isinstance(old, str) and _defined_at(old) == _defined_at(new) and _defined_at(new)[1] is not None


def _defined_at(obj: Any) -> tuple[Any, Any]:
    return getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)


def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())[:120]


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or ep.value.split(":")[0].split(".")[0]


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def check_kwargs(key: str, fn: Any, positional: int, kwargs: dict[str, Any]) -> None:
    """A ConfigError at `key.<name>` for a keyword `fn` does not take (after its first
    `positional` parameters), listing those it does."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    takes = [p.name for p in params[positional:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in kwargs:
        if name not in takes:
            raise ConfigError(f"{key}.{name}", f"{getattr(fn, '__name__', fn)!s} takes no keyword {name!r}; it takes {takes}")


# --------------------------------------------------------------------------- kinds


def _is_algorithm_class(target: Any) -> bool:
    """A class built from parts (rayfl.Algorithm), known by its marker: no import of the drivers."""
    return isinstance(target, type) and bool(getattr(target, "__rayfl_algorithm__", False))


def algorithm_class(cfg: Any) -> type | None:
    """The parts-built algorithm class a config names, or None for a hand-written server loop."""
    target = ALGORITHMS.get(cfg.algorithm.name).load()
    return target if _is_algorithm_class(target) else None


def _check_algorithm(entry: Entry, target: Any) -> str | None:
    """An algorithm is a class built from parts (rayfl.Algorithm) or a server loop function."""
    if _is_algorithm_class(target):
        return None
    return _check_callable("fed", "cfg", "run")(entry, target)


def _check_callable(*positional: str, classes: bool = False) -> Callable[[Entry, Any], str | None]:
    """A check that the target is callable with these leading positional parameters (a class
    only where `classes`: a model may be an nn.Module subclass, a server loop is a function)."""

    def check(entry: Entry, target: Any) -> str | None:
        if not callable(target):
            return f"{type(target).__name__} is not callable"
        if isinstance(target, type) and not classes:
            what = "a subclass of rayfl.Algorithm or a server-loop function" if entry.kind == "algorithm" else "a function"
            return f"it is a class ({target.__name__}); a {entry.kind} is {what}"
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            return None  # a builtin or C callable: trust it
        try:
            sig.bind_partial(*positional)
        except TypeError:
            return f"it must take ({', '.join(positional)}), its signature is {sig}"
        return None

    return check


ALGORITHMS = Registry(
    "algorithm", "algorithm.name", "rayfl.algorithms", "rayfl.algorithms.catalog",
    "rayfl.config:AlgorithmConfig", "rayfl.config:GenericAlgorithmConfig", _check_algorithm,
)
MODELS = Registry(
    "model", "model.name", "rayfl.models", "rayfl.models.catalog",
    "rayfl.config:ModelConfig", "rayfl.config:GenericModelConfig", _check_callable("input_shape", "num_classes", classes=True),
)
DATASETS = Registry(
    "dataset", "data.dataset", "rayfl.datasets", "rayfl.data.catalog",
    "rayfl.config:DataConfig", "rayfl.config:GenericDataConfig", _check_callable("cfg", "seed"),
)
PARTITIONERS = Registry(
    "partitioner", "partition.method", "rayfl.partitioners", "rayfl.data.partition",
    "rayfl.config:PartitionConfig", "rayfl.config:GenericPartitionConfig",
    _check_callable("labels", "num_clients", "cfg", "rng"),
)
CALLBACKS = Registry(
    "callback", "callbacks.name", "rayfl.callbacks", "rayfl.callbacks.catalog",
    "rayfl.config:CallbackConfig", "rayfl.config:GenericCallbackConfig", _check_callable(classes=True),
)
REGISTRIES: dict[str, Registry] = {r.kind: r for r in (ALGORITHMS, MODELS, DATASETS, PARTITIONERS, CALLBACKS)}
# the sections that name one entry (the job's `callbacks:` is a list, resolved on its own)
BY_SECTION: dict[str, Registry] = {r.key.split(".")[0]: r for r in (ALGORITHMS, MODELS, DATASETS, PARTITIONERS)}


def register_algorithm(name: str, run: Any = None, *, config: Any = None, summary: str = "") -> Any:
    """Make an algorithm available to jobs as `algorithm.name: NAME`; a decorator without `run`.

    Args:
        name: the name a job gives (no `:`).
        run: a subclass of `rayfl.Algorithm` (its `config` is its config class), or a server
            loop `run(fed, cfg, run_cfg) -> dict`.
        config: the config dataclass, a subclass of `rayfl.AlgorithmConfig` (an `Algorithm`
            subclass's `config` when omitted).
        summary: the line `rayfl list` shows (default: the docstring's first line).

    Returns:
        `run`, unchanged (the decorator too returns what it decorates)."""
    return ALGORITHMS.register(name, run, config=config, summary=summary)


def register_model(name: str, factory: Any = None, *, config: Any = None, summary: str = "") -> Any:
    """Make a network available to jobs as `model.name: NAME`; a decorator without `factory`.

    Args:
        name: the name a job gives (no `:`).
        factory: `(input_shape, num_classes, **kwargs) -> torch.nn.Module`, a network whose
            state is all in its parameters (no buffers).
        config: its config dataclass, a subclass of `rayfl.ModelConfig` whose own fields are
            the factory's keyword arguments; without one the job's `model.kwargs` are.
        summary: the line `rayfl list` shows (default: the docstring's first line).

    Returns:
        `factory`, unchanged."""
    return MODELS.register(name, factory, config=config, summary=summary)


def register_dataset(name: str, load: Any = None, *, config: Any = None, summary: str = "") -> Any:
    """Make a dataset available to jobs as `data.dataset: NAME`; a decorator without `load`.

    Args:
        name: the name a job gives (no `:`).
        load: `(cfg, seed, **kwargs)` returning an `ArrayDataset` (rayfl splits off the test
            set), a `(train, test)` pair of them, or a `FederatedDataset` (its own clients).
        config: its config dataclass, a subclass of `rayfl.DataConfig`.
        summary: the line `rayfl list` shows (default: the docstring's first line).

    Returns:
        `load`, unchanged."""
    return DATASETS.register(name, load, config=config, summary=summary)


def register_partitioner(name: str, split: Any = None, *, config: Any = None, summary: str = "") -> Any:
    """Make a partitioner available to jobs as `partition.method: NAME`; a decorator without
    `split`.

    Args:
        name: the name a job gives (no `:`).
        split: `(labels, num_clients, cfg, rng, **kwargs) -> list of index arrays`, one per
            client, disjoint, its randomness drawn from `rng` only.
        config: its config dataclass, a subclass of `rayfl.PartitionConfig`.
        summary: the line `rayfl list` shows (default: the docstring's first line).

    Returns:
        `split`, unchanged."""
    return PARTITIONERS.register(name, split, config=config, summary=summary)


def register_callback(name: str, factory: Any = None, *, config: Any = None, summary: str = "") -> Any:
    """Make a callback available to jobs as a `callbacks:` item `name: NAME`; a decorator
    without `factory`.

    Args:
        name: the name a job gives (no `:`).
        factory: `(cfg) -> rayfl.Callback`; a Callback subclass whose constructor takes the
            config works too.
        config: its config dataclass, a subclass of `rayfl.CallbackConfig`; without one the
            factory gets the item's `kwargs` as keyword arguments.
        summary: the line `rayfl list` shows (default: the docstring's first line).

    Returns:
        `factory`, unchanged."""
    return CALLBACKS.register(name, factory, config=config, summary=summary)
