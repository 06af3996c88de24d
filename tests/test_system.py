"""The system model and the synchronous policies, without Ray: distributions, tiers, traces,
availability, dropout plans, and who a round counts under sync / deadline / over-selection."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl.config import ConfigError, Distribution, SystemConfig, Tier, load_config
from rayfl.engine.system import SystemModel, client_draws
from rayfl.engine.tasks import (
    DROPPED,
    LATE,
    OFFLINE,
    OK,
    ClientResult,
    TaskPlan,
    close_round,
    plan_task,
    settle,
)
from rayfl.rng import client_uniforms

IDS = np.arange(40_000)


def draws(d: Distribution) -> np.ndarray:
    return client_draws(d, 0, "test", IDS)


def test_distributions_follow_their_laws():
    assert np.all(draws(Distribution("constant", 3.0)) == 3.0)
    u = draws(Distribution("uniform", 2.0, low=0.5, high=1.5))
    assert u.min() >= 1.0 and u.max() <= 3.0 and u.mean() == pytest.approx(2.0, abs=0.01)
    ln = draws(Distribution("lognormal", 10.0, sigma=1.0))
    assert np.median(ln) == pytest.approx(10.0, rel=0.03) and np.log(ln).std() == pytest.approx(1.0, abs=0.02)
    pa = draws(Distribution("pareto", 2.0, shape=1.5))
    assert pa.min() >= 2.0
    for x in (3.0, 10.0, 40.0):  # the survival function, (value / x)^shape
        assert np.mean(pa > x) == pytest.approx((2.0 / x) ** 1.5, abs=0.01)  # 4 sd
    inv = draws(Distribution("inverse_pareto", 2.0, shape=1.5))
    assert inv.max() <= 2.0 and np.mean(inv < 0.5) == pytest.approx(0.25**1.5, abs=0.006)  # P(value / X < y)
    t = draws(Distribution("tiers", values=[1.0, 10.0, 5.0], probs=[0.7, 0.2, 0.1]))
    assert set(np.unique(t)) == {1.0, 5.0, 10.0}
    assert np.mean(t == 10.0) == pytest.approx(0.2, abs=0.01) and np.mean(t == 5.0) == pytest.approx(0.1, abs=0.01)


def test_a_clients_draw_depends_on_the_client_alone():
    d = Distribution("lognormal", 1.0, sigma=0.5)
    every = client_draws(d, 3, "system.speed", IDS)
    picked = np.array([39_999, 7, 123, 7])
    np.testing.assert_array_equal(client_draws(d, 3, "system.speed", picked), every[picked])
    assert not np.array_equal(client_draws(d, 4, "system.speed", IDS[:10]), every[:10])  # another seed
    assert not np.array_equal(client_draws(d, 3, "system.latency", IDS[:10]), every[:10])  # another purpose
    # uniforms over a billion ids: in (0, 1), no collisions among neighbours
    u = client_uniforms(0, "x", np.arange(10**9 - 1000, 10**9))
    assert u.min() > 0.0 and u.max() < 1.0 and len(np.unique(u)) == 1000


def test_explicit_tiers_make_that_fraction_slower():
    cfg = SystemConfig(tiers=[Tier(fraction=0.1, speed_factor=0.1), Tier(fraction=0.3, speed_factor=0.5)])
    sm = SystemModel(cfg, 20_000, forward_flops=100.0, seed=3)
    speed = sm.speed.of(range(20_000))
    slow, half = np.mean(speed == 1e8), np.mean(speed == 5e8)
    assert slow == pytest.approx(0.1, abs=0.007) and half == pytest.approx(0.3, abs=0.01)  # > 3 sd of a binomial
    assert np.mean(speed == 1e9) == pytest.approx(1 - slow - half)  # disjoint; the rest keep theirs


def test_trace_sets_profiles_and_availability(tmp_path):
    trace = tmp_path / "devices.csv"
    trace.write_text(
        "client,speed,up_bandwidth,dropout,available_from,available_to\n"
        "0,5e8,1e5,0.0,0,100\n"
        "0,5e8,1e5,0.0,200,300\n"
        "2,2e9,,0.5,0,1000\n"
    )
    cfg = SystemConfig(trace=str(trace))
    cfg.availability.kind = "trace"
    sm = SystemModel(cfg, 3, forward_flops=1.0, seed=0)
    assert sm.speed.of(range(3)).tolist() == [5e8, 1e9, 2e9]
    assert sm.up_bandwidth[0] == 1e5 and sm.up_bandwidth[2] == 1.25e6
    assert sm.dropout.of(range(3)).tolist() == [0.0, 0.0, 0.5]
    av = sm.availability
    assert av.online(0, 50) and not av.online(0, 150) and av.online(0, 250)
    assert not av.online(1, 0)  # no interval: never online
    assert av.offline_at(0, 50, 500) == 100 and av.offline_at(2, 50, 500) is None


def test_bad_trace_names_the_file(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("id,speed\n0,1\n")
    with pytest.raises(ConfigError, match="no 'client' column"):
        SystemModel(SystemConfig(trace=str(bad)), 2, 1.0, 0)
    bad.write_text("client,speed\n5,1\n")
    with pytest.raises(ConfigError, match="client 5"):
        SystemModel(SystemConfig(trace=str(bad)), 2, 1.0, 0)
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"system.trace={tmp_path / 'missing.csv'}"])
    assert e.value.key == "system.trace"


def test_periodic_availability():
    cfg = SystemConfig()
    cfg.availability.kind, cfg.availability.period, cfg.availability.online_fraction = "periodic", 100.0, 0.25
    sm = SystemModel(cfg, 2000, 1.0, seed=1)
    frac = np.mean([sm.availability.online(c, 1234.5) for c in range(2000)])
    assert frac == pytest.approx(0.25, abs=0.03)
    c = next(c for c in range(2000) if sm.availability.online(c, 0.0))
    stop = sm.availability.offline_at(c, 0.0, 1e9)
    assert 0.0 < stop <= 25.0 and not sm.availability.online(c, stop + 1e-9)


def test_dropout_plans_are_seeded_per_task():
    sm = SystemModel(SystemConfig(dropout=0.3), 1000, 1.0, seed=0)
    plans = [plan_task(sm, 7, c, seq=c, key=4, now=0.0, version=0) for c in range(1000)]
    again = [plan_task(sm, 7, c, seq=c, key=4, now=0.0, version=0) for c in range(1000)]
    assert plans == again
    frac = np.mean([p.drop_fraction is not None for p in plans])
    assert frac == pytest.approx(0.3, abs=0.05)


def _record(client: int, backward: int) -> dict:
    return {"client": client, "host": 0, "values": {}, "num_samples": 10, "forward_samples": 0,
            "backward_samples": backward, "local_steps": 1, "bytes_up": 0, "bytes_down": 0}


def _results(durations: list[float]) -> list[ClientResult]:
    """Clients whose tasks take exactly `durations` (speed 1 FLOP/s, 1 FLOP per sample)."""
    cfg = SystemConfig(backward_cost=1.0, latency=Distribution("constant", 0.0), speed=Distribution("constant", 1.0))
    sm = SystemModel(cfg, len(durations), forward_flops=1.0, seed=0)
    out = []
    for c, d in enumerate(durations):
        plan = TaskPlan(c, c, 10.0, 0, None, None)
        out.append(settle(plan, _record(c, int(d)), sm, 0))
    return out


def test_sync_waits_for_everyone():
    res = _results([3, 1, 2])
    assert close_round(res, "sync", 10.0, None, None) == 13.0
    assert all(r.outcome == OK for r in res)


def test_deadline_drops_late_clients():
    res = _results([1, 4, 2, 5])
    end = close_round(res, "deadline", 10.0, 3.0, None)
    assert end == 13.0
    assert [r.outcome for r in res] == [OK, LATE, OK, LATE]
    early = _results([1, 2])
    assert close_round(early, "deadline", 10.0, 3.0, None) == 12.0  # everyone done before T


def test_over_selection_keeps_the_first_k():
    res = _results([4, 1, 3, 2, 6])
    end = close_round(res, "over_selection", 10.0, None, 3)
    assert end == 13.0
    assert [r.outcome for r in res] == [LATE, OK, OK, OK, LATE]


def test_failures_are_never_counted():
    cfg = SystemConfig(backward_cost=1.0, latency=Distribution("constant", 0.0), speed=Distribution("constant", 1.0))
    sm = SystemModel(cfg, 2, forward_flops=1.0, seed=0)
    dropped = settle(TaskPlan(0, 0, 0.0, 0, 0.5, None), _record(0, 8), sm, 0)
    assert dropped.outcome == DROPPED and dropped.finish_time == 4.0
    offline = settle(TaskPlan(1, 1, 0.0, 0, None, 3.0), _record(1, 8), sm, 0)
    assert offline.outcome == OFFLINE and offline.finish_time == 3.0
    res = [dropped, offline]
    assert close_round(res, "over_selection", 0.0, None, 1) == 4.0  # nobody made it: wait for all
    assert [r.outcome for r in res] == [DROPPED, OFFLINE]
