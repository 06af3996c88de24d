"""Checkpoints: a run's whole state at the end of a server round, as one file beside its Parquet.

What a run needs to continue exactly as if never stopped: the server loop's state object (the
one it registered with `fed.track`), every client's committed state, the simulated clock, the
model version, the task counter, the specs of asynchronous tasks still in flight, and how many
part files each results table had. Random draws need nothing: every stream is derived from
(seed, purpose, round, client), so a resumed round draws what the uninterrupted one drew.

The file is replaced atomically (temp dot-name, fsync, rename on local disk; one complete PUT on
an object store), so a crash while checkpointing leaves the previous checkpoint intact."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rayfl.results.storage import Location, write_atomically

CHECKPOINT_FILE = "checkpoint.pkl"


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
    """Write `ckpt` as `<run_dir>/checkpoint.pkl`, replacing the previous one atomically."""
    from ray import cloudpickle  # pickles client functions defined anywhere, by reference or value

    write_atomically(run_dir.child(CHECKPOINT_FILE), cloudpickle.dumps(ckpt))


def load_checkpoint(run_dir: Location) -> Checkpoint | None:
    """The run's checkpoint, or None when it never wrote one."""
    import pickle

    target = run_dir.child(CHECKPOINT_FILE)
    if not target.is_file():
        return None
    ckpt = pickle.loads(target.read_bytes())
    if not isinstance(ckpt, Checkpoint):
        raise ValueError(f"{target} is not a rayfl checkpoint")
    return ckpt
