"""An algorithm as the parts its paper writes down; a round driver owns everything else.

The parts (see docs/guides/extending.md):

    config          its config dataclass (keys validated before anything runs)
    init()          the server state: data the server carries between steps, checkpointed
    payload()       what a client receives this step (per_client() for what differs by client)
    client          fn(ctx, **payload) -> dict, run in the client's host; optionally batched
    uploads         the model-shaped keys of a client's answer the server sums, with
    weights()       each answer's weight in that sum (a weighted mean unless `weighting` is "sum")
    server_update() (state, the combined uploads, round) -> the next state: short and pure
    metrics()       the `rounds` columns of a step; evaluate(): the model on test data

Methods with several client calls per round (ComFedL's probe, DRFA's loss reports) list them
as `phases()`; the algorithm is its own last or first phase. Everything else (sampling,
dispatch, the round policy on the simulated clock, asynchrony, the privacy / compression /
robust pipeline, the finiteness check, evaluation cadence, logging, checkpoints, callbacks and
host-failure replay) belongs to the drivers (`rayfl.driver.sync`, `rayfl.driver.asynchronous`).

Extending a method means overriding one part: FedAvg with server momentum is FedAvg whose
`server_update` keeps a velocity in its state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from rayfl.config import AlgorithmConfig, RunConfig
from rayfl.driver.rounds import clients_this_round, evaluate_global, round_metrics
from rayfl.driver.settings import AsynchronyConfig

if TYPE_CHECKING:
    from rayfl.engine import Federation

S = TypeVar("S")
ClientFn = Callable[..., dict]
NAMED_WEIGHTINGS = ("samples", "uniform", "sum")


@dataclass
class Round:
    """One server step as its parts see it: its index, the clients sampled for it, and what
    one phase leaves for the next (`notes`, `accepted`). Not checkpointed: it lives for one step."""

    index: int
    cohort: list[int]  # sampled for a synchronous round; an asynchronous step's buffered clients
    total: int
    asynchronous: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    accepted: dict[str, list[Any]] = field(default_factory=dict)  # phase name -> its accepted results


class Uploads:
    """What the accepted answers of one client call come to, as a server update reads them:
    `uploads[key]`, the combined sum of a declared upload (exact, through the round pipeline
    when one is on; taken on first read), the answers themselves (`results`, sorted by client;
    `values(key)` of a scalar key), the weights each sum used, and under asynchrony each
    answer's staleness."""

    def __init__(
        self,
        results: Sequence[Any],
        combine: Callable[[str], np.ndarray] | None = None,
        weights: Callable[[str], np.ndarray] | None = None,
        staleness: Sequence[int] | None = None,
        downloaded: Sequence[Any] | None = None,
    ):
        self.results = list(results)
        self._combine = combine
        self._weights = weights
        self._sums: dict[str, np.ndarray] = {}
        self.staleness = None if staleness is None else np.asarray(staleness, dtype=np.int64)
        self.downloaded = None if downloaded is None else list(downloaded)

    @classmethod
    def of(cls, sums: Mapping[str, np.ndarray], results: Sequence[Any] = (), weights: Mapping[str, Any] | None = None,
           staleness: Sequence[int] | None = None, downloaded: Sequence[Any] | None = None) -> Uploads:
        """Uploads from values computed by hand: what a one-step test of a server update feeds it."""
        out = cls(results, staleness=staleness, downloaded=downloaded,
                  weights=(lambda key: np.asarray(weights[key], dtype=np.float64)) if weights else None)
        out._sums = {k: np.asarray(v) for k, v in sums.items()}
        return out

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._sums:
            if self._combine is None:
                raise KeyError(f"no combined upload {key!r}")
            self._sums[key] = self._combine(key)
        return self._sums[key]

    def __len__(self) -> int:
        return len(self.results)

    def __bool__(self) -> bool:
        return bool(self.results)

    @property
    def clients(self) -> list[int]:
        """The accepted answers' client ids, in the order of `results`."""
        return [r.client for r in self.results]

    @property
    def asynchronous(self) -> bool:
        """Whether this step is asynchronous (each answer then has a staleness)."""
        return self.staleness is not None

    def weights(self, key: str) -> np.ndarray:
        """The weights the sum of `key` takes (normalised, staleness included)."""
        if self._weights is None:
            raise KeyError(f"no weights for {key!r}")
        return self._weights(key)

    def values(self, key: str) -> np.ndarray:
        """A scalar every answer carries (a loss, q-FedAvg's h), as float64 in client order."""
        return np.array([float(r[key]) for r in self.results], dtype=np.float64)


