"""The run's clients as the server sees them: how much data each holds, who is online now and
who is drawn for a round.

Every draw comes from a stream seeded by (run seed, purpose, round or draw number), never from
the hosts or the order answers arrive, so the same clients come out whatever the placement and
whether or not the run was resumed. A round costs O(its cohort), not O(the population): a draw
asks the size and availability of the clients it draws and nothing else, so a billion
registered clients cost what a thousand do (a population held whole, as a stored dataset is,
costs its size array)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rayfl.rng import numpy_rng

if TYPE_CHECKING:
    from rayfl.config import Config
    from rayfl.data import FederatedDataset
    from rayfl.engine.clock import SimClock
    from rayfl.engine.system import SystemModel

# Eligibility is asked of this many clients at a time where the population is enumerated (the
# rare fall-back of `draw_distinct`, and `trainable`), so even that never holds a
# population-sized array of booleans or ids beyond the answer.
CHUNK = 1 << 22


class Population:
    """The clients of one run: their sizes and weights, availability on the simulated clock,
    and the seeded draws of a synchronous cohort or of one idle client."""

    def __init__(self, cfg: Config, dataset: FederatedDataset, system: SystemModel, clock: SimClock):
        self.cfg = cfg
        self.dataset = dataset
        self.system = system
        self.clock = clock
        self.seed = cfg.run.seed
        # round -> how many of its over-selected cohort the round keeps (the first to finish)
        self.keep: dict[int, int] = {}
        self._sizes: np.ndarray | None = None
        self._trainable: np.ndarray | None = None
        self._num_trainable: int | None = None

    @property
    def num_clients(self) -> int:
        return self.dataset.num_clients

    @property
    def sizes(self) -> np.ndarray:
        """Training samples per client, indexable by an id or an id array (a lazy population
        makes them on demand); read-only."""
        if self._sizes is None:
            sizes = self.dataset.client_sizes()
            if isinstance(sizes, np.ndarray):  # a stored population: 4 bytes a client where they fit
                sizes = sizes.astype(np.int32) if sizes.size and sizes.max() < 2**31 else sizes.copy()
                sizes.flags.writeable = False
            self._sizes = sizes
        return self._sizes

    def weights(self, client_ids: list[int] | None = None, kind: str = "samples") -> np.ndarray:
        """Aggregation weights over `client_ids` summing to 1: by sample count or uniform.
        Always finite: clients that hold no samples all get weight 0 by sample count."""
        ids = np.arange(self.num_clients) if client_ids is None else np.asarray(client_ids, dtype=np.int64)
        w = np.asarray(self.sizes[ids]).astype(np.float64) if kind == "samples" else np.ones(len(ids))
        total = w.sum()
        return w / total if total > 0 else np.zeros(len(ids))

    @property
    def num_trainable(self) -> int:
        """How many clients hold a training sample (the N of uniform and Poisson sampling's
        accounting), without listing them where the dataset knows the count."""
        if self._num_trainable is None:
            known = getattr(self.dataset, "num_trainable", None)
            self._num_trainable = int(known) if known is not None else len(self.trainable)
            if self._num_trainable == 0:
                raise ValueError("no client holds any training sample; check the partition")
        return self._num_trainable

    @property
    def trainable(self) -> np.ndarray:
        """Clients holding at least one training sample, listed (O(population): for algorithms
        that use every client; sampling never asks for it)."""
        if self._trainable is None:
            self._trainable = self._listed(lambda ids: np.asarray(self.sizes[ids]) > 0)
            if len(self._trainable) == 0:
                raise ValueError("no client holds any training sample; check the partition")
        return self._trainable

    @property
    def always_online(self) -> bool:
        return self.cfg.system.availability.kind == "always"

    def eligible(self, clients: np.ndarray) -> np.ndarray:
        """Which of `clients` may be drawn now: trainable and online (bool, vectorised)."""
        ok = np.asarray(self.sizes[clients]) > 0
        if not self.always_online:
            ok &= self.system.availability.online_ids(clients, self.clock.now)
        return ok

    def candidates(self) -> np.ndarray:
        """Every client that may be drawn now, listed (O(population), in chunks): the fall-back
        of a draw that cannot finish from random ids."""
        if self.always_online:
            return self.trainable
        return self._listed(self.eligible)

    def _listed(self, keep: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Every client id that `keep` accepts, asked CHUNK ids at a time."""
        n = self.num_clients
        parts = [ids[keep(ids)] for ids in (np.arange(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK))]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def sample(self, round: int, k: int | None = None, fraction: float | None = None,
               poisson: float | None = None) -> list[int]:
        """Uniform participation without replacement among the clients online now, seeded by
        (seed, 'sample', round). Under `over_selection` it picks ceil((1 + o) k) and the round
        keeps the first k to finish (`keep`). `poisson` is a rate: each client independently
        (the privacy accountant's sampling). The cohort's device profiles are made here, at
        once."""
        if poisson is not None:
            cohort = self.sample_poisson(round, poisson)
        else:
            if k is None:
                k = self.num_clients if fraction is None else max(1, round_half_up(fraction * self.num_clients))
            picks = k
            if self.cfg.system.policy == "over_selection":
                picks = int(np.ceil((1.0 + self.cfg.system.over_selection) * k - 1e-9))
            cohort = sorted(self.draw_distinct(numpy_rng(self.seed, "sample", round), picks))
            if not cohort:
                raise RuntimeError(f"no trainable client is online at simulated time {self.clock.now:.1f}s; "
                                   "check system.availability")
            if self.cfg.system.policy == "over_selection":
                self.keep[round] = min(k, len(cohort))
        self.system.prepare(cohort)
        return cohort

    def draw_distinct(self, rng: np.random.Generator, picks: int) -> list[int]:
        """`picks` distinct clients, uniformly among the eligible ones (`draw_distinct`)."""
        known = self.num_trainable if self.always_online else None
        return draw_distinct(rng, self.num_clients, picks, self.eligible, self.candidates, known)

    def sample_poisson(self, round: int, rate: float) -> list[int]:
        """Each registered client independently with probability `rate`, kept if eligible now:
        the count from Binomial(N, rate), then that many distinct ids uniformly, which is the
        distribution of one Bernoulli per client, in O(count). Seeded by (seed,
        'sample.poisson', round)."""
        rng = numpy_rng(self.seed, "sample.poisson", round)
        count = int(rng.binomial(self.num_clients, rate))
        ids = np.sort(rng.choice(self.num_clients, size=count, replace=False))
        return [int(c) for c in ids[self.eligible(ids)]]

    def sample_idle(self, busy: set[int], key: int) -> int | None:
        """One client, uniformly among those online, trainable and not busy, for an async slot:
        the first eligible, idle id of a seeded stream of uniform ids (listing the eligible
        clients only after N ids without one)."""
        rng = numpy_rng(self.seed, "async.sample", key)
        n, drawn = self.num_clients, 0
        while drawn < n:
            ids = rng.integers(0, n, size=64)
            drawn += 64
            for c in ids[self.eligible(ids)].tolist():
                if c not in busy:
                    return c
        idle = self.candidates()
        idle = idle[~np.isin(idle, np.fromiter(busy, dtype=np.int64, count=len(busy)))]
        return int(rng.choice(idle)) if len(idle) else None

    def rows_of(self, client: int) -> tuple[np.ndarray, np.ndarray | None]:
        """A client's train and test row indices, for a host that does not hold it."""
        ds = self.dataset
        return np.asarray(ds.client_train[client]), None if ds.client_test is None else np.asarray(ds.client_test[client])


