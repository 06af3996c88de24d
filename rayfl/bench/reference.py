"""The reference every rayfl workload is timed against: a plain single-process PyTorch FedAvg
loop, the few lines a researcher would write by hand (an `nn.Module`, `torch.optim.SGD`,
`loss.backward()`, clients one after another), doing exactly rayfl's client work.

"Exactly" means: the clients rayfl samples (the same seeded draw, `Federation.sample`), each
client's minibatches in the order its seeded stream gives them (`ClientContext.batches`), the
same initial model (`Federation.initial_params`), lr, epochs and batch size, and the same
sample-weighted float64 average. Both must reach the same model to float32 tolerance; that is
what makes the timing comparison fair."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.config import Config
from rayfl.data import FederatedDataset
from rayfl.engine.evaluation import initial_model_params
from rayfl.engine.population import draw_distinct
from rayfl.models import build_model
from rayfl.models.params import set_flat
from rayfl.rng import numpy_rng
from rayfl.zo.lower_level import epoch_indices


@dataclass
class LoopResult:
    final: np.ndarray  # the global model after the last round
    round_seconds: list[float]  # wall seconds of each round
    sampled: dict[int, list[int]]  # the clients of each round


def initial_params(cfg: Config, dataset: FederatedDataset) -> np.ndarray:
    """The initial model, drawn exactly as `Federation.initial_params` draws it."""
    return initial_model_params(cfg, dataset, cfg.run.seed)


def sample_clients(seed: int, round: int, sizes: np.ndarray, k: int) -> list[int]:
    """`Federation.sample(round, k)` with every client always online."""
    trainable = np.flatnonzero(sizes > 0).astype(np.int64)
    rng = numpy_rng(seed, "sample", round)
    return sorted(draw_distinct(rng, len(sizes), k, lambda ids: sizes[ids] > 0, lambda: trainable, len(trainable)))


def run_reference_loop(
    cfg: Config, dataset: FederatedDataset, rounds: int, threads: int | None = 1, device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LoopResult:
    """FedAvg (server_lr 1, sample weights; FedProx: each client's gradient plus
    mu * (w - w_global)) for `rounds` rounds, one client after another,
    on `threads` torch threads (None: torch's default, one per core). One thread is the fair
    default: rayfl's hosts run one each (engine.torch_threads), and on a shared machine
    torch's spinning OpenMP workers make a multi-threaded loop of tiny steps far slower.

    On `device` "cuda" the loop is what a researcher with a GPU writes: the training data and
    the model on the GPU once, each client's minibatch indices moved there once per client.

    `dtype` float64 runs the same loop in double precision: how far the float32 loop ends from
    it is the size of float32 rounding over the run, the scale rayfl's agreement is judged on."""
    if threads is not None:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return run_reference_loop(cfg, dataset, rounds, None, device, dtype)
        finally:
            torch.set_num_threads(previous)
    alg = cfg.algorithm
    assert alg.local_epochs is not None and alg.local_steps is None, "the reference loop runs local epochs"
    assert alg.name in ("fedavg", "fedprox") and not alg.weight_decay, "the reference loop runs FedAvg / FedProx"
    mu = float(getattr(alg, "mu", 0.0))
    seed = cfg.run.seed
    sizes = np.array([len(ix) for ix in dataset.client_train], dtype=np.int64)
    dev = torch.device(device)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes).to(dev, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=alg.lr)
    x = torch.from_numpy(initial_params(cfg, dataset)).to(dev, dtype)
    on_gpu = dev.type != "cpu"

    def samples(rows: np.ndarray) -> torch.Tensor:  # float features in the loop's precision, tokens as they are
        t = torch.from_numpy(rows)
        return t.to(dtype) if t.is_floating_point() else t

    if on_gpu:
        train_x, train_y = samples(dataset.train_x).to(dev), torch.from_numpy(dataset.train_y).to(dev)
    seconds, sampled = [], {}
    for r in range(rounds):
        t0 = time.perf_counter()
        ids = sample_clients(seed, r, sizes, alg.clients_per_round)
        weights = sizes[ids] / sizes[ids].sum()
        acc = torch.zeros(x.shape, dtype=torch.float64, device=dev)
        for c, w in zip(ids, weights, strict=True):
            rows = dataset.client_train[c]
            if on_gpu:
                on_device = torch.as_tensor(np.asarray(rows), device=dev)
                cx, cy = train_x[on_device], train_y[on_device]
            else:  # numpy's gather: on the CPU 1-4% faster per round than torch's here
                cx, cy = samples(dataset.train_x[rows]), torch.from_numpy(dataset.train_y[rows])
            set_flat(model, x)
            center = [p.detach().clone() for p in model.parameters()] if mu else []
            batches = epoch_indices(numpy_rng(seed, "batches", r, c), len(rows), alg.batch_size, alg.local_epochs)
            if on_gpu:
                batches = torch.cat(batches).to(dev).split([len(b) for b in batches])
            for idx in batches:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(cx[idx]), cy[idx]).backward()
                if mu:  # FedProx: the gradient of mu/2 ||w - w_global||^2
                    for p, p0 in zip(model.parameters(), center, strict=True):
                        p.grad.add_(p.detach() - p0, alpha=mu)
                opt.step()
            acc += w * (torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - x).double()
        x = (x.double() + acc).to(dtype)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # the round's kernels finished, not only queued
        seconds.append(time.perf_counter() - t0)
        sampled[r] = ids
    return LoopResult(x.cpu().numpy().astype(np.float32) if dtype == torch.float32 else x.cpu().numpy(), seconds, sampled)
