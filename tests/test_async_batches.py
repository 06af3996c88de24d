"""Asynchronous tasks sent as batches (`ClientHostImpl.run_tasks`) and spread over the hosts.

Unit level, without Ray: a batch of tasks with their own stream keys, payloads and task ids,
one client among them twice, returns what the tasks return one at a time; each stages its own
state; a client another host holds runs from the rows it came with and leaves nothing behind.
With Ray: the pool sends a stateless function's queued tasks as one call per host, the hosts
taking them in turn, and commits them in the simulated order a single host gives, each task
on the same host in every run; a stateful function's tasks go at once to their client's own
host; a run's tables on 1 and 2 hosts differ only in `clients.host`."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import ray.cloudpickle as cloudpickle
from host_fixtures import assert_records_match, sized_host
from test_async import make_fed  # noqa: F401  (a fixture)

from rayfl.algorithms.fedavg import fedavg_client, scaffold_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.config import load_config, section_config
from rayfl.engine import AsyncPool
from rayfl.engine.balance import stateless
from rayfl.engine.host import ClientHostImpl, HostTask
from rayfl.models import build_model
from rayfl.models.params import get_flat
from rayfl.results import load
from rayfl.runner import run_experiment

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # hosts cannot import tests/

F_IN, C = 6, 3
SIZES = {0: 7, 1: 12, 2: 3, 3: 10, 4: 0}
MODEL = section_config("model", name="mlp", hidden=[40])


def host(vectorize: str = "auto") -> ClientHostImpl:
    return sized_host(SIZES, F_IN, C, MODEL, 3, 10.0, vectorize)


def payloads() -> list[dict]:
    """Two model versions with their own learning rates."""
    x0 = get_flat(build_model(MODEL, (F_IN,), C)).numpy()
    x1 = (x0 + np.float32(0.01)).astype(np.float32)
    return [{"params": x0, "lr": 0.3, "schedule": LocalSchedule(4, 2, None)},
            {"params": x1, "lr": 0.1, "schedule": LocalSchedule(4, 2, None)}]


# client, stream key, payload: client 1 twice, with other keys and payloads
TASKS = [(1, 5, 0), (3, 7, 1), (1, 9, 1), (2, 4, 0), (4, 6, 0), (0, 8, 1)]


@pytest.mark.parametrize("vectorize", ["auto", "off"])
def test_a_batch_of_tasks_equals_its_tasks_one_at_a_time(vectorize):
    given = payloads()
    tasks = [HostTask(fedavg_client, c, key, p, 100 + i) for i, (c, key, p) in enumerate(TASKS)]
    batch = host(vectorize).run_tasks(tasks, None, *given)
    alone = [host(vectorize).run_tasks([HostTask(fedavg_client, c, key, 0, 100 + i)], None, given[p])[0]
             for i, (c, key, p) in enumerate(TASKS)]
    assert [r["client"] for r in batch] == [c for c, _, _ in TASKS]
    assert_records_match(alone, batch)
    # a task alone is `run`'s call of one client: same stream key, same payload, same bits
    c, key, p = TASKS[1]
    assert_records_match(host(vectorize).run(fedavg_client, [c], key, given[p]), [batch[1]])
    # the same client on other keys and payloads trains on other minibatches from another start
    assert not np.array_equal(batch[0]["values"]["delta"], batch[2]["values"]["delta"])


def test_each_task_of_a_batch_stages_its_own_state():
    """Both tasks of client 1 start from its committed state; settling one commits its state."""
    x = payloads()[0]
    base = {**x, "control": np.zeros_like(x["params"])}
    h = host()
    tasks = [HostTask(scaffold_client, 1, 0, 0, 10), HostTask(scaffold_client, 1, 1, 0, 11),
             HostTask(scaffold_client, 3, 0, 0, 12)]
    recs = h.run_tasks(tasks, None, base)
    assert sorted(h.staged) == [10, 11, 12] and all(r["state_changed"] for r in recs)
    assert not h.states.get(1)  # nothing committed yet
    first = host().run_tasks([tasks[0]], None, base)[0]
    second = host().run_tasks([tasks[1]], None, base)[0]
    assert_records_match([first, second], recs[:2])
    h.settle({11: True, 10: False, 12: False})
    assert h.staged == {}
    staged_alone = host()
    staged_alone.run_tasks([tasks[1]], None, base)
    np.testing.assert_array_equal(h.states[1]["control"], staged_alone.staged[11][1]["control"])


def test_a_visiting_client_runs_from_its_rows_and_leaves_nothing_behind():
    home = host()
    away = ClientHostImpl(1, home.arrays, {c: home.client_train[c] for c in (0, 1)}, None, MODEL, (F_IN,), C, 3,
                          flops_per_sample=10.0, vectorize="auto")  # the same rows, holding clients 0 and 1 only
    rows = (home.client_train[3], None)
    given = payloads()[0]
    mine = home.run_tasks([HostTask(fedavg_client, 3, 2, 0, 1)], None, given)
    visit = away.run_tasks([HostTask(fedavg_client, 3, 2, 0, 1, rows=rows)], None, given)
    assert visit[0]["host"] == away.host_id
    assert_records_match(mine, visit)
    assert 3 not in away.states and away.foreign == {} and away.staged == {}
    with pytest.raises(KeyError, match="does not host client 3"):
        away.run_tasks([HostTask(fedavg_client, 3, 2, 0, 1)], None, given)


@stateless
def unit_work(ctx, samples: int = 1) -> dict:
    """Exactly `samples` gradient samples of work, whatever the client's data; no state."""
    ctx.work.gradient_step(samples)
    return {"id": ctx.id}


