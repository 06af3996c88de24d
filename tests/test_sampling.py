"""How a round's clients are drawn, checked as distributions: uniform participation without
replacement (inclusion frequencies, chi-squared), Poisson sampling (the count against
Binomial(N, q), each client's frequency against q), over-selection, availability, an idle
client for an asynchronous slot, and that a draw costs O(its cohort) at a billion clients."""

from __future__ import annotations

import tracemalloc
import types

import numpy as np
import pytest
from scipy import stats

from rayfl.config import load_config
from rayfl.data import build_federated_dataset
from rayfl.engine.clock import SimClock
from rayfl.engine.population import Population, draw_distinct
from rayfl.engine.system import SystemModel

ROUNDS = 3000
# a chi-squared p-value below this fails: about one false alarm in 10^5 runs of each test
ALPHA = 1e-5


def population(n: int, avail: str = "always", policy: str = "sync", empty_every: int = 7, **system: str) -> Population:
    """The driver's sampling state without Ray or hosts; every `empty_every`-th client (none
    for 0) holds no sample and must never be drawn."""
    sets = [f"partition.num_clients={n}", f"system.availability.kind={avail}", f"system.policy={policy}",
            *(f"system.{k}={v}" for k, v in system.items())]
    cfg = load_config(None, sets)
    sizes = np.full(n, 5, dtype=np.int64)
    if empty_every:
        sizes[::empty_every] = 0
    dataset = types.SimpleNamespace(num_clients=n, client_sizes=lambda: sizes)
    return Population(cfg, dataset, SystemModel(cfg.system, n, 1000.0, cfg.run.seed), SimClock())


def uniform_inclusion(counts: np.ndarray) -> float:
    """The chi-squared p-value of equal inclusion counts."""
    return float(stats.chisquare(counts).pvalue)


def test_uniform_sampling_is_without_replacement_and_uniform_over_trainable_clients():
    pop = population(60)
    counts = np.zeros(60, dtype=np.int64)
    for r in range(ROUNDS):
        cohort = pop.sample(r, 8)
        assert len(cohort) == 8 and len(set(cohort)) == 8 and cohort == sorted(cohort)
        counts[cohort] += 1
    trainable = np.arange(60) % 7 != 0
    assert counts[~trainable].sum() == 0  # empty clients are never drawn
    assert uniform_inclusion(counts[trainable]) > ALPHA
    # every 8-subset equally likely, not just every client: pairs of clients come together at
    # the rate of a uniform subset, C(k,2) / C(n,2) per round
    pairs = np.zeros((60, 60))
    for r in range(ROUNDS):
        c = np.array(pop.sample(r, 8))
        pairs[np.ix_(c, c)] += 1
    tr = np.flatnonzero(trainable)
    upper = pairs[np.ix_(tr, tr)][np.triu_indices(len(tr), 1)]
    m = len(tr)
    assert upper.mean() == pytest.approx(ROUNDS * 8 * 7 / (m * (m - 1)), rel=1e-9)  # every pair counted once
    assert uniform_inclusion(upper) > ALPHA


def test_a_stored_populations_sizes_take_4_bytes_a_client():
    pop = population(60)
    assert pop.sizes.dtype == np.int32 and not pop.sizes.flags.writeable and pop.sizes[7] == 0


def test_the_same_round_draws_the_same_clients():
    assert population(500).sample(4, 10) == population(500).sample(4, 10)
    assert population(500).sample(4, 10) != population(500).sample(5, 10)


def test_a_cohort_larger_than_the_trainable_clients_is_all_of_them():
    assert population(20).sample(0, 50) == [c for c in range(20) if c % 7]


def test_availability_draws_only_online_clients_uniformly():
    pop = population(400, "periodic", **{"availability.period": "100", "availability.online_fraction": "0.2"})
    avail = pop.system.availability
    counts = np.zeros(400, dtype=np.int64)
    for r in range(ROUNDS):
        now = pop.clock.now
        cohort = pop.sample(r, 6)
        assert len(cohort) == 6 and len(set(cohort)) == 6
        assert all(avail.online(c, now) and c % 7 for c in cohort), "a drawn client is offline or empty"
        counts[cohort] += 1
        pop.clock.advance_to(now + 100.0)  # the same phase each round: the same clients online
    online = np.array([avail.online(c, 0.0) and c % 7 != 0 for c in range(400)])
    assert counts[~online].sum() == 0 and uniform_inclusion(counts[online]) > ALPHA


