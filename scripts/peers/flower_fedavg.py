"""The `fedavg-mlp` workload on Flower: a `ServerApp` running the message API's `FedAvg`
strategy and a `ClientApp` training with plain PyTorch SGD, one virtual SuperNode per client,
in `flwr.simulation.run_simulation` on its Ray backend. Run in Flower's own virtual
environment by scripts/compare_peers.py; prints one JSON line (shared_workload.report).

The backend runs `--workers` clients at a time, each reserving one CPU and using one torch
thread, as rayfl's hosts do."""

from __future__ import annotations

import logging
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from shared_workload import Workload, accuracy, arguments, build_model, load_workload, now, report

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """One client's local epochs of minibatch SGD from the global model it was sent."""
    torch.set_num_threads(1)
    config = msg.content["config"]
    # cached in shared_workload, which each Ray worker imports once (this script's own globals
    # travel by value with every call)
    w = load_workload(Path(str(config["data"])))
    cid = int(context.node_config["partition-id"])
    x, y = (torch.from_numpy(a) for a in w.client(cid))
    model = build_model(w)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
    shuffle = torch.Generator().manual_seed(cid * 100_003 + int(config["server-round"]))
    for _ in range(int(config["local-epochs"])):
        for idx in torch.randperm(len(x), generator=shuffle).split(int(config["batch-size"])):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(x)})})
    return Message(content=content, reply_to=msg)


def server_app_for(w: Workload, data: Path, stamps: list[float], final: list[ArrayRecord]) -> ServerApp:
    """FedAvg over `clients_per_round` of the SuperNodes a round, no federated evaluation;
    `evaluate_fn` only stamps the clock (before round 1 and after every round)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=w.clients_per_round / w.num_clients, fraction_evaluate=0.0,
                          min_train_nodes=w.clients_per_round, min_available_nodes=w.num_clients)
        config = ConfigRecord({"data": str(data), "lr": float(w.lr), "local-epochs": int(w.local_epochs),
                               "batch-size": int(w.batch_size)})
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(build_model(w).state_dict()),
                                num_rounds=w.rounds, train_config=config,
                                evaluate_fn=lambda _round, _arrays: stamps.append(now()))
        final.append(result.arrays)

    return app


def main() -> None:
    args = arguments(__doc__)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    w = load_workload(args.data)
    stamps: list[float] = []
    final: list[ArrayRecord] = []
    began = now()  # the library's own setup onwards (Ray's start included), not reading the arrays
    run_simulation(server_app=server_app_for(w, args.data.resolve(), stamps, final), client_app=client_app,
                   num_supernodes=w.num_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.workers, "include_dashboard": False}})
    total = now() - began
    model = build_model(w)
    model.load_state_dict(final[0].to_torch_state_dict())
    report("flower", {"flwr": version("flwr"), "ray": version("ray"), "torch": torch.__version__,
                      "numpy": np.__version__},
           stamps[:-1], stamps[-1], total, accuracy(model, w), workers=args.workers,
           client_torch_threads=1)


if __name__ == "__main__":
    main()
