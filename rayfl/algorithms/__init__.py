"""The algorithm registry: `algorithm.name` in a job picks one of these."""

from rayfl.algorithms.async_ffgg import AsyncFFGGConfig, run_async_ffgg
from rayfl.algorithms.asynchronous import FedAsyncConfig, FedBuffConfig, run_fedasync, run_fedbuff
from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.comfedl import ComFedLConfig, run_comfedl
from rayfl.algorithms.ditto import DittoConfig, run_ditto
from rayfl.algorithms.drfa import DRFAConfig, run_drfa
from rayfl.algorithms.fedavg import (
    FedAvgConfig,
    FedProxConfig,
    ScaffoldConfig,
    run_fedavg,
    run_scaffold,
)
from rayfl.algorithms.fedavg_adapt import FedAvgAdaptConfig, run_fedavg_adapt
from rayfl.algorithms.fedmspp import FedMSPPConfig, run_fedmspp
from rayfl.algorithms.fedrzo_bl import FedRZOBLConfig, FedRZOMinimaxConfig, run_fedrzo_bl
from rayfl.algorithms.fedrzo_nn import FedRZONNConfig, run_fedrzo_nn
from rayfl.algorithms.ffgg import (
    BRFFGGConfig,
    FFGGConfig,
    LocalFFGGConfig,
    run_ffgg,
    run_local_ffgg,
)
from rayfl.algorithms.l2gd import (
    L2GDConfig,
    QuadraticBaselineConfig,
    QuadraticScaffoldConfig,
    run_l2gd,
    run_local_gd,
    run_scaffold_quadratic,
)
from rayfl.algorithms.local_finetune import LocalFinetuneConfig, run_local_finetune
from rayfl.algorithms.per_fedavg import PerFedAvgConfig, run_per_fedavg
from rayfl.algorithms.qfedavg import QFedAvgConfig, run_qfedavg
from rayfl.algorithms.scaffnew import ScaffnewConfig, run_scaffnew
from rayfl.algorithms.tr_maml import TRMAMLConfig, run_tr_maml
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
        Algorithm("comfedl", ComFedLConfig, run_comfedl, "ComFedL, compositional local SGD, uniform average (Huang & Li 2021)"),
        Algorithm("drfa", DRFAConfig, run_drfa, "DRFA / DRFL, explicit robust client weights (Deng et al. 2020)"),
        Algorithm("qfedavg", QFedAvgConfig, run_qfedavg, "q-FedAvg, loss-powered fair aggregation (Li et al. 2020)"),
        Algorithm("fedrzo_nn", FedRZONNConfig, run_fedrzo_nn, "FedRZO_nn, zeroth-order FedAvg with local sets (Qiu et al. 2023)"),
        Algorithm("fedmspp", FedMSPPConfig, run_fedmspp, "FedMSPP, minibatch stochastic proximal point (Yuan & Li 2022)"),
        Algorithm("scaffnew", ScaffnewConfig, run_scaffnew, "Scaffnew / ProxSkip, control variates, random communication (Mishchenko et al. 2022)"),
        Algorithm("fedrzo_bl", FedRZOBLConfig, run_fedrzo_bl, "FedRZO_bl, zeroth-order bilevel FedAvg with delayed lower-level calls (Qiu et al. 2023)"),
        Algorithm("fedrzo_minimax", FedRZOMinimaxConfig, run_fedrzo_bl, "FedRZO_bl for minimax with a federated ascent oracle (Qiu et al. 2023, Cor. 1)"),
        Algorithm("per_fedavg", PerFedAvgConfig, run_per_fedavg, "Per-FedAvg / FedMAML, one-step MAML local steps (Fallah et al. 2020)"),
        Algorithm("tr_maml", TRMAMLConfig, run_tr_maml, "TR-MAML federated, min-max task weights on the server (Collins et al. 2020)"),
        Algorithm("ditto", DittoConfig, run_ditto, "Ditto, persistent lam-proximal personal models (Li et al. 2021)"),
        Algorithm("fedavg_adapt", FedAvgAdaptConfig, run_fedavg_adapt, "FedAvg evaluated after one local adaptation step (ComFedL Sec. 5.2)"),
        Algorithm("ffgg", FFGGConfig, run_ffgg, "FFGG, fine-tune personal w then a global gradient on theta (Mishchenko et al. 2023, Alg. 1)"),
        Algorithm("local_ffgg", LocalFFGGConfig, run_local_ffgg, "Local FFGG, alternating local w / theta steps (Mishchenko et al. 2023, Alg. 4)"),
        Algorithm("br_ffgg", BRFFGGConfig, run_ffgg, "BR-FFGG, FFGG with a robust aggregator under Byzantine clients (Alg. 5)"),
        Algorithm("async_ffgg", AsyncFFGGConfig, run_async_ffgg, "Asynchronous FFGG, one delayed update per arrival (Mishchenko et al. 2023, Alg. 3)"),
        Algorithm("local_gd", QuadraticBaselineConfig, run_local_gd, "Local GD on FFGG's quadratic, joint (theta, w) shared (FFGG Fig. 1b-d)"),
        Algorithm("scaffold_quadratic", QuadraticScaffoldConfig, run_scaffold_quadratic, "SCAFFOLD on FFGG's quadratic, option I/II (FFGG Fig. 1b-d)"),
        Algorithm("l2gd", L2GDConfig, run_l2gd, "L2GD, loopless local GD for full personalization (Hanzely & Richtarik 2020)"),
        Algorithm("local_finetune", LocalFinetuneConfig, run_local_finetune, "Local fine-tuning of personal params, then per-client test (FFGG Table 1, step 3)"),
    ]
}

__all__ = ["ALGORITHMS", "Algorithm"]
