"""The device / network model behind the simulated clock.

A client task's simulated duration is computed from the work it reports and the bytes it moves,
never from wall-clock time, so simulated time is deterministic and independent of the hardware
running the simulation:

    duration = flops / speed + bytes_down / down_bw + bytes_up / up_bw + latency

with flops = forward_flops_per_sample * (forward_samples + backward_cost * backward_samples).
Profiles (speed, bandwidths, latency, dropout, availability) are drawn once per client from
seeded distributions, or read from a trace file.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from rayfl.config import ConfigError, Distribution, SystemConfig
from rayfl.rng import numpy_rng

if TYPE_CHECKING:  # pandas is imported where a trace or the profiles table is used: 0.4 s of every run's start
    import pandas as pd


@dataclass(frozen=True)
class TaskTiming:
    compute: float
    download: float
    upload: float
    latency: float

    @property
    def total(self) -> float:
        return self.compute + self.download + self.upload + self.latency


def sample_distribution(d: Distribution, n: int, rng: np.random.Generator) -> np.ndarray:
    """n seeded draws from a Distribution."""
    if d.dist == "constant":
        return np.full(n, float(d.value))
    if d.dist == "uniform":
        return d.value * rng.uniform(d.low, d.high, size=n)
    if d.dist == "lognormal":
        return d.value * rng.lognormal(0.0, d.sigma, size=n)
    if d.dist == "pareto":  # Pareto(shape) with minimum `value`: heavy right tail
        return d.value * (1.0 + rng.pareto(d.shape, size=n))
    if d.dist == "inverse_pareto":  # at most `value`, heavy tail towards 0 (slow stragglers)
        return d.value / (1.0 + rng.pareto(d.shape, size=n))
    if d.dist == "tiers":
        return np.asarray(d.values, dtype=np.float64)[rng.choice(len(d.values), size=n, p=d.probs)]
    raise ValueError(f"unknown distribution {d.dist}")


class Availability:
    """When clients are online; the base class is always-online."""

    def online(self, client: int, t: float) -> bool:
        return True

    def online_mask(self, t: float, num_clients: int) -> np.ndarray:
        """`online(c, t)` for every client at once (bool [num_clients]), vectorised: sampling
        asks this every round, and a Python loop over a million clients would dominate it."""
        return np.ones(num_clients, dtype=bool)

    def offline_at(self, client: int, start: float, end: float) -> float | None:
        """When a client online at `start` goes offline before `end` (None if it does not)."""
        return None


class PeriodicAvailability(Availability):
    """Online for `on` seconds of every `period`, from a per-client phase (no stored windows,
    so 10^5 clients cost nothing)."""

    def __init__(self, period: float, online_fraction: float, phase: np.ndarray):
        self.period, self.on, self.phase = period, online_fraction * period, phase

    def _offset(self, client: int, t: float) -> float:
        return float((t - self.phase[client]) % self.period)

    def online(self, client: int, t: float) -> bool:
        return self._offset(client, t) < self.on

    def online_mask(self, t: float, num_clients: int) -> np.ndarray:
        # the same float64 operations as `online`, element-wise, so the same clients
        return ((t - self.phase[:num_clients]) % self.period) < self.on

    def offline_at(self, client: int, start: float, end: float) -> float | None:
        if not self.online(client, start):
            return start
        stop = start + self.on - self._offset(client, start)
        return stop if stop < end else None


class IntervalAvailability(Availability):
    """Explicit online intervals per client (from a trace): [k, 2] arrays of [start, end)."""

    def __init__(self, intervals: list[np.ndarray]):
        self.intervals = intervals
        # every interval flattened once, with its client, for `online_mask`
        self._owner = np.repeat(np.arange(len(intervals)), [len(iv) for iv in intervals])
        self._flat = np.concatenate(intervals) if intervals else np.zeros((0, 2))

    def online_mask(self, t: float, num_clients: int) -> np.ndarray:
        mask = np.zeros(num_clients, dtype=bool)
        mask[self._owner[(self._flat[:, 0] <= t) & (t < self._flat[:, 1])]] = True
        return mask

    def _containing(self, client: int, t: float) -> np.ndarray:
        iv = self.intervals[client]
        return iv[(iv[:, 0] <= t) & (t < iv[:, 1])]

    def online(self, client: int, t: float) -> bool:
        return len(self._containing(client, t)) > 0

    def offline_at(self, client: int, start: float, end: float) -> float | None:
        here = self._containing(client, start)
        if len(here) == 0:
            return start
        stop = float(here[:, 1].max())
        return stop if stop < end else None


class SystemModel:
    """Per-client device profiles and task timing."""

    def __init__(self, cfg: SystemConfig, num_clients: int, forward_flops: float, seed: int):
        self.cfg = cfg
        self.num_clients = num_clients
        self.forward_flops = float(forward_flops)
        draw = lambda name: sample_distribution(getattr(cfg, name), num_clients, numpy_rng(seed, f"system.{name}"))  # noqa: E731
        self.speed = draw("speed")
        self.up_bandwidth = draw("up_bandwidth")
        self.down_bandwidth = draw("down_bandwidth")
        self.latency = draw("latency")
        self.dropout = np.full(num_clients, cfg.dropout)
        self._apply_tiers(seed)
        self.availability = Availability()
        if cfg.availability.kind == "periodic":
            phase = numpy_rng(seed, "system.availability").uniform(0.0, cfg.availability.period, size=num_clients)
            self.availability = PeriodicAvailability(cfg.availability.period, cfg.availability.online_fraction, phase)
        if cfg.trace is not None:
            intervals = self._apply_trace(Path(cfg.trace).expanduser(), cfg.availability.kind == "trace")
            if intervals is not None:
                self.availability = IntervalAvailability(intervals)

    def _apply_tiers(self, seed: int) -> None:
        """Explicit tiers: disjoint seeded random subsets whose speed is scaled."""
        if not self.cfg.tiers:
            return
        order = numpy_rng(seed, "system.tiers").permutation(self.num_clients)
        start = 0
        for t in self.cfg.tiers:
            count = int(round(t.fraction * self.num_clients))
            self.speed[order[start : start + count]] *= t.speed_factor
            start += count

    def _apply_trace(self, path: Path, use_availability: bool) -> list[np.ndarray] | None:
        trace = read_trace(path, self.num_clients)
        first = trace.groupby("client").first()
        for col in ("speed", "up_bandwidth", "down_bandwidth", "latency", "dropout"):
            if col in first.columns:
                vals = first[col].dropna()
                getattr(self, col)[vals.index.to_numpy()] = vals.to_numpy(dtype=np.float64)
        if not use_availability:
            return None
        if not {"available_from", "available_to"} <= set(trace.columns):
            raise ConfigError("system.trace", f"{path} needs columns available_from and available_to for availability: trace")
        intervals = [np.zeros((0, 2)) for _ in range(self.num_clients)]
        for cid, rows in trace.groupby("client"):
            iv = rows[["available_from", "available_to"]].to_numpy(dtype=np.float64)
            intervals[int(cid)] = iv[np.argsort(iv[:, 0])]
        return intervals

    def flops(self, forward_samples: int, backward_samples: int) -> float:
        return self.forward_flops * (forward_samples + self.cfg.backward_cost * backward_samples)

    def timing(self, client: int, forward_samples: int, backward_samples: int, bytes_down: int, bytes_up: int) -> TaskTiming:
        return TaskTiming(
            compute=self.flops(forward_samples, backward_samples) / self.speed[client],
            download=bytes_down / self.down_bandwidth[client],
            upload=bytes_up / self.up_bandwidth[client],
            latency=float(self.latency[client]),
        )

    def compute_budget(self, client: int, seconds: float, bytes_down: int, bytes_up_estimate: int) -> float:
        """FLOPs a client can spend so that it still finishes within `seconds` of dispatch."""
        comm = bytes_down / self.down_bandwidth[client] + bytes_up_estimate / self.up_bandwidth[client] + self.latency[client]
        return max(0.0, (seconds - comm) * self.speed[client])

    def profiles(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            {
                "client": np.arange(self.num_clients),
                "speed": self.speed,
                "up_bandwidth": self.up_bandwidth,
                "down_bandwidth": self.down_bandwidth,
                "latency": self.latency,
                "dropout": self.dropout,
            }
        )


TRACE_COLUMNS = ("client", "speed", "up_bandwidth", "down_bandwidth", "latency", "dropout",
                 "available_from", "available_to")


def _positive(v: np.ndarray) -> np.ndarray:
    return np.isnan(v) | (np.isfinite(v) & (v > 0))


def _non_negative(v: np.ndarray) -> np.ndarray:
    return np.isnan(v) | (np.isfinite(v) & (v >= 0))


def _probability(v: np.ndarray) -> np.ndarray:
    return np.isnan(v) | ((v >= 0) & (v <= 1))


def _time(v: np.ndarray) -> np.ndarray:
    return ~np.isnan(v)


# What each column's cells must satisfy (an empty profile cell keeps the drawn value).
TRACE_CHECKS = {
    "client": (lambda v: np.isfinite(v) & (v == np.round(v)), "must be an integer client id"),
    "speed": (_positive, "must be > 0 and finite (or empty)"),
    "up_bandwidth": (_positive, "must be > 0 and finite (or empty)"),
    "down_bandwidth": (_positive, "must be > 0 and finite (or empty)"),
    "latency": (_non_negative, "must be >= 0 and finite (or empty)"),
    "dropout": (_probability, "must be a probability in [0, 1] (or empty)"),
    "available_from": (_time, "must be a time in simulated seconds"),
    "available_to": (_time, "must be a time in simulated seconds"),
}


def read_trace(path: Path, num_clients: int) -> pd.DataFrame:
    """A device trace: CSV or Parquet with a `client` column. Its contents are checked here
    (config validation calls this before Ray starts), so a bad cell is a ConfigError naming
    the file, column and line, never a pandas traceback half-way through a run."""
    import pandas as pd

    is_csv = path.suffix.lower() not in (".parquet", ".pq")
    try:
        with warnings.catch_warnings():  # more fields than header names: an error, not a warning
            warnings.simplefilter("error", pd.errors.ParserWarning)
            trace = pd.read_csv(path, index_col=False) if is_csv else pd.read_parquet(path)
    except Exception as e:  # pandas raises many types for unreadable files
        raise ConfigError("system.trace", f"cannot read {path}: {' '.join(str(e).split())}") from e
    cols = list(trace.columns)
    if "client" not in cols:
        raise ConfigError("system.trace", f"{path} has no 'client' column (columns: {cols})")
    unknown = [c for c in cols if c not in TRACE_COLUMNS]
    if unknown:
        raise ConfigError(
            "system.trace",
            f"{path}: unknown column {unknown[0]!r}; allowed columns are {list(TRACE_COLUMNS)}",
        )
    if ("available_from" in cols) != ("available_to" in cols):
        raise ConfigError("system.trace", f"{path}: give both available_from and available_to")
    if len(trace) == 0:
        raise ConfigError("system.trace", f"{path} has a header but no rows")

    def bad_cell(col: str, row: int, what: str) -> ConfigError:
        where = f"line {row + 2}" if is_csv else f"row {row}"  # CSV line 1 is the header
        value = trace[col].iloc[row]
        value = value.item() if isinstance(value, np.generic) else value  # 5, not np.int64(5)
        return ConfigError("system.trace", f"{path}, {where}: column {col} {what}, got {value!r}")

    numeric: dict[str, np.ndarray] = {}
    for col in cols:
        if pd.api.types.is_bool_dtype(trace[col]):
            raise bad_cell(col, 0, "must be numeric")
        values = pd.to_numeric(trace[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(np.isnan(values) & trace[col].notna().to_numpy())
        if bad.size:
            raise bad_cell(col, int(bad[0]), "must be numeric")
        ok, what = TRACE_CHECKS[col]
        bad = np.flatnonzero(~ok(values))
        if bad.size:
            raise bad_cell(col, int(bad[0]), what)
        numeric[col] = values
    clients = numeric["client"]
    bad = np.flatnonzero((clients < 0) | (clients >= num_clients))
    if bad.size:
        raise ConfigError(
            "system.trace",
            f"{path} names client {int(clients[bad[0]])}, outside 0..{num_clients - 1} "
            f"(partition.num_clients={num_clients})",
        )
    if "available_from" in numeric:
        bad = np.flatnonzero(numeric["available_to"] < numeric["available_from"])
        if bad.size:
            start = numeric["available_from"][bad[0]]
            raise bad_cell("available_to", int(bad[0]), f"is before available_from ({start:g})")
    out = pd.DataFrame(numeric)
    out["client"] = clients.astype(np.int64)
    return out


def forward_flops_per_sample(model: torch.nn.Module, input_shape: tuple[int, ...]) -> float:
    """Multiply-adds x 2 of one forward pass, counted from Linear and Conv2d layers by hooks.
    (Activations, pooling and normalisation are cheap next to these and are ignored.)"""
    total = 0.0

    def linear_hook(mod: torch.nn.Linear, inp, out) -> None:
        nonlocal total
        total += 2.0 * mod.in_features * mod.out_features

    def conv_hook(mod: torch.nn.Conv2d, inp, out) -> None:
        nonlocal total
        k = mod.kernel_size[0] * mod.kernel_size[1]
        total += 2.0 * k * (mod.in_channels // mod.groups) * out.shape[1] * out.shape[2] * out.shape[3]

    handles = []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
        elif isinstance(m, torch.nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            model(torch.zeros((2, *input_shape), device=device))  # hooks count per sample
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return total
