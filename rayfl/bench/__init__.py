"""`rayfl bench`: the benchmark workloads, one small module each, sharing the timing, peak
memory, result-writing (`common`) and reference-loop (`reference`) machinery.

    scale          many registered clients, seconds per round and peak memory
    asynchronous   stragglers: sync vs deadline vs FedBuff, async wall-clock speed-up
    zo             a ZO-HFL round against FedAvg rounds
    fedavg         fedavg-mlp / fedavg-linear / fedprox-mlp: rayfl against a plain PyTorch loop doing the
                   same client work, vectorised and not, pre-aggregated and not, on 1 and 2 hosts
    startup        a short job as a whole process: the seconds outside its rounds, by phase"""

from rayfl.bench.asynchronous import run_async_bench
from rayfl.bench.common import PeakMemory
from rayfl.bench.fedavg import run_fedavg_bench
from rayfl.bench.scale import run_scale_bench
from rayfl.bench.startup import run_startup_bench
from rayfl.bench.zo import run_zo_bench

__all__ = ["PeakMemory", "run_async_bench", "run_fedavg_bench", "run_scale_bench", "run_startup_bench", "run_zo_bench"]
