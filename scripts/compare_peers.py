"""The `fedavg-mlp` workload on four systems in one invocation: the plain PyTorch loop of
`rayfl bench`, rayfl with its defaults, and each peer simulator (pfl-research, Flower) run by
its runner in scripts/peers/ under the Python of its own virtual environment
(scripts/compare_peers.sh builds those). Writes one JSON summary: per system the seconds per
round (median of rounds 1..R-2, as `rayfl bench` times them), the total, the final test
accuracy and the versions, with the machine, date and commit.

All four train the same arrays (exported here from rayfl's dataset to an .npz the runners
read), the same MLP from the same initial weights, the same number of clients a round with
the same local epochs, batch size and learning rate, on the same 2 cores."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayfl.bench.common import round_seconds, steady, write_result
from rayfl.bench.reference import initial_params, run_reference_loop
from rayfl.bench.workloads import workload, workload_config

WORKLOAD = "fedavg-mlp"
PEERS = Path(__file__).resolve().parent / "peers"
RUNNERS = {"pfl-research": PEERS / "pfl_fedavg.py", "flower": PEERS / "flower_fedavg.py"}
FAIRNESS = (
    "the same arrays (rayfl's dataset exported to .npz), the same MLP from the same initial weights, "
    "the same clients per round, local epochs, batch size and learning rate (each system samples its "
    "clients itself), on the same 2 cores: the loop on 1 torch thread (rayfl bench's reference), rayfl "
    "with its defaults (a host per core, 1 torch thread each), pfl-research in its one simulating "
    "process on 1 torch thread, Flower running one client per core at a time, 1 torch thread each"
)


def export_workload(cfg: Any, dataset: Any, path: Path) -> dict[str, Any]:
    """The dataset's arrays with each client's training rows contiguous, the initial model and
    the workload's settings, for runners that cannot import rayfl."""
    order = np.concatenate([np.asarray(rows) for rows in dataset.client_train])
    offsets = np.concatenate([[0], np.cumsum([len(rows) for rows in dataset.client_train])]).astype(np.int64)
    alg = cfg.algorithm
    settings = {"workload": WORKLOAD, "rounds": cfg.run.rounds, "clients_per_round": alg.clients_per_round,
                "local_epochs": alg.local_epochs, "batch_size": alg.batch_size, "lr": alg.lr,
                "features": int(np.prod(dataset.input_shape)), "hidden": list(cfg.model.hidden),
                "classes": dataset.num_classes, "num_clients": dataset.num_clients}
    np.savez(path, train_x=np.asarray(dataset.train_x)[order].astype(np.float32),
             train_y=np.asarray(dataset.train_y)[order].astype(np.int64), offsets=offsets,
             test_x=np.asarray(dataset.test_x, dtype=np.float32), test_y=np.asarray(dataset.test_y, dtype=np.int64),
             initial=initial_params(cfg, dataset).astype(np.float32))
    path.with_suffix(".json").write_text(json.dumps(settings))
    return settings


def test_accuracy(cfg: Any, dataset: Any, flat: np.ndarray) -> float:
    """The accuracy of the flat parameters `flat` on the dataset's test rows."""
    from rayfl.models import build_model
    from rayfl.models.params import set_flat

    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    set_flat(model, torch.from_numpy(flat))
    with torch.no_grad():
        predicted = model(torch.from_numpy(np.asarray(dataset.test_x, dtype=np.float32))).argmax(1).numpy()
    return float((predicted == np.asarray(dataset.test_y)).mean())


def timed(seconds: list[float] | np.ndarray) -> float:
    return round(float(np.median(steady(seconds, 1, 1))), 4)


