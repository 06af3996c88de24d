"""The run's clients as the server sees them: how much data each holds, who is online now and
who is drawn for a round.

Every draw comes from a stream seeded by (run seed, purpose, round or draw number), never from
the hosts or the order answers arrive, so the same clients come out whatever the placement and
whether or not the run was resumed. A client's data never leave the dataset here: the sizes
are counted once, and a population of a million clients costs a few arrays."""

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

PoissonDraw = Callable[[int, np.ndarray], list[int]]  # (round, candidates) -> the cohort


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
        self._trainable_mask: np.ndarray | None = None  # bool [num_clients], for `candidates`

    @property
    def num_clients(self) -> int:
        return self.dataset.num_clients

    @property
    def sizes(self) -> np.ndarray:
        """Training samples per client, counted once (the asynchronous driver asks for every
        task it dispatches); read-only."""
        if self._sizes is None:
            sizes = self.dataset.client_sizes().view()
            sizes.flags.writeable = False
            self._sizes = sizes
        return self._sizes

    def weights(self, client_ids: list[int] | None = None, kind: str = "samples") -> np.ndarray:
        """Aggregation weights over `client_ids` summing to 1: by sample count or uniform.
        Always finite: clients that hold no samples all get weight 0 by sample count."""
        ids = np.arange(self.num_clients) if client_ids is None else np.asarray(client_ids, dtype=np.int64)
        w = self.sizes[ids].astype(np.float64) if kind == "samples" else np.ones(len(ids))
        total = w.sum()
        return w / total if total > 0 else np.zeros(len(ids))

    @property
    def trainable(self) -> np.ndarray:
        """Clients holding at least one training sample: the only ones ever sampled to train
        (a partition may leave some empty, e.g. Dirichlet with min_size 0)."""
        if self._trainable is None:
            self._trainable = np.flatnonzero(self.sizes > 0).astype(np.int64)
            if len(self._trainable) == 0:
                raise ValueError("no client holds any training sample; check the partition")
        return self._trainable

    def online(self) -> np.ndarray:
        """Clients online now (an error if nobody is: the availability model is then broken)."""
        now = self.clock.now
        online = np.flatnonzero(self.system.availability.online_mask(now, self.num_clients)).astype(np.int64)
        if len(online) == 0:
            raise RuntimeError(f"no client is online at simulated time {now:.1f}s; check system.availability")
        return online

    def candidates(self) -> np.ndarray:
        """Clients that may be sampled now: trainable and, under an availability model, online."""
        if self.cfg.system.availability.kind == "always":
            return self.trainable
        online = self.online()  # sorted, so the filtered ids equal intersect1d's
        if self._trainable_mask is None:
            self._trainable_mask = np.zeros(self.num_clients, dtype=bool)
            self._trainable_mask[self.trainable] = True
        return online[self._trainable_mask[online]]

    def sample(self, round: int, k: int | None = None, fraction: float | None = None,
               poisson: PoissonDraw | None = None) -> list[int]:
        """Uniform participation without replacement among the clients online now, seeded by
        (seed, 'sample', round). Under `over_selection` it picks ceil((1 + o) k) and the round
        keeps the first k to finish (`keep`). `poisson` draws the cohort instead (the privacy
        accountant's sampling)."""
        if k is None:
            k = self.num_clients if fraction is None else max(1, round_half_up(fraction * self.num_clients))
        candidates = self.candidates()
        if len(candidates) == 0:
            raise RuntimeError(f"no trainable client is online at simulated time {self.clock.now:.1f}s; "
                               "check system.availability")
        if poisson is not None:
            return poisson(round, candidates)
        k = min(k, len(candidates))
        picks = k
        if self.cfg.system.policy == "over_selection":
            picks = min(len(candidates), int(np.ceil((1.0 + self.cfg.system.over_selection) * k - 1e-9)))
            self.keep[round] = k
        rng = numpy_rng(self.seed, "sample", round)
        return sorted(int(c) for c in rng.choice(candidates, size=picks, replace=False))

    def sample_idle(self, busy: set[int], key: int) -> int | None:
        """One client, uniformly among those online, trainable and not busy, for an async slot."""
        candidates = self.candidates()
        free = np.ones(self.num_clients, dtype=bool)
        free[np.fromiter(busy, dtype=np.int64, count=len(busy))] = False
        idle = candidates[free[candidates]]  # sorted, as candidates are
        if len(idle) == 0:
            return None
        return int(numpy_rng(self.seed, "async.sample", key).choice(idle))

    def rows_of(self, client: int) -> tuple[np.ndarray, np.ndarray | None]:
        """A client's train and test row indices, for a host that does not hold it."""
        ds = self.dataset
        return np.asarray(ds.client_train[client]), None if ds.client_test is None else np.asarray(ds.client_test[client])


def round_half_up(v: float) -> int:
    return int(np.floor(v + 0.5))
