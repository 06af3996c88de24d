"""Client-level DP accounting: hand-checked closed forms and dp_accounting's own answers."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

from rayfl.pipeline import accounting
from rayfl.pipeline.accounting import (
    Mechanism,
    calibrate_noise,
    dp_event,
    epsilon,
    epsilons,
)

DELTA = 1e-5
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


def improved_conversion(orders: list[float], rdp: list[float], delta: float) -> float:
    """RDP -> (eps, delta) as dp_accounting's compute_epsilon does (Prop. 12 of 2004.00010)."""
    eps = []
    for a, r in zip(orders, rdp, strict=True):
        if delta**2 + math.expm1(-r) > 0:
            eps.append(0.0)
        elif a > 1.01:
            eps.append(r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1))
        else:
            eps.append(math.inf)
    return max(0.0, min(eps))


def gaussian_rdp(z: float, rounds: int) -> list[float]:
    """RDP of `rounds` compositions of the Gaussian mechanism: T a / (2 z^2)."""
    return [rounds * a / (2 * z**2) for a in DEFAULT_RDP_ORDERS]


@pytest.mark.parametrize(("z", "rounds", "delta"), [(1.1, 50, 1e-5), (4.0, 1000, 1e-6)])
def test_all_matches_gaussian_closed_form(z: float, rounds: int, delta: float) -> None:
    m = Mechanism(z, "all", num_clients=20, cohort=20)
    got = epsilon(m, rounds, delta)
    rdp = gaussian_rdp(z, rounds)
    assert got == pytest.approx(improved_conversion(DEFAULT_RDP_ORDERS, rdp, delta), rel=1e-9)
    plain = min(r + math.log(1 / delta) / (a - 1) for a, r in zip(DEFAULT_RDP_ORDERS, rdp, strict=True))
    assert plain >= got


def test_poisson_matches_dp_accounting() -> None:
    m = Mechanism(1.0, "poisson", num_clients=1000, cohort=10)
    assert m.rate == 0.01
    event = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))
    want = RdpAccountant().compose(event, 300).get_epsilon(DELTA)
    assert epsilon(m, 300, DELTA) == pytest.approx(want, rel=1e-12)
    want_pld = (
        PLDAccountant(value_discretization_interval=1e-4).compose(event, 100).get_epsilon(DELTA)
    )
    assert epsilon(m, 100, DELTA, "pld") == pytest.approx(want_pld, rel=1e-12)
    assert epsilon(m, 100, DELTA, "pld") < epsilon(m, 100, DELTA)  # PLD is the tighter one


def test_fixed_matches_dp_accounting_with_replace_one_sensitivity() -> None:
    # Replace-one: a client's clipped update can move the sum by 2C, so dp_accounting's
    # sensitivity-normalised multiplier is z / 2 = 0.75.
    m = Mechanism(1.5, "fixed", num_clients=100, cohort=5)
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        100, 5, dp_accounting.GaussianDpEvent(0.75)
    )
    want = RdpAccountant(neighboring_relation=REPLACE_ONE).compose(event, 200).get_epsilon(DELTA)
    assert epsilon(m, 200, DELTA) == pytest.approx(want, rel=1e-12)
    assert dp_event(m, 200) == dp_accounting.SelfComposedDpEvent(event, 200)


def test_fixed_full_cohort_is_the_replace_one_gaussian() -> None:
    # Everyone sampled: no amplification; Gaussian with sensitivity 2C, RDP T a / (2 (z/2)^2).
    m = Mechanism(3.0, "fixed", num_clients=10, cohort=10)
    want = improved_conversion(DEFAULT_RDP_ORDERS, gaussian_rdp(1.5, 40), DELTA)
    assert epsilon(m, 40, DELTA) == pytest.approx(want, rel=1e-9)


def test_local_is_gaussian_with_half_the_multiplier() -> None:
    # Per upload: std z C, sensitivity 2C (replace) -> multiplier z / 2, every round.
    z, rounds = 6.0, 100
    local = Mechanism(z, "local", num_clients=50, cohort=5)
    want = improved_conversion(DEFAULT_RDP_ORDERS, gaussian_rdp(z / 2, rounds), DELTA)
    assert epsilon(local, rounds, DELTA) == pytest.approx(want, rel=1e-9)
    half = Mechanism(z / 2, "all", num_clients=50, cohort=50)
    assert epsilon(local, rounds, DELTA) == pytest.approx(epsilon(half, rounds, DELTA), rel=1e-12)
    central = Mechanism(z, "all", num_clients=50, cohort=50)
    assert epsilon(local, rounds, DELTA) > epsilon(central, rounds, DELTA)
    assert epsilon(local, rounds, DELTA, "pld") > epsilon(central, rounds, DELTA, "pld")


