"""Callbacks: objects that watch a run's rows, may stop it, and mirror it to trackers."""

from rayfl.callbacks.base import Callback, RunInfo

__all__ = ["Callback", "RunInfo"]
