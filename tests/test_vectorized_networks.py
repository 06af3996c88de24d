"""The generic batched client step (rayfl.algorithms.vmapped: torch.func.vmap over
`functional_call`, BatchNorm as MaskedBatchNorm) on tiny versions of the literature's
networks: Conv-4 (BatchNorm), LEAF's FEMNIST CNN, ResNet-18 (GroupNorm) and LEAF's
character LSTM (token inputs), for clients of unequal sizes with short last batches and an
empty client.

Host level (float32, on the CPU): `vectorize: on` gives the loop's records for FedAvg, FedProx
and two rounds of SCAFFOLD; `auto` declines these networks on a CPU and loops; one host and
hosts running subsets of the clients agree. Kernel level (float64): the loop (`local_sgd`)
and the batched step (`local_sgd_batched`) against a hand-written torch.optim.SGD reference
on the client's own minibatches, to 1e-10."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from host_fixtures import assert_records_match, sized_host

from rayfl.algorithms.fedavg import fedavg_client, fedavg_clients, scaffold_client, scaffold_clients
from rayfl.algorithms.local import LocalSchedule, local_sgd, local_sgd_batched
from rayfl.config import ModelConfig, section_config
from rayfl.engine.context import ClientContext, WorkMeter
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.vectorized import batched_version, vectorize_mode
from rayfl.models import build_model
from rayfl.models.params import get_flat, set_flat
from rayfl.zo.lower_level import epoch_indices, minibatch_indices
from rayfl.zo.schedules import step_size

# vmap has no batching rule for the LSTM and runs it client by client (and says so)
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


@dataclass(frozen=True)
class Net:
    keys: dict[str, Any]
    shape: tuple[int, ...]
    classes: int
    tokens: bool = False  # int64 token sequences over a vocabulary of `classes`

    def config(self, name: str) -> ModelConfig:
        return section_config("model", name=name, **self.keys)


NETS = {
    "conv4": Net({"conv_channels": 2}, (1, 8, 8), 3),
    "femnist_cnn": Net({"channels": [2, 3], "dense": 8}, (1, 8, 8), 3),
    "resnet18": Net({"width": 4, "norm_groups": 2}, (3, 8, 8), 3),
    "char_lstm": Net({"embedding": 3, "hidden": 4, "layers": 2}, (6,), 5, tokens=True),
}
SIZES = {0: 7, 1: 12, 2: 3, 3: 10, 4: 0}  # unequal, short last batches, one empty client
BATCH, EPOCHS, LR = 4, 2, 0.1
STEPS = [2 * -(-n // BATCH) for n in SIZES.values()]  # ceil(n / 4) a pass, two passes: 4, 6, 2, 6, 0
# float32, loop against batched: same arithmetic, other summation orders (grouped against
# plain convolutions, vmap's batched matmuls). Largest seen (2-core AMD EPYC, torch 2.13):
# 7.2e-7 in a delta (ResNet-18, SCAFFOLD's second round), deltas up to 1.
TOL = dict(rtol=1e-5, atol=2e-6)
# SCAFFOLD's c_i = c_i - c + (x - y) / (K lr) scales the update's error by 1 / (K lr): up to 5
# here (client 2 takes two steps of 0.1), so its control variates get TOL's atol times 5.
# Largest seen: 4.3e-6 (ResNet-18's c_i after two rounds, values up to 1.3).
CONTROL_TOL = dict(rtol=1e-5, atol=1e-5)
MU, DECAY = 0.5, 0.01


def make_host(net: str, vectorize: str) -> ClientHostImpl:
    spec = NETS[net]
    return sized_host(SIZES, spec.shape, spec.classes, spec.config(net), 3, 10.0, vectorize, "cpu", tokens=spec.tokens)


def initial(net: str) -> np.ndarray:
    spec = NETS[net]
    torch.manual_seed(0)
    return get_flat(build_model(spec.config(net), spec.shape, spec.classes)).numpy()


def broadcast_for(net: str, objective: str) -> dict[str, Any]:
    x0 = initial(net)
    out: dict[str, Any] = {"params": x0, "lr": LR, "schedule": LocalSchedule(BATCH, EPOCHS, None)}
    if objective == "prox":
        out.update(prox_mu=MU, weight_decay=DECAY)
    if objective == "scaffold":
        out["control"] = (0.05 * np.random.default_rng(1).normal(size=x0.shape)).astype(np.float32)
    return out


@pytest.fixture
def twin_outputs(monkeypatch) -> list[int | None]:
    """What FedAvg's and SCAFFOLD's batched twins returned, call by call: the number of
    records, or None where the twin declined (and the host looped)."""
    seen: list[int | None] = []
    for fn in (fedavg_client, scaffold_client):
        twin = batched_version(fn)

        def spy(ctxs, kwargs, twin=twin):
            out = twin(ctxs, kwargs)
            seen.append(None if out is None else len(out))
            return out

        monkeypatch.setattr(fn, "__rayfl_batched__", spy)
    return seen


def assert_trained(records: list[dict]) -> None:
    """Two passes of batch 4: ceil(n / 4) * 2 steps each; the empty client has no loss and no
    update, the others really moved."""
    assert [r["local_steps"] for r in records] == STEPS
    assert [r["backward_samples"] for r in records] == [2 * n for n in SIZES.values()]
    assert np.isnan(records[-1]["values"]["loss"]) and not np.any(records[-1]["values"]["delta"])
    assert all(np.abs(r["values"]["delta"]).max() > 1e-3 for r in records[:-1])


# ---------------------------------------------------------------- host level, float32


@pytest.mark.parametrize("objective", ["sgd", "prox"])
@pytest.mark.parametrize("net", NETS)
def test_batched_fedavg_and_fedprox_equal_the_loop(net, objective, twin_outputs):
    """FedAvg, and FedProx with weight decay, batched (`vectorize: on`) against the loop."""
    broadcast = broadcast_for(net, objective)
    loop = make_host(net, "off").run(fedavg_client, list(SIZES), 0, broadcast)
    assert twin_outputs == []  # off: the twin is never asked
    vec = make_host(net, "on").run(fedavg_client, list(SIZES), 0, broadcast)
    assert twin_outputs == [len(SIZES)]  # on: one batch of all the clients, not the loop
    assert_records_match(loop, vec, **TOL)
    assert_trained(vec)


@pytest.mark.parametrize("net", NETS)
def test_batched_scaffold_keeps_control_variates_like_the_loop(net, twin_outputs):
    """Two rounds: the second reads each client's control variate from the first."""
    broadcast = broadcast_for(net, "scaffold")
    hosts = {mode: make_host(net, mode) for mode in ("off", "on")}
    records = {mode: [host.run(scaffold_client, list(SIZES), r, broadcast) for r in range(2)]
               for mode, host in hosts.items()}
    assert twin_outputs == [len(SIZES)] * 2
    for loop, vec in zip(records["off"], records["on"], strict=True):
        assert_records_match(loop, vec, {"delta_control": CONTROL_TOL}, **TOL)
        assert_trained(vec)
    for c in SIZES:
        a, b = (hosts[mode].states[c].get("control") for mode in ("off", "on"))
        assert (a is None) == (b is None) == (SIZES[c] == 0)  # an empty client never took a step
        if a is not None:
            np.testing.assert_allclose(b.numpy(), a.numpy(), **CONTROL_TOL)
    # round 2 started from round 1's c_i: its correction c - c_i differs from round 1's
    assert not np.array_equal(records["on"][0][1]["values"]["delta"], records["on"][1][1]["values"]["delta"])


