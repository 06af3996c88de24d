"""Where a client-step of a `rayfl bench` workload spends its time, on one torch thread.

    python scripts/profile_step.py femnist-cnn
    python scripts/profile_step.py cifar-resnet --steps 20
    python scripts/profile_step.py shakespeare-lstm
    python scripts/profile_step.py shakespeare-lstm --pairs 5 --steps 200

Times the reference loop's step (`torch.optim.SGD` on the module's own NCHW parameters, what
`rayfl bench` compares against) and rayfl's (`local_sgd` on a flat vector: deferred dense-layer
steps, channels-last convolutions as `engine.channels_last: auto` gives on a CPU) on random
minibatches of the workload's input shape, model and batch size, then prints the torch profiler's top
operators of each. docs/benchmarks.md ("Where the time goes") quotes it.

`--pairs N` instead measures what two processes on two cores cost each other: the loop's step
timed in one process alone, then in two at once, N times in turn; the work two do at once over
one alone bounds what two hosts can reach against the one-thread loop."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import profile

from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.bench.workloads import workload_config
from rayfl.data.lookalike import SHAPES
from rayfl.engine.context import ClientContext
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
    parser.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)  # one process of --pairs
    args = parser.parse_args()
    if args.pairs:
        two_processes(args.workload, args.steps, args.pairs)
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


def two_processes(workload: str, steps: int, pairs: int) -> None:
    """The loop's seconds a step in one process alone and in two at once, `pairs` times in turn
    (the machine's speed drifts: compare neighbours), and the work two do over one's."""
    command = [sys.executable, __file__, workload, "--steps", str(steps), "--loop-only"]

    def timed(count: int) -> list[float]:
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
        return [float(p.communicate()[0].split()[-1]) for p in procs]

    ratios = []
    for i in range(pairs):
        (alone,), both = timed(1), timed(2)
        ratios.append(sum(alone / s for s in both))
        print(f"{i}: alone {alone * 1e3:.1f} ms a step; two at once {both[0] * 1e3:.1f} and {both[1] * 1e3:.1f} ms: "
              f"{ratios[-1]:.2f}x the work of one")
    print(f"{workload}: two processes do {statistics.median(ratios):.2f}x the work of one "
          f"(median of {pairs}; range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
