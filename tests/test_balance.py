"""`engine.balance`: a stateless client function's clients spread over the hosts by their
expected work (rayfl.engine.balance), with the results of running each on its own host."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from host_fixtures import sized_host

from rayfl.algorithms.fedavg import fedavg_client, scaffold_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.config import ConfigError, load_config, section_config
from rayfl.engine.balance import balanced_assignment, expected_rows, is_stateless, stateless
from rayfl.results import load
from rayfl.runner import run_experiment


def test_longest_work_first_to_the_least_loaded_host():
    # by hand: 5 -> h0, 4 -> h1, 3 (c2) -> h1 (4 < 5), 3 (c3) -> h0 (5 < 7), 3 (c4) -> h1 (7 < 8)
    assert balanced_assignment([0, 1, 2, 3, 4], [5, 4, 3, 3, 3], 2) == {0: [0, 3], 1: [1, 2, 4]}
    # equal work: ids in order, ties to the lowest host
    assert balanced_assignment([7, 3, 5, 1], [1, 1, 1, 1], 3) == {0: [1, 7], 1: [3], 2: [5]}
    assert balanced_assignment([4], [2.0], 3) == {0: [4]}  # hosts without clients are left out


def test_expected_rows_follow_the_schedule():
    assert expected_rows(30, {"schedule": LocalSchedule(10, 2, None)}) == 60
    assert expected_rows(30, {"schedule": LocalSchedule(10, None, 5)}) == 50
    assert expected_rows(4, {"schedule": LocalSchedule(10, None, 5)}) == 20  # batches of at most its 4 rows
    assert expected_rows(30, {}) == 30


def test_fedavg_is_stateless_and_scaffold_is_not():
    assert is_stateless(fedavg_client) and not is_stateless(scaffold_client)


def host(vectorize: str = "off"):
    return sized_host({0: 7, 1: 12, 2: 3}, 6, 3, section_config("model", name="mlp", hidden=[5]), 3, 10.0, vectorize)


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_a_visiting_client_computes_what_it_computes_at_home(vectorize):
    home = host(vectorize)
    x0 = np.zeros(6 * 5 + 5 + 5 * 3 + 3, dtype=np.float32) + 0.1
    broadcast = {"params": x0, "lr": 0.3, "schedule": LocalSchedule(4, 2, None)}
    at_home = home.run(fedavg_client, [0, 1, 2], 0, broadcast)
    away = sized_host({5: 0}, 6, 3, section_config("model", name="mlp", hidden=[5]), 3, 10.0, vectorize)
    away.arrays = home.arrays  # every host maps the whole dataset
    visit = away.run(fedavg_client, [0, 1, 2], 0, broadcast, foreign={c: (home.client_train[c], None) for c in (0, 1, 2)})
    for a, b in zip(at_home, visit, strict=True):
        assert a["local_steps"] == b["local_steps"] and a["host"] == b["host"] == 0
        np.testing.assert_array_equal(a["values"]["delta"], b["values"]["delta"])
    assert sorted(away.states) == [] and not away.foreign  # nothing left behind
    with pytest.raises(KeyError, match="does not host client 1"):
        away.run(fedavg_client, [1], 0, broadcast)


def test_a_stateless_function_that_writes_state_fails_on_a_visit():
    @stateless
    def liar(ctx, **kwargs):
        ctx.state["seen"] = 1
        return {"loss": 0.0}

    home = host()
    away = sized_host({5: 0}, 6, 3, section_config("model", name="mlp", hidden=[5]), 3, 10.0, "off")
    away.arrays = home.arrays
    with pytest.raises(RuntimeError, match="marked stateless"):
        away.run(liar, [1], 0, {}, task_ids={1: 0}, foreign={1: (home.client_train[1], None)})


def test_bad_balance_value_is_one_config_error():
    with pytest.raises(ConfigError, match="engine.balance") as err:
        load_config(None, ["engine.balance=always"])
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- end to end, on Ray

LAYOUT = ["wall_time", "host", "run_id", "experiment", "host_failures", "rerun"]
BASE = ["data.dataset=synthetic", "data.features=20", "partition.num_clients=16", "data.size_mu=3.0",
        "data.size_sigma=1.2", "data.min_client_samples=4", "data.max_client_samples=200", "partition.method=natural",
        "model.name=mlp", "model.hidden=[8]", "algorithm.clients_per_round=6", "algorithm.batch_size=8",
        "algorithm.lr=0.1", "run.rounds=4", "run.eval_every=2", "output.log_clients=true", "engine.num_hosts=2",
        "engine.num_cpus_per_host=0.5"]


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("balance")
    variants = {
        "fedavg-off": ["engine.balance=off"], "fedavg-auto": ["engine.balance=auto"],
        "fedavg-auto-killed": ["engine.balance=auto", "engine.kill_host_every=7"],
        "fedprox-auto-on": ["algorithm.name=fedprox", "algorithm.mu=0.1", "engine.vectorize=on"],
        "fedprox-off-on": ["algorithm.name=fedprox", "algorithm.mu=0.1", "engine.vectorize=on", "engine.balance=off"],
        "scaffold-auto": ["algorithm.name=scaffold"],
    }
    return {name: load(run_experiment(load_config(None, [*BASE, *extra, f"output.dir={out}", f"run.run_id={name}"])).run_dir)
            for name, extra in variants.items()}


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in ("round", "phase", "client", "split") if c in df.columns]
    return df.drop(columns=[c for c in LAYOUT if c in df.columns]).sort_values(keys).reset_index(drop=True)


def busiest_host_rows(clients: pd.DataFrame) -> pd.Series:
    return clients.groupby(["round", "host"])["backward_samples"].sum().groupby("round").max()


@pytest.mark.parametrize("pair", [("fedavg-off", "fedavg-auto"), ("fedavg-off", "fedavg-auto-killed"),
                                  ("fedprox-off-on", "fedprox-auto-on")])
def test_balancing_changes_which_host_runs_a_client_and_nothing_else(runs, pair):
    off, auto = runs[pair[0]], runs[pair[1]]
    pd.testing.assert_frame_equal(comparable(off.clients), comparable(auto.clients))
    pd.testing.assert_frame_equal(comparable(off.rounds), comparable(auto.rounds))


def test_balancing_evens_out_the_hosts_work(runs):
    off, auto = runs["fedavg-off"].clients, runs["fedavg-auto"].clients
    home = off.drop_duplicates("client").set_index("client")["host"]
    moved = (auto.set_index("client")["host"] != home.reindex(auto["client"]).to_numpy()).sum()
    assert moved > 0  # some clients ran away from home
    # longest-processing-time first: the busiest host is within one client of the mean
    per_round = auto.groupby("round")["backward_samples"]
    assert (busiest_host_rows(auto) <= per_round.sum() / 2 + per_round.max()).all()
    assert busiest_host_rows(auto).sum() < 0.9 * busiest_host_rows(off).sum()


def test_stateful_clients_stay_at_home(runs):
    clients = runs["scaffold-auto"].clients
    assert clients.groupby("client")["host"].nunique().max() == 1


def test_a_host_killed_before_the_sum_reruns_the_clients_it_ran(ray_local, tmp_path, monkeypatch):
    """Pre-aggregation keeps FedAvg's deltas on the hosts that ran them, balanced clients
    included: a host killed between the round and the server's sum is replaced, re-runs the
    tasks it ran (visitors too, from their rows) and the run ends with the failure-free bits."""
    from test_host_failures import kill_and_wait

    from rayfl.engine.federation import Federation

    def run(name: str, *extra: str):
        cfg = load_config(None, [*BASE, "engine.preaggregate=on", f"output.dir={tmp_path}", f"run.run_id={name}", *extra])
        seen = {}
        out = run_experiment(cfg, on_start=lambda _dir, fed: seen.setdefault("fed", fed))
        return load(out.run_dir), np.asarray(seen["fed"].server_state.x)

    ref_tables, ref_final = run("reference", "engine.preaggregate=off")
    original, killed = Federation.weighted_sum, []

    def kill_then_sum(self, results, key, weights):
        visitors = [r for r in results if r.host != self.host_of(r.client)]
        if not killed and key == "delta" and visitors:
            kill_and_wait(self.hosts[visitors[0].host])
            killed.append(visitors[0].host)
        return original(self, results, key, weights)

    monkeypatch.setattr(Federation, "weighted_sum", kill_then_sum)
    tables, final = run("killed")
    assert killed
    np.testing.assert_array_equal(final, ref_final)
    assert int(tables.rounds["host_failures"].sum()) == 1
    for table in ("rounds", "clients"):
        pd.testing.assert_frame_equal(comparable(getattr(tables, table)), comparable(getattr(ref_tables, table)))
