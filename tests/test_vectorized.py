"""Vectorised client execution (rayfl.engine.vectorized) against the plain loop.

Unit level, without Ray: one ClientHostImpl runs the same clients with `vectorize: off` and
`vectorize: on`; every record (work meter, bytes, state) must be identical and the model
results equal to float32 tolerance, with unequal client sizes, short last batches, per-client
step counts and a deadline's work budget. End to end, a module-scoped set of Ray runs checks
the `clients` Parquet on and off, and 1 vs 2 hosts with vectorisation on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from host_fixtures import assert_records_match, sized_host

from rayfl.algorithms.fedavg import fedavg_client, fedavg_clients, scaffold_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.config import ConfigError, load_config, section_config
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.vectorized import batched_version, use_batched
from rayfl.models import build_model
from rayfl.models.params import get_flat
from rayfl.results import load
from rayfl.runner import run_experiment

F_IN, C = 6, 3
SIZES = {0: 7, 1: 12, 2: 3, 3: 10, 4: 0}  # unequal, a short last batch, one empty client
TOL = dict(rtol=1e-5, atol=2e-6)


def model_config(model: str, hidden: int):
    """`model` with `hidden` units (a linear model has no hidden layer)."""
    return section_config("model", name=model, **({} if model == "linear" else {"hidden": [hidden]}))


def make_host(vectorize: str, model: str = "mlp", seed: int = 3, hidden: int = 5, device: str = "auto") -> ClientHostImpl:
    return sized_host(SIZES, F_IN, C, model_config(model, hidden), seed, 10.0, vectorize, device)


def initial(model: str = "mlp", hidden: int = 5) -> np.ndarray:
    torch.manual_seed(0)
    return get_flat(build_model(model_config(model, hidden), (F_IN,), C)).numpy()


def run_both(fn, broadcast, per_client=None, budgets=None, model="mlp", rounds=1, hidden=5):
    """Records of the loop and of the batched twin on identical fresh hosts."""
    out = {}
    for mode in ("off", "on"):
        host = make_host(mode, model, hidden=hidden)
        recs = []
        for r in range(rounds):
            recs = host.run(fn, list(SIZES), r, broadcast, per_client, budgets)
        out[mode] = (recs, host)
    return out["off"], out["on"]


@pytest.mark.parametrize("model", ["mlp", "linear"])
def test_fedavg_batched_equals_loop_with_unequal_clients(model):
    x0 = initial(model)
    (loop, _), (vec, _) = run_both(fedavg_client, {"params": x0, "lr": 0.3, "schedule": LocalSchedule(4, 2, None)}, model=model)
    assert_records_match(loop, vec, **TOL)
    assert [r["local_steps"] for r in vec] == [4, 6, 2, 6, 0]  # ceil(n / 4) per epoch, two epochs
    assert np.isnan(vec[-1]["values"]["loss"]) and not np.any(vec[-1]["values"]["delta"])  # the empty client
    assert np.abs(vec[1]["values"]["delta"]).max() > 1e-3  # it really trained


def test_fedprox_and_per_client_schedules_and_harmonic_lr():
    x0 = initial()
    per = {c: {"schedule": LocalSchedule(5, None, 1 + c, lr_offset=2.0), "lr": 0.2 + 0.1 * c} for c in SIZES}
    (loop, _), (vec, _) = run_both(fedavg_client, {"params": x0, "weight_decay": 0.01, "prox_mu": 0.5}, per)
    assert_records_match(loop, vec, **TOL)
    assert [r["local_steps"] for r in vec] == [1, 2, 3, 4, 0]


def test_fedprox_pull_towards_the_start_takes_the_folded_path(monkeypatch):
    """FedProx's batched clients pull towards their own start, which the kernel folds into its
    scale for the first window (`Affine.anchor`) instead of a drift matmul. With 5 hidden units
    every window is one step, so the steps after the first take it as an explicit drift."""
    from rayfl.algorithms import local

    seen = []
    real = local.Affine.of.__func__

    def spy(cls, grad_fn, wd, mu, centers, *rest):
        seen.append(centers if isinstance(centers, str) else "tensor")
        return real(cls, grad_fn, wd, mu, centers, *rest)

    monkeypatch.setattr(local.Affine, "of", classmethod(spy))
    (loop, _), (vec, _) = run_both(fedavg_client, {"params": initial(), "lr": 0.2, "prox_mu": 0.5,
                                                   "schedule": LocalSchedule(4, 1, None)})
    assert_records_match(loop, vec, **TOL)
    assert seen[0] == "start" and "tensor" in seen  # the fold, then the explicit drift


def test_work_budget_truncates_like_the_loop():
    x0 = initial()
    budgets = {0: 10.0 * 3 * 8, 1: 10.0 * 3 * 20, 3: 0.0}  # flops_per_sample 10, backward 3: 8, 20, 0 samples
    (loop, _), (vec, _) = run_both(fedavg_client, {"params": x0, "lr": 0.3, "schedule": LocalSchedule(4, 2, None)},
                                   budgets=budgets)
    assert_records_match(loop, vec, **TOL)
    assert [r["local_steps"] for r in vec] == [2, 5, 2, 0, 0] and vec[0]["truncated"] and not vec[2]["truncated"]


@pytest.mark.parametrize("hidden", [5, 40])
def test_scaffold_batched_keeps_control_variates_like_the_loop(hidden):
    """40 hidden units: windows of several steps carry the correction c - c_i (`affine_terms`)."""
    assert batched_version(scaffold_client) is not None
    x0 = initial(hidden=hidden)
    rng = np.random.default_rng(1)
    control = (0.05 * rng.normal(size=x0.shape)).astype(np.float32)
    broadcast = {"params": x0, "control": control, "lr": 0.2, "schedule": LocalSchedule(4, 1, None)}
    (loop, host_l), (vec, host_v) = run_both(scaffold_client, broadcast, rounds=2, hidden=hidden)  # round 2 reads round 1's c_i
    assert_records_match(loop, vec, **TOL)
    for c in SIZES:
        a, b = host_l.states[c].get("control"), host_v.states[c].get("control")
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(b.cpu().numpy(), a.cpu().numpy(), **TOL)


def test_batched_twin_runs_only_where_the_mode_allows():
    assert batched_version(fedavg_client) is fedavg_clients
    assert use_batched("off", fedavg_client, 10) is None
    # `auto` offers the twin even one client (its kernels decide by model and device alone)
    assert use_batched("auto", fedavg_client, 1) is fedavg_clients and use_batched("auto", fedavg_client, 0) is None
    assert use_batched("on", fedavg_client, 1) is fedavg_clients
    assert use_batched("on", lambda ctx: {}, 5) is None  # no twin: the loop


def test_bad_vectorize_value_is_one_config_error():
    with pytest.raises(ConfigError, match="engine.vectorize") as err:
        load_config(None, ["engine.vectorize=sometimes"])
    assert "\n" not in str(err.value)
    assert load_config(None, ["engine.vectorize=on"]).engine.vectorize == "on"  # not YAML's boolean


@pytest.mark.parametrize("objective", ["sgd", "prox"])
@pytest.mark.parametrize("hidden", [5, 40])
def test_one_host_and_two_hosts_give_bitwise_identical_records(hidden, objective):
    """Each client's arithmetic does not depend on which clients share its batch (padding to
    the configured batch size, not to the batch's largest client): one host running all
    clients and two hosts splitting them return the same bits. 40 hidden units make windows
    of 5 steps (`window_shape`): clients of 2 to 6 steps, windows padded past a chunk's last.
    "prox": FedProx with weight decay (the windows' affine terms)."""
    from rayfl.algorithms.local import window_shape

    assert window_shape(4, hidden)[0] == (1 if hidden == 5 else 5)
    x0 = initial(hidden=hidden)
    broadcast = {"params": x0, "lr": 0.3, "schedule": LocalSchedule(4, 2, None)}
    if objective == "prox":
        broadcast.update(prox_mu=0.5, weight_decay=0.01)

    def host() -> ClientHostImpl:
        return make_host("on", hidden=hidden)

    whole = host().run(fedavg_client, list(SIZES), 0, broadcast)
    split = (host().run(fedavg_client, [0, 2], 0, broadcast) + host().run(fedavg_client, [1], 0, broadcast)
             + host().run(fedavg_client, [3, 4], 0, broadcast))  # one alone: a batch of one
    loop = make_host("off", hidden=hidden).run(fedavg_client, list(SIZES), 0, broadcast)
    split.sort(key=lambda r: r["client"])
    for a, b, c in zip(whole, split, loop, strict=True):
        assert a["local_steps"] == b["local_steps"]
        np.testing.assert_array_equal(a["values"]["delta"], b["values"]["delta"])
        np.testing.assert_allclose(a["values"]["delta"], c["values"]["delta"], **TOL)
        assert a["values"]["loss"] == b["values"]["loss"] or np.isnan(a["values"]["loss"])
    np.testing.assert_array_equal(broadcast["params"], initial(hidden=hidden))  # the shared broadcast is never written


@pytest.mark.parametrize("objective", ["sgd", "prox", "scaffold"])
@pytest.mark.parametrize("hidden", [5, 40])
def test_the_gpus_fixed_chunks_change_no_bit(monkeypatch, hidden, objective):
    """On a GPU every chunk holds the same client count, idle clients filling the last, and
    steps are padded to whole windows (`fixed_chunk`, tests/test_gpu.py on a real card). The
    same layout forced on the CPU, whose kernels give a row the same bits in any batch, must
    change nothing: idle clients never move or touch a real one, and their rows are dropped."""
    from rayfl.algorithms import local

    x0 = initial(hidden=hidden)
    fn = scaffold_client if objective == "scaffold" else fedavg_client
    broadcast = {"params": x0, "lr": 0.3, "schedule": LocalSchedule(4, 2, None)}
    if objective == "prox":
        broadcast.update(prox_mu=0.5, weight_decay=0.01)
    if objective == "scaffold":
        broadcast["control"] = (0.05 * np.random.default_rng(1).normal(size=x0.shape)).astype(np.float32)

    def rounds() -> tuple[list[dict], ClientHostImpl]:
        host = make_host("on", hidden=hidden, device="cpu")  # on a GPU other chunk sizes give other bits
        return [host.run(fn, list(SIZES), r, broadcast) for r in range(2)], host

    cpu, cpu_host = rounds()
    monkeypatch.setattr(local, "fixed_chunk", lambda row_bytes, device: 3)  # 5 clients: chunks of 3, one idle
    gpu, gpu_host = rounds()
    for a, b in zip(sum(cpu, []), sum(gpu, []), strict=True):
        assert (a["client"], a["local_steps"]) == (b["client"], b["local_steps"])
        for key, v in a["values"].items():
            np.testing.assert_array_equal(b["values"][key], v, err_msg=f"{key} of client {a['client']}")
    for c in SIZES:
        a, b = cpu_host.states[c].get("control"), gpu_host.states[c].get("control")
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert np.abs(sum(cpu, [])[1]["values"]["delta"]).max() > 1e-3


def test_gpu_chunks_are_fixed_and_cover_every_client():
    from rayfl.algorithms.local import GPU_CHUNK_BYTES, chunk_slices, fixed_chunk

    mlp_row = 159_010 * 4
    assert fixed_chunk(mlp_row, torch.device("cpu")) == 0
    assert fixed_chunk(mlp_row, torch.device("cuda")) == GPU_CHUNK_BYTES // mlp_row == 105
    assert fixed_chunk(GPU_CHUNK_BYTES * 3, torch.device("cuda")) == 1
    assert chunk_slices(210, mlp_row, 105) == [slice(0, 105), slice(105, 210)]


# ---------------------------------------------------------------- end to end, on Ray

LAYOUT = ["wall_time", "host", "run_id", "experiment"]
FLOAT = ["local_loss", "train_loss", "test_loss", "test_accuracy"]  # model results: equal to tolerance only


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict[str, object]:
    """FedProx under a deadline with partial work (some clients truncated, some late), the
    loop on one host and vectorised on two."""
    out = tmp_path_factory.mktemp("vec")
    base = ["data.dataset=synthetic", "data.features=20", "partition.num_clients=12",
            "data.size_mu=2.5", "data.size_sigma=1.0", "data.min_client_samples=4",
            "data.max_client_samples=40", "partition.method=natural", "model.name=mlp", "model.hidden=[8]",
            "algorithm.name=fedprox", "algorithm.mu=0.1", "algorithm.clients_per_round=8", "algorithm.batch_size=8",
            "algorithm.lr=0.1", "system.speed={dist: lognormal, value: 2.0e+4, sigma: 1.0}",
            "system.policy=deadline", "system.deadline=1.0", "system.late_policy=partial",
            "run.rounds=2", f"output.dir={out}", "output.log_clients=true"]
    variants = {"off-1": ["engine.vectorize=off", "engine.num_hosts=1"],
                "on-2": ["engine.vectorize=on", "engine.num_hosts=2"]}
    return {name: load(run_experiment(load_config(None, [*base, *extra, f"run.run_id={name}"])).run_dir)
            for name, extra in variants.items()}


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in LAYOUT if c in df.columns]).reset_index(drop=True)


