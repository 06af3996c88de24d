"""Checkpoints: a run's whole state at the end of a server round, as one file beside its Parquet.

What a run needs to continue exactly as if never stopped: the server loop's state object (the
one it registered with `fed.track`), every client's committed state, the simulated clock, the
model version, the task counter, the specs of asynchronous tasks still in flight, and how many
part files each results table had. Random draws need nothing: every stream is derived from
(seed, purpose, round, client), so a resumed round draws what the uninterrupted one drew.

The file, `checkpoint.npz`, holds data only (rayfl.engine.state_codec): the tree as JSON plus
its arrays, read with `allow_pickle=False`; dataclasses and task functions come back only as
classes and functions of the run's own code (a Resolver), so reading a checkpoint from an
untrusted bucket never runs code. A `checkpoint.pkl` of an older rayfl is pickle, which runs
whatever the file holds: it is read only when the caller says it trusts the directory.

The file is replaced atomically (temp dot-name, fsync, rename on local disk; one complete PUT on
an object store), so a crash while checkpointing leaves the previous checkpoint intact. The one
before it is kept too, as `checkpoint.prev.npz`: a checkpoint damaged afterwards (an interrupted
copy, a truncated upload) is named in one line, and a resume falls back to the previous one,
saying so; the run then drops the rows written after that one and produces them again."""

from __future__ import annotations

import io
import logging
import posixpath
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.engine.state_codec import (
    Encoder,
    Resolver,
    UnreadableState,
    decode,
    from_json,
    module_prefixes,
    to_json,
)
from rayfl.errors import ConfigError
from rayfl.results.storage import Location, write_atomically

if TYPE_CHECKING:
    from rayfl.config import Config

CHECKPOINT_FILE = "checkpoint.npz"
PREVIOUS_FILE = "checkpoint.prev.npz"  # the checkpoint before the last one: a resume's fallback
PICKLE_FILES = ("checkpoint.pkl", "checkpoint.prev.pkl")  # an older rayfl's, read only when trusted
FORMAT = "rayfl.checkpoint"
VERSION = 1
TREE = "tree"  # the npz member holding the JSON tree; the arrays are a0, a1, ...
RAYFL_ONLY = Resolver()  # what a run of built-in code may name


@dataclass
class Checkpoint:
    """The state of a run after server round `round` (see the module docstring)."""

    round: int
    server_state: Any
    client_states: dict[int, dict[str, Any]]
    clock: float
    model_version: int
    next_task: int
    pools: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)
    pipeline: dict[str, Any] | None = None  # the round pipeline's state (adaptive clip, references)
    callbacks: list[dict[str, Any]] = field(default_factory=list)  # each callback's state_dict
    model: Any = None  # the global model at the checkpoint, as the algorithm says (model.init_from reads it)
    driver: dict[str, Any] = field(default_factory=dict)  # the driver's own state (the server optimizer's moments)


class DamagedCheckpoint(ConfigError):
    """No checkpoint of a run can be read: one line naming the files and why (exit status 2)."""


class UntrustedPickle(ConfigError):
    """A pickle checkpoint that the caller did not say it trusts (exit status 2)."""


def resolver_for(cfg: Config) -> Resolver:
    """What a checkpoint of a run of `cfg` may name (see `resolver_named`)."""
    return resolver_named(cfg.algorithm.name, [cb.name for cb in getattr(cfg, "callbacks", [])])


def resolver_named(algorithm: str, callbacks: Iterable[str] = ()) -> Resolver:
    """rayfl's classes and functions and those of the packages the run's algorithm and
    callbacks come from, loaded through the registries as the run itself loads them, so a
    checkpoint's names are looked up, never imported."""
    import rayfl.driver.asynchronous  # noqa: F401  # the classes a checkpoint holds beside the algorithm's
    import rayfl.engine.asyncpool  # noqa: F401
    import rayfl.pipeline.uploads  # noqa: F401
    from rayfl.registry import ALGORITHMS, CALLBACKS

    code = [ALGORITHMS.get(algorithm).load(), *(CALLBACKS.get(name).load() for name in callbacks)]
    return Resolver(tuple(sorted({"rayfl", *module_prefixes(code)})))


def checkpoint_bytes(ckpt: Checkpoint) -> bytes:
    """`ckpt` as an npz file: the JSON tree and its arrays. UnsavableState names what cannot be
    saved (a function in a client's state, an open file in the server's)."""
    enc = Encoder()
    tree: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    for f in fields(ckpt):
        value = getattr(ckpt, f.name)
        if f.name == "client_states":
            tree[f.name] = [[cid, enc.encode(state, f"client {cid}'s ctx.state")] for cid, state in value.items()]
        else:
            where = {"driver": "driver_state"}.get(f.name, f.name)
            tree[f.name] = enc.encode(value, where, dataclasses_ok=True, functions_ok=f.name == "pools")
    buf = io.BytesIO()
    np.savez(buf, **{TREE: np.frombuffer(to_json(tree), dtype=np.uint8)}, **enc.arrays)
    return buf.getvalue()


