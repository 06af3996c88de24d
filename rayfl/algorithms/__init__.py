"""The algorithm registry: `algorithm.name` in a job picks one of these."""

from rayfl.algorithms.asynchronous import FedAsyncConfig, FedBuffConfig, run_fedasync, run_fedbuff
from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.fedavg import (
    FedAvgConfig,
    FedProxConfig,
    ScaffoldConfig,
    run_fedavg,
    run_scaffold,
)
from rayfl.algorithms.zo_hfl import ZOHFLConfig, run_zo_hfl

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("fedavg", FedAvgConfig, run_fedavg, "FedAvg, sample-size weighted (McMahan et al. 2017)"),
        Algorithm("fedprox", FedProxConfig, run_fedavg, "FedProx, proximal local objective (Li et al. 2020)"),
        Algorithm("scaffold", ScaffoldConfig, run_scaffold, "SCAFFOLD option II control variates (Karimireddy et al. 2020)"),
        Algorithm("fedasync", FedAsyncConfig, run_fedasync, "FedAsync, staleness-weighted mixing (Xie et al. 2019)"),
        Algorithm("fedbuff", FedBuffConfig, run_fedbuff, "FedBuff, buffered asynchronous aggregation (Nguyen et al. 2022)"),
        Algorithm("zo_hfl", ZOHFLConfig, run_zo_hfl, "ZO-HFL, zeroth-order bilevel FL with server data (Qiu et al. 2025)"),
    ]
}

__all__ = ["ALGORITHMS", "Algorithm"]