def run_loop(cfg: Any, dataset: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    loop = run_reference_loop(cfg, dataset, cfg.run.rounds, threads=1)
    total = time.perf_counter() - t0
    return {"seconds_per_round": timed(loop.round_seconds), "round_seconds": [round(s, 4) for s in loop.round_seconds],
            "total_seconds": round(total, 3), "final_accuracy": test_accuracy(cfg, dataset, loop.final),
            "versions": {"torch": torch.__version__}, "torch_threads": 1}


def run_rayfl(rounds: int, dataset: Any, results: Path) -> dict[str, Any]:
    """rayfl with its defaults: the run starts its own Ray and hosts, timed from the call."""
    import ray

    import rayfl
    from rayfl.runner import run_experiment

    cfg = workload_config(WORKLOAD, rounds, f"output.dir={results}", "run.experiment=peers")
    t0 = time.perf_counter()
    outcome = run_experiment(cfg, dataset=dataset)
    total = time.perf_counter() - t0
    seconds = round_seconds(outcome.run_dir)
    return {"seconds_per_round": timed(seconds), "round_seconds": [round(float(s), 4) for s in seconds],
            "total_seconds": round(total, 3), "final_accuracy": outcome.summary.get("test_accuracy"),
            "versions": {"rayfl": rayfl.__version__, "ray": ray.__version__, "torch": torch.__version__},
            "torch_threads": cfg.engine.torch_threads, "run_dir": str(outcome.run_dir)}


def run_peer(name: str, python: str, data: Path, workers: int, timeout: float) -> dict[str, Any]:
    """One peer's runner under its own Python; its result is the last line it prints."""
    cmd = [python, str(RUNNERS[name]), "--data", str(data), "--workers", str(workers)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: " + " | ".join(done.stderr.strip().splitlines()[-5:])}
    return {k: v for k, v in json.loads(lines[-1]).items() if k != "system"}


def peer_python(spec: str) -> tuple[str, str]:
    """`--peer NAME=PYTHON` as (name, interpreter)."""
    name, sep, python = spec.partition("=")
    if not sep or name not in RUNNERS or not python:
        raise argparse.ArgumentTypeError(f"--peer {spec!r}: give NAME=PYTHON, NAME one of {sorted(RUNNERS)}")
    return name, python


def compare(peers: list[tuple[str, str]], rounds: int, out: Path, work: Path, workers: int,
            timeout: float) -> dict[str, Any]:
    from rayfl.runner import build_dataset

    work.mkdir(parents=True, exist_ok=True)
    cfg = workload_config(WORKLOAD, rounds)
    dataset = build_dataset(cfg)
    settings = export_workload(cfg, dataset, work / f"{WORKLOAD}.npz")
    systems = {"loop": run_loop(cfg, dataset), "rayfl": run_rayfl(rounds, dataset, work / "results")}
    for name, python in peers:
        systems[name] = run_peer(name, python, work / f"{WORKLOAD}.npz", workers, timeout)
    summary = {"workload": WORKLOAD, **workload(WORKLOAD).describe(), "settings": settings,
               "timed_rounds": f"1..{rounds - 2} (median; round 0 is warm-up, round {rounds - 1} evaluates in rayfl)",
               "fairness": FAIRNESS, "python": sys.version.split()[0], "systems": systems}
    write_result(out, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", type=peer_python, action="append", default=[], metavar="NAME=PYTHON",
                        help=f"a peer and the Python of its virtual environment; NAME one of {sorted(RUNNERS)}")
    parser.add_argument("--rounds", type=int, default=workload(WORKLOAD).rounds)
    parser.add_argument("--workers", type=int, default=2, help="cores a peer may use (default 2)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a peer may take")
    parser.add_argument("--work-dir", type=Path, default=Path("bench/peers"), help="the exported data and rayfl's run")
    parser.add_argument("--out", type=Path, default=Path("bench/peers.json"))
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be >= 3 (round 0 and the last round are not timed)")
    summary = compare(args.peer, args.rounds, args.out, args.work_dir, args.workers, args.timeout)
    for name, result in summary["systems"].items():
        line = result.get("error") or f"{result['seconds_per_round']:.4f} s/round, accuracy {result['final_accuracy']}"
        print(f"{name}: {line}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
