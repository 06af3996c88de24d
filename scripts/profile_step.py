"""Where a client-step of a `rayfl bench` workload spends its time, on one torch thread.

    python scripts/profile_step.py femnist-cnn
    python scripts/profile_step.py cifar-resnet --steps 20
    python scripts/profile_step.py shakespeare-lstm
    python scripts/profile_step.py shakespeare-lstm --pairs 5 --steps 200
    python scripts/profile_step.py fedavg-mlp --clients 50 --steps 6
    python scripts/profile_step.py fedavg-mlp --clients 50 --steps 6 --pairs 5

Times the reference loop's step (`torch.optim.SGD` on the module's own NCHW parameters, what
`rayfl bench` compares against) and rayfl's (`local_sgd` on a flat vector: deferred dense-layer
steps, channels-last convolutions as `engine.channels_last: auto` gives on a CPU) on random
minibatches of the workload's input shape, model and batch size, then prints the torch profiler's top
operators of each. docs/benchmarks.md ("Where the time goes") quotes it.

`--pairs N` instead measures what two processes on two cores cost each other: the loop's step
timed in one process alone, then in two at once, N times in turn; the work two do at once over
one alone bounds what two hosts can reach against the one-thread loop.

`--clients K` (rayfl's MLP and linear models) instead times what a host computes in a round:
K clients of `--steps` minibatches each as one batch through the fused kernel
(`local_sgd_batched`, FedAvg's deltas), and the rate of its useful arithmetic (the loop's
forward and backward matmuls) against a large float32 matmul on the same core, then the host's
whole call (`ClientHostImpl.run` with FedAvg's deltas kept and summed, as a 2-host round asks).
With `--pairs`, the batched round alone and in two processes at once."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.profiler import profile

from rayfl.algorithms.fedavg import fedavg_client
from rayfl.algorithms.local import BatchedMLPGrad, LocalSchedule, local_sgd, local_sgd_batched
from rayfl.bench.workloads import workload_config
from rayfl.data.lookalike import SHAPES
from rayfl.engine.context import ClientContext
from rayfl.engine.host import ClientHostImpl, retain_freed_memory
from rayfl.models import build_model
from rayfl.models.channels_last import channels_last_rule
from rayfl.models.params import get_flat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="femnist-cnn, cifar-resnet, shakespeare-lstm, fedavg-mlp, ...")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each (after 5 warm-up steps)")
    parser.add_argument("--rows", type=int, default=12, help="operators printed per profile")
    parser.add_argument("--pairs", type=int, default=0,
                        help="time the loop's step alone and in two processes at once, this many times in turn")
    parser.add_argument("--clients", type=int, default=0,
                        help="time a host's round of this many clients as one batch (MLP / linear models)")
    parser.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)  # one process of --pairs
    args = parser.parse_args()
    if args.pairs:
        two_processes(args.workload, args.steps, args.pairs, args.clients)
        return
    if args.clients:
        torch.set_num_threads(1)
        host_round(args.workload, args.clients, args.steps, quiet=args.loop_only)
        return
    torch.set_num_threads(1)
    cfg = workload_config(args.workload, 3)
    if cfg.data.dataset == "lookalike":
        shape, classes, _ = SHAPES[cfg.data.like]
        tokens = cfg.data.like == "shakespeare"
    else:  # the synthetic vectors of fedavg-mlp and its kin
        shape, classes, tokens = (cfg.data.features,), cfg.data.classes, False
    batch, n = cfg.algorithm.batch_size, cfg.algorithm.batch_size * args.steps
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, classes, (n, *shape), generator=g) if tokens else torch.randn((n, *shape), generator=g)
    rows = x, torch.randint(0, classes, (n,), generator=g)
    torch.manual_seed(0)
    model = build_model(cfg.model, shape, classes)
    cpu = torch.device("cpu")
    last = channels_last_rule("auto", model, shape, cpu)

    loop_model = build_model(cfg.model, shape, classes)
    loop_model.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(loop_model.parameters(), lr=cfg.algorithm.lr)

    def loop_steps(count: int) -> None:
        for i in range(count):
            xb, yb = rows[0][i * batch:(i + 1) * batch], rows[1][i * batch:(i + 1) * batch]
            opt.zero_grad()
            F.cross_entropy(loop_model(xb), yb).backward()
            opt.step()

    start = get_flat(model)

    def rayfl_steps(count: int) -> None:
        ctx = ClientContext(id=0, round=0, seed=0, model=model, device=cpu, x=rows[0][:count * batch],
                            y=rows[1][:count * batch], test_x=None, test_y=None, state={}, channels_last=last)
        local_sgd(ctx, start, cfg.algorithm.lr, LocalSchedule(batch, None, count))

    if args.loop_only:
        loop_steps(5)
        t = time.perf_counter()
        loop_steps(args.steps)
        print((time.perf_counter() - t) / args.steps)
        return
    print(f"{args.workload}: {type(model).__name__}, batch {batch}, one thread, torch {torch.__version__}; "
          f"channels-last convolutions: {last}")
    for name, run in (("loop", loop_steps), ("rayfl", rayfl_steps)):
        run(5)
        seconds = []
        for _ in range(3):
            t = time.perf_counter()
            run(args.steps)
            seconds.append((time.perf_counter() - t) / args.steps)
        print(f"{name}: {statistics.median(seconds) * 1e3:.1f} ms a step (median of 3 x {args.steps} steps)")
    for name, run in (("loop", loop_steps), ("rayfl", rayfl_steps)):
        with profile() as prof:
            run(args.steps)
        print(f"\n{name}, per {args.steps} steps:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


def host_round(workload: str, clients: int, steps: int, quiet: bool = False) -> None:
    """Seconds of one host's batched round of `clients` clients (median of 5, after one
    warm-up), and the rate of its useful arithmetic against a 1024^3 float32 matmul's."""
    cfg = workload_config(workload, 3)
    features, classes, batch = cfg.data.features, cfg.data.classes, cfg.algorithm.batch_size
    torch.manual_seed(0)
    model = build_model(cfg.model, (features,), classes)
    kernel = BatchedMLPGrad.of(model)
    if kernel is None:
        raise SystemExit(f"--clients times rayfl's fused MLP / linear kernel; {workload}'s model is not one")
    g = torch.Generator().manual_seed(0)
    cpu, n = torch.device("cpu"), batch * steps
    ctxs = [ClientContext(id=c, round=0, seed=c, model=model, device=cpu, x=torch.randn((n, features), generator=g),
                          y=torch.randint(0, classes, (n,), generator=g), test_x=None, test_y=None, state={})
            for c in range(clients)]
    starts = get_flat(model)[None].expand(clients, -1)
    lrs, schedules = [cfg.algorithm.lr] * clients, [LocalSchedule(batch, 1, None)] * clients

    def run() -> float:
        t = time.perf_counter()
        local_sgd_batched(ctxs, starts, lrs, schedules, minus_start=True)
        return time.perf_counter() - t

    retain_freed_memory()  # as a host does: no page faults on a round's fresh buffers
    run()
    seconds = statistics.median(run() for _ in range(5))
    if quiet:
        print(seconds)
        return
    # the loop's matmuls a sample: forward and weight gradient of every layer, input gradient above the first
    products = sum(i * o for i, o, _ in kernel.shapes)
    flops = 2 * clients * n * (3 * products - kernel.shapes[0][0] * kernel.shapes[0][1])
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    torch.mm(a, b)
    t = time.perf_counter()
    for _ in range(10):
        torch.mm(a, b)
    peak = 10 * 2 * 1024**3 / (time.perf_counter() - t)
    with profile() as prof:
        run()
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    matmuls, total = sum(ops.get(k, 0) for k in ("aten::bmm", "aten::baddbmm_", "aten::mm")), sum(ops.values())
    print(f"{workload}: one host's round of {clients} clients x {steps} steps of {batch}, one thread: "
          f"{seconds * 1e3:.1f} ms ({seconds / clients * 1e3:.2f} ms a client); the loop's arithmetic for it "
          f"{flops / 1e9:.2f} GFLOP, at {flops / seconds / 1e9:.0f} GFLOP/s (a 1024^3 float32 matmul: "
          f"{peak / 1e9:.0f} GFLOP/s); under the profiler, batched matmuls {matmuls / 1e3:.1f} ms of {total / 1e3:.1f}")
    print(f"the host's whole call (ClientHostImpl.run: the same clients drawn from 1,000, FedAvg's deltas kept "
          f"and added to the partial sum): {whole_call(cfg, clients, n) * 1e3:.1f} ms a round")


