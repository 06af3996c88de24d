"""The driver's own CPU time per round: how much of a round the server process spends in rayfl
(sampling, dispatch, bookkeeping, sums, logging) rather than waiting for the hosts.

Runs a `rayfl bench` workload (default fedavg-mlp: 100 clients a round on 2 hosts) in this
process and reads the process's CPU time (user + system, all its threads) at the end of every
round; prints the median over rounds 2..R-2 (round 0 warms up, the last evaluates) and the wall
seconds a round beside it, as JSON.

    python scripts/driver_time.py --rounds 30
    PYTHONPATH=/path/to/another/checkout python scripts/driver_time.py   # the same on other code"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="fedavg-mlp")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)

    import rayfl
    from rayfl.bench.workloads import workload
    from rayfl.engine.federation import Federation

    cpu: list[float] = []
    wall: list[float] = []
    log_round = Federation.log_round

    def timed(self, r, **metrics):
        log_round(self, r, **metrics)
        cpu.append(time.process_time())
        wall.append(time.perf_counter())

    Federation.log_round = timed
    rayfl.run(None, [*workload(args.workload).overrides, f"run.rounds={args.rounds}", f"run.eval_every={args.rounds}",
                     f"engine.num_hosts={args.hosts}", "output.dir=/tmp/driver_time", "output.overwrite=true",
                     "run.run_id=driver-time", *args.overrides])
    per_cpu, per_wall = np.diff(cpu)[1:-1], np.diff(wall)[1:-1]
    print(json.dumps({"workload": args.workload, "rounds": args.rounds, "hosts": args.hosts,
                      "driver_cpu_ms_per_round": round(1000 * float(np.median(per_cpu)), 2),
                      "wall_ms_per_round": round(1000 * float(np.median(per_wall)), 2),
                      "rayfl": rayfl.__file__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