def draw_distinct(rng: np.random.Generator, n: int, picks: int, eligible: Callable[[np.ndarray], np.ndarray],
                  listing: Callable[[], np.ndarray], num_eligible: int | None = None) -> list[int]:
    """`picks` distinct ids of [0, n), uniformly among the eligible ones, or all of them when
    fewer are eligible (`num_eligible`, where known, settles that at once): uniform ids in
    order, each kept when eligible and not yet kept, which is a uniform draw without
    replacement from the eligible ids in O(picks / eligible fraction). After n ids without
    finishing (fewer eligible than picks, or very few eligible), the eligible ids are listed
    once (`listing`) and the rest drawn among those not yet kept: the same distribution."""
    if num_eligible is not None and picks >= num_eligible:
        return [int(c) for c in listing()]
    chosen: dict[int, None] = {}  # an ordered set
    drawn, batch = 0, 2 * picks + 64
    while len(chosen) < picks:
        if drawn >= n:
            rest = listing()
            rest = rest[~np.isin(rest, np.fromiter(chosen, dtype=np.int64, count=len(chosen)))]
            need = picks - len(chosen)
            more = rest if len(rest) <= need else rng.choice(rest, size=need, replace=False)
            chosen.update(dict.fromkeys(int(c) for c in more))
            break
        ids = rng.integers(0, n, size=batch)
        drawn += batch
        for c in ids[eligible(ids)].tolist():
            if c not in chosen:
                chosen[c] = None
                if len(chosen) == picks:
                    break
    return list(chosen)


def round_half_up(v: float) -> int:
    return int(np.floor(v + 0.5))
