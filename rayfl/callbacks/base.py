"""What a callback is: an object that watches a run's rows as they are written and may stop it.

The Federation hands every callback the same rows it writes to Parquet (`rounds` after each
server round, `evals` as they are logged), so a tracker mirrors exactly what the results hold
and a stopping rule decides on exactly what a later analysis would see. Callbacks run on the
driver, in the order the job lists them; their state (`state_dict`) goes into every checkpoint,
so a resumed run's early-stopping counter or tracker run carries on where it stopped."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunInfo:
    """What a callback may know about the run it watches.

    `run_dir` is the run's local directory (None when results go to an object store or nowhere);
    `config` the job as a nested dict (`Config.to_dict()`); `global_params` returns the server's
    current global model as a flat vector, when its tracked state has one (`x`), else None;
    `save` writes bytes under the run's results location (a name relative to the run)."""

    run_id: str
    run_dir: Path | None
    config: dict[str, Any]
    resumed: bool = False
    global_params: Callable[[], Any] = field(default=lambda: None)
    save: Callable[[str, bytes], str] | None = None


class Callback:
    """Base class of a run's callbacks; override what you need.

    `on_round` may return a one-line reason to stop: the run then ends after this round as
    completed (its manifest says `stopped_early` with the round and the reason), with a final
    checkpoint so `rayfl resume --rounds` could still continue it."""

    def on_run_start(self, run: RunInfo) -> None:
        """Before the first round (also when resuming; `run.resumed` says which)."""

    def on_round(self, row: Mapping[str, Any], run: RunInfo) -> str | None:
        """After each server round, with its `rounds` row; a string stops the run."""
        return None

    def on_eval(self, row: Mapping[str, Any], run: RunInfo) -> None:
        """For each `evals` row (global model: client -1; personalized: a client id)."""

    def on_run_end(self, status: str, run: RunInfo) -> None:
        """Once, when the run ends: `completed`, `stopped_early`, `interrupted` or `failed`."""

    def state_dict(self) -> dict[str, Any]:
        """What this callback must remember across a checkpoint and resume (picklable)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (a resumed run)."""
