"""What Ray itself costs a synchronous round: calls to two actors and back, on a local Ray.

    python scripts/ray_call_floor.py
    python scripts/ray_call_floor.py --entries 6600000 --calls 100
    python scripts/ray_call_floor.py --compiled

A rayfl round is one call to every host: it passes the broadcast model as an object reference
and each host answers with its partial sum (float64, the model's size). This times, on this
machine, the same shapes of call with nothing inside them: a call that does nothing, one that
passes a reference to `--entries` float32 values, one that answers with `--entries` float64
values, and one that ships the model by value. docs/benchmarks.md quotes it next to a round's
parts.

`--compiled` also times Ray Compiled Graphs (shared-memory channels to actor loops) on the same
call, and what their waiting costs: the CPU seconds per wall second that idle actors and the
waiting driver burn (their channels poll), and a round in which the actors compute for about
`--work-ms` while the driver waits, against the same round as plain calls."""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import numpy as np
import ray


@ray.remote(num_cpus=1)
class Idle:
    """A host that does no work."""

    def call(self, *args: object) -> None:
        return None

    def answer(self, entries: int) -> np.ndarray:
        return np.zeros(entries)

    def work_and_answer(self, args: tuple[dict[str, np.ndarray], int, int]) -> np.ndarray:
        """About `repeats` passes over a 4 MB array (the actor's compute), then the answer."""
        _, entries, repeats = args
        scratch = np.ones(1 << 19)
        for _ in range(repeats):
            scratch *= 1.0000001
        return np.zeros(entries)

    def cpu_seconds(self) -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime


def median_ms(run: Callable[[], object], calls: int) -> tuple[float, float]:
    """Median and 90th percentile milliseconds of `calls` runs, after one warm-up run."""
    run()
    seconds = []
    for _ in range(calls):
        t = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t)
    return statistics.median(seconds) * 1e3, float(np.percentile(seconds, 90)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--entries", type=int, default=159_010, help="model entries (fedavg-mlp's by default)")
    parser.add_argument("--calls", type=int, default=300, help="timed calls of each kind")
    parser.add_argument("--compiled", action="store_true", help="also time Ray Compiled Graphs and their polling")
    parser.add_argument("--work-ms", type=float, default=40.0, help="the actors' compute in --compiled's round")
    args = parser.parse_args()
    ray.init(num_cpus=args.actors, include_dashboard=False, logging_level="ERROR")
    actors = [Idle.remote() for _ in range(args.actors)]
    ray.get([a.call.remote() for a in actors])
    model = {"params": np.zeros(args.entries, dtype=np.float32)}

    def by_reference() -> None:
        ref = ray.put(model)
        ray.get([a.call.remote(ref) for a in actors])

    kinds: dict[str, Callable[[], object]] = {
        "a call that does nothing": lambda: ray.get([a.call.remote() for a in actors]),
        "the model put and passed by reference": by_reference,
        "the model passed by value": lambda: ray.get([a.call.remote(model) for a in actors]),
        "answering with a model-sized float64 array": lambda: ray.get([a.answer.remote(args.entries) for a in actors]),
    }
    print(f"{args.actors} actors, {args.entries:,} entries, ray {ray.__version__}; median and 90th percentile "
          f"of {args.calls} calls to all of them and back")
    for name, run in kinds.items():
        median, p90 = median_ms(run, args.calls)
        print(f"{name:44s} {median:6.2f} ms  (p90 {p90:.2f})")
    if args.compiled:
        compiled_graphs(actors, model, args)
    ray.shutdown()


def compiled_graphs(actors: list[object], model: dict[str, np.ndarray], args: argparse.Namespace) -> None:
    """The same call as a compiled graph, the CPU its polling burns, and a round with compute."""
    from ray.dag import InputNode, MultiOutputNode

    def scratch_ms(repeats: int) -> float:
        scratch = np.ones(1 << 19)
        t = time.perf_counter()
        for _ in range(repeats):
            scratch *= 1.0000001
        return (time.perf_counter() - t) * 1e3

    repeats = max(1, round(args.work_ms * 100 / scratch_ms(100)))
    with InputNode() as given:
        graph = MultiOutputNode([a.work_and_answer.bind(given) for a in actors]).experimental_compile()

    def cpu_per_wall(run: Callable[[], object], calls: int) -> tuple[float, list[float], float]:
        """Median ms of `calls` runs, and CPU seconds per wall second of the actors and driver."""
        before, driver, t = ray.get([a.cpu_seconds.remote() for a in actors]), time.process_time(), time.perf_counter()
        median, _ = median_ms(run, calls)
        wall = time.perf_counter() - t
        after = ray.get([a.cpu_seconds.remote() for a in actors])
        return median, [(b - a) / wall for a, b in zip(before, after, strict=True)], (time.process_time() - driver) / wall

    try:
        plain = {"model": model}

        def plain_round(work: int) -> object:
            ref = ray.put(plain)
            return ray.get([a.work_and_answer.remote((ref, args.entries, work)) for a in actors])

        print(f"\nRay Compiled Graphs, the same {len(actors)} actors")
        median, p90 = median_ms(lambda: ray.get(graph.execute((model, args.entries, 0))), args.calls)
        print(f"{'compiled: the model in, an answer back':44s} {median:6.2f} ms  (p90 {p90:.2f})")
        before = ray.get([a.cpu_seconds.remote() for a in actors])
        time.sleep(2.0)
        after = ray.get([a.cpu_seconds.remote() for a in actors])
        print("compiled, idle for 2 s: the actors burn " + ", ".join(f"{(b - a) / 2:.2f}" for a, b in zip(before, after, strict=True))
              + " CPU seconds a second")
        calls = max(10, args.calls // 10)
        for name, run in (("plain calls", lambda: plain_round(repeats)),
                          ("compiled", lambda: ray.get(graph.execute((model, args.entries, repeats))))):
            median, actor_cpu, driver_cpu = cpu_per_wall(run, calls)
            print(f"{name}, actors computing ~{args.work_ms:.0f} ms: {median:6.2f} ms a round; CPU per wall second: "
                  f"actors {', '.join(f'{c:.2f}' for c in actor_cpu)}, driver {driver_cpu:.2f}")
    finally:
        graph.teardown()


if __name__ == "__main__":
    main()