# ---------------------------------------------------------------- `auto` on a CPU


def contexts(net: str, model: torch.nn.Module, sizes: dict[int, int], dtype: torch.dtype,
             channels_last: bool = False) -> list[ClientContext]:
    """One context per client over data of `dtype` (tokens stay int64), each with its own fresh
    work meter, all sharing `model` (what the batched step requires); `channels_last` as a host
    under `engine.channels_last` sets it."""
    spec = NETS[net]
    g = torch.Generator().manual_seed(7)
    out = []
    for c, n in sizes.items():
        if spec.tokens:
            x = torch.randint(0, spec.classes, (n, *spec.shape), generator=g)
        else:
            x = torch.randn((n, *spec.shape), generator=g, dtype=torch.float64).to(dtype)
        y = torch.randint(0, spec.classes, (n,), generator=g)
        out.append(ClientContext(id=c, round=1, seed=11, model=model, device=torch.device("cpu"), x=x, y=y,
                                 test_x=None, test_y=None, state={}, work=WorkMeter(), channels_last=channels_last))
    return out


@pytest.mark.parametrize("net", NETS)
def test_auto_loops_these_networks_on_the_cpu(net, twin_outputs):
    """Under `auto` on a CPU the generic vmap step does not pay: the twins decline, before
    charging any work, and a host's records are the loop's, bit for bit."""
    spec = NETS[net]
    model = build_model(spec.config(net), spec.shape, spec.classes)
    x0 = get_flat(model).numpy()
    kw = {"params": x0, "lr": LR, "schedule": LocalSchedule(BATCH, EPOCHS, None)}
    for twin, extra in ((fedavg_clients, {}), (scaffold_clients, {"control": np.zeros_like(x0)})):
        ctxs = contexts(net, model, SIZES, torch.float32)
        with vectorize_mode("auto"):
            assert twin(ctxs, [{**kw, **extra}] * len(ctxs)) is None
        assert all(ctx.work.steps == 0 and ctx.work.backward_samples == 0 for ctx in ctxs)
    broadcast = broadcast_for(net, "prox")
    auto = make_host(net, "auto").run(fedavg_client, list(SIZES), 0, broadcast)
    assert twin_outputs == [None]  # asked (5 clients), declined: the host looped
    assert_records_match(make_host(net, "off").run(fedavg_client, list(SIZES), 0, broadcast), auto)


