"""An exception raised in the user's own code, told in a few lines instead of a traceback
through Ray and rayfl.

A client function, a model or a server update of a package outside rayfl that raises ends the
run with exit status 1 and a short block: the exception, where it happened (client and round
when a host ran it) and the user's own frames, innermost last. The whole traceback goes to
`error.log` in the run's directory, whose path the block ends with. A frame is the user's when
its file is neither rayfl's nor an installed package's nor Python's own library."""

from __future__ import annotations

import os
import site
import sysconfig
import traceback
from types import TracebackType

import rayfl

_RAYFL = os.path.dirname(os.path.abspath(rayfl.__file__))
_LIBRARY = {os.path.abspath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"],
                                         *site.getsitepackages(), site.getusersitepackages()) if p}


def is_users(filename: str) -> bool:
    """Whether a frame's file is the user's: not rayfl's, an installed package's, nor Python's."""
    path = os.path.abspath(filename)
    if filename.startswith("<") or path.startswith(_RAYFL + os.sep):
        return False
    return not any(path.startswith(root + os.sep) for root in _LIBRARY)


def users_frames(tb: TracebackType | None) -> list[str]:
    """The user's frames of a traceback, formatted as Python does (file, line, code)."""
    frames = [f for f in traceback.extract_tb(tb) if is_users(f.filename)]
    return traceback.format_list(frames)


class UserCodeError(Exception):
    """The user's code raised `summary` (type: message) at `where` (e.g. "client 3, round 2");
    `frames` are its own frames, `full` the whole traceback. Plain strings, so it crosses
    from a host to the driver as it is."""

    def __init__(self, summary: str, where: str, frames: list[str], full: str):
        super().__init__(summary, where, frames, full)
        self.summary, self.where, self.frames, self.full = summary, where, frames, full

    def __str__(self) -> str:
        return f"{self.summary} ({self.where})" if self.where else self.summary


def from_exception(e: BaseException, where: str = "") -> UserCodeError | None:
    """`e` as a UserCodeError when the user's own code raised it (a frame of theirs is in its
    traceback), else None: an error of rayfl's or a library's keeps its own traceback."""
    frames = users_frames(e.__traceback__)
    if not frames:
        return None
    summary = " ".join(f"{type(e).__name__}: {e}".split())
    return UserCodeError(summary, where, frames, "".join(traceback.format_exception(type(e), e, e.__traceback__)))


def found_in(e: BaseException) -> UserCodeError | None:
    """The UserCodeError behind `e` (a host's, as Ray's task error wraps it), or `e` itself as
    one when the driver ran the user's code (a server update), else None."""
    seen: BaseException | None = e
    while seen is not None:
        cause = getattr(seen, "cause", None)  # Ray's task error: the host's exception as raised there
        if isinstance(cause, UserCodeError):
            return cause
        if type(seen) is UserCodeError:
            return seen
        seen = cause if isinstance(cause, BaseException) else seen.__cause__
    return from_exception(e)


def report(err: UserCodeError, log: str | None) -> str:
    """The block the CLI prints: the error, where, the user's frames, and the log's path."""
    lines = [f"rayfl: error in your code: {err}"]
    lines += [line.rstrip("\n") for frame in err.frames for line in frame.splitlines()]
    if log:
        lines.append(f"rayfl: the full traceback is in {log}")
    return "\n".join(lines)


def write_log(run_dir: str, text: str) -> str | None:
    """Write the full traceback to `<run_dir>/error.log` (a local run directory); its path."""
    path = os.path.join(run_dir, "error.log")
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        return None
    return path
