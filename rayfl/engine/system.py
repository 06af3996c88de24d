"""The device / network model behind the simulated clock.

A client task's simulated duration is computed from the work it reports and the bytes it moves,
never from wall-clock time, so simulated time is deterministic and independent of the hardware
running the simulation:

    duration = flops / speed + bytes_down / down_bw + bytes_up / up_bw + latency

with flops = forward_flops_per_sample * (forward_samples + backward_cost * backward_samples).
Profiles (speed, bandwidths, latency, dropout, availability) come from seeded distributions,
each client's a function of (seed, column, client) made when the run first touches it, or from
a trace file.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from rayfl.config import ConfigError, Distribution, SystemConfig
from rayfl.rng import client_normals, client_uniforms

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


def client_draws(d: Distribution, seed: int, purpose: str, clients: np.ndarray) -> np.ndarray:
    """The draws of `clients` from a Distribution, each a function of (seed, purpose, client)
    alone (rayfl.rng.client_uniforms, by inverse CDF): any client's value in O(1), so a
    profile exists only for the clients a run touches."""
    n = len(clients)
    if d.dist == "constant":
        return np.full(n, float(d.value))
    if d.dist == "lognormal":
        return d.value * np.exp(d.sigma * client_normals(seed, purpose, clients))
    u = client_uniforms(seed, purpose, clients)
    if d.dist == "uniform":
        return d.value * (d.low + (d.high - d.low) * u)
    if d.dist == "pareto":  # P(X > x) = (value / x)^shape
        return d.value * u ** (-1.0 / d.shape)
    if d.dist == "inverse_pareto":  # value / Pareto: at most value
        return d.value * u ** (1.0 / d.shape)
    if d.dist == "tiers":
        cut = np.cumsum(np.asarray(d.probs, dtype=np.float64))
        tier = np.minimum(np.searchsorted(cut / cut[-1], u, side="right"), len(d.values) - 1)
        return np.asarray(d.values, dtype=np.float64)[tier]
    raise ValueError(f"unknown distribution {d.dist}")


class PerClient:
    """One per-client value (a profile column, an availability phase), made from seeds when a
    client is first asked for and kept: the model holds values for the clients the run touched,
    never a population-sized array. `prepare` makes a round's cohort at once (vectorised);
    `overrides` (from a trace) win over the drawn values."""

    def __init__(self, make: Callable[[np.ndarray], np.ndarray], overrides: dict[int, float] | None = None):
        self._make = make
        self.overrides = overrides or {}
        self._known: dict[int, float] = {}

    def prepare(self, clients: Iterable[int]) -> None:
        missing = [int(c) for c in clients if int(c) not in self._known]
        if missing:
            values = self._make(np.asarray(missing, dtype=np.int64)).tolist()
            self._known.update(zip(missing, values, strict=True))
            for c in missing:
                if c in self.overrides:
                    self._known[c] = self.overrides[c]

    def __getitem__(self, client: int) -> float:
        value = self._known.get(client)
        if value is None:
            self.prepare((client,))
            value = self._known[int(client)]
        return value

    def peek(self, clients: np.ndarray) -> np.ndarray:
        """The values of `clients`, made without keeping them: a draw asks about ids it may
        reject, which need no entry."""
        values = self._make(np.asarray(clients, dtype=np.int64))
        for i, c in enumerate(clients.tolist() if self.overrides else ()):
            values[i] = self.overrides.get(c, values[i])
        return values

    def of(self, clients: Iterable[int]) -> np.ndarray:
        """The values of `clients`, in order (float64)."""
        ids = [int(c) for c in clients]
        self.prepare(ids)
        return np.array([self._known[c] for c in ids], dtype=np.float64)

    @property
    def known(self) -> int:
        """Clients with a value made so far (what the run touched). Not a length: this is
        not a sequence over the population."""
        return len(self._known)


class Availability:
    """When clients are online; the base class is always-online."""

    def online(self, client: int, t: float) -> bool:
        return True

    def online_ids(self, clients: np.ndarray, t: float) -> np.ndarray:
        """`online(c, t)` for each of `clients` (bool, vectorised): sampling asks this of every
        client it draws, never of the whole population."""
        return np.ones(len(clients), dtype=bool)

    def offline_at(self, client: int, start: float, end: float) -> float | None:
        """When a client online at `start` goes offline before `end` (None if it does not)."""
        return None


class PeriodicAvailability(Availability):
    """Online for `on` seconds of every `period`, from a per-client phase made from seeds when a
    client is first asked for (no stored windows: a population of any size costs nothing)."""

    def __init__(self, period: float, online_fraction: float, phase: PerClient):
        self.period, self.on, self.phase = period, online_fraction * period, phase

    def _offset(self, client: int, t: float) -> float:
        return float((t - self.phase[client]) % self.period)

    def online(self, client: int, t: float) -> bool:
        return self._offset(client, t) < self.on

    def online_ids(self, clients: np.ndarray, t: float) -> np.ndarray:
        # the same float64 operations as `online`, element-wise, so the same clients
        return ((t - self.phase.peek(clients)) % self.period) < self.on

    def offline_at(self, client: int, start: float, end: float) -> float | None:
        if not self.online(client, start):
            return start
        stop = start + self.on - self._offset(client, start)
        return stop if stop < end else None


class IntervalAvailability(Availability):
    """Explicit online intervals of the clients a trace lists: {client: [k, 2] array of
    [start, end)}; a client the trace does not list is never online."""

    NONE = np.zeros((0, 2))

    def __init__(self, intervals: dict[int, np.ndarray]):
        self.intervals = intervals

    def _containing(self, client: int, t: float) -> np.ndarray:
        iv = self.intervals.get(int(client), self.NONE)
        return iv[(iv[:, 0] <= t) & (t < iv[:, 1])]

    def online(self, client: int, t: float) -> bool:
        return len(self._containing(client, t)) > 0

    def online_ids(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.fromiter((self.online(int(c), t) for c in clients), dtype=bool, count=len(clients))

    def offline_at(self, client: int, start: float, end: float) -> float | None:
        here = self._containing(client, start)
        if len(here) == 0:
            return start
        stop = float(here[:, 1].max())
        return stop if stop < end else None


PROFILE_COLUMNS = ("speed", "up_bandwidth", "down_bandwidth", "latency", "dropout")


class SystemModel:
    """Per-client device profiles and task timing. A client's profile is a function of (seed,
    column, client) alone, made when the run first touches the client (`prepare` does a
    round's cohort at once), so the model's memory follows the clients a run touches, not the
    registered population; a trace's values override the drawn ones for the clients it lists."""

    def __init__(self, cfg: SystemConfig, num_clients: int, forward_flops: float, seed: int):
        self.cfg = cfg
        self.num_clients = num_clients
        self.forward_flops = float(forward_flops)
        self.seed = seed
        trace = read_trace(Path(cfg.trace).expanduser(), num_clients) if cfg.trace is not None else None
        given = trace_profiles(trace)

        def column(name: str) -> PerClient:
            if name == "dropout":
                return PerClient(lambda ids: np.full(len(ids), float(cfg.dropout)), given.get(name))
            make = lambda ids: client_draws(getattr(cfg, name), seed, f"system.{name}", ids)  # noqa: E731
            if name == "speed" and cfg.tiers:
                make = lambda ids: client_draws(cfg.speed, seed, "system.speed", ids) * self._tier_factor(ids)  # noqa: E731
            return PerClient(make, given.get(name))

        self.speed, self.up_bandwidth, self.down_bandwidth, self.latency, self.dropout = map(column, PROFILE_COLUMNS)
        self.availability = Availability()
        if cfg.availability.kind == "periodic":
            period = cfg.availability.period
            phase = PerClient(lambda ids: period * client_uniforms(seed, "system.availability", ids))
            self.availability = PeriodicAvailability(period, cfg.availability.online_fraction, phase)
        if trace is not None and cfg.availability.kind == "trace":
            self.availability = IntervalAvailability(trace_intervals(trace, Path(cfg.trace)))

    def _tier_factor(self, clients: np.ndarray) -> np.ndarray:
        """Explicit tiers: each client falls in tier t with probability t.fraction (from one
        seeded uniform per client, so the tiers are disjoint), its speed scaled by the tier's
        factor; clients beyond the listed fractions keep their drawn speed."""
        u = client_uniforms(self.seed, "system.tiers", clients)
        factor = np.ones(len(clients))
        low = 0.0
        for t in self.cfg.tiers:
            factor[(low <= u) & (u < low + t.fraction)] = t.speed_factor
            low += t.fraction
        return factor

    def prepare(self, clients: Iterable[int]) -> None:
        """Make the profiles (and availability phases) of a round's clients at once."""
        ids = list(clients)
        for name in PROFILE_COLUMNS:
            getattr(self, name).prepare(ids)
        if isinstance(self.availability, PeriodicAvailability):
            self.availability.phase.prepare(ids)

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

    def profiles(self, clients: Iterable[int]) -> pd.DataFrame:
        """The profiles of `clients` as a table."""
        import pandas as pd

        ids = [int(c) for c in clients]
        return pd.DataFrame({"client": np.asarray(ids, dtype=np.int64),
                             **{name: getattr(self, name).of(ids) for name in PROFILE_COLUMNS}})


def trace_profiles(trace: pd.DataFrame | None) -> dict[str, dict[int, float]]:
    """A trace's profile values, {column: {client: value}} (each client's first row; an empty
    cell keeps the drawn value)."""
    if trace is None:
        return {}
    first = trace.groupby("client").first()
    out: dict[str, dict[int, float]] = {}
    for col in PROFILE_COLUMNS:
        if col in first.columns:
            vals = first[col].dropna()
            out[col] = dict(zip(vals.index.astype(np.int64).tolist(), vals.to_numpy(dtype=np.float64).tolist(), strict=True))
    return out


def trace_intervals(trace: pd.DataFrame, path: Path) -> dict[int, np.ndarray]:
    """The online intervals of every client the trace lists, sorted by start."""
    if not {"available_from", "available_to"} <= set(trace.columns):
        raise ConfigError("system.trace", f"{path} needs columns available_from and available_to for availability: trace")
    intervals: dict[int, np.ndarray] = {}
    for cid, rows in trace.groupby("client"):
        iv = rows[["available_from", "available_to"]].to_numpy(dtype=np.float64)
        intervals[int(cid)] = iv[np.argsort(iv[:, 0])]
    return intervals


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
