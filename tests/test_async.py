"""The clock with real Ray hosts: exact async order and staleness with hand-set durations,
deadline / over-selection / dropout bookkeeping, and async results independent of placement."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray.cloudpickle as cloudpickle

from rayfl.config import load_config
from rayfl.data import build_federated_dataset
from rayfl.engine import Federation
from rayfl.results import load
from rayfl.runner import run_experiment

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # hosts cannot import tests/


def unit_work(ctx, samples: int = 1) -> dict:
    """Exactly `samples` gradient samples of work, whatever the client's data."""
    ctx.work.gradient_step(samples)
    return {"id": ctx.id}


def sgd_work(ctx, steps: int = 5) -> dict:
    """Local steps that respect a partial-work budget."""
    for _ in ctx.batches(4, steps=steps):
        ctx.work.gradient_step(4)
    return {"id": ctx.id}


@pytest.fixture
def make_fed(ray_local, tmp_path):
    """A Federation over digits whose clients' task durations are set by hand: a client doing
    `samples` gradient samples takes durations[c] * samples simulated seconds."""
    feds = []

    def make(durations: list[float], *extra: str, hosts: int = 1) -> Federation:
        n = len(durations)
        probe = load_config(None, ["data.dataset=digits", "partition.method=iid", f"partition.num_clients={n}",
                                   f"algorithm.clients_per_round={n}"])
        ds = build_federated_dataset(probe.data, probe.partition, 0)
        from rayfl.engine.system import forward_flops_per_sample
        from rayfl.models import build_model

        flops = 3.0 * forward_flops_per_sample(build_model(probe.model, ds.input_shape, ds.num_classes), ds.input_shape)
        trace = tmp_path / f"trace{len(feds)}.csv"
        trace.write_text("client,speed,dropout\n" + "".join(f"{c},{flops / d!r},{0.0}\n" for c, d in enumerate(durations)))
        cfg = load_config(None, [
            "data.dataset=digits", "partition.method=iid", f"partition.num_clients={n}",
            f"algorithm.clients_per_round={n}", f"system.trace={trace}", "system.latency=0",
            "system.up_bandwidth=1e30", "system.down_bandwidth=1e30",
            f"engine.num_hosts={hosts}", "engine.num_cpus_per_host=0.5", *extra,
        ])
        fed = Federation(cfg, ds)
        feds.append(fed)
        return fed

    yield make
    for f in feds:
        f.shutdown()


def test_async_commits_in_simulated_order_with_exact_staleness(make_fed):
    """Three clients with durations 1, 2.6 and 4.2 restart as soon as they report (FedAsync)."""
    fed = make_fed([1.0, 2.6, 4.2], hosts=2)
    pool = fed.async_pool()
    for c in range(3):
        pool.submit(c, unit_work)
    events = []
    for _ in range(8):
        r = pool.next()
        events.append((r.client, round(r.finish_time, 6), r.version, r.staleness))
        fed.advance_version()
        pool.submit(r.client, unit_work)
    pool.drain()
    assert events == [  # (client, finish, version downloaded, staleness when applied)
        (0, 1.0, 0, 0),
        (0, 2.0, 1, 0),
        (1, 2.6, 0, 2),
        (0, 3.0, 2, 1),
        (0, 4.0, 4, 0),
        (2, 4.2, 0, 5),
        (0, 5.0, 5, 1),
        (1, 5.2, 3, 4),
    ]
    assert fed.now == pytest.approx(5.2)


def test_bounded_staleness_marks_old_updates(make_fed):
    fed = make_fed([1.0, 3.5])
    pool = fed.async_pool()
    pool.submit(0, unit_work)
    pool.submit(1, unit_work)
    outcomes = []
    for _ in range(4):
        r = pool.next(max_staleness=2)
        outcomes.append((r.client, r.staleness, r.outcome))
        if r.ok:
            fed.advance_version()
        pool.submit(r.client, unit_work)
    pool.drain()
    assert outcomes == [(0, 0, "ok"), (0, 0, "ok"), (0, 0, "ok"), (1, 3, "stale")]


