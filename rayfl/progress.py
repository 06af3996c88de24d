"""A one-line progress bar for long runs: round, simulated time, wall time, last accuracy."""

from __future__ import annotations

import sys
from typing import Any


class RoundProgress:
    """A progress bar over a run's rounds with its simulated and wall time, drawn from the
    first finished round on: whatever fails before (hosts that cannot start, a bad model)
    is said without a bar at 0% above it."""

    def __init__(self, total_rounds: int, enabled: bool = True):
        self.total = total_rounds
        self.enabled = enabled
        self.bar = None
        self.last_accuracy: float | None = None

    def __enter__(self) -> RoundProgress:
        return self

    def update(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="round", file=sys.stderr, mininterval=0.5, dynamic_ncols=True)
        acc = row.get("test_accuracy")
        if acc is not None:
            self.last_accuracy = float(acc)
        post = {"sim": format_seconds(row["sim_time"]), "wall": format_seconds(row["wall_time"])}
        if self.last_accuracy is not None:
            post["acc"] = f"{self.last_accuracy:.4f}"
        if row.get("epsilon") is not None:  # a private run: what it has spent so far
            post["eps"] = f"{float(row['epsilon']):.3g}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(row["round"] + 1 - self.bar.n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def format_seconds(s: float) -> str:
    s = float(s)
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


# ---------------------------------------------------------------------- start-up timing

TIMING_ENV = "RAYFL_TIMING"
_marks: list[tuple[str, float]] = []


def mark(phase: str) -> None:
    """Note that `phase` ended now (wall-clock seconds since the epoch, so that a parent
    process can line the marks up with its own clock). Cheap enough to leave in always; the
    marks are only written when RAYFL_TIMING names a file (see `write_marks`)."""
    import time

    _marks.append((phase, time.time()))


def write_marks(**extra: Any) -> None:
    """Write the marks so far, in order, as JSON to the file RAYFL_TIMING names (nothing when
    it is unset), and start afresh: what `rayfl bench startup` reads to split a run's wall
    time into phases."""
    import json
    import os

    path = os.environ.get(TIMING_ENV)
    marks, _marks[:] = list(_marks), []
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"marks": [[name, t] for name, t in marks], **extra}, f)