def test_fewer_eligible_than_picks_gives_every_eligible_client():
    """The fall-back once N ids went by: list the eligible and draw the rest among them."""
    eligible = {3, 500, 977}

    def is_eligible(ids: np.ndarray) -> np.ndarray:
        return np.isin(ids, list(eligible))

    listing = lambda: np.array(sorted(eligible))  # noqa: E731
    assert sorted(draw_distinct(np.random.default_rng(0), 1000, 5, is_eligible, listing)) == [3, 500, 977]
    counts = {c: 0 for c in eligible}
    for seed in range(900):
        got = draw_distinct(np.random.default_rng(seed), 1000, 2, is_eligible, listing)
        assert len(set(got)) == 2 and set(got) <= eligible
        for c in got:
            counts[c] += 1
    assert uniform_inclusion(np.array(list(counts.values()))) > ALPHA


def test_over_selection_draws_more_and_keeps_k():
    pop = population(300, policy="over_selection", over_selection="0.3")
    cohort = pop.sample(2, 10)
    assert len(cohort) == 13 and len(set(cohort)) == 13 and pop.keep[2] == 10


def test_poisson_count_is_binomial_and_each_client_has_rate_q():
    n, q = 200, 0.05
    pop = population(n, empty_every=0)  # every client trainable: the count is Binomial(n, q)
    counts = np.zeros(n, dtype=np.int64)
    sizes = []
    for r in range(ROUNDS):
        cohort = pop.sample(r, poisson=q)
        assert len(set(cohort)) == len(cohort) and cohort == sorted(cohort)
        counts[cohort] += 1
        sizes.append(len(cohort))
    sizes_arr = np.array(sizes)
    mean_sd = np.sqrt(n * q * (1 - q) / ROUNDS)
    assert abs(sizes_arr.mean() - n * q) < 4.5 * mean_sd  # an off-by-one count is 20 sd away
    assert sizes_arr.var() == pytest.approx(n * q * (1 - q), rel=0.12)
    # the histogram of counts against Binomial(n, q) (bins with expectation >= 5)
    ks = np.arange(n + 1)
    expected = stats.binom.pmf(ks, n, q) * ROUNDS
    keep = expected >= 5
    observed = np.bincount(sizes_arr, minlength=n + 1)
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > ALPHA
    assert uniform_inclusion(counts) > ALPHA
    assert counts.mean() == pytest.approx(ROUNDS * q, rel=0.02)


def test_poisson_keeps_only_eligible_clients():
    pop = population(500)
    for r in range(200):
        assert all(c % 7 for c in pop.sample(r, poisson=0.1))


def test_an_idle_client_is_uniform_among_the_idle_and_eligible():
    pop = population(40)
    busy = {1, 2, 3, 8, 9}
    counts = np.zeros(40, dtype=np.int64)
    for key in range(ROUNDS):
        c = pop.sample_idle(busy, key)
        counts[c] += 1
    idle = np.array([c % 7 != 0 and c not in busy for c in range(40)])
    assert counts[~idle].sum() == 0 and uniform_inclusion(counts[idle]) > ALPHA
    everyone = {c for c in range(40) if c % 7}
    assert pop.sample_idle(everyone, 0) is None  # nobody idle


def test_a_round_at_a_billion_clients_costs_its_cohort():
    """A lazily generated billion, periodic availability and Poisson sampling: the dataset,
    device model and three draws of ~1,000 clients hold a few MB (one float per registered
    client would be 8 GB)."""
    n = 10**9
    cfg = load_config(None, ["data.dataset=synthetic", "data.lazy=true", "partition.method=natural",
                             f"partition.num_clients={n}", "system.availability.kind=periodic",
                             "system.availability.period=100", "system.speed.dist=lognormal"])
    tracemalloc.start()
    ds = build_federated_dataset(cfg.data, cfg.partition, 0)
    system = SystemModel(cfg.system, n, 1000.0, 0)
    pop = Population(cfg, ds, system, SimClock())
    uniform = [pop.sample(r, 1000) for r in range(3)]
    poisson = [pop.sample(r, poisson=1000 / n) for r in range(3)]
    idle = pop.sample_idle(set(uniform[0]), 0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 40 * 2**20, f"a billion clients: the driver peaked at {peak / 2**20:.0f} MB"
    assert all(len(c) == 1000 for c in uniform) and all(400 < len(c) < 600 for c in poisson)  # half are online
    assert idle is not None and idle not in uniform[0]
    assert max(max(c) for c in uniform) > 0.9 * n  # drawn from the whole population
    assert system.speed.known < 10_000  # profiles exist only for the clients touched
    # phases are kept for the drawn cohorts only, not for every id a draw asked about and rejected
    assert system.availability.phase.known <= sum(len(c) for c in uniform + poisson)
