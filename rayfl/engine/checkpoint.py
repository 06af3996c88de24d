"""Checkpoints: a run's whole state at the end of a server round, as one file beside its Parquet.

What a run needs to continue exactly as if never stopped: the server loop's state object (the
one it registered with `fed.track`), every client's committed state, the simulated clock, the
model version, the task counter, the specs of asynchronous tasks still in flight, and how many
part files each results table had. Random draws need nothing: every stream is derived from
(seed, purpose, round, client), so a resumed round draws what the uninterrupted one drew.

The file is replaced atomically (temp dot-name, fsync, rename on local disk; one complete PUT on
an object store), so a crash while checkpointing leaves the previous checkpoint intact. The one
before it is kept too, as `checkpoint.prev.pkl`: a checkpoint damaged afterwards (an interrupted
copy, a truncated upload) is named in one line, and a resume falls back to the previous one,
saying so; the run then drops the rows written after that one and produces them again."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rayfl.errors import ConfigError
from rayfl.results.storage import Location, write_atomically

CHECKPOINT_FILE = "checkpoint.pkl"
PREVIOUS_FILE = "checkpoint.prev.pkl"  # the checkpoint before the last one: a resume's fallback


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


def save_checkpoint(run_dir: Location, ckpt: Checkpoint) -> None:
    """Write `ckpt` as `<run_dir>/checkpoint.pkl`, replacing the previous one atomically; that
    one becomes `checkpoint.prev.pkl`."""
    from ray import cloudpickle  # pickles client functions defined anywhere, by reference or value

    data = cloudpickle.dumps(ckpt)
    current = run_dir.child(CHECKPOINT_FILE)
    if current.is_file():
        current.fs.move(current.path, run_dir.child(PREVIOUS_FILE).path)
    write_atomically(current, data)


class DamagedCheckpoint(ConfigError):
    """No checkpoint of a run can be read: one line naming the files and why (exit status 2)."""


def read_checkpoint(target: Location) -> Checkpoint:
    """One checkpoint file; DamagedCheckpoint when it cannot be read back as one."""
    import pickle

    try:
        ckpt = pickle.loads(target.read_bytes())
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as e:
        raise DamagedCheckpoint(str(target), f"damaged ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not isinstance(ckpt, Checkpoint):
        raise DamagedCheckpoint(str(target), "not a rayfl checkpoint")
    return ckpt


def load_checkpoint(run_dir: Location) -> Checkpoint | None:
    """The run's last checkpoint, or None when it never wrote one. A damaged or missing last
    checkpoint falls back to the one before it, with a one-line warning; when neither can be
    read, DamagedCheckpoint names both."""
    current, previous = run_dir.child(CHECKPOINT_FILE), run_dir.child(PREVIOUS_FILE)
    if not current.is_file() and not previous.is_file():
        return None
    why: list[str] = []
    for target in (current, previous):
        if not target.is_file():
            why.append(f"{target.name} is missing")
            continue
        try:
            ckpt = read_checkpoint(target)
        except DamagedCheckpoint as e:
            why.append(f"{target.name} is {str(e).partition(': ')[2]}")
            continue
        if target is previous:
            logging.getLogger(__name__).warning(
                "%s: %s; using %s (round %d) instead", run_dir, why[0], PREVIOUS_FILE, ckpt.round)
        return ckpt
    raise DamagedCheckpoint(str(current), f"no checkpoint of this run can be read: {'; '.join(why)}")