@pytest.mark.parametrize("sampling", ["poisson", "fixed", "all", "local"])
def test_monotone_in_rounds_and_noise(sampling: str) -> None:
    m = Mechanism(2.0, sampling, num_clients=200, cohort=10)
    by_rounds = [epsilon(m, t, DELTA) for t in (1, 10, 100)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 3
    by_z = [epsilon(Mechanism(z, sampling, 200, 10), 50, DELTA) for z in (1.0, 2.0, 4.0)]
    assert by_z == sorted(by_z, reverse=True) and len(set(by_z)) == 3


@pytest.mark.parametrize("sampling", ["poisson", "fixed", "all", "local"])
def test_epsilons_rdp_entry_t_is_epsilon_after_t_rounds(sampling: str) -> None:
    m = Mechanism(1.3, sampling, num_clients=100, cohort=4)
    table = epsilons(m, 30, DELTA)
    assert len(table) == 30
    for t in (1, 2, 3, 17, 30):
        assert table[t - 1] == pytest.approx(epsilon(m, t, DELTA), rel=1e-9)


@pytest.mark.parametrize("sampling", ["poisson", "all", "local"])
def test_epsilons_pld_entry_t_is_epsilon_after_t_rounds(sampling: str) -> None:
    m = Mechanism(4.0, sampling, num_clients=100, cohort=4)
    table = epsilons(m, 12, DELTA, "pld")
    assert len(table) == 12
    for t in (1, 2, 7, 12):
        assert table[t - 1] == pytest.approx(epsilon(m, t, DELTA, "pld"), rel=1e-6)


def test_edges() -> None:
    m = Mechanism(1.0, "poisson", num_clients=100, cohort=1)
    assert epsilon(m, 0, DELTA) == 0.0
    assert epsilons(m, 0, DELTA) == []
    silent = Mechanism(0.0, "poisson", num_clients=100, cohort=1)
    assert epsilon(silent, 5, DELTA) == math.inf
    assert epsilon(silent, 5, DELTA, "pld") == math.inf
    assert epsilons(silent, 3, DELTA) == [math.inf] * 3
    assert calibrate_noise(m, 0, 1.0, DELTA) == 0.0
    with pytest.raises(ValueError):
        Mechanism(1.0, "poisson", num_clients=10, cohort=11)


@pytest.mark.parametrize(
    ("sampling", "accountant", "rounds", "target"),
    [
        ("poisson", "rdp", 500, 2.0),
        ("fixed", "rdp", 100, 5.0),
        ("local", "rdp", 20, 8.0),
        ("poisson", "pld", 50, 1.0),
        ("all", "pld", 30, 3.0),
    ],
)
def test_calibrate_noise_is_smallest_within_budget(
    sampling: str, accountant: str, rounds: int, target: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The search, not PLD fidelity, is under test here: a coarser grid keeps it ~10x faster.
    monkeypatch.setattr(accounting, "PLD_VALUE_DISCRETIZATION_INTERVAL", 1e-3)
    m = Mechanism(123.0, sampling, num_clients=1000, cohort=10)
    z = calibrate_noise(m, rounds, target, DELTA, accountant)

    def eps(noise: float) -> float:
        return epsilon(Mechanism(noise, sampling, 1000, 10), rounds, DELTA, accountant)

    assert eps(z) <= target
    assert eps(z * (1 - 2e-3)) > target


def test_pld_rejects_fixed_sampling() -> None:
    m = Mechanism(1.0, "fixed", num_clients=100, cohort=10)
    for call in (
        lambda: epsilon(m, 10, DELTA, "pld"),
        lambda: epsilons(m, 10, DELTA, "pld"),
        lambda: calibrate_noise(m, 10, 1.0, DELTA, "pld"),
    ):
        with pytest.raises(ValueError, match="rdp"):
            call()