def test_deadline_drops_or_truncates_late_clients(make_fed):
    fed = make_fed([1.0, 2.0, 3.0, 4.0], "system.policy=deadline", "system.deadline=2.5")
    ok = fed.call([0, 1, 2, 3], unit_work, round=0)
    assert [r["id"] for r in ok] == [0, 1]
    assert fed.now == pytest.approx(2.5)
    partial = make_fed([0.05, 0.1, 0.2, 0.4], "system.policy=deadline", "system.deadline=2.5",
                       "system.late_policy=partial")
    res = partial.call([0, 1, 2, 3], sgd_work, round=0, steps=5)  # 20 samples: 1, 2, 4, 8 s
    assert [r["id"] for r in res] == [0, 1, 2, 3]
    assert [r.local_steps for r in res] == [5, 5, 3, 1]
    assert [r.truncated for r in res] == [False, False, True, True]
    assert max(r.finish_time for r in res) <= 2.5


def test_over_selection_counts_the_first_k(make_fed):
    fed = make_fed([4.0, 1.0, 3.0, 2.0, 5.0, 6.0], "system.policy=over_selection", "system.over_selection=0.5")
    picked = fed.sample(0, k=4)
    assert len(picked) == 6
    ok = fed.call(picked, unit_work, round=0)
    assert sorted(r["id"] for r in ok) == [0, 1, 2, 3]
    assert fed.now == pytest.approx(4.0)