def test_vectorized_and_loop_log_the_same_client_tasks(runs):
    """Same sampling, outcomes, steps, simulated times and bytes; losses to tolerance."""
    off, on = comparable(runs["off-1"].clients), comparable(runs["on-2"].clients)
    assert runs["on-2"].clients["host"].nunique() == 2
    assert off["truncated"].any() and (off["local_steps"] > 0).any()
    exact = [c for c in off.columns if c not in FLOAT]
    pd.testing.assert_frame_equal(off[exact], on[exact])
    np.testing.assert_allclose(on["local_loss"].to_numpy(float), off["local_loss"].to_numpy(float), rtol=1e-4)
    r_off, r_on = comparable(runs["off-1"].rounds), comparable(runs["on-2"].rounds)
    exact = [c for c in r_off.columns if c not in FLOAT]
    pd.testing.assert_frame_equal(r_off[exact], r_on[exact])
    np.testing.assert_allclose(r_on["train_loss"], r_off["train_loss"], rtol=1e-4)


def test_batched_mlp_kernel_matches_float64_autograd_per_client():
    """BatchedMLPGrad's masked loss and gradient, and its fused step, against a float64
    autograd computation of each client's unpadded minibatch alone."""
    import torch.nn.functional as F

    from rayfl.algorithms.local import BatchedMLPGrad
    from rayfl.models.params import functional_logits

    model = build_model(section_config("model", name="mlp", hidden=[5, 4]), (F_IN,), C)
    kernel = BatchedMLPGrad.of(model)
    assert kernel is not None and BatchedMLPGrad.of(build_model(section_config("model", name="conv4"), (1, 8, 8), 2)) is None
    g = torch.Generator().manual_seed(0)
    k, b, d = 3, 4, get_flat(model).numel()
    w = torch.randn(k, d, generator=g)
    x, y = torch.randn(k, b, F_IN, generator=g), torch.randint(0, C, (k, b), generator=g)
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)  # full, short, inactive
    segments, loss = kernel(w, x, y, m)
    grad = torch.zeros(k, d)
    for offset, part in segments:
        grad[:, offset : offset + part.shape[1]] = part
    model64 = model.double()
    for j in range(2):
        rows = m[j] > 0
        v = w[j].double().requires_grad_(True)
        ref = F.cross_entropy(functional_logits(model64, v, x[j][rows].double()), y[j][rows])
        (ref_grad,) = torch.autograd.grad(ref, v)
        np.testing.assert_allclose(loss[j].item(), ref.item(), rtol=1e-5)
        np.testing.assert_allclose(grad[j].numpy(), ref_grad.numpy(), rtol=1e-4, atol=1e-6)
    assert not grad[2].any()  # a client without a step this time gets no gradient
    step = torch.tensor([0.5, 0.25, 0.0])
    moved = w.clone()
    layers = kernel.split(moved)
    kernel.step(layers, x, y, m, step)
    kernel.join(layers, moved)
    np.testing.assert_allclose(moved.numpy(), (w - step[:, None] * grad).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("terms", ["sgd", "decay", "drift", "all", "prox"])
@pytest.mark.parametrize("hidden", [[5, 4], None])
def test_a_window_of_steps_equals_single_sgd_steps_in_float64(hidden, terms):
    """BatchedMLPGrad.window (S steps reading the first layer once, in a window padded with
    zero rows) against each client's SGD in float64 autograd on its own unpadded minibatches,
    with per-step step sizes, a short minibatch and a step one client skips; and against S
    calls of the one-step kernel. `terms`: plain SGD, or with the gradient's affine terms
    (`affine_terms`): weight decay, a FedProx pull towards a center other than the start,
    SCAFFOLD's correction, each per client; "prox": FedProx's pull towards the start itself,
    which the window folds into its scale (the single steps take it as an explicit drift)."""
    import torch.nn.functional as F

    from rayfl.algorithms.local import Affine, BatchedMLPGrad
    from rayfl.models.params import functional_logits

    model = build_model(section_config("model", name="mlp", hidden=hidden) if hidden else section_config("model", name="linear"), (F_IN,), C)
    kernel = BatchedMLPGrad.of(model)
    assert kernel is not None
    g = torch.Generator().manual_seed(1)
    k, s_n, b, d = 3, 4, 4, get_flat(model).numel()
    w = torch.randn(k, d, generator=g)
    x = torch.randn(s_n, k, b, F_IN, generator=g)
    y = torch.randint(0, C, (s_n, k, b), generator=g)
    m = torch.ones(s_n, k, b)
    m[2, 1, 3:] = 0  # client 1's third minibatch is short
    m[3, 2] = 0  # client 2 takes three steps
    steps = torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.3, 0.2], [0.3, 0.3, 0.2], [0.2, 0.3, 0.0]])
    wd = torch.tensor([[0.3], [0.0], [0.1]]) if terms in ("decay", "all", "prox") else None
    mu = torch.tensor([[0.5], [0.2], [0.0]]) if terms in ("all", "prox") else None
    centers = {"all": torch.randn(k, d, generator=g), "prox": w}.get(terms)
    corrections = 0.5 * torch.randn(k, d, generator=g) if terms in ("drift", "all", "prox") else None
    moved = w.clone()
    layers = kernel.split(moved)
    affine = Affine.of(kernel, wd, mu, "start" if terms == "prox" else centers, corrections, w, None)
    assert (affine is None) == (terms == "sgd") and (terms != "prox" or affine.anchor is not None)
    padded = torch.zeros(k, (s_n + 2) * b, F_IN)  # a window padded by two steps of zero rows
    padded[:, : s_n * b] = x.transpose(0, 1).reshape(k, s_n * b, F_IN)
    losses = kernel.window(layers, padded, list(y), m, steps, affine)
    kernel.join(layers, moved)
    one_by_one = w.clone()
    single = kernel.split(one_by_one)
    explicit = Affine.of(kernel, wd, mu, centers, corrections, w, None)  # the pull as a drift
    for t in range(s_n):
        kernel.step(single, x[t], y[t], m[t], steps[t], explicit)
    kernel.join(single, one_by_one)
    np.testing.assert_allclose(moved.numpy(), one_by_one.numpy(), rtol=1e-5, atol=1e-6)
    model64 = model.double()
    for j in range(k):
        v = w[j].double()
        for t in range(s_n):
            rows = m[t, j] > 0
            if not rows.any():
                continue
            v = v.detach().requires_grad_(True)
            loss = F.cross_entropy(functional_logits(model64, v, x[t, j][rows].double()), y[t, j][rows])
            (grad,) = torch.autograd.grad(loss, v)
            np.testing.assert_allclose(losses[t][j].item(), loss.item(), rtol=1e-5)
            v = v.detach()
            if wd is not None:
                grad = grad + float(wd[j]) * v
            if mu is not None:
                grad = grad + float(mu[j]) * (v - centers[j].double())
            if corrections is not None:
                grad = grad + corrections[j].double()
            v = v - float(steps[t, j]) * grad
        np.testing.assert_allclose(moved[j].numpy(), v.numpy(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(moved, w)


def test_windows_are_sized_by_the_batch_size_alone():
    from rayfl.algorithms.local import ALIGN_FLOATS, WINDOW_ROWS, window_shape

    assert window_shape(10, 200) == (6, 64)  # the fedavg-mlp benchmark's epoch in one window, 4 zero rows
    assert window_shape(10, 10) == (1, 16)  # a linear model: one step (the Gram would cost 3x the step)
    assert window_shape(10, 50) == (2, 32)  # at most outputs / 2 rows
    assert window_shape(WINDOW_ROWS, 200) == (1, WINDOW_ROWS) and window_shape(3 * WINDOW_ROWS, 200)[0] == 1
    assert window_shape(1, 1000) == (WINDOW_ROWS, WINDOW_ROWS)
    assert all(window_shape(b, o)[1] % ALIGN_FLOATS == 0 and window_shape(b, o)[1] >= window_shape(b, o)[0] * b
               for b in range(1, 200) for o in (10, 200))


@pytest.mark.parametrize("terms", ["sgd", "drift", "anchor"])
@pytest.mark.parametrize("s_n, b", [(6, 4), (8, 8)])
def test_a_clients_bits_do_not_depend_on_its_place_in_the_batch(s_n, b, terms):
    """Odd shapes (a 6x5 first layer: 120-byte blocks) where MKL's batched matmuls would sum
    in another order for a client whose block starts off a 64-byte boundary; plain SGD, and
    with weight decay and a drift (SCAFFOLD, FedProx towards another center) or an anchor
    (FedProx towards the start)."""
    from rayfl.algorithms.local import ALIGN_FLOATS, Affine, BatchedMLPGrad

    kernel = BatchedMLPGrad([(F_IN, 5, True), (5, C, True)])
    d = F_IN * 5 + 5 + 5 * C + C
    g = torch.Generator().manual_seed(0)
    rows = -(-s_n * b // ALIGN_FLOATS) * ALIGN_FLOATS  # a window's padded length
    w, x = torch.randn(5, d, generator=g), torch.zeros(5, rows, F_IN)
    x[:, : s_n * b] = torch.randn(5, s_n * b, F_IN, generator=g)
    y, m, steps = torch.randint(0, C, (s_n, 5, b), generator=g), torch.ones(s_n, 5, b), torch.full((s_n, 5), 0.3)

    decay = torch.linspace(0.1, 0.5, 5)
    drift = torch.randn(5, d, generator=g)

    def moved(ids: list[int]) -> torch.Tensor:
        start = w[ids].clone()
        out = start.clone()
        layers = kernel.split(out)
        affine = {"sgd": None,
                  "drift": Affine(decay[ids], None, kernel.split(drift[ids].clone()), None),
                  "anchor": Affine(decay[ids], 0.5 * decay[ids], None, kernel._layers(start))}[terms]
        kernel.window(layers, x[ids].clone(), [t[ids] for t in y], m[:, ids], steps[:, ids], affine)
        kernel.join(layers, out)
        return out[ids.index(1)]

    alone = moved([1])
    for ids in ([0, 1], [1, 2], [4, 3, 0, 1], [0, 1, 2, 3, 4]):
        assert torch.equal(moved(ids), alone), ids


def test_chunks_are_near_equal_and_within_the_byte_budget():
    from rayfl.algorithms.local import CHUNK_BYTES, chunk_slices

    mlp_row = 159_010 * 4  # MLP 784-200-10 in float32
    parts = chunk_slices(50, mlp_row)
    assert [p.stop - p.start for p in parts] == [13, 13, 12, 12]
    assert parts[0].start == 0 and parts[-1].stop == 50
    assert all(a.stop == b.start for a, b in zip(parts[:-1], parts[1:], strict=True))
    assert all((p.stop - p.start) * mlp_row <= CHUNK_BYTES for p in parts)
    assert [p.stop - p.start for p in chunk_slices(3, 7_850 * 4)] == [3]  # a linear model: one chunk
    assert [p.stop - p.start for p in chunk_slices(2, CHUNK_BYTES * 2)] == [1, 1]  # never an empty chunk
    assert chunk_slices(0, mlp_row) == []


def test_host_keeps_freed_memory_for_the_next_round():
    """Four chunk-sized buffers freed and allocated again: with the host's malloc settings the
    second round reuses the pages instead of faulting them in afresh (glibc trims 32 MB freed
    at the top of the heap by default)."""
    import resource
    import sys

    from rayfl.engine.host import retain_freed_memory

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc malloc settings")
    retain_freed_memory()

    def one_round() -> None:
        bufs = [np.empty(2 << 20, dtype=np.float32) for _ in range(4)]  # 4 x 8 MB
        for b in bufs:
            b.fill(1.0)

    one_round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    one_round()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 500, f"{faults} page faults re-touching 32 MB (8,192 pages) that were freed"