def test_auto_batches_the_mlp_on_the_cpu(twin_outputs):
    """The fused MLP kernel pays on a CPU: `auto` batches it."""
    model = build_model(section_config("model", name="mlp", hidden=[5]), (6,), 3)
    x0 = get_flat(model).numpy()
    g = torch.Generator().manual_seed(0)
    ctxs = [ClientContext(id=c, round=0, seed=1, model=model, device=torch.device("cpu"), x=torch.randn(n, 6, generator=g),
                          y=torch.randint(0, 3, (n,), generator=g), test_x=None, test_y=None, state={}, work=WorkMeter())
            for c, n in SIZES.items()]
    with vectorize_mode("auto"):
        out = fedavg_clients(ctxs, [{"params": x0, "lr": LR, "schedule": LocalSchedule(BATCH, EPOCHS, None)}] * len(ctxs))
    assert isinstance(out, list) and len(out) == len(SIZES)
    assert [ctx.work.steps for ctx in ctxs] == STEPS
    host = sized_host(SIZES, 6, 3, section_config("model", name="mlp", hidden=[5]), 3, 10.0, "auto", "cpu")
    recs = host.run(fedavg_client, list(SIZES), 0, {"params": x0, "lr": LR, "schedule": LocalSchedule(BATCH, EPOCHS, None)})
    assert twin_outputs == [len(SIZES)] and [r["local_steps"] for r in recs] == STEPS


# ---------------------------------------------------------------- batch composition


# vmap makes K clients' convolutions one grouped convolution, whose per-group result does not
# depend on the group count; over one client it runs a plain convolution with other bits (up
# to 4.8e-7 in a delta, measured on a 2-core AMD EPYC, torch 2.13). So the generic step never
# runs a client alone: an idle client keeps it company (`local_sgd_batched`, `chunk_slices`'
# `least`), and every layout gives every client the same bits.


