"""Hosts on a real GPU: fractional `engine.num_gpus_per_host` shares one card, the CUDA paths
(vectorised kernel, client loop, host pre-aggregation, the reference loop) reach the CPU's model,
and the host count still changes no bit. Skipped where torch sees no GPU, so CI (2 CPUs, no GPU)
never depends on one; run it on a GPU machine with `python -m pytest tests/test_gpu.py`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.bench.fedavg import TOLERANCE, _rayfl_row, device_overrides, workload_config
from rayfl.bench.reference import run_reference_loop
from rayfl.data import build_federated_dataset
from rayfl.results import load
from rayfl.results.load import read_manifest
from rayfl.runner import run_experiment

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ROUNDS = 3
SMALL = ["partition.num_clients=60", "algorithm.clients_per_round=16", "engine.num_cpus_per_host=0.1"]


@pytest.fixture(scope="module")
def small():
    cfg = workload_config("fedavg-mlp", ROUNDS, *SMALL)
    ds = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    return cfg, ds, run_reference_loop(cfg, ds, ROUNDS)


def test_reference_loop_on_the_gpu_reaches_the_cpu_model(small):
    cfg, ds, cpu = small
    gpu = run_reference_loop(cfg, ds, ROUNDS, device="cuda")
    assert gpu.sampled == cpu.sampled
    assert np.abs(gpu.final - cpu.final).max() <= TOLERANCE


@pytest.mark.parametrize(("vectorize", "hosts"), [("on", 1), ("on", 4), ("on", 8), ("off", 4)])
def test_hosts_sharing_one_gpu_reach_the_cpu_loops_model(ray_local, small, tmp_path, vectorize, hosts):
    cfg, ds, cpu = small
    run_cfg = workload_config("fedavg-mlp", ROUNDS, *SMALL, f"engine.vectorize={vectorize}", f"engine.num_hosts={hosts}",
                              f"output.dir={tmp_path}", *device_overrides("cuda", hosts))
    row = _rayfl_row("fedavg-mlp", run_cfg, ds, cpu, vectorize, "off", hosts, "cuda")
    assert row["same_clients"]
    assert row["max_abs_diff"] <= TOLERANCE
    devices = row["host_devices"]
    assert len(devices) == hosts
    assert all(d.startswith("cuda") for d in devices), devices
    assert len(set(devices)) == 1, f"the hosts should share one GPU: {devices}"
    assert "CUDA_VISIBLE_DEVICES=None" not in devices[0]


UNEQUAL_FEDPROX = ["data.size_sigma=0.8", "data.size_mu=3.5", "data.min_client_samples=8",
                   "data.max_client_samples=150", "algorithm.name=fedprox", "algorithm.mu=0.01"]


def run_on_gpu(tmp, hosts: int, extra: list[str]):
    cfg = workload_config("fedavg-mlp", ROUNDS, *SMALL, *extra, f"engine.num_hosts={hosts}", "engine.vectorize=on",
                          "engine.preaggregate=on", f"output.dir={tmp}", f"run.run_id=gpu{hosts}",
                          *device_overrides("cuda", hosts))
    feds = []
    out = run_experiment(cfg, on_start=lambda _dir, fed: feds.append(fed))
    return load(out.run_dir), np.asarray(feds[0].server_state.x)


@pytest.mark.parametrize("extra", [[], UNEQUAL_FEDPROX], ids=["equal-fedavg", "unequal-fedprox"])
def test_one_two_four_hosts_on_a_gpu_give_the_same_bits(ray_local, tmp_path, extra):
    """cuBLAS picks its kernels by the batch count, so this holds only because every chunk on a
    GPU has the same client count and whole windows (rayfl.algorithms.local.fixed_chunk);
    unequal clients take different step counts, so the windows' padding matters too."""
    runs = {h: run_on_gpu(tmp_path, h, extra) for h in (1, 2, 4)}
    base_tables, base_model = runs[1]
    for h in (2, 4):
        tables, model = runs[h]
        np.testing.assert_array_equal(model, base_model)
        for name in ("rounds", "clients"):
            a, b = getattr(tables, name), getattr(base_tables, name)
            keys = [c for c in ("round", "client") if c in a.columns]
            cols = [c for c in a.columns if "loss" in c or "accuracy" in c or c in ("num_samples", "sim_time")]
            assert cols, a.columns
            pd.testing.assert_frame_equal(a.sort_values(keys)[keys + cols].reset_index(drop=True),
                                          b.sort_values(keys)[keys + cols].reset_index(drop=True))


def test_auto_hosts_use_the_gpu_only_with_a_share(ray_local, tmp_path):
    devices = {}
    for share in (0.0, 0.5):
        cfg = workload_config("fedavg-mlp", 1, *SMALL, "engine.num_hosts=2", f"engine.num_gpus_per_host={share}",
                              "engine.device=auto", "engine.pool=off", f"output.dir={tmp_path}", f"run.run_id=auto{share}")
        out = run_experiment(cfg)
        devices[share] = {h["device"] for h in read_manifest(out.run_dir)["placement"]["hosts"]}
    assert devices == {0.0: {"cpu"}, 0.5: {"cuda"}}
