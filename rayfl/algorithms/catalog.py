"""rayfl's own algorithms, registered like a user's: each names the module holding its config
class and server loop, imported when a job first uses it (a run imports the algorithm it runs,
not all 26: 0.2 s of a short run's start-up on 2 cores)."""

from rayfl.registry import ALGORITHMS

BUILTIN = [
    ("fedavg", "fedavg:FedAvg", "fedavg:FedAvgConfig", "FedAvg, sample-size weighted (McMahan et al. 2017)"),
    ("fedprox", "fedavg:FedProx", "fedavg:FedProxConfig", "FedProx, proximal local objective (Li et al. 2020)"),
    ("scaffold", "fedavg:Scaffold", "fedavg:ScaffoldConfig", "SCAFFOLD option II control variates (Karimireddy et al. 2020)"),
    ("fedasync", "asynchronous:FedAsync", "asynchronous:FedAsyncConfig", "FedAsync, staleness-weighted mixing (Xie et al. 2019)"),
    ("fedbuff", "asynchronous:FedBuff", "asynchronous:FedBuffConfig", "FedBuff, buffered asynchronous aggregation (Nguyen et al. 2022)"),
    ("zo_hfl", "zo_hfl:ZOHFL", "zo_hfl:ZOHFLConfig", "ZO-HFL, zeroth-order bilevel FL with server data (Qiu et al. 2025)"),
    ("comfedl", "comfedl:ComFedL", "comfedl:ComFedLConfig", "ComFedL, compositional local SGD, uniform average (Huang & Li 2021)"),
    ("drfa", "drfa:DRFA", "drfa:DRFAConfig", "DRFA / DRFL, explicit robust client weights (Deng et al. 2020)"),
    ("qfedavg", "qfedavg:QFedAvg", "qfedavg:QFedAvgConfig", "q-FedAvg, loss-powered fair aggregation (Li et al. 2020)"),
    ("fedrzo_nn", "fedrzo_nn:FedRZONN", "fedrzo_nn:FedRZONNConfig", "FedRZO_nn, zeroth-order FedAvg with local sets (Qiu et al. 2023)"),
    ("fedmspp", "fedmspp:FedMSPP", "fedmspp:FedMSPPConfig", "FedMSPP, minibatch stochastic proximal point (Yuan & Li 2022)"),
    ("scaffnew", "scaffnew:Scaffnew", "scaffnew:ScaffnewConfig", "Scaffnew / ProxSkip, control variates, random communication (Mishchenko et al. 2022)"),
    ("fedrzo_bl", "fedrzo_bl:run_fedrzo_bl", "fedrzo_bl:FedRZOBLConfig", "FedRZO_bl, zeroth-order bilevel FedAvg with delayed lower-level calls (Qiu et al. 2023)"),
    ("fedrzo_minimax", "fedrzo_bl:run_fedrzo_bl", "fedrzo_bl:FedRZOMinimaxConfig", "FedRZO_bl for minimax with a federated ascent oracle (Qiu et al. 2023, Cor. 1)"),
    ("per_fedavg", "per_fedavg:PerFedAvg", "per_fedavg:PerFedAvgConfig", "Per-FedAvg / FedMAML, one-step MAML local steps (Fallah et al. 2020)"),
    ("tr_maml", "tr_maml:TRMAML", "tr_maml:TRMAMLConfig", "TR-MAML federated, min-max task weights on the server (Collins et al. 2020)"),
    ("ditto", "ditto:Ditto", "ditto:DittoConfig", "Ditto, persistent lam-proximal personal models (Li et al. 2021)"),
    ("fedavg_adapt", "fedavg_adapt:FedAvgAdapt", "fedavg_adapt:FedAvgAdaptConfig", "FedAvg evaluated after one local adaptation step (ComFedL Sec. 5.2)"),
    ("ffgg", "ffgg:FFGG", "ffgg:FFGGConfig", "FFGG, fine-tune personal w then a global gradient on theta (Mishchenko et al. 2023, Alg. 1)"),
    ("local_ffgg", "ffgg:LocalFFGG", "ffgg:LocalFFGGConfig", "Local FFGG, alternating local w / theta steps (Mishchenko et al. 2023, Alg. 4)"),
    ("br_ffgg", "ffgg:BRFFGG", "ffgg:BRFFGGConfig", "BR-FFGG, FFGG with a robust aggregator under Byzantine clients (Alg. 5)"),
    ("async_ffgg", "async_ffgg:AsyncFFGG", "async_ffgg:AsyncFFGGConfig", "Asynchronous FFGG, one delayed update per arrival (Mishchenko et al. 2023, Alg. 3)"),
    ("local_gd", "l2gd:LocalGD", "l2gd:QuadraticBaselineConfig", "Local GD on FFGG's quadratic, joint (theta, w) shared (FFGG Fig. 1b-d)"),
    ("scaffold_quadratic", "l2gd:ScaffoldQuadratic", "l2gd:QuadraticScaffoldConfig", "SCAFFOLD on FFGG's quadratic, option I/II (FFGG Fig. 1b-d)"),
    ("l2gd", "l2gd:L2GD", "l2gd:L2GDConfig", "L2GD, loopless local GD for full personalization (Hanzely & Richtarik 2020)"),
    ("local_finetune", "local_finetune:LocalFinetune", "local_finetune:LocalFinetuneConfig", "Local fine-tuning of personal params, then per-client test (FFGG Table 1, step 3)"),
]

for name, run, config, summary in BUILTIN:
    ALGORITHMS.register(name, f"rayfl.algorithms.{run}", config=f"rayfl.algorithms.{config}", summary=summary, origin="built-in")