def whole_call(cfg: Any, clients: int, rows: int, pool: int = 1000, rounds: int = 10) -> float:
    """Median seconds of `ClientHostImpl.run` in this process, as a 2-host round calls it: FedAvg
    on `clients` clients drawn afresh each round from `pool` of `rows` rows, the deltas kept and
    summed on the host (`engine.preaggregate: on`)."""
    g = np.random.default_rng(0)
    features, classes = cfg.data.features, cfg.data.classes
    arrays = {"train_x": g.normal(size=(pool * rows, features)).astype(np.float32),
              "train_y": g.integers(0, classes, size=pool * rows)}
    owned = {c: np.arange(c * rows, (c + 1) * rows) for c in range(pool)}
    host = ClientHostImpl(0, arrays, owned, None, cfg.model, (features,), classes, 0, flops_per_sample=1e5,
                          vectorize="on")
    broadcast = {"params": get_flat(host.model).numpy(), "lr": cfg.algorithm.lr,
                 "schedule": LocalSchedule(cfg.algorithm.batch_size, 1, None)}
    seconds, task = [], 0
    for r in range(rounds + 3):
        ids = sorted(int(c) for c in g.choice(pool, clients, replace=False))
        tasks = {c: task + i for i, c in enumerate(ids)}
        task += clients
        t = time.perf_counter()
        host.run(fedavg_client, ids, r, broadcast, task_ids=tasks, keep=("delta",),
                 presum={"delta": (-20, {tasks[c]: 1.0 for c in ids})})
        seconds.append(time.perf_counter() - t)
        host.settle(dict.fromkeys(tasks.values(), True))
    return statistics.median(seconds[3:])


def two_processes(workload: str, steps: int, pairs: int, clients: int = 0) -> None:
    """The loop's seconds a step (with `clients`, a host's batched round) in one process alone
    and in two at once, `pairs` times in turn (the machine's speed drifts: compare neighbours),
    and the work two do over one's."""
    command = [sys.executable, __file__, workload, "--steps", str(steps), "--loop-only"]
    if clients:
        command += ["--clients", str(clients)]

    def timed(count: int) -> list[float]:
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
        return [float(p.communicate()[0].split()[-1]) for p in procs]

    ratios = []
    for i in range(pairs):
        (alone,), both = timed(1), timed(2)
        ratios.append(sum(alone / s for s in both))
        unit = "a host round" if clients else "a step"
        print(f"{i}: alone {alone * 1e3:.1f} ms {unit}; two at once {both[0] * 1e3:.1f} and {both[1] * 1e3:.1f} ms: "
              f"{ratios[-1]:.2f}x the work of one")
    print(f"{workload}: two processes do {statistics.median(ratios):.2f}x the work of one "
          f"(median of {pairs}; range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