@pytest.mark.parametrize("objective", ["sgd", "prox"])
@pytest.mark.parametrize("net", NETS)
def test_one_host_and_hosts_running_subsets_agree_bitwise(net, objective):
    """One host running every client and hosts running subsets of them (one alone among
    them), `vectorize: on`: the same bits, and the loop's values to TOL."""
    broadcast = broadcast_for(net, objective)
    whole = make_host(net, "on").run(fedavg_client, list(SIZES), 0, broadcast)
    loop = make_host(net, "off").run(fedavg_client, list(SIZES), 0, broadcast)
    for layout in (([0, 2], [1, 3, 4]), ([3, 4], [2, 1, 0]), ([0, 2], [1], [3, 4]), ([0], [1], [2], [3], [4])):
        split = sorted(sum((make_host(net, "on").run(fedavg_client, ids, 0, broadcast) for ids in layout), []),
                       key=lambda r: r["client"])
        for a, b, c in zip(whole, split, loop, strict=True):
            assert_records_match([a], [b])
            assert_records_match([c], [b], **TOL)
    np.testing.assert_array_equal(broadcast["params"], initial(net))  # the shared broadcast is never written


def test_generic_chunks_never_hold_a_client_alone():
    from rayfl.algorithms.local import chunk_slices

    big = 64 << 20  # a client's parameters larger than a chunk's byte budget
    for k in range(2, 12):
        parts = chunk_slices(k, big, least=2)
        assert sum(p.stop - p.start for p in parts) == k and min(p.stop - p.start for p in parts) >= 2
    assert [p.stop - p.start for p in chunk_slices(3, big, least=1)] == [1, 1, 1]  # the fused kernel's chunks


# ---------------------------------------------------------------- kernel level, float64


KERNEL_SIZES = {0: 7, 1: 12, 2: 3, 3: 10, 4: 0, 5: 5}  # client 5: a last minibatch of one row


def schedules_for(kind: str) -> list[LocalSchedule]:
    """Two passes of batch 4 (steps 4, 6, 2, 6, 0, 4), or per-client step counts (passes
    reshuffled, the last short of a pass dropped) with the decaying step lr / (t + 2)."""
    if kind == "epochs":
        return [LocalSchedule(BATCH, EPOCHS, None)] * len(KERNEL_SIZES)
    return [LocalSchedule(BATCH, None, 1 + 2 * c, lr_offset=2.0) for c in KERNEL_SIZES]


def reference_sgd(net: str, ctx: ClientContext, start: torch.Tensor, lr: float, schedule: LocalSchedule,
                  decay: float, mu: float, correction: torch.Tensor | None) -> tuple[torch.Tensor, float, int]:
    """The client's local SGD by hand in float64: a fresh module, torch.optim.SGD, plain
    F.cross_entropy on each minibatch's rows alone, FedProx's mu (w - w0) and SCAFFOLD's
    correction added to the gradient, on the minibatches the client draws (its "batches"
    stream: `ClientContext.batches`' order). Returns (final vector, mean loss, steps)."""
    spec = NETS[net]
    model = build_model(spec.config(net), spec.shape, spec.classes).double()
    set_flat(model, start)
    params = list(model.parameters())
    anchors = [p.detach().clone() for p in params]
    corrections = [None] * len(params)
    if correction is not None:
        sizes = [p.numel() for p in params]
        corrections = [part.view(p.shape) for part, p in zip(correction.split(sizes), params, strict=True)]
    opt = torch.optim.SGD(params, lr=lr, weight_decay=decay)
    n, rng = ctx.num_samples, ctx.rng("batches")
    if schedule.epochs is not None:
        batches = epoch_indices(rng, n, schedule.batch_size, schedule.epochs)
    else:
        batches = list(minibatch_indices(rng, n, schedule.batch_size, schedule.steps or 0)) if n else []
    losses = []
    for t, idx in enumerate(batches):
        opt.param_groups[0]["lr"] = step_size(lr, t, schedule.lr_offset)
        opt.zero_grad()
        loss = F.cross_entropy(model(ctx.x[idx]), ctx.y[idx])
        loss.backward()
        with torch.no_grad():
            for p, anchor, corr in zip(params, anchors, corrections, strict=True):
                if mu:
                    p.grad.add_(p - anchor, alpha=mu)
                if corr is not None:
                    p.grad.add_(corr)
        opt.step()
        losses.append(loss.item())
    final = torch.cat([p.detach().reshape(-1) for p in params])
    return final, float(np.mean(losses)) if losses else float("nan"), len(batches)