def test_dropped_client_update_is_never_applied(ray_local, tmp_path):
    trace = tmp_path / "drop.csv"
    trace.write_text("client,dropout\n" + "".join(f"{c},{1.0 if c == 2 else 0.0}\n" for c in range(6)))
    cfg = load_config(None, ["data.dataset=digits", "partition.method=iid", "partition.num_clients=6",
                             "algorithm.clients_per_round=6", "run.rounds=3", f"system.trace={trace}",
                             f"output.dir={tmp_path / 'results'}"])
    res = load(run_experiment(cfg).run_dir)
    by = res.clients.groupby("client")["outcome"].unique()
    assert list(by[2]) == ["dropped"] and all(list(by[c]) == ["ok"] for c in (0, 1, 3, 4, 5))
    assert res.rounds["num_updates"].tolist() == [5, 5, 5]
    assert res.rounds["clients_dropped"].tolist() == [1, 1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasync"])
def test_async_runs_are_identical_with_1_and_4_hosts(ray_local, tmp_path, algorithm):
    frames = {}
    for hosts in (1, 4):
        cfg = load_config(None, [
            "data.dataset=digits", "partition.method=dirichlet", "partition.num_clients=20",
            f"algorithm.name={algorithm}", "algorithm.concurrency=6", "algorithm.clients_per_round=6",
            "algorithm.lr=0.1", "algorithm.batch_size=16", "run.rounds=8",
            # dropout 0.3: a dropped task among FedAsync's 8 is all but certain (0.7^8 = 6% chance of none)
            "system.speed={dist: pareto, value: 1.0e8, shape: 1.5}", "system.dropout=0.3",
            f"engine.num_hosts={hosts}", "engine.num_cpus_per_host=0.5",
            f"output.dir={tmp_path}", f"run.run_id={algorithm}-{hosts}",
        ])
        frames[hosts] = load(run_experiment(cfg).run_dir)
    drop = ["wall_time", "host"]
    for table in ("rounds", "clients"):
        a = getattr(frames[1], table).drop(columns=drop, errors="ignore").drop(columns=["run_id"])
        b = getattr(frames[4], table).drop(columns=drop, errors="ignore").drop(columns=["run_id"])
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    clients = frames[1].clients
    assert clients["staleness"].max() > 0
    assert (clients["outcome"] == "dropped").any()
    assert clients["finish_time"].is_monotonic_increasing  # committed in simulated-time order


def test_fedbuff_steps_on_exactly_buffer_size_fresh_updates(ray_local, tmp_path):
    """Each server step applies exactly `buffer_size` ok updates; dropped and too-stale tasks are
    logged but never counted or aggregated. A committed task belongs to the step during which it
    arrived, i.e. the model version current at commit: version downloaded + staleness."""
    rounds, buffer, max_staleness = 6, 3, 1
    cfg = load_config(None, [
        "data.dataset=digits", "partition.method=iid", "partition.num_clients=12",
        "algorithm.name=fedbuff", "algorithm.concurrency=6", f"algorithm.buffer_size={buffer}",
        f"algorithm.max_staleness={max_staleness}", "algorithm.lr=0.1", "algorithm.batch_size=16",
        f"run.rounds={rounds}", "system.speed={dist: pareto, value: 1.0e8, shape: 1.2}", "system.dropout=0.2",
        "engine.num_hosts=1", "engine.num_cpus_per_host=0.5", f"output.dir={tmp_path}",
    ])
    res = load(run_experiment(cfg).run_dir)
    clients, steps = res.clients, res.rounds.sort_values("round").reset_index(drop=True)
    assert steps["round"].tolist() == list(range(rounds))
    clients = clients.assign(step=clients["version"] + clients["staleness"])
    assert clients["step"].between(0, rounds - 1).all()
    outcome = clients["outcome"]
    assert (clients.loc[outcome == "ok", "staleness"] <= max_staleness).all()
    assert (clients.loc[outcome == "stale", "staleness"] > max_staleness).all()
    # the run exercised both filters: some updates came back too stale, some clients dropped out
    assert (outcome == "stale").any() and (outcome == "dropped").any()
    counts = clients.groupby(["step", "outcome"]).size().unstack(fill_value=0).reindex(range(rounds), fill_value=0)
    for name in ("ok", "stale", "dropped"):
        col = counts[name] if name in counts else pd.Series(0, index=counts.index)
        assert col.tolist() == steps[f"clients_{name}"].tolist(), name
    assert counts["ok"].tolist() == steps["num_updates"].tolist() == [buffer] * rounds
    assert int((outcome == "ok").sum()) == rounds * buffer
    # the staleness the server aggregated is that of the step's ok updates, and only theirs
    ok = clients[outcome == "ok"].groupby("step")["staleness"]
    np.testing.assert_allclose(ok.mean().to_numpy(), steps["staleness_mean"].to_numpy())
    assert ok.max().tolist() == steps["staleness_max"].tolist()


def test_stragglers_jobs_validate():
    jobs = sorted((Path(__file__).resolve().parents[1] / "jobs").glob("stragglers_*.yaml"))
    assert len(jobs) == 5
    policies = {load_config(j).system.policy for j in jobs}
    algorithms = {load_config(j).algorithm.name for j in jobs}
    assert policies == {"sync", "deadline", "over_selection"} and {"fedasync", "fedbuff"} <= algorithms


@pytest.mark.slow
def test_bench_async_writes_its_summary(ray_local, tmp_path):
    from rayfl.bench.asynchronous import run_async_bench

    out = tmp_path / "bench" / "async.json"
    summary = run_async_bench(clients=40, target=0.3, rounds=4, updates=40, out=out, vectorize=("auto", "off"))
    assert set(summary["policies"]) == {"sync", "deadline", "fedbuff"}
    assert all(p["sim_seconds_total"] > 0 and p["updates_applied"] > 0 for p in summary["policies"].values())
    assert summary["wall_seconds_per_1000_updates"]["1_hosts"] > 0
    assert summary["sync_wall_seconds_per_1000_updates"]["2_hosts"] > 0
    assert set(summary["async_over_sync_wall"]) == {"1_hosts", "2_hosts"}
    assert summary["parallel_speedup_2_vs_1_hosts"] > 0 and summary["sync_parallel_speedup"] > 0
    assert set(summary["by_vectorize"]) == {"auto", "off"}
    assert summary["by_vectorize"]["auto"]["wall_seconds_per_1000_updates"] == summary["wall_seconds_per_1000_updates"]
    assert all(v > 0 for v in summary["cpu_seconds_per_1000_updates"].values())  # the machine was busy between rounds
    assert summary["sync_cpu_seconds_per_1000_updates"]["2_hosts"] > 0 and summary["cores"] >= 1
    table = pd.read_parquet(out.with_suffix(".parquet"))
    assert out.is_file() and table.shape[0] == 11 and set(table["vectorize"].dropna()) == {"auto", "off"}
