"""The simulated clock. Time only moves forward, and only through the system model: never from
wall-clock measurements, so a rerun reproduces every timestamp exactly."""

from __future__ import annotations


class SimClock:
    def __init__(self, start: float = 0.0):
        self._now = float(start)

    @property
    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"simulated time cannot go back from {self._now} to {t}")
        self._now = float(t)

    def advance_by(self, dt: float) -> None:
        self.advance_to(self._now + dt)
