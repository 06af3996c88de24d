"""`rayfl bench fedavg-*`: the reference loop does exactly rayfl's client work.

Without Ray: rayfl's FedAvg client function, run by a ClientHostImpl (loop and vectorised) on
the clients the reference samples, averaged like `run_fedavg`, must reach the reference loop's
model; the reference's initial model and sampling must be the Federation's. Plus the CLI's
argument parsing for the new workloads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rayfl.algorithms.fedavg import fedavg_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.bench.common import steady
from rayfl.bench.fedavg import workload_config
from rayfl.bench.reference import initial_params, run_reference_loop, sample_clients
from rayfl.cli import build_parser
from rayfl.data import build_federated_dataset
from rayfl.engine.clock import SimClock
from rayfl.engine.federation import Federation
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.population import Population
from rayfl.engine.system import SystemModel

SMALL = ["partition.num_clients=8", "algorithm.clients_per_round=3", "data.features=20",
         "data.min_client_samples=13", "data.max_client_samples=40", "data.size_sigma=1.0",
         "data.size_mu=2.0"]  # unequal sizes: the weights and short batches matter
ROUNDS = 3


@pytest.fixture(scope="module")
def small():
    cfg = workload_config("fedavg-mlp", ROUNDS, *SMALL)
    return cfg, build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)


def rayfl_clients_in_process(cfg, ds, vectorize: str) -> np.ndarray:
    """`run_fedavg`'s arithmetic with rayfl's own client function on one in-process host."""
    arrays = {"train_x": ds.train_x, "train_y": ds.train_y}
    host = ClientHostImpl(0, arrays, dict(enumerate(ds.client_train)), None, cfg.model, tuple(ds.input_shape),
                          ds.num_classes, cfg.run.seed, vectorize=vectorize)
    sizes = ds.client_sizes()
    x = initial_params(cfg, ds)
    alg = cfg.algorithm
    for r in range(ROUNDS):
        ids = sample_clients(cfg.run.seed, r, sizes, alg.clients_per_round)
        recs = host.run(fedavg_client, ids, r, {"params": x, "lr": alg.lr, "prox_mu": getattr(alg, "mu", 0.0),
                                                "schedule": LocalSchedule(alg.batch_size, alg.local_epochs, None)})
        w = sizes[ids] / sizes[ids].sum()
        x = (x + sum(wi * rec["values"]["delta"].astype(np.float64) for wi, rec in zip(w, recs, strict=True))).astype(np.float32)
    return x


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_reference_loop_reaches_rayfls_model(small, vectorize):
    cfg, ds = small
    ref = run_reference_loop(cfg, ds, ROUNDS)
    mine = rayfl_clients_in_process(cfg, ds, vectorize)
    assert np.abs(ref.final - initial_params(cfg, ds)).max() > 1e-3  # it trained
    np.testing.assert_allclose(mine, ref.final, rtol=0, atol=1e-5)
    assert len(ref.round_seconds) == ROUNDS and sorted(ref.sampled) == list(range(ROUNDS))


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_reference_fedprox_loop_reaches_rayfls_model(small, vectorize):
    """`fedprox-mlp`: the loop's proximal gradient is rayfl's FedProx (a strong mu, so that
    the term matters: the model is 70x the tolerance away from FedAvg's)."""
    cfg, ds = small
    prox = workload_config("fedprox-mlp", ROUNDS, *SMALL, "algorithm.mu=0.5")
    assert prox.algorithm.name == "fedprox" and prox.data == cfg.data  # the same data as `small`
    ref = run_reference_loop(prox, ds, ROUNDS)
    np.testing.assert_allclose(rayfl_clients_in_process(prox, ds, vectorize), ref.final, rtol=0, atol=1e-5)
    assert np.abs(ref.final - run_reference_loop(cfg, ds, ROUNDS).final).max() > 1e-4


def test_reference_initial_model_and_sampling_are_the_federations(small):
    cfg, ds = small
    fake = SimpleNamespace(seed=cfg.run.seed, cfg=cfg, dataset=ds)
    np.testing.assert_array_equal(initial_params(cfg, ds), Federation.initial_params(fake))
    sizes = ds.client_sizes()
    population = Population(cfg, ds, SystemModel(cfg.system, ds.num_clients, 1.0, cfg.run.seed), SimClock())
    for r in range(3):  # Federation.sample's draw, with every client always online
        assert sample_clients(cfg.run.seed, r, sizes, 3) == population.sample(r, 3)


def test_steady_drops_warm_up_and_evaluation_rounds():
    np.testing.assert_array_equal(steady([5.0, 1.0, 2.0, 9.0], 1, 1), [1.0, 2.0])
    np.testing.assert_array_equal(steady([5.0], 1, 1), [5.0])


def test_cli_parses_the_fedavg_workloads():
    p = build_parser()
    args = p.parse_args(["bench", "fedavg-mlp", "--rounds", "5", "--hosts", "1,2,3", "--vectorize", "on"])
    assert (args.bench, args.rounds, args.hosts, args.vectorize) == ("fedavg-mlp", 5, [1, 2, 3], ["on"])
    assert p.parse_args(["bench", "fedavg-linear"]).vectorize == ["on", "off"]
    assert p.parse_args(["bench", "fedavg-linear"]).preaggregate == ["off", "on"]
    assert p.parse_args(["bench", "fedprox-mlp"]).out == "bench/fedprox-mlp.json"
    assert p.parse_args(["bench", "fedavg-mlp", "--preaggregate", "on"]).preaggregate == ["on"]
    for bad in (["--hosts", "0"], ["--vectorize", "sometimes"], ["--preaggregate", "auto"]):
        with pytest.raises(SystemExit):
            p.parse_args(["bench", "fedavg-mlp", *bad])
    assert p.parse_args(["bench", "fedavg-mlp"]).device == "cpu"
    assert p.parse_args(["bench", "fedprox-mlp", "--device", "cuda"]).device == "cuda"
    with pytest.raises(SystemExit):
        p.parse_args(["bench", "fedavg-mlp", "--device", "tpu"])


def test_device_overrides_share_one_gpu():
    from rayfl.bench.fedavg import device_overrides

    assert device_overrides("cpu", 4) == []
    assert device_overrides("cuda", 4) == ["engine.device=cuda", "engine.num_gpus_per_host=0.25"]
    assert device_overrides("cuda", 8)[1] == "engine.num_gpus_per_host=0.125"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_cuda_bench_without_a_gpu_is_one_line_and_status_2(tmp_path, capsys):
    from rayfl.cli import main

    code = main(["bench", "fedavg-mlp", "--device", "cuda", "--rounds", "3", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--device" in err and "no GPU" in err
    assert not (tmp_path / "x.json").exists()


def test_paired_row_takes_the_median_of_back_to_back_ratios():
    from rayfl.bench.fedavg import paired_row

    def row(s: float, diff: float, same: bool = True) -> dict:
        return {"seconds_per_round": s, "mean_round_seconds": s, "client_updates_per_second": 100 / s,
                "peak_rss_mb": 10 * s, "max_abs_diff": diff, "same_clients": same, "run_dir": f"r{s}"}

    # the machine slowed during pair 2: its ratio, not its seconds, is what compares
    out = paired_row([(row(1.0, 1e-6), 1.0, 1.0), (row(2.2, 3e-6), 2.0, 2.0), (row(0.9, 2e-6), 1.0, 1.0)])
    assert out["ratios"] == [1.0, 1.1, 0.9]
    assert out["ratio_to_loop"] == 1.0
    assert out["seconds_per_round"] == 1.0 and out["loop_seconds_per_round"] == 1.0
    assert out["client_updates_per_second"] == 100.0
    assert out["peak_rss_mb"] == 22.0 and out["max_abs_diff"] == 3e-6 and out["same_clients"]
    assert not paired_row([(row(1.0, 0.0), 1.0, 1.0), (row(1.0, 0.0, same=False), 1.0, 1.0)])["same_clients"]
    # the ratio is of means over the same rounds, not of medians of different ones
    uneven = dict(row(1.0, 0.0), mean_round_seconds=3.0)
    assert paired_row([(uneven, 2.0, 4.0)])["ratio_to_loop"] == 0.75
    p = build_parser()
    assert p.parse_args(["bench", "fedavg-mlp", "--repeat", "3"]).repeat == 3


def test_bench_table_shows_speedups_and_their_range(tmp_path, capsys):
    import json

    from rayfl.cli import main

    summary = {"workload": "femnist-cnn", "repeat": 3, "timed_rounds": "1..6", "date": "2026-11-28",
               "loop": {"seconds_per_round": 6.0}, "loop_float32_rounding": 2.4e-5,
               "machine": {"processor": "AMD EPYC", "platform": "Linux", "cpus": 2, "torch": "2.13.0"},
               "runs": {"vectorize-auto-2h": {"ratios": [0.5, 0.4, 0.625], "ratio_to_loop": 0.5, "seconds_per_round": 3.0,
                                              "loop_seconds_per_round": 6.0, "max_abs_diff": 1.4e-5, "peak_rss_mb": 9000.0,
                                              "peak_process_mb": 7000.0}}}
    (tmp_path / "f.json").write_text(json.dumps(summary))
    assert main(["bench", "table", str(tmp_path / "f.json")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "vectorize-auto-2h" in line)
    assert "2.00x (1.60-2.50)" in row and "| 6.000 | 3.000 |" in row and "9000 / 7000" in row and "2.4e-05" in row
    assert "- `femnist-cnn`: 2026-11-28, AMD EPYC, 2 CPUs, torch 2.13.0, 3 repeat(s)" in out


def test_set_overrides_every_rayfl_run_and_a_bad_one_stops_before_timing(tmp_path, capsys, monkeypatch):
    """`--set KEY=VALUE` reaches every rayfl run (not the loop), is recorded, labels the table's
    rows, and a bad key or value is one line and status 2 before the loop is timed."""
    import json

    import rayfl.bench.fedavg as bench
    from rayfl.cli import main

    p = build_parser()
    args = p.parse_args(["bench", "cifar-resnet", "--set", "engine.channels_last=off", "--set", "engine.balance=off"])
    assert args.overrides == ["engine.channels_last=off", "engine.balance=off"]
    assert p.parse_args(["bench", "cifar-resnet"]).overrides == []
    timed = []
    monkeypatch.setattr(bench, "run_reference_loop", lambda *a, **k: timed.append(a))
    code = main(["bench", "fedavg-mlp", "--rounds", "3", "--set", "engine.channels_last=sometimes",
                 "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "engine.channels_last" in err
    assert not timed and not (tmp_path / "x.json").exists()
    summary = {"workload": "cifar-resnet", "repeat": 1, "timed_rounds": "1..6", "overrides": ["engine.channels_last=off"],
               "loop": {"seconds_per_round": 6.0}, "machine": {"platform": "Linux", "cpus": 2, "torch": "2.13.0"},
               "runs": {"vectorize-auto-preagg-2h": {"ratio_to_loop": 0.5, "seconds_per_round": 3.0, "max_abs_diff": 1e-5,
                                                     "peak_rss_mb": 9000.0}}}
    (tmp_path / "c.json").write_text(json.dumps(summary))
    assert main(["bench", "table", str(tmp_path / "c.json")]) == 0
    assert "| cifar-resnet | vectorize-auto-preagg-2h engine.channels_last=off | 6.000 | 3.000 | 2.00x |" \
        in capsys.readouterr().out


def test_set_reaches_every_rayfl_run_and_not_the_loop(tmp_path, monkeypatch):
    """The timing machinery stubbed out: each rayfl run's config carries the overrides, the
    loop's does not, and the summary records them."""
    import rayfl.bench.fedavg as bench
    import rayfl.runner

    loops, runs = [], []

    def fake_loop(cfg, *a, **k):
        loops.append(cfg)
        return SimpleNamespace(final=np.zeros(3), round_seconds=[1.0, 1.0, 1.0])

    def fake_row(name, cfg, dataset, loop, vec, pre, hosts, device, label=""):
        runs.append(cfg)
        return {"workload": name, "runner": "rayfl", "device": device, "vectorize": vec, "preaggregate": pre,
                "num_hosts": hosts, "seconds_per_round": 0.5, "mean_round_seconds": 0.5,
                "client_updates_per_second": 1.0, "peak_rss_mb": 1.0, "max_abs_diff": 0.0, "same_clients": True}

    monkeypatch.setattr(rayfl.runner, "build_dataset", lambda cfg: None)
    monkeypatch.setattr(bench, "_start_ray", lambda cfg: False)
    monkeypatch.setattr(bench, "run_reference_loop", fake_loop)
    monkeypatch.setattr(bench, "_rayfl_row", fake_row)
    summary = bench.run_fedavg_bench("fedavg-mlp", 3, tmp_path / "x.json", hosts=[1, 2], vectorize=["auto"],
                                     preaggregate=["on"], repeat=2, overrides=["engine.channels_last=off"])
    assert len(runs) == 4 and {cfg.engine.channels_last for cfg in runs} == {"off"}
    assert {cfg.engine.num_hosts for cfg in runs} == {1, 2}
    assert loops and {cfg.engine.channels_last for cfg in loops} == {"auto"}
    assert summary["overrides"] == ["engine.channels_last=off"]
