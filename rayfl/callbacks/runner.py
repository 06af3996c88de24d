"""Runs a run's callbacks: builds them from the job's `callbacks:` list (and objects handed to
`rayfl.run`), feeds them the rows the Federation writes, and collects a stop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rayfl.callbacks.base import Callback, RunInfo
from rayfl.errors import ConfigError


def build_callback(cfg: Any) -> Callback:
    """One configured callback: its registered factory called with its config (or, for a
    callback registered without a config class, with the config's `kwargs`)."""
    from rayfl.config import GenericCallbackConfig
    from rayfl.registry import CALLBACKS

    factory = CALLBACKS.get(cfg.name).load()
    made = factory(**cfg.kwargs) if isinstance(cfg, GenericCallbackConfig) else factory(cfg)
    if not isinstance(made, Callback):
        raise ConfigError("callbacks.name", f"{cfg.name!r} made a {type(made).__name__}, not a rayfl Callback")
    return made


class CallbackRunner:
    """The run's callbacks, in job order then the Python-given ones."""

    def __init__(self, cfg: Any, fed: Any, extra: Sequence[Callback] = ()):
        self.callbacks: list[Callback] = [build_callback(c) for c in cfg.callbacks] + list(extra)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"a callback must subclass rayfl.Callback, got {type(cb).__name__}")
        self.fed = fed
        self.info: RunInfo | None = None

    def start(self, resumed: bool) -> None:
        """Tell every callback the run starts (or resumes)."""
        if not self.callbacks:
            return
        fed = self.fed
        writer = fed.runlog.writer
        run_dir = None
        if writer is not None and writer.location.is_local:
            run_dir = Path(str(writer.location))
        self.info = RunInfo(
            run_id=str(writer.location).rstrip("/").rsplit("/", 1)[-1] if writer is not None else (fed.cfg.run.run_id or ""),
            run_dir=run_dir,
            config=fed.cfg.to_dict(),
            resumed=resumed,
            global_params=lambda: global_model(fed),
            save=(lambda name, data: _save(writer, name, data)) if writer is not None else None,
        )
        for cb in self.callbacks:
            cb.on_run_start(self.info)

    def on_round(self, row: Mapping[str, Any]) -> str | None:
        """Every callback sees the row; the first reason to stop wins (all still see it)."""
        why = None
        for cb in self.callbacks:
            reason = cb.on_round(row, self._info())
            if reason is not None and why is None:
                why = str(reason)
        return why

    def on_eval(self, row: Mapping[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_eval(row, self._info())

    def end(self, status: str) -> None:
        for cb in self.callbacks:
            cb.on_run_end(status, self._info())

    def state_dict(self) -> list[dict[str, Any]]:
        return [cb.state_dict() for cb in self.callbacks]

    def load_state_dict(self, states: Sequence[Mapping[str, Any]]) -> None:
        for cb, state in zip(self.callbacks, states, strict=False):
            cb.load_state_dict(state)

    def _info(self) -> RunInfo:
        if self.info is None:
            self.start(resumed=False)
        assert self.info is not None
        return self.info


def _save(writer: Any, name: str, data: bytes) -> str:
    from rayfl.results.storage import write_atomically

    where = writer.location.child(name)
    write_atomically(where, data)
    return str(where)


def global_model(fed: Any) -> Any:
    """The server's current global model: what the algorithm's driver says it is (an
    algorithm's `model_of` its state), else a hand-written loop's tracked `x`, else None."""
    model_of = getattr(fed, "model_of", None)
    return model_of(fed.server_state) if model_of is not None else getattr(fed.server_state, "x", None)