class Phase:
    """One client call of a server step: who is called, with what, what comes back summed, and
    how the server state moves. An `Algorithm` is its own main phase; `phases()` may add more."""

    name: ClassVar[str] = "train"  # the `clients.phase` column of its tasks
    client: ClassVar[ClientFn | None] = None  # fn(ctx, **payload) -> dict
    uploads: ClassVar[tuple[str, ...]] = ()  # model-shaped answer keys the server sums
    weighting: ClassVar[str] = "samples"  # samples or uniform (weighted means), sum (plain sums)
    # exact sums (pre-aggregated on the hosts, the same bits for any host layout) or ordered
    # (float64, client by client in id order on the driver: also host-independent)
    exact_sums: ClassVar[bool] = True
    # run server_update even when no answer was accepted (ZO-HFL's server gradient)
    update_without_uploads: ClassVar[bool] = False
    # the server's own data as one more, always-on client, run on the driver after the call
    # (rayfl.algorithms.server_client; FedAvg's `server_as_client`), or None
    server_client: Any = None

    fed: Federation
    cfg: AlgorithmConfig

    def clients(self, state: Any, rnd: Round) -> list[int] | None:
        """Who this phase calls: the round's cohort; None skips the phase (and its update)."""
        return rnd.cohort

    def payload(self, state: Any, rnd: Round) -> dict[str, Any]:
        """What every called client receives (shipped once through the object store)."""
        raise NotImplementedError(f"{type(self).__name__} must define payload()")

    def per_client(self, state: Any, rnd: Round, ids: list[int]) -> dict[int, dict[str, Any]] | None:
        """What differs by client (a step count, a direction), or None."""
        return None

    def weighting_of(self, key: str) -> str:
        """The weighting of one upload key: `weighting` unless the algorithm says otherwise."""
        return self.weighting

    def weights(self, state: Any, key: str, results: Sequence[Any], rnd: Round) -> np.ndarray:
        """Each accepted answer's relative weight in the sum of `key`; the driver normalises
        them into a weighted mean (except for `weighting: sum`) and multiplies in staleness."""
        kind = self.weighting_of(key)
        if kind == "samples" and self.server_client is not None:  # it counts its own samples
            return np.array([r.num_samples for r in results], dtype=np.float64)
        if kind == "samples":
            return self.fed.client_sizes[np.asarray([r.client for r in results], dtype=np.int64)].astype(np.float64)
        if kind in ("uniform", "sum"):
            return np.ones(len(results))
        raise NotImplementedError(f"{type(self).__name__}: weighting {kind!r} of {key!r} needs its own weights()")

    def server_update(self, state: S, uploads: Uploads, rnd: Round) -> S:
        """The next server state from this state and the combined uploads."""
        return state

    def metrics(self, state: Any, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        """This phase's columns of the step's `rounds` row."""
        return {}

    def promised_work(self, client: int, payload: Mapping[str, Any]) -> tuple[int, int]:
        """(forward, backward) samples a client is sure to process: the asynchronous driver
        runs tasks in parallel while their results cannot overtake each other on the clock.
        Local SGD on a `schedule` payload promises its epochs or steps."""
        from rayfl.algorithms.local import LocalSchedule, promised_samples

        schedule = payload.get("schedule")
        if isinstance(schedule, LocalSchedule):
            return 0, promised_samples(schedule, int(self.fed.client_sizes[client]))
        return 0, 0


class Algorithm(Phase, Generic[S]):
    """A federated method built from parts (see the module docstring). Subclass it, set
    `config`, `client` and `uploads`, and define `init`, `payload` and `server_update`."""

    __rayfl_algorithm__: ClassVar[bool] = True  # what the registry knows a parts-built class by
    config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    # why the round pipeline (privacy, compression, robust) cannot apply, or None: it applies
    # to `uploads`, the model-shaped sums
    pipeline_refusal: ClassVar[str | None] = None
    # why the method has no asynchronous reading, or None: the asynchronous driver runs it
    asynchrony_refusal: ClassVar[str | None] = None
    # asynchronous by itself (FedAsync, FedBuff, asynchronous FFGG: their own keys set it up)
    always_asynchronous: ClassVar[bool] = False
    # what check_finite names when the model diverges: (the model, the setting to lower)
    diverged: ClassVar[tuple[str, str]] = ("global model", "algorithm.lr")

    def __init__(self, fed: Federation, cfg: AlgorithmConfig, run: RunConfig):
        self.fed, self.cfg, self.run = fed, cfg, run
        self.setup()

    def setup(self) -> None:
        """What the parts need that follows from the data and config (a split, step sizes):
        computed once per run, never checkpointed."""

    # ---------------------------------------------------------------- the parts

    def init(self) -> S:
        """The server state at round 0 (a dataclass of arrays and numbers)."""
        raise NotImplementedError(f"{type(self).__name__} must define init()")

    def rounds(self) -> int:
        """Server steps to run: `run.rounds`."""
        return self.run.rounds

    def start(self, state: S) -> None:
        """Called once with the state the run starts from (the checkpoint's on resume)."""

    def phases(self) -> list[Phase]:
        """The client calls of one server step, in order: just this one by default."""
        return [self]

    def cohort(self, state: S, rnd: Round) -> list[int]:
        """The clients sampled for a synchronous round: `participation` of them, or
        `clients_per_round`, uniformly (Poisson under DP's accountant)."""
        return clients_this_round(self.fed, self.cfg, rnd.index)

    def model_of(self, state: S) -> np.ndarray:
        """The global model in a state: what is evaluated, checked and returned."""
        return state.x  # type: ignore[attr-defined]

    def with_model(self, state: S, model: np.ndarray) -> S:
        """`state` with its global model replaced: what the `server:` section's optimizer
        writes back (rayfl.driver.server_optimizer). Override it beside `model_of`."""
        return dataclasses.replace(state, x=model)  # type: ignore[type-var]

    def evaluate(self, state: S, rnd: Round) -> dict[str, Any]:
        """On the run's evaluation rounds: the global model on the global test set."""
        return evaluate_global(self.fed, self.model_of(state), rnd.index)

    def metrics(self, state: Any, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        """A step's summary: synchronously the accepted updates and their weighted training
        loss (by the first upload's weights); asynchronously their mean loss and staleness."""
        if uploads.asynchronous:
            staleness = uploads.staleness
            return {
                "train_loss": float(np.mean([r["loss"] for r in uploads.results])),
                "num_updates": len(uploads),
                "staleness_mean": float(np.mean(staleness)),
                "staleness_max": int(staleness.max()),
            }
        if not uploads:
            return {"num_updates": 0}
        weights = uploads.weights(self.uploads[0]) if self.uploads else np.full(len(uploads), 1.0 / len(uploads))
        return round_metrics(uploads.results, weights)

    def summary(self, state: S, metrics: dict[str, Any]) -> dict[str, Any]:
        """What the run returns (the manifest's summary; `final_params` is the model)."""
        return {"final_params": self.model_of(state), **metrics}

    # ---------------------------------------------------------------- what a config may ask

    @classmethod
    def refuses_pipeline(cls, cfg: Any, sections: list[str]) -> str | None:
        """Why the round pipeline's `sections` (privacy, compression, robust) cannot apply to
        this method under the job's config, or None."""
        if not cls.uploads:
            return "it declares no model-shaped upload (`uploads`) for the pipeline to transform"
        return cls.pipeline_refusal

    @classmethod
    def refuses_asynchrony(cls, cfg: AlgorithmConfig) -> str | None:
        """Why this method has no asynchronous reading, or None."""
        return cls.asynchrony_refusal

    @classmethod
    def asynchrony_of(cls, cfg: Any) -> AsynchronyConfig | None:
        """How the asynchronous driver runs this method under a job's config, or None for the
        synchronous driver: the job's `asynchrony:` section when it is on."""
        section = getattr(cfg, "asynchrony", None)
        return section if section is not None and section.enabled else None

    # ---------------------------------------------------------------- asynchrony

    def asynchrony(self) -> AsynchronyConfig | None:
        """The asynchronous driver's settings for this run, or None (synchronous rounds)."""
        cfg = getattr(self.fed, "cfg", None)
        return None if cfg is None else type(self).asynchrony_of(cfg)

    def dispatcher(self, settings: AsynchronyConfig, run_state: Any) -> Any:
        """Who runs the next asynchronous task (a rayfl.driver.asynchronous.Dispatcher), or
        None for the driver's own: an idle client drawn uniformly when one finishes."""
        return None

