"""The run's records: one `clients` row per task, one `rounds` row per server step, `evals` rows,
and at the steps' cadence a checkpoint. The callbacks see every row and may stop the run; a
stop asked for from outside (a signal, a sweep's scheduler) ends it after the step, with a
checkpoint, so that `rayfl resume` continues it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rayfl.callbacks.runner import CallbackRunner, global_model
from rayfl.engine.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    read_checkpoint,
    resolver_for,
    save_checkpoint,
)
from rayfl.engine.payload import payload_nbytes
from rayfl.engine.state_codec import check_savable
from rayfl.engine.tasks import OUTCOMES, ClientResult

if TYPE_CHECKING:
    from rayfl.callbacks.base import Callback

ProgressFn = Callable[[dict[str, Any]], None]  # sees each `rounds` row (the CLI's progress bar, a sweep's report)


class RunInterrupted(KeyboardInterrupt):
    """A stop was requested (SIGTERM, Ctrl-C): the run checkpointed after a round and stops;
    the results writer closes it as `interrupted`."""


class RunLog:
    """Writes a run's rows (through `writer`, a rayfl.results.RunWriter, or nowhere when None),
    runs its callbacks on them and checkpoints it."""

    def __init__(self, fed: Any, writer: Any | None, progress: ProgressFn | None, callbacks: Sequence[Callback]):
        self.fed = fed  # the run's Federation (not imported: it imports this module)
        self.writer = writer
        self.progress = progress
        self.callbacks = CallbackRunner(fed.cfg, fed, callbacks)
        self.stop_requested = False  # asked from outside (a signal, a sweep): checkpoint after this round, stop
        self.stopped_early: dict[str, Any] | None = None  # a callback's stop: the round and why
        self.last_checkpoint: int | None = None  # the round of the last checkpoint this run wrote
        self._wall_start = time.perf_counter()
        self._round_bytes = 0
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._failures_logged = 0  # hosts replaced before the last `rounds` row
        # client -> bytes of its committed state: only clients that have state (e.g. SCAFFOLD's
        # c_i for the clients ever sampled), reported in every `rounds` row
        self.state_bytes: dict[int, int] = {}
        self._state_total = 0
        self._server_state_checked = False

    def _note_state(self, client: int, nbytes: int) -> None:
        self._state_total += nbytes - self.state_bytes.get(client, 0)
        self.state_bytes[client] = nbytes

    @property
    def wall_time(self) -> float:
        """Wall-clock seconds since the run's Federation was created."""
        return time.perf_counter() - self._wall_start

    def record_tasks(self, results: list[ClientResult], round: int, phase: str) -> None:
        """Count outcomes and bytes for the round row, and write one `clients` row per task."""
        for r in results:
            self._outcomes[r.outcome] += 1
            self._round_bytes += r.bytes_up + r.bytes_down
            if r.ok and r.state_changed and r.state_bytes is not None:
                self._note_state(r.client, r.state_bytes)
        if self.writer is None or not self.fed.cfg.output.log_clients:
            return
        tags = self.fed.client_tags
        rows = []
        for r in results:
            row = {
                "round": round,
                "phase": phase,
                "client": r.client,
                "host": r.host,
                "outcome": r.outcome,
                "dispatch_time": r.dispatch_time,
                "finish_time": r.finish_time,
                "compute_seconds": r.timing.compute,
                "download_seconds": r.timing.download,
                "upload_seconds": r.timing.upload,
                "version": r.version,
                "staleness": r.staleness,
                "num_samples": r.num_samples,
                "local_steps": r.local_steps,
                "truncated": r.truncated,
                "forward_samples": r.forward_samples,
                "backward_samples": r.backward_samples,
                "bytes_up": r.bytes_up,
                "bytes_down": r.bytes_down,
                "rerun": bool(r.extra.get("rerun", False)),
                "task": r.task,
                **tags.get(r.client, {}),
                **r.extra.get("pipeline", {}),
            }
            loss = r.values.get("loss") if isinstance(r.values, dict) else None
            if isinstance(loss, (int, float, np.floating)):
                row["local_loss"] = float(loss)
            rows.append(row)
        self.writer.extend("clients", rows)

    def log_round(self, round: int, **metrics: Any) -> None:
        """One row of `rounds`. The writer flushes by its own policy (rows buffered, their age;
        see rayfl.results.writer) checked here once per server step, and also every
        `output.flush_every_rounds` rounds when that is set; `last_round` reaches the manifest
        at the flush that writes its row. The callbacks see the row and may stop the run; a
        checkpoint follows every `output.checkpoint_every` rounds and when the run stops."""
        fed = self.fed
        if not self._server_state_checked:  # a state no checkpoint can hold fails now, not rounds later
            check_savable(fed.server_state, "server_state", dataclasses_ok=True)
            self._server_state_checked = True
        row = {
            "round": round,
            "sim_time": fed.clock.now,
            "wall_time": self.wall_time,
            "bytes": self._round_bytes,
            **{f"clients_{k}": v for k, v in self._outcomes.items()},
            "host_failures": fed.hosts.failures - self._failures_logged,
            "clients_with_state": len(self.state_bytes),
            "client_state_bytes": self._state_total,
            **{k: _scalar(v) for k, v in metrics.items()},
            **(fed.pipeline.finish_round(round) if fed.pipeline is not None else {}),
        }
        self._round_bytes = 0
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._failures_logged = fed.hosts.failures
        if self.writer is not None:
            self.writer.append("rounds", row)
            self.writer.note_progress(last_round=round, sim_time=fed.clock.now)
            every = fed.cfg.output.flush_every_rounds
            if every and (round + 1) % every == 0:
                self.writer.flush()
            else:
                self.writer.maybe_flush()
        if self.progress is not None:
            self.progress(row)
        why = self.callbacks.on_round(row)
        if why is not None:
            self.stopped_early = {"round": round, "reason": why}
            if self.writer is not None:
                self.writer.update_manifest(stopped_early=self.stopped_early)
        every = fed.cfg.output.checkpoint_every
        if self.stop_requested or self.stopped_early is not None or (every and (round + 1) % every == 0):
            self.checkpoint(round)
        if self.stop_requested:
            where = self.writer.run_dir if self.writer is not None else "<run dir>"
            raise RunInterrupted(f"stopped after round {round}; continue with: rayfl resume {where}")

    def log_eval(self, round: int, metrics: Mapping[str, Any], client: int = -1, split: str = "test") -> None:
        """One row of `evals`: client -1 is the global model."""
        row = {"round": round, "sim_time": self.fed.clock.now, "wall_time": self.wall_time, "client": client,
               "split": split}
        row.update({k: _scalar(v) for k, v in metrics.items()})
        if self.writer is not None:
            self.writer.append("evals", row)
        self.callbacks.on_eval(row)

    def checkpoint(self, round: int) -> Checkpoint | None:
        """Save the run's state after `round` (see rayfl.engine.checkpoint) beside its Parquet.
        Every row logged so far is flushed first, so the checkpoint names complete part files."""
        if self.writer is None:
            return None
        fed = self.fed
        self.writer.flush()
        ckpt = Checkpoint(
            round=round,
            server_state=fed.server_state,
            client_states=fed.export_states(),
            clock=fed.clock.now,
            model_version=fed.model_version,
            next_task=fed.tasks_issued,
            pools=[pool.snapshot() for pool in fed.pools],
            parts=self.writer.part_counts(),
            pipeline=fed.pipeline.state_dict() if fed.pipeline is not None else None,
            callbacks=self.callbacks.state_dict(),
            model=global_model(fed),
            driver=fed.driver_state,
        )
        save_checkpoint(self.writer.location, ckpt)
        fed.checkpointed()
        self.writer.update_manifest(checkpoint={"round": round, "sim_time": fed.clock.now, "file": CHECKPOINT_FILE})
        self.last_checkpoint = round
        return ckpt

    def saved(self) -> Checkpoint | None:
        """The checkpoint this run wrote last, read back from its file (None before the first)."""
        if self.last_checkpoint is None or self.writer is None:
            return None
        return read_checkpoint(self.writer.location.child(CHECKPOINT_FILE), resolver_for(self.fed.cfg))

    def restore(self, ckpt: Checkpoint) -> None:
        """Put back what a checkpoint holds beside the Federation's own counters and the client
        states: the round pipeline's state (adaptive clip, references) and the callbacks'."""
        pipeline = self.fed.pipeline
        if pipeline is not None:
            pipeline.round = ckpt.round + 1
            saved = getattr(ckpt, "pipeline", None)
            if saved is not None:
                pipeline.load_state_dict(saved)
        self.callbacks.load_state_dict(getattr(ckpt, "callbacks", None) or [])
        for client, state in ckpt.client_states.items():
            self._note_state(int(client), payload_nbytes(state))


def _scalar(v: Any) -> Any:
    """A numpy or one-element torch scalar as a Python number, for a table cell."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return v
