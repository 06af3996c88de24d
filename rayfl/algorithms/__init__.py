"""The algorithm registry: `algorithm.name` in a job picks one of these.

An entry names the module (under rayfl.algorithms) that holds its config class and server loop,
imported when the entry's `config_class` or `run` is first used: a run imports the algorithm it
runs, not all 26 (0.2 s of a short run's start-up on 2 cores). `import_all` imports every one,
for processes that may run any (a pool's or a head's idle workers)."""

import importlib

from rayfl.algorithms.base import Algorithm

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("fedavg", "fedavg", "FedAvgConfig", "run_fedavg", "FedAvg, sample-size weighted (McMahan et al. 2017)"),
        Algorithm("fedprox", "fedavg", "FedProxConfig", "run_fedavg", "FedProx, proximal local objective (Li et al. 2020)"),
        Algorithm("scaffold", "fedavg", "ScaffoldConfig", "run_scaffold", "SCAFFOLD option II control variates (Karimireddy et al. 2020)"),
        Algorithm("fedasync", "asynchronous", "FedAsyncConfig", "run_fedasync", "FedAsync, staleness-weighted mixing (Xie et al. 2019)"),
        Algorithm("fedbuff", "asynchronous", "FedBuffConfig", "run_fedbuff", "FedBuff, buffered asynchronous aggregation (Nguyen et al. 2022)"),
        Algorithm("zo_hfl", "zo_hfl", "ZOHFLConfig", "run_zo_hfl", "ZO-HFL, zeroth-order bilevel FL with server data (Qiu et al. 2025)"),
        Algorithm("comfedl", "comfedl", "ComFedLConfig", "run_comfedl", "ComFedL, compositional local SGD, uniform average (Huang & Li 2021)"),
        Algorithm("drfa", "drfa", "DRFAConfig", "run_drfa", "DRFA / DRFL, explicit robust client weights (Deng et al. 2020)"),
        Algorithm("qfedavg", "qfedavg", "QFedAvgConfig", "run_qfedavg", "q-FedAvg, loss-powered fair aggregation (Li et al. 2020)"),
        Algorithm("fedrzo_nn", "fedrzo_nn", "FedRZONNConfig", "run_fedrzo_nn", "FedRZO_nn, zeroth-order FedAvg with local sets (Qiu et al. 2023)"),
        Algorithm("fedmspp", "fedmspp", "FedMSPPConfig", "run_fedmspp", "FedMSPP, minibatch stochastic proximal point (Yuan & Li 2022)"),
        Algorithm("scaffnew", "scaffnew", "ScaffnewConfig", "run_scaffnew", "Scaffnew / ProxSkip, control variates, random communication (Mishchenko et al. 2022)"),
        Algorithm("fedrzo_bl", "fedrzo_bl", "FedRZOBLConfig", "run_fedrzo_bl", "FedRZO_bl, zeroth-order bilevel FedAvg with delayed lower-level calls (Qiu et al. 2023)"),
        Algorithm("fedrzo_minimax", "fedrzo_bl", "FedRZOMinimaxConfig", "run_fedrzo_bl", "FedRZO_bl for minimax with a federated ascent oracle (Qiu et al. 2023, Cor. 1)"),
        Algorithm("per_fedavg", "per_fedavg", "PerFedAvgConfig", "run_per_fedavg", "Per-FedAvg / FedMAML, one-step MAML local steps (Fallah et al. 2020)"),
        Algorithm("tr_maml", "tr_maml", "TRMAMLConfig", "run_tr_maml", "TR-MAML federated, min-max task weights on the server (Collins et al. 2020)"),
        Algorithm("ditto", "ditto", "DittoConfig", "run_ditto", "Ditto, persistent lam-proximal personal models (Li et al. 2021)"),
        Algorithm("fedavg_adapt", "fedavg_adapt", "FedAvgAdaptConfig", "run_fedavg_adapt", "FedAvg evaluated after one local adaptation step (ComFedL Sec. 5.2)"),
        Algorithm("ffgg", "ffgg", "FFGGConfig", "run_ffgg", "FFGG, fine-tune personal w then a global gradient on theta (Mishchenko et al. 2023, Alg. 1)"),
        Algorithm("local_ffgg", "ffgg", "LocalFFGGConfig", "run_local_ffgg", "Local FFGG, alternating local w / theta steps (Mishchenko et al. 2023, Alg. 4)"),
        Algorithm("br_ffgg", "ffgg", "BRFFGGConfig", "run_ffgg", "BR-FFGG, FFGG with a robust aggregator under Byzantine clients (Alg. 5)"),
        Algorithm("async_ffgg", "async_ffgg", "AsyncFFGGConfig", "run_async_ffgg", "Asynchronous FFGG, one delayed update per arrival (Mishchenko et al. 2023, Alg. 3)"),
        Algorithm("local_gd", "l2gd", "QuadraticBaselineConfig", "run_local_gd", "Local GD on FFGG's quadratic, joint (theta, w) shared (FFGG Fig. 1b-d)"),
        Algorithm("scaffold_quadratic", "l2gd", "QuadraticScaffoldConfig", "run_scaffold_quadratic", "SCAFFOLD on FFGG's quadratic, option I/II (FFGG Fig. 1b-d)"),
        Algorithm("l2gd", "l2gd", "L2GDConfig", "run_l2gd", "L2GD, loopless local GD for full personalization (Hanzely & Richtarik 2020)"),
        Algorithm("local_finetune", "local_finetune", "LocalFinetuneConfig", "run_local_finetune", "Local fine-tuning of personal params, then per-client test (FFGG Table 1, step 3)"),
    ]
}


def import_all() -> None:
    """Import every algorithm's module (what a host may be asked to run)."""
    for algorithm in ALGORITHMS.values():
        importlib.import_module(algorithm.module_path)


__all__ = ["ALGORITHMS", "Algorithm", "import_all"]
