"""Engine pieces: placement, byte accounting, client batches, the system model, the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.config import (
    Distribution,
    EngineConfig,
    ModelConfig,
    SystemConfig,
    constant,
    section_config,
)
from rayfl.engine.context import ClientContext
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.payload import payload_nbytes
from rayfl.engine.placement import plan_placement
from rayfl.engine.resources import (
    Capacity,
    HostRequest,
    NodeGroup,
    ResourceError,
    autoscaler_may_add_nodes,
    check_request,
    host_request,
    hosts_that_fit,
)
from rayfl.engine.system import SystemModel, forward_flops_per_sample
from rayfl.models import build_model


def test_placement_auto_packs_one_host_per_cpu():
    p = plan_placement(EngineConfig(), 10_000, {"CPU": 2.0})
    assert p.num_hosts == 2
    assert p.assignment == [range(0, 5_000), range(5_000, 10_000)]  # contiguous blocks, no id arrays
    assert p.host_of(9_999) == 1 and p.host_of(4_999) == 0 and p.host_of(5_000) == 1
    uneven = plan_placement(EngineConfig(num_hosts=3), 10, {"CPU": 2.0})
    assert [list(r) for r in uneven.assignment] == [a.tolist() for a in np.array_split(np.arange(10), 3)]
    assert [uneven.host_of(c) for c in range(10)] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(IndexError):
        uneven.host_of(10)
    billion = plan_placement(EngineConfig(num_hosts=32), 10**9, {"CPU": 2.0})
    assert billion.num_clients == 10**9 and billion.host_of(10**9 - 1) == 31


def test_placement_one_actor_per_client_and_gpu_shares():
    assert plan_placement(EngineConfig(clients_per_host=1), 7, {"CPU": 2.0}).num_hosts == 7
    assert plan_placement(EngineConfig(clients_per_host=3), 7, {"CPU": 2.0}).num_hosts == 3
    gpu = plan_placement(EngineConfig(num_gpus_per_host=0.25), 100, {"CPU": 8.0, "GPU": 2.0})
    assert gpu.num_hosts == 8 and gpu.num_gpus == 0.25
    with pytest.raises(ResourceError, match="no GPU") as e:
        plan_placement(EngineConfig(num_gpus_per_host=0.5), 10, {"CPU": 2.0})
    assert e.value.key == "engine.num_gpus_per_host"
    assert plan_placement(EngineConfig(num_hosts=50), 10, {"CPU": 2.0}).num_hosts == 10


LAPTOP = Capacity((NodeGroup({"CPU": 2.0}),))  # this machine: one node, 2 CPUs, no GPU
GPU_NODES = Capacity((NodeGroup({"CPU": 8.0, "GPU": 1.0}), NodeGroup({"CPU": 8.0, "GPU": 1.0})))


def request(cfg: EngineConfig, num_clients: int = 100, cluster: dict | None = None) -> HostRequest:
    placement = plan_placement(cfg, num_clients, cluster or {"CPU": 2.0})
    return host_request(cfg, placement, num_clients)


def test_resource_check_accepts_what_fits():
    check_request(request(EngineConfig()), LAPTOP)  # auto: one host per CPU
    check_request(request(EngineConfig(num_hosts=4, num_cpus_per_host=0.5)), LAPTOP)
    check_request(request(EngineConfig(num_hosts=64, num_cpus_per_host=0)), LAPTOP)  # no reserve
    check_request(request(EngineConfig(clients_per_host=50)), LAPTOP)
    check_request(request(EngineConfig(num_hosts=4, num_gpus_per_host=0.5)), GPU_NODES)
    check_request(request(EngineConfig(num_hosts=2, device="cuda", num_gpus_per_host=1)), GPU_NODES)


CPU, GPU, HOSTS = "engine.num_cpus_per_host", "engine.num_gpus_per_host", "engine.num_hosts"


@pytest.mark.parametrize(
    ("cfg", "capacity", "key", "fix"),
    [
        (EngineConfig(num_hosts=64), LAPTOP, HOSTS, "at most 2"),
        (EngineConfig(num_hosts=64), LAPTOP, HOSTS, "num_cpus_per_host to 0.02"),
        (EngineConfig(clients_per_host=1), LAPTOP, "engine.clients_per_host", "at least 50"),
        (EngineConfig(num_hosts=1, num_cpus_per_host=4), LAPTOP, CPU, "to 2"),
        (EngineConfig(num_cpus_per_host=3), LAPTOP, CPU, "single node"),
        (EngineConfig(num_hosts=2, num_gpus_per_host=0.5), LAPTOP, GPU, "no GPU"),
        (EngineConfig(device="cuda"), LAPTOP, "engine.device", "engine.device=auto or cpu"),
        (EngineConfig(device="cuda"), GPU_NODES, GPU, "GPU share per host"),
        (EngineConfig(num_hosts=6, num_gpus_per_host=0.5), GPU_NODES, HOSTS, f"{GPU} to 0.25"),
        (EngineConfig(num_hosts=1, num_gpus_per_host=2), GPU_NODES, GPU, "single node"),
    ],
)
def test_resource_check_refuses_what_never_fits(cfg, capacity, key, fix):
    with pytest.raises(ResourceError) as e:
        check_request(request(cfg, cluster={"CPU": 2.0, "GPU": capacity.total("GPU")}), capacity)
    assert e.value.key == key and fix in str(e.value)
    assert "\n" not in str(e.value)


def test_resource_check_counts_per_node_not_just_totals():
    # 3 CPUs in all, but 1.5 per node: two one-CPU hosts fit, not three
    halves = Capacity((NodeGroup({"CPU": 1.5}), NodeGroup({"CPU": 1.5})))
    assert hosts_that_fit(halves, 1.0, 0.0) == 2
    with pytest.raises(ResourceError, match="only 2 fit"):
        check_request(request(EngineConfig(num_hosts=3)), halves)


def test_resource_check_allows_for_an_autoscaler():
    # node types an autoscaler may launch: up to 10 workers of 4 CPUs, none running yet
    groups = (NodeGroup({"CPU": 2.0}), NodeGroup({"CPU": 4.0}, 10))
    bounded = Capacity(groups, source="autoscaler node types")
    check_request(request(EngineConfig(num_hosts=42)), bounded)
    with pytest.raises(ResourceError, match="at most 42"):
        check_request(request(EngineConfig(num_hosts=43)), bounded)
    unbounded = Capacity((NodeGroup({"CPU": 2.0}), NodeGroup({"CPU": 4.0, "GPU": 1.0}, None)))
    check_request(request(EngineConfig(num_hosts=1000, num_gpus_per_host=1)), unbounded)
    scaling = Capacity((NodeGroup({"CPU": 2.0}),), scales=True)  # limits unknown: never refuse
    check_request(request(EngineConfig(num_hosts=1000, device="cuda", num_gpus_per_host=0.5)), scaling)


def test_a_plain_head_is_not_an_autoscaler():
    # ray.init / `ray start` run the autoscaler read-only, naming each node's type after the node
    assert not autoscaler_may_add_nodes({"node_" + "ab12" * 14})
    assert not autoscaler_may_add_nodes(set())
    assert autoscaler_may_add_nodes({"node_" + "ab12" * 14, "ray.worker.gpu"})  # `ray up`, KubeRay


def test_payload_bytes_are_measured_not_assumed():
    model = np.zeros(1000, dtype=np.float32)
    assert payload_nbytes({"delta": model, "loss": 0.5}) == 4008
    assert payload_nbytes({"seed": 7, "f_plus": 1.0, "f_minus": 2.0}) == 24
    assert payload_nbytes(torch.zeros(10, dtype=torch.float64)) == 80
    with pytest.raises(TypeError):
        payload_nbytes(object())


def _ctx(n: int = 10, round: int = 0, cid: int = 3) -> ClientContext:
    model = torch.nn.Linear(2, 2)
    return ClientContext(
        id=cid, round=round, seed=42, model=model, device=torch.device("cpu"),
        x=torch.arange(n, dtype=torch.float32).reshape(n, 1).repeat(1, 2), y=torch.arange(n) % 2,
        test_x=None, test_y=None, state={},
    )


def test_batches_cover_each_epoch_once_and_are_seeded():
    seen = [int(xb[i, 0]) for xb, _ in _ctx().batches(4, epochs=2) for i in range(len(xb))]
    assert len(seen) == 20 and sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    again = [int(xb[i, 0]) for xb, _ in _ctx().batches(4, epochs=2) for i in range(len(xb))]
    other_round = [int(xb[i, 0]) for xb, _ in _ctx(round=1).batches(4, epochs=2) for i in range(len(xb))]
    assert seen == again and seen != other_round


def test_batches_by_steps_clip_batch_to_client_size():
    batches = list(_ctx(n=5).batches(32, steps=3))
    assert len(batches) == 3 and all(len(b[1]) == 5 for b in batches)
    assert list(_ctx(n=0).batches(4, steps=3)) == []


def test_system_model_charges_work_bytes_and_latency():
    cfg = SystemConfig(speed=constant(1e6), backward_cost=3.0, up_bandwidth=constant(100.0),
                       down_bandwidth=constant(200.0), latency=constant(0.5))
    sm = SystemModel(cfg, num_clients=4, forward_flops=1000.0, seed=0)
    t = sm.timing(client=2, forward_samples=10, backward_samples=100, bytes_down=400, bytes_up=100)
    assert t.compute == pytest.approx(1000.0 * (10 + 300) / 1e6)
    assert t.download == pytest.approx(2.0) and t.upload == pytest.approx(1.0)
    assert t.total == pytest.approx(t.compute + 3.5)
    lognormal = SystemConfig(speed=Distribution("lognormal", 1e9, sigma=1.0))
    slow = SystemModel(lognormal, 1000, 1.0, seed=5)
    every = range(1000)
    assert np.median(slow.speed.of(every)) == pytest.approx(1e9, rel=0.15)
    assert np.array_equal(slow.speed.of(every), SystemModel(lognormal, 1000, 1.0, seed=5).speed.of(every))
    assert not np.array_equal(slow.speed.of(every), SystemModel(lognormal, 1000, 1.0, seed=6).speed.of(every))


def test_forward_flops_counts_linear_layers():
    model = build_model(section_config("model", name="mlp", hidden=[20]), (1, 8, 8), 10)
    assert forward_flops_per_sample(model, (1, 8, 8)) == pytest.approx(2 * (64 * 20 + 20 * 10))


def count_and_remember(ctx: ClientContext, scale: float) -> dict:
    ctx.work.forward(ctx.num_samples)
    calls = ctx.state.get("calls", 0) + 1
    ctx.state["calls"] = calls
    return {"mean_x": ctx.x.mean() * scale, "calls": calls, "noise": ctx.rng("noise").normal()}


def test_host_runs_clients_in_id_order_and_keeps_state():
    x = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    arrays = {"train_x": x, "train_y": np.zeros(30, dtype=np.int64), "test_x": x[:2], "test_y": np.zeros(2, dtype=np.int64)}
    train = {0: np.arange(0, 10), 5: np.arange(10, 30)}
    host = ClientHostImpl(0, arrays, train, None, ModelConfig(), (4,), 2, seed=1)
    recs = host.run(count_and_remember, [5, 0], 0, {"scale": 2.0})
    assert [r["client"] for r in recs] == [0, 5]
    assert recs[1]["num_samples"] == 20 and recs[1]["forward_samples"] == 20
    assert np.isclose(recs[0]["values"]["mean_x"], 2.0 * x[:10].mean())
    assert recs[0]["bytes_down"] == 8 and recs[0]["bytes_up"] == 4 + 8 + 8
    again = host.run(count_and_remember, [0], 0, {"scale": 2.0})
    assert again[0]["values"]["calls"] == 2
    assert again[0]["values"]["noise"] == recs[0]["values"]["noise"]  # same (seed, purpose, round, client)
    with pytest.raises(KeyError):
        host.run(count_and_remember, [1], 0, {"scale": 1.0})


def test_auto_device_takes_the_gpu_only_with_a_ray_gpu_share(ray_local, monkeypatch):
    """On a GPU node Ray leaves CUDA visible to actors that reserved no GPU; an "auto" host
    there must stay on the CPU (tests/test_gpu.py checks the GPU side on a real card)."""
    from rayfl.engine import host

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert host._ray_gpu_share() is None  # the driver is no Ray worker
    assert host.resolve_device("auto").type == "cuda"  # an in-process host uses what torch sees

    @ray_local.remote(num_cpus=0)
    def in_a_worker():
        from rayfl.engine import host

        torch.cuda.is_available = lambda: True  # a GPU node, as the worker's torch would see it
        return host._ray_gpu_share(), str(host.resolve_device("auto"))

    assert ray_local.get(in_a_worker.remote()) == (False, "cpu")
