"""What Ray itself costs a synchronous round: calls to two actors and back, on a local Ray.

    python scripts/ray_call_floor.py
    python scripts/ray_call_floor.py --entries 6600000 --calls 100

A rayfl round is one call to every host: it passes the broadcast model as an object reference
and each host answers with its partial sum (float64, the model's size). This times, on this
machine, the same shapes of call with nothing inside them: a call that does nothing, one that
passes a reference to `--entries` float32 values, one that answers with `--entries` float64
values, and one that ships the model by value. docs/benchmarks.md quotes it next to a round's
parts."""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--entries", type=int, default=159_010, help="model entries (fedavg-mlp's by default)")
    parser.add_argument("--calls", type=int, default=300, help="timed calls of each kind")
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
        run()
        seconds = []
        for _ in range(args.calls):
            t = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - t)
        print(f"{name:44s} {statistics.median(seconds) * 1e3:6.2f} ms  (p90 {np.percentile(seconds, 90) * 1e3:.2f})")
    ray.shutdown()


if __name__ == "__main__":
    main()