def checkpoint_from_bytes(data: bytes, resolver: Resolver) -> Checkpoint:
    """The Checkpoint an npz file holds, never unpickling anything; UnreadableState,
    zipfile.BadZipFile, ValueError, KeyError when it is not one."""
    archive = np.load(io.BytesIO(data), allow_pickle=False)
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UnreadableState("not an npz file")
    with archive:
        tree = from_json(archive[TREE].tobytes())
        if not isinstance(tree, dict) or tree.get("format") != FORMAT:
            raise UnreadableState("not a rayfl checkpoint")
        if tree.get("version") != VERSION:
            raise UnreadableState(f"format version {tree.get('version')!r}, this rayfl reads {VERSION}")
        values = {f.name: decode(tree[f.name], archive.__getitem__, resolver) for f in fields(Checkpoint)
                  if f.name != "client_states"}
        values["client_states"] = {int(cid): decode(node, archive.__getitem__, resolver)
                                   for cid, node in tree["client_states"]}
    return Checkpoint(**values)


def save_checkpoint(run_dir: Location, ckpt: Checkpoint) -> None:
    """Write `ckpt` as `<run_dir>/checkpoint.npz`, replacing the previous one atomically; that
    one becomes `checkpoint.prev.npz`. An older rayfl's pickle checkpoints, now stale, go."""
    data = checkpoint_bytes(ckpt)
    current = run_dir.child(CHECKPOINT_FILE)
    if current.is_file():
        current.fs.move(current.path, run_dir.child(PREVIOUS_FILE).path)
    write_atomically(current, data)
    for name in PICKLE_FILES:
        old = run_dir.child(name)
        if old.is_file():
            old.fs.delete_file(old.path)


def read_checkpoint(target: Location, resolver: Resolver = RAYFL_ONLY, trust_pickle: bool = False) -> Checkpoint:
    """One checkpoint file; DamagedCheckpoint when it cannot be read back as one. The default
    `resolver` knows rayfl's own code only (a run of a built-in algorithm)."""
    if file_name(target) in PICKLE_FILES:
        return _read_pickle(target, trust_pickle)
    try:
        return checkpoint_from_bytes(target.read_bytes(), resolver)
    except (UnreadableState, zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError, KeyError,
            IndexError, RuntimeError) as e:
        raise DamagedCheckpoint(str(target), f"damaged ({type(e).__name__}: {' '.join(str(e).split())})") from None


def _read_pickle(target: Location, trust_pickle: bool) -> Checkpoint:
    """An older rayfl's pickle checkpoint, only when the caller trusts the run directory."""
    if not trust_pickle:
        raise UntrustedPickle(str(target), "is a pickle checkpoint of an older rayfl, and loading pickle runs any "
                                           "code the file holds; resume with --trust-pickle (rayfl.resume(..., "
                                           "trust_pickle=True)) only if you wrote this run directory yourself")
    import pickle

    try:
        ckpt = pickle.loads(target.read_bytes())
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as e:
        raise DamagedCheckpoint(str(target), f"damaged ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not isinstance(ckpt, Checkpoint):
        raise DamagedCheckpoint(str(target), "not a rayfl checkpoint")
    return ckpt


def file_name(target: Location) -> str:
    """The file's own name (a Location's `name` is its whole path or URI)."""
    return posixpath.basename(target.path)


def has_checkpoint(run_dir: Location) -> bool:
    """Whether the run wrote a checkpoint (of either format), without reading it."""
    return any(run_dir.child(name).is_file() for name in (CHECKPOINT_FILE, PREVIOUS_FILE, *PICKLE_FILES))


def load_checkpoint(run_dir: Location, resolver: Resolver = RAYFL_ONLY, trust_pickle: bool = False) -> Checkpoint | None:
    """The run's last checkpoint, or None when it never wrote one. A damaged or missing last
    checkpoint falls back to the one before it, with a one-line warning; when neither can be
    read, DamagedCheckpoint names both. Only a run without a checkpoint.npz reads the pickle
    files an older rayfl wrote, and only with `trust_pickle` (else UntrustedPickle)."""
    current, previous = run_dir.child(CHECKPOINT_FILE), run_dir.child(PREVIOUS_FILE)
    if not current.is_file() and not previous.is_file():
        current, previous = (run_dir.child(name) for name in PICKLE_FILES)
        if not current.is_file() and not previous.is_file():
            return None
    why: list[str] = []
    for target in (current, previous):
        if not target.is_file():
            why.append(f"{file_name(target)} is missing")
            continue
        try:
            ckpt = read_checkpoint(target, resolver, trust_pickle)
        except DamagedCheckpoint as e:
            why.append(f"{file_name(target)} is {str(e).partition(': ')[2]}")
            continue
        if target is previous:
            logging.getLogger(__name__).warning(
                "%s: %s; using %s (round %d) instead", run_dir, why[0], file_name(previous), ckpt.round)
        return ckpt
    raise DamagedCheckpoint(str(current), f"no checkpoint of this run can be read: {'; '.join(why)}")