def stateful_work(ctx, samples: int = 1) -> dict:
    ctx.work.gradient_step(samples)
    ctx.state["n"] = ctx.state.get("n", 0) + 1
    return {"id": ctx.id, "n": ctx.state["n"]}


def spy_calls(monkeypatch) -> list[tuple[int, list[int]]]:
    """Every call the pools send: (host, its tasks' clients)."""
    sent: list[tuple[int, list[int]]] = []
    send = AsyncPool._send

    def spy(self, h, tasks):
        sent.append((h, [t.spec.plan.client for t in tasks]))
        return send(self, h, tasks)

    monkeypatch.setattr(AsyncPool, "_send", spy)
    return sent


def run_events(fed, fn, clients, count: int) -> list[tuple]:
    """FedAsync's loop over `fn` with `clients` in flight: (client, finish, version, staleness, host)."""
    pool = fed.async_pool()
    for c in clients:
        pool.submit(c, fn, min_backward_samples=1)
    events = []
    for _ in range(count):
        r = pool.next()
        events.append((r.client, round(r.finish_time, 6), r.version, r.staleness, r.host))
        fed.advance_version()
        pool.submit(r.client, fn, min_backward_samples=1)
    pool.drain()
    return events


def test_queued_tasks_go_out_together_and_spread_over_the_hosts(make_fed, monkeypatch):  # noqa: F811
    durations = [1.0, 2.6, 4.2, 1.7, 3.1, 2.2]
    sent = spy_calls(monkeypatch)
    one = run_events(make_fed(durations, hosts=1), unit_work, range(6), 12)
    assert sent[0][1] == [0, 1, 2, 3, 4, 5]  # the first wait sends all six as one call
    sent.clear()
    fed = make_fed(durations, hosts=2)
    home = {c: fed.host_of(c) for c in range(6)}
    assert set(home.values()) == {0, 1}
    two = run_events(fed, unit_work, [c for c in range(6) if home[c] == 0] + [c for c in range(6) if home[c] == 1], 12)
    assert [e[:4] for e in two] == [e[:4] for e in one]  # the same simulated order, versions and staleness
    first = dict(sent[:2])
    assert sorted(first) == [0, 1] and min(len(c) for c in first.values()) >= 2  # one call per host
    assert any(e[4] != home[e[0]] for e in two)  # some ran away from their client's host
    assert len(sent) < sum(len(clients) for _, clients in sent)  # several tasks a call
    again = run_events(make_fed(durations, hosts=2), unit_work,
                       [c for c in range(6) if home[c] == 0] + [c for c in range(6) if home[c] == 1], 12)
    assert again == two  # where a task runs depends on the submissions alone


def test_a_stateful_functions_tasks_go_at_once_to_their_clients_host(make_fed, monkeypatch):  # noqa: F811
    sent = spy_calls(monkeypatch)
    fed = make_fed([1.0, 2.6, 4.2, 1.7], hosts=2)
    events = run_events(fed, stateful_work, range(4), 6)
    assert len(sent) == 4 + 6 and all(len(clients) == 1 for _, clients in sent)
    assert all(h == fed.host_of(clients[0]) for h, clients in sent)
    assert all(host == fed.host_of(c) for c, *_, host in events)


def test_queued_tasks_are_in_the_snapshot_and_drained_unsent(make_fed, monkeypatch):  # noqa: F811
    sent = spy_calls(monkeypatch)
    fed = make_fed([1.0, 2.0, 3.0], hosts=2)
    pool = fed.async_pool()
    for c in range(3):
        pool.submit(c, unit_work, min_backward_samples=1)
    assert len(pool) == 3 and pool.busy_clients == {0, 1, 2}
    assert [spec.plan.client for spec in pool.snapshot()["tasks"]] == [0, 1, 2]
    pool.drain()
    assert sent == [] and len(pool) == 0 and fed.tasks_discarded == 3


@pytest.mark.slow
def test_fedbuff_tables_on_1_and_2_hosts_differ_only_in_where_tasks_ran(ray_local, tmp_path):
    frames, homes = {}, {}
    for hosts in (1, 2):
        cfg = load_config(None, [
            "data.dataset=synthetic", "data.iid=true", "partition.num_clients=60", "model.name=mlp",
            "model.hidden=[32]", "algorithm.name=fedbuff", "algorithm.concurrency=8", "algorithm.buffer_size=3",
            "algorithm.local_epochs=2", "run.rounds=10", "system.speed={dist: inverse_pareto, value: 2.0e+6, shape: 1.2}",
            "system.dropout=0.1", f"engine.num_hosts={hosts}", "engine.num_cpus_per_host=0.5",
            f"output.dir={tmp_path}", f"run.run_id=hosts-{hosts}",
        ])
        out = run_experiment(cfg, on_start=lambda run_dir, fed: homes.update({c: fed.host_of(c) for c in range(60)}))
        frames[hosts] = load(out.run_dir)
    for table in ("rounds", "clients", "evals"):
        a, b = (getattr(frames[h], table).drop(columns=["wall_time", "host", "run_id"], errors="ignore") for h in (1, 2))
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    clients = frames[2].clients
    assert (clients["host"] != clients["client"].map(homes)).any()  # some tasks ran away from their client's host
