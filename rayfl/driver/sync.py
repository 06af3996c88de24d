"""The synchronous round driver: one loop for every algorithm built from parts.

Each round: sample the cohort; for each phase, call its clients under the round policy on the
simulated clock (`fed.call`: sync, deadline, over-selection, dropouts, availability), the
round pipeline transforming the declared uploads on the hosts; combine them (exactly, or
through the pipeline's robust rule or noised sum); apply the phase's server update; after the
last phase, the `server:` section's optimizer on the round's model change; refuse a diverged
model; then evaluate on the run's cadence and log the round (which checkpoints and
runs the callbacks). A resumed run starts after its checkpoint with the checkpoint's state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.driver.parts import Algorithm, Phase, Round, Uploads
from rayfl.driver.rounds import check_finite, eval_due, normalized, ordered_sum
from rayfl.driver.server_optimizer import ServerOptimizer

if TYPE_CHECKING:
    from rayfl.engine import Federation


def run_sync(fed: Federation, alg: Algorithm) -> dict[str, Any]:
    """Run `alg` for `run.rounds` synchronous rounds (those after a checkpoint, on resume)."""
    state = fed.track(alg.init())
    fed.model_of = alg.model_of  # what callbacks (the best model, trackers) read as the global model
    alg.start(state)
    optimizer = ServerOptimizer.of(alg)
    metrics: dict[str, Any] = {}
    for r in fed.rounds(alg.rounds()):
        rnd = Round(r, [], alg.run.rounds)
        rnd.cohort = alg.cohort(state, rnd)
        metrics = {}
        start, stepped = (optimizer.start(state) if optimizer is not None else None), False
        for phase in alg.phases():
            ids = phase.clients(state, rnd)
            if ids is None:
                continue
            uploads = call_phase(fed, phase, state, rnd, ids)
            rnd.accepted[phase.name] = uploads.results
            if uploads or phase.update_without_uploads:
                state = phase.server_update(state, uploads, rnd)
                fed.server_state, stepped = state, True
                check_finite(alg.model_of(state), r, *alg.diverged)
            metrics.update(phase.metrics(state, uploads, rnd))
        if optimizer is not None and stepped:  # the round's model change, as one optimizer step
            state = fed.server_state = optimizer(start, state)
            check_finite(alg.model_of(state), r, *alg.diverged)
        if eval_due(r, alg.run):
            metrics.update(alg.evaluate(state, rnd))
        fed.log_round(r, **metrics)
    return alg.summary(state, metrics)


def call_phase(fed: Federation, phase: Phase, state: Any, rnd: Round, ids: list[int]) -> Uploads:
    """One client call of a phase: its payload to `ids`, the accepted answers (and, where the
    phase has one, the server's own update appended last), and how to combine them."""
    payload = phase.payload(state, rnd)
    per_client = phase.per_client(state, rnd, ids)
    server = phase.server_client
    keys = phase.uploads
    summed_on_hosts = bool(keys) and (phase.exact_sums or fed.pipeline is not None)
    extra: dict[str, Any] = {}
    if summed_on_hosts:  # only then: stand-in federations in tests need not know these keywords
        extra["keep"] = keys
        expected = expected_weights(fed, phase, ids) if server is None and ids else None
        if expected:
            extra["expect_weights"] = expected
    results: list[Any] = fed.call(ids, phase.client, round=rnd.index, phase=phase.name, per_client=per_client,
                                  **extra, **payload)
    if server is not None:
        mine = phase.per_client(state, rnd, [server.id])
        results.append(server.run(phase.client, rnd.index, **{**payload, **(mine[server.id] if mine else {})}))
    return combined(fed, phase, state, results, rnd)


def combined(fed: Federation, phase: Phase, state: Any, results: list[Any], rnd: Round, staleness: np.ndarray | None = None,
             factors: np.ndarray | None = None, downloaded: list[Any] | None = None) -> Uploads:
    """The Uploads a server update reads: each declared key's weighted sum, taken when read.
    Asynchronously each answer's `staleness` and weight factor s(staleness) come with it, and
    the model it `downloaded`."""
    cache: dict[str, np.ndarray] = {}

    def weights(key: str) -> np.ndarray:
        if key not in cache:
            relative = phase.weights(state, key, results, rnd)
            cache[key] = normalized(relative, phase.weighting_of(key) != "sum", factors)
        return cache[key]

    def combine(key: str) -> np.ndarray:
        if phase.exact_sums or fed.pipeline is not None:
            return fed.weighted_sum(results, key, weights(key))
        return ordered_sum(results, key, weights(key))

    return Uploads(results, combine, weights, staleness, downloaded)


def expected_weights(fed: Federation, phase: Phase, ids: list[int]) -> dict[str, dict[int, float]] | None:
    """The weights each summed key takes if every called client is accepted, for the named
    weightings: the hosts then sum at once (rayfl.engine.exact_sum), sparing a second round
    trip when the round keeps everyone (the same bits either way)."""
    if type(phase).weights is not Phase.weights:
        return None
    out = {}
    for key in phase.uploads:
        kind = phase.weighting_of(key)
        if kind == "samples":
            relative = fed.client_sizes[np.asarray(ids, dtype=np.int64)].astype(np.float64)
        elif kind in ("uniform", "sum"):
            relative = np.ones(len(ids))
        else:
            continue
        w = normalized(relative, kind != "sum")
        out[key] = dict(zip(ids, w.tolist(), strict=True))
    return out or None
