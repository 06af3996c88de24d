"""What every benchmark shares: peak memory, per-round wall seconds from a run's `rounds`
table, and writing a JSON summary next to a Parquet table of its rows."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


class PeakMemory:
    """Peak summed RSS of this process and all its descendants (the driver plus the Ray
    processes it started: GCS, raylet, object store, ClientHost actors), sampled every
    `interval` seconds."""

    def __init__(self, interval: float = 0.25):
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self.per_process: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> int:
        import psutil

        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a process may end between listing and reading
                rss = p.memory_info().rss
                total += rss
                self.per_process[p.pid] = max(self.per_process.get(p.pid, 0), rss)
        return total

    @property
    def peak_process_mb(self) -> float:
        """The largest peak RSS of any one process (the driver, a host, Ray's own)."""
        return round(max(self.per_process.values(), default=0) / 2**20, 1)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    @property
    def peak_mb(self) -> float:
        return round(self.peak / 2**20, 1)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def load_average() -> list[float] | None:
    """The machine's 1 / 5 / 15-minute load, recorded beside timings (None where unknown)."""
    import os

    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def round_seconds(run_dir: str | Path) -> np.ndarray:
    """Wall seconds of every round of a run (round 0 includes the hosts' warm-up)."""
    from rayfl.results import load

    wall = load(run_dir).rounds.sort_values("round")["wall_time"].to_numpy()
    return np.diff(np.concatenate([[0.0], wall]))


def steady(per_round: Sequence[float], skip_first: int = 1, skip_last: int = 0) -> np.ndarray:
    """The rounds a benchmark times: without the first `skip_first` (warm-up) and the last
    `skip_last` (e.g. a final evaluation); all of them when too few remain."""
    arr = np.asarray(per_round, dtype=np.float64)
    kept = arr[skip_first : len(arr) - skip_last]
    return kept if len(kept) else arr


def processor_name() -> str:
    """The CPU's model name (platform.processor() is empty on Linux)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def provenance() -> dict[str, Any]:
    """What a figure needs beside it to be read at all: the commit of the code measured (and
    whether the checkout had uncommitted changes), the machine, the date and its load."""
    import os
    import subprocess
    import time

    from rayfl.results.writer import git_revision

    rev = git_revision()
    here = Path(__file__).resolve().parent
    try:
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", str(here.parent)], cwd=here,
                                    capture_output=True, text=True, timeout=10, check=False).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return {"commit": rev[:7] if rev else None, "uncommitted_changes": dirty, "date": time.strftime("%Y-%m-%d"),
            "cpus": os.cpu_count(), "processor": processor_name(), "load_average": load_average()}


def write_result(out: Path, summary: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> None:
    """`out` (JSON, stamped with its `provenance`) and, with rows, `out` with suffix .parquet
    (one row per measured run). The stamp goes into `summary` itself, so what a bench prints
    or returns is what the file holds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    summary["provenance"] = summary.get("provenance") or provenance()
    out.write_text(json.dumps(summary, indent=2, default=jsonable))
    if rows is not None:
        pd.DataFrame(rows).to_parquet(out.with_suffix(".parquet"))


def jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(type(v))


def measure_each_in_process(module: str, flag: str, values: Sequence[int], out: Path, *args: str) -> list[dict[str, Any]]:
    """`python -m module --flag v --out <out>_<v>.json *args` for each value, one fresh process
    each (so one size's memory and Ray processes never count towards the next); their results."""
    import subprocess
    import sys

    rows = []
    for v in values:
        part = out.with_name(f"{out.stem}_{v}.json")
        subprocess.run([sys.executable, "-m", module, flag, str(v), "--out", str(part), *args], check=True)
        rows.append(json.loads(part.read_text()))
    return rows