@pytest.mark.parametrize("kind", ["epochs", "steps"])
@pytest.mark.parametrize("objective", ["sgd", "prox", "scaffold"])
@pytest.mark.parametrize("net", NETS)
def test_loop_and_batched_steps_equal_hand_written_sgd_in_float64(net, objective, kind):
    """`local_sgd` (the loop, with NCHW and with channels-last convolution weights) and
    `local_sgd_batched` (`vectorize: on`) on a float64 model and
    float64 data against `reference_sgd`, each client from its own start, with its own decay,
    proximal mu and correction: the same final parameters to 1e-10, the same mean loss and
    steps. Padded rows (short last batches, a one-row batch, an empty client, steps past a
    client's own count) change nothing: BatchNorm's statistics and the loss are the client's
    own minibatch's."""
    spec = NETS[net]
    model = build_model(spec.config(net), spec.shape, spec.classes).double()
    k, d = len(KERNEL_SIZES), get_flat(model).numel()
    g = torch.Generator().manual_seed(3)
    starts = get_flat(model).double()[None] + 0.05 * torch.randn(k, d, generator=g, dtype=torch.float64)
    schedules = schedules_for(kind)
    lrs = [LR + 0.02 * j for j in range(k)]
    decay = [DECAY * (j % 3) for j in range(k)] if objective == "prox" else [0.0] * k
    mu = [MU / (1 + j) for j in range(k)] if objective == "prox" else [0.0] * k
    corrections = 0.05 * torch.randn(k, d, generator=g, dtype=torch.float64) if objective == "scaffold" else None

    refs = [reference_sgd(net, ctx, starts[j], lrs[j], schedules[j], decay[j], mu[j],
                          None if corrections is None else corrections[j])
            for j, ctx in enumerate(contexts(net, model, KERNEL_SIZES, torch.float64))]
    ref_steps = [r[2] for r in refs]
    assert ref_steps == ([4, 6, 2, 6, 0, 4] if kind == "epochs" else [1, 3, 5, 7, 0, 11])

    def looped(ctxs: list[ClientContext]) -> list[tuple[torch.Tensor, float]]:
        return [local_sgd(ctx, starts[j], lrs[j], schedules[j], weight_decay=decay[j], prox_mu=mu[j], prox_center=starts[j],
                          correction=None if corrections is None else corrections[j]) for j, ctx in enumerate(ctxs)]

    loop_ctxs = contexts(net, model, KERNEL_SIZES, torch.float64)
    loop = looped(loop_ctxs)
    # the loop with channels-last convolution weights (engine.channels_last on a CPU)
    last_ctxs = contexts(net, model, KERNEL_SIZES, torch.float64, channels_last=True)
    last = looped(last_ctxs)
    vec_ctxs = contexts(net, model, KERNEL_SIZES, torch.float64)
    with vectorize_mode("on"):
        out = local_sgd_batched(vec_ctxs, starts, lrs, schedules, weight_decay=decay, prox_mu=mu, prox_centers=starts,
                                corrections=corrections)
    assert out is not None
    vec = list(zip(*out, strict=True))
    for name, results, ctxs in (("loop", loop, loop_ctxs), ("channels-last loop", last, last_ctxs),
                                ("batched", vec, vec_ctxs)):
        assert [ctx.work.steps for ctx in ctxs] == ref_steps, name
        for j, ((w, loss), (w_ref, loss_ref, _)) in enumerate(zip(results, refs, strict=True)):
            assert w.dtype == torch.float64
            err = (w - w_ref).abs().max().item()
            assert err <= 1e-10, f"{name}, client {j}: parameters {err:.3g} off"
            assert (np.isnan(loss) and np.isnan(loss_ref)) or abs(loss - loss_ref) <= 1e-10, (name, j, loss, loss_ref)
    assert all((r[0] - starts[j]).abs().max() > 1e-3 for j, r in enumerate(refs) if ref_steps[j])
