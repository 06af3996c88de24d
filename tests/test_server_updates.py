"""One server step of every built-in algorithm, against its paper formula written out by hand.

Each test builds the server state and the combined uploads from a few hand-made numbers
(`Uploads.of`), applies ONE `server_update` and compares with the formula of the algorithm's
docstring computed here in float64. Algorithms whose setup needs a Federation are built with
`Cls.__new__` and the few attributes their server update reads. Pure unit tests: no Ray, no data."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rayfl.algorithms.async_ffgg import AsyncFFGG, AsyncFFGGConfig, step_size
from rayfl.algorithms.asynchronous import FedAsync, FedAsyncConfig, FedBuff, FedBuffConfig
from rayfl.algorithms.comfedl import ComFedL, ComFedLConfig, Probe
from rayfl.algorithms.ditto import Ditto, DittoConfig
from rayfl.algorithms.drfa import DRFA, DRFAConfig, DRFAState, LossReports
from rayfl.algorithms.fedavg import (
    FedAvg,
    FedAvgConfig,
    FedProx,
    FedProxConfig,
    Scaffold,
    ScaffoldConfig,
    ScaffoldState,
)
from rayfl.algorithms.fedavg_adapt import FedAvgAdapt, FedAvgAdaptConfig
from rayfl.algorithms.fedmspp import FedMSPP, FedMSPPConfig
from rayfl.algorithms.fedrzo_nn import FedRZONN, FedRZONNConfig, FedRZOState
from rayfl.algorithms.ffgg import FFGG, FFGGConfig, FFGGState, LocalFFGG, LocalFFGGConfig, Split
from rayfl.algorithms.finetune import SplitSpec
from rayfl.algorithms.l2gd import (
    L2GD,
    JointState,
    L2GDConfig,
    LocalGD,
    QuadraticBaselineConfig,
    QuadraticScaffoldConfig,
    ScaffoldQuadratic,
)
from rayfl.algorithms.per_fedavg import PerFedAvg, PerFedAvgConfig
from rayfl.algorithms.qfedavg import QFedAvg, QFedAvgConfig
from rayfl.algorithms.scaffnew import Scaffnew, ScaffnewConfig
from rayfl.algorithms.server_opt import ModelState, ServerOptimizerConfig
from rayfl.algorithms.tr_maml import (
    TRMAML,
    TRMAMLConfig,
    TRMAMLState,
    task_weight_step,
    task_weights,
)
from rayfl.algorithms.zo_hfl import ZOHFL, PenaltyTracker, ZOHFLConfig, ZOHFLState, server_step
from rayfl.driver.parts import Round, Uploads
from rayfl.driver.rounds import normalized
from rayfl.driver.settings import AsynchronyConfig, staleness_weight

RTOL = 1e-6  # the server states travel as float32; every planted bug moves them by far more


@dataclass
class Result:
    """A stand-in for an accepted ClientResult: what a server update reads of one answer."""

    client: int
    values: dict[str, Any] = field(default_factory=dict)
    staleness: int = 0
    local_steps: int = 1
    num_samples: int = 10

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def bare(cls: type, cfg: Any, fed: Any = None, **attrs: Any) -> Any:
    """An algorithm without its setup(): its config, a stub federation and what setup() sets."""
    alg = cls.__new__(cls)
    alg.cfg, alg.fed = cfg, fed
    for name, value in attrs.items():
        setattr(alg, name, value)
    return alg


def results_of(clients: list[int], **scalars: list[float]) -> list[Result]:
    """One answer per client carrying the given scalar keys (scalars[key][k] for client k)."""
    return [Result(c, {key: vals[k] for key, vals in scalars.items()}) for k, c in enumerate(clients)]


def one_step(alg: Any, state: Any, sums: dict[str, np.ndarray], clients: list[int]) -> Any:
    """One synchronous server update (round 0) on `sums` answered by `clients`, the whole cohort."""
    return alg.server_update(state, Uploads.of(sums, results_of(clients)), Round(0, list(clients), 5))


def simplex_projection(z: np.ndarray) -> np.ndarray:
    """argmin_{p in simplex} ||p - z||: sort, find the largest j with u_j > (sum_{i<=j} u_i - 1) / j,
    subtract that threshold and clip at 0 (Duchi et al. 2008), written independently of rayfl."""
    u = np.sort(z)[::-1]
    css = np.cumsum(u)
    j = np.arange(1, len(z) + 1)
    rho = j[u - (css - 1.0) / j > 0][-1]
    theta = (css[rho - 1] - 1.0) / rho
    return np.maximum(z - theta, 0.0)


X = np.array([0.5, -1.25, 2.0, 0.75], dtype=np.float32)  # a global model (exact in float32)
DELTA = np.array([0.1, -0.4, 0.25, -0.05])  # a combined (already weighted) mean client delta


# ---------------------------------------------------------------- the drivers' weights


def test_staleness_weight_constant_polynomial_hinge() -> None:
    """s(t): constant 1; polynomial (1 + t)^-a; hinge 1 for t <= b, else 1 / (a (t - b) + 1)."""
    constant = AsynchronyConfig(staleness="constant")
    assert [staleness_weight(constant, t) for t in (0, 3, 50)] == [1.0, 1.0, 1.0]
    poly = AsynchronyConfig(staleness="polynomial", staleness_a=0.5)
    assert staleness_weight(poly, 0) == 1.0
    assert staleness_weight(poly, 3) == pytest.approx(0.5)  # 4^-0.5
    assert staleness_weight(poly, 8) == pytest.approx(1.0 / 3.0)  # 9^-0.5
    assert staleness_weight(AsynchronyConfig(staleness="polynomial", staleness_a=2.0), 1) == pytest.approx(0.25)
    hinge = AsynchronyConfig(staleness="hinge", staleness_a=0.5, staleness_b=4.0)
    assert staleness_weight(hinge, 0) == 1.0
    assert staleness_weight(hinge, 4) == 1.0
    assert staleness_weight(hinge, 8) == pytest.approx(1.0 / 3.0)  # 1 / (0.5 * 4 + 1)
    assert staleness_weight(hinge, 6) == pytest.approx(0.5)  # 1 / (0.5 * 2 + 1)


def test_normalized_weighted_mean_plain_sum_and_staleness() -> None:
    """w_k / sum w (all zero if sum 0); w_k for a plain sum; (s_k w_k) / sum w with staleness."""
    np.testing.assert_allclose(normalized(np.array([1.0, 3.0]), mean=True), [0.25, 0.75])
    np.testing.assert_allclose(normalized(np.array([2.0, 5.0, 1.0]), mean=False), [2.0, 5.0, 1.0])
    np.testing.assert_array_equal(normalized(np.zeros(3), mean=True), np.zeros(3))
    s = np.array([1.0, 0.5, 0.25, 1.0])
    np.testing.assert_allclose(normalized(np.ones(4), True, s), s / 4.0)  # FedBuff: s(t_k) / K
    np.testing.assert_allclose(normalized(np.array([1.0, 3.0]), True, np.array([0.5, 1.0])), [0.125, 0.75])
    np.testing.assert_allclose(normalized(np.array([2.0, 4.0]), False, np.array([0.5, 0.25])), [1.0, 1.0])


# ---------------------------------------------------------------- FedAvg family


@pytest.mark.parametrize(("cls", "cfg"), [
    (FedAvg, FedAvgConfig(server_lr=0.7)),
    (FedProx, FedProxConfig(server_lr=0.7, mu=0.1)),
    (FedAvgAdapt, FedAvgAdaptConfig(server_lr=0.7)),
])
def test_fedavg_sgd_step(cls: type, cfg: Any) -> None:
    """FedAvg (and FedProx, FedAvgAdapt, which inherit it): x <- x + server_lr * sum_k w_k delta_k."""
    alg = bare(cls, cfg, server_client=None)
    new = one_step(alg, ModelState(x=X.copy()), {"delta": DELTA}, [0, 1])
    expected = X.astype(np.float64) + 0.7 * DELTA
    assert new.x.dtype == np.float32
    np.testing.assert_allclose(new.x, expected, rtol=RTOL)


def test_fedavg_adam_step() -> None:
    """FedAdam: g = -delta; m = (1-b1) g, v = (1-b2) g^2 from zero moments; bias-corrected
    m / (1 - b1), v / (1 - b2); x - lr m_hat / (sqrt(v_hat) + eps). Two steps carry the moments."""
    b1, b2, eps, lr = 0.8, 0.9, 1e-3, 0.05
    alg = bare(FedAvg, FedAvgConfig(server_lr=lr, server_optimizer=ServerOptimizerConfig("adam", b1, b2, eps)),
               server_client=None)
    state0 = ModelState(x=X.copy())
    d2 = np.array([-0.2, 0.1, 0.3, 0.0])
    s1 = alg.server_update(state0, Uploads.of({"delta": DELTA}), Round(0, [0], 5))
    s2 = alg.server_update(s1, Uploads.of({"delta": d2}), Round(1, [0], 5))
    g1, g2 = -DELTA, -d2
    m1, v1 = (1 - b1) * g1, (1 - b2) * g1**2
    x1 = X.astype(np.float64) - lr * (m1 / (1 - b1)) / (np.sqrt(v1 / (1 - b2)) + eps)
    m2, v2 = b1 * m1 + (1 - b1) * g2, b2 * v1 + (1 - b2) * g2**2
    x2 = x1.astype(np.float32).astype(np.float64) - lr * (m2 / (1 - b1**2)) / (np.sqrt(v2 / (1 - b2**2)) + eps)
    np.testing.assert_allclose(s1.x, x1, rtol=RTOL)
    np.testing.assert_allclose(s2.x, x2, rtol=RTOL)
    assert s2.moments.steps == 2
    assert state0.moments.steps == 0 and state0.moments.m is None  # the old state's moments are untouched


def test_scaffold_step() -> None:
    """SCAFFOLD option II: x <- x + server_lr * mean delta; c <- c + |S|/N * mean delta_control."""
    n_clients, cohort = 10, [1, 4, 7]
    alg = bare(Scaffold, ScaffoldConfig(server_lr=0.5), SimpleNamespace(num_clients=n_clients), server_client=None)
    c = np.array([0.2, 0.0, -0.1, 0.4], dtype=np.float32)
    dc = np.array([1.0, -2.0, 0.5, 0.3])
    uploads = Uploads.of({"delta": DELTA, "delta_control": dc}, results_of(cohort))
    new = alg.server_update(ScaffoldState(x=X.copy(), control=c.copy()), uploads, Round(0, cohort, 5))
    np.testing.assert_allclose(new.x, X.astype(np.float64) + 0.5 * DELTA, rtol=RTOL)
    np.testing.assert_allclose(new.control, c.astype(np.float64) + 3 / 10 * dc, rtol=RTOL)


def test_fedasync_mixing() -> None:
    """FedAsync: x <- (1 - a) x + a (x_downloaded + delta), a = mixing * (1 + t)^-a_poly."""
    cfg = FedAsyncConfig(mixing=0.6, staleness="polynomial", staleness_a=0.5)
    alg = bare(FedAsync, cfg, server_client=None)
    x_dl = np.array([0.25, -1.0, 1.5, 1.0], dtype=np.float32)
    res = Result(3, {"delta": DELTA, "loss": 0.3}, staleness=3)
    uploads = Uploads([res], staleness=[3], downloaded=[x_dl])
    new = alg.server_update(ModelState(x=X.copy()), uploads, Round(0, [], 5, asynchronous=True))
    a = 0.6 * (1.0 + 3) ** -0.5  # 0.3
    expected = (1 - a) * X.astype(np.float64) + a * (x_dl.astype(np.float64) + DELTA)
    np.testing.assert_allclose(new.x, expected, rtol=RTOL)
    assert alg.mixing(uploads) == pytest.approx(0.3)


def test_fedbuff_staleness_weighted_step() -> None:
    """FedBuff: weights s(t_k) / K (uniform, K = buffer size), x <- x + server_lr * sum_k s(t_k)/K delta_k."""
    cfg = FedBuffConfig(server_lr=2.0, buffer_size=3, staleness="polynomial", staleness_a=0.5)
    alg = bare(FedBuff, cfg, server_client=None)
    settings = FedBuff.asynchrony_of(SimpleNamespace(algorithm=cfg))
    assert (settings.buffer_size, settings.staleness, settings.staleness_a) == (3, "polynomial", 0.5)
    stale = [0, 3, 8]
    deltas = [np.array([0.1, 0.2, 0.0, -0.3]), np.array([-0.4, 0.0, 0.6, 0.2]), np.array([0.9, -0.3, 0.3, 0.0])]
    results = [Result(k, {"delta": d, "loss": 0.0}, staleness=t)
               for k, (d, t) in enumerate(zip(deltas, stale, strict=True))]
    rnd = Round(0, [], 5, asynchronous=True)
    factors = np.array([staleness_weight(settings, t) for t in stale])
    w = normalized(alg.weights(ModelState(x=X), "delta", results, rnd), alg.weighting_of("delta") != "sum", factors)
    hand_w = np.array([1.0, 1.0 / 2.0, 1.0 / 3.0]) / 3.0  # (1 + t)^-0.5 / K
    np.testing.assert_allclose(w, hand_w)
    total = sum(wk * d for wk, d in zip(hand_w, deltas, strict=True))
    uploads = Uploads.of({"delta": total}, results, {"delta": w}, staleness=stale)
    new = alg.server_update(ModelState(x=X.copy()), uploads, rnd)
    np.testing.assert_allclose(new.x, X.astype(np.float64) + 2.0 * total, rtol=RTOL)


@pytest.mark.parametrize(("cls", "cfg"), [
    (Ditto, DittoConfig()),
    (PerFedAvg, PerFedAvgConfig()),
    (ComFedL, ComFedLConfig()),
])
def test_plain_mean_delta_step(cls: type, cfg: Any) -> None:
    """Ditto, Per-FedAvg, ComFedL (line 17): w_{s+1} = w_s + the (weighted) mean delta, no server lr."""
    alg = bare(cls, cfg)
    new = one_step(alg, ModelState(x=X.copy()), {"delta": DELTA}, [0, 2])
    np.testing.assert_allclose(new.x, X.astype(np.float64) + DELTA, rtol=RTOL)


# ---------------------------------------------------------------- min-max and fair methods


def test_trmaml_task_weights() -> None:
    """Step 3's relative weights: p_i of the answering clients, uniform when they are all 0."""
    p = np.array([0.1, 0.0, 0.3, 0.6])
    np.testing.assert_allclose(task_weights(p, [0, 2, 3]), [0.1, 0.3, 0.6])
    np.testing.assert_allclose(task_weights(np.array([0.0, 0.0, 0.5, 0.5]), [0, 1]), [1.0, 1.0])


def test_trmaml_task_weight_step() -> None:
    """Step 4: v_i = (n/m) L_i on the answering clients (non-finite L_i: 0), p <- Proj(p + lr tau v)."""
    p = np.full(4, 0.25)
    losses = np.array([0.4, np.nan, 1.0])
    got = task_weight_step(p, [0, 1, 3], losses, 3, 0.1, 2)
    v = np.array([4 / 3 * 0.4, 0.0, 0.0, 4 / 3 * 1.0])
    np.testing.assert_allclose(got, simplex_projection(p + 0.1 * 2 * v))
    np.testing.assert_allclose(got.sum(), 1.0)


def test_trmaml_step() -> None:
    """TR-MAML: w + the p-weighted mean delta; p <- Proj_simplex(p + weight_lr * tau * (n/m) L)."""
    cfg = TRMAMLConfig(weight_lr=0.08, local_steps=5)
    alg = bare(TRMAML, cfg)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    cohort = [0, 1, 3]
    losses = [2.0, 0.5, 1.0]
    uploads = Uploads.of({"delta": DELTA}, results_of(cohort, adapted_loss=losses))
    new = alg.server_update(TRMAMLState(x=X.copy(), p=p.copy()), uploads, Round(0, cohort, 5))
    v = np.zeros(4)
    v[cohort] = 4 / 3 * np.array(losses)
    np.testing.assert_allclose(new.x, X.astype(np.float64) + DELTA, rtol=RTOL)
    np.testing.assert_allclose(new.p, simplex_projection(p + 0.08 * 5 * v), atol=1e-12)
    assert new.p.min() == 0.0 < new.p.max()  # the projection clipped a weight: the test sees the whole step


def test_comfedl_probe_sets_the_shift() -> None:
    """The probe phase: c_s = gamma log((1/m) sum_j exp(L_j / gamma)) in rnd.notes["shift"], state unchanged."""
    cfg = ComFedLConfig(gamma=0.5)
    probe = Probe(SimpleNamespace(fed=None, cfg=cfg))
    losses = [0.2, 1.1, 0.7]
    rnd = Round(0, [0, 1, 2], 5)
    state = ModelState(x=X.copy())
    out = probe.server_update(state, Uploads.of({}, results_of([0, 1, 2], probe=losses)), rnd)
    assert out is state
    assert rnd.notes["shift"] == pytest.approx(0.5 * np.log(np.mean(np.exp(np.array(losses) / 0.5))), rel=1e-12)


def test_drfa_model_step_writes_the_snapshot() -> None:
    """DRFA's model step: w + weighted mean delta, w' = w + weighted mean snapshot delta (rnd.notes), lambda kept."""
    alg = bare(DRFA, DRFAConfig())
    snap = np.array([0.05, -0.2, 0.1, 0.0])
    lam = np.array([0.1, 0.2, 0.3, 0.4])
    rnd = Round(0, [0, 3], 5)
    new = alg.server_update(DRFAState(x=X.copy(), lam=lam), Uploads.of({"delta": DELTA, "snapshot": snap}), rnd)
    np.testing.assert_allclose(new.x, X.astype(np.float64) + DELTA, rtol=RTOL)
    np.testing.assert_allclose(rnd.notes["snapshot"], X.astype(np.float64) + snap, rtol=RTOL)
    np.testing.assert_array_equal(new.lam, lam)


def test_drfa_lambda_step_weighted() -> None:
    """Weighted variant: lambda <- Proj(lambda + lr 0.9^r tau v), v_i = (n/m) f_i (m = the cohort),
    then floored at weight_floor and renormalised."""
    cfg = DRFAConfig(weight_lr=0.2, weight_lr_decay=0.5, weight_floor=0.05, local_steps=4, variant="weighted")
    phase = LossReports(SimpleNamespace(fed=SimpleNamespace(num_clients=5), cfg=cfg))
    lam = np.array([0.3, 0.1, 0.2, 0.2, 0.2])
    cohort = [1, 3]
    f = [0.8, 0.3]
    uploads = Uploads.of({}, results_of(cohort, f=f))
    new = phase.server_update(DRFAState(x=X, lam=lam.copy()), uploads, Round(2, cohort, 5))
    v = np.zeros(5)
    v[cohort] = 5 / 2 * np.array(f)
    z = simplex_projection(lam + 0.2 * 0.5**2 * 4 * v)
    z = np.maximum(z, 0.05)
    np.testing.assert_allclose(new.lam, z / z.sum(), atol=1e-12)
    assert new.x is X


def test_drfa_lambda_step_sampling() -> None:
    """Sampling variant (Alg. 1): lambda <- Proj(lambda + lr tau v), v_i = (n/m) f_i, m = clients_per_round,
    no decay, no floor."""
    cfg = DRFAConfig(weight_lr=0.1, local_steps=2, variant="sampling", clients_per_round=2)
    phase = LossReports(SimpleNamespace(fed=SimpleNamespace(num_clients=4), cfg=cfg))
    lam = np.full(4, 0.25)
    reporters = [0, 2]
    f = [1.5, 0.5]
    new = phase.server_update(DRFAState(x=X, lam=lam.copy()), Uploads.of({}, results_of(reporters, f=f)),
                              Round(3, [0, 1, 3], 5))
    v = np.array([4 / 2 * 1.5, 0.0, 4 / 2 * 0.5, 0.0])
    np.testing.assert_allclose(new.lam, simplex_projection(lam + 0.1 * 2 * v), atol=1e-12)


def test_qfedavg_step() -> None:
    """q-FedAvg: Delta_k = F_k^q L (w - w_k), h_k = q F_k^(q-1) ||L (w - w_k)||^2 + L F_k^q,
    w <- w - sum_k Delta_k / sum_k h_k."""
    q, lr = 0.5, 0.1
    big_l = 1.0 / lr
    f = np.array([0.9, 2.5])
    moves = [np.array([0.01, -0.02, 0.0, 0.03]), np.array([-0.05, 0.01, 0.02, 0.0])]  # w - w_k
    deltas = [fk**q * big_l * m for fk, m in zip(f, moves, strict=True)]
    hs = [q * fk ** (q - 1) * float((big_l * m) @ (big_l * m)) + big_l * fk**q for fk, m in zip(f, moves, strict=True)]
    alg = bare(QFedAvg, QFedAvgConfig(q=q, lr=lr))
    uploads = Uploads.of({"delta_q": deltas[0] + deltas[1]}, results_of([0, 1], h=hs, f=list(f)))
    new = alg.server_update(ModelState(x=X.copy()), uploads, Round(0, [0, 1], 5))
    expected = X.astype(np.float64) - (deltas[0] + deltas[1]) / (hs[0] + hs[1])
    np.testing.assert_allclose(new.x, expected, rtol=RTOL)
    assert not np.allclose(new.x, X)


# ---------------------------------------------------------------- zeroth-order and model averages


@pytest.mark.parametrize(("cls", "cfg"), [(FedRZONN, FedRZONNConfig()), (FedMSPP, FedMSPPConfig())])
def test_model_average_step(cls: type, cfg: Any) -> None:
    """FedRZO_nn / FedMSPP step 8: x_{r+1} = (1/m) sum_i x_{i,H} = x_r + uniform mean delta."""
    alg = bare(cls, cfg)
    new = one_step(alg, FedRZOState(x=X.copy()), {"delta": DELTA}, [0, 1])
    np.testing.assert_allclose(new.x, X.astype(np.float64) + DELTA, rtol=RTOL)


def test_scaffnew_average_and_missing_client() -> None:
    """Scaffnew: x <- mean w_i = x + mean delta with every client; a missing client raises (its h_i would go stale)."""
    alg = bare(Scaffnew, ScaffnewConfig())
    full = one_step(alg, FedRZOState(x=X.copy()), {"delta": DELTA}, [0, 1, 2])
    np.testing.assert_allclose(full.x, X.astype(np.float64) + DELTA, rtol=RTOL)
    with pytest.raises(RuntimeError, match="lost 1 client"):
        alg.server_update(FedRZOState(x=X.copy()), Uploads.of({"delta": DELTA}, results_of([0, 2])),
                          Round(0, [0, 1, 2], 5))
    empty = FedRZOState(x=X.copy())
    assert alg.server_update(empty, Uploads.of({}), Round(0, [], 5)) is empty


def test_zo_hfl_server_step() -> None:
    """Lines 7-8: gamma_r = gamma_0 / (r + 1)^p, x_{r+1} = x_r - gamma_r (grad f1 + sum_i w_i g_i)."""
    cfg = ZOHFLConfig(server_lr=0.2, server_lr_power=0.5)
    x = np.array([1.0, -2.0, 0.5])
    g1 = np.array([0.1, 0.0, -0.3])
    ests = [np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 0.0])]
    w = np.array([0.25, 0.75])
    x_new, g_zo, gamma = server_step(x, 3, g1, ests, w, cfg)
    assert gamma == pytest.approx(0.2 / 2.0)  # 0.2 / sqrt(4)
    np.testing.assert_allclose(g_zo, 0.25 * ests[0] + 0.75 * ests[1])
    np.testing.assert_allclose(x_new, x - 0.1 * (g1 + 0.25 * ests[0] + 0.75 * ests[1]))


def test_zo_hfl_server_update_two_point_estimates() -> None:
    """ZO-HFL without server data (grad f1 = 0): g_i = (d / 2 eta)(f2(x + eta v_i, y+_i) - f2(x - eta v_i, y-_i)) v_i,
    f2 = lam/2 ||x - y||^2, w_i = rho_i renormalised over the answering clients, x - gamma_r sum_i w_i g_i."""
    cfg = ZOHFLConfig(server_lr=0.3, server_lr_power=1.0, eta=0.5, lam=2.0, aggregation="participants")
    rho = np.array([0.1, 0.2, 0.3, 0.4])
    stub = SimpleNamespace(num_clients=4, seed=0, num_params=3)
    alg = bare(ZOHFL, cfg, stub, server=None, kernel=None, rho=rho)
    x = np.array([0.5, -0.25, 1.0])
    v = {0: np.array([0.6, 0.8, 0.0], dtype=np.float32), 2: np.array([0.0, -1.0, 0.0], dtype=np.float32)}
    ys = {0: (np.array([0.2, 0.3, 0.9], dtype=np.float32), np.array([0.4, -0.6, 1.1], dtype=np.float32)),
          2: (np.array([1.0, 0.0, 0.0], dtype=np.float32), np.array([0.0, 0.5, 1.0], dtype=np.float32))}
    results = [Result(i, {"y_plus": ys[i][0], "y_minus": ys[i][1], "loss": 0.1}) for i in (0, 2)]
    rnd = Round(1, [0, 2], 5, notes={"directions": {i: (i, v[i]) for i in v}})
    state = ZOHFLState(x=x.copy(), penalty=PenaltyTracker(cfg.lam, rho))
    new = alg.server_update(state, Uploads.of({}, results), rnd)

    def f2(a: np.ndarray, b: np.ndarray) -> float:
        return 0.5 * 2.0 * float(np.sum((a - b.astype(np.float64)) ** 2))

    g = {}
    for i in (0, 2):
        vi = v[i].astype(np.float64)
        g[i] = (3 / (2 * 0.5)) * (f2(x + 0.5 * vi, ys[i][0]) - f2(x - 0.5 * vi, ys[i][1])) * vi
    w = {0: 0.1 / 0.4, 2: 0.3 / 0.4}
    gamma = 0.3 / (1 + 1) ** 1.0
    np.testing.assert_allclose(new.x, x - gamma * (w[0] * g[0] + w[2] * g[2]), rtol=1e-12)
    assert rnd.notes["gamma"] == pytest.approx(gamma)
    np.testing.assert_allclose(rnd.notes["weights"], [0.25, 0.75])
    np.testing.assert_allclose(new.penalty.y_bar[2], 0.5 * (ys[2][0] + ys[2][1]))
    assert state.penalty.y_bar == {}


# ---------------------------------------------------------------- FFGG and its quadratic baselines


def split_of(theta0: np.ndarray) -> Split:
    return Split(SplitSpec("quadratic"), theta0)


THETA = np.array([1.0, -0.5, 0.25])
GRAD = np.array([0.4, -0.2, 1.0])  # the mean Delta


def test_ffgg_step() -> None:
    """FFGG Alg. 1 line 8: theta - gamma_theta (1/n) sum_m Delta_m."""
    alg = bare(FFGG, FFGGConfig(), split=split_of(np.zeros(3)), gamma_theta=0.3)
    new = alg.server_update(FFGGState(theta=THETA.copy()), Uploads.of({"delta": GRAD}), Round(0, [0], 5))
    assert new.theta.dtype == np.float64
    np.testing.assert_allclose(new.theta, THETA - 0.3 * GRAD, rtol=1e-12)


def test_local_ffgg_sgd_step() -> None:
    """Local FFGG Alg. 4 line 11: theta + server_lr mean(theta_m - theta) = theta - server_lr mean Delta."""
    alg = bare(LocalFFGG, LocalFFGGConfig(), split=split_of(np.zeros(3)), server_lr=0.7)
    new = alg.server_update(FFGGState(theta=THETA.copy()), Uploads.of({"delta": GRAD}), Round(0, [0], 5))
    np.testing.assert_allclose(new.theta, THETA - 0.7 * GRAD, rtol=1e-12)


def test_local_ffgg_adam_step() -> None:
    """Local FFGG with FedAdam: pseudo-gradient g = mean Delta (= -mean model delta); one step from zero
    moments: theta - lr (g (1-b1) / (1-b1)) / (sqrt(g^2 (1-b2) / (1-b2)) + eps)."""
    b1, b2, eps = 0.9, 0.999, 1e-2
    cfg = LocalFFGGConfig(server_optimizer=ServerOptimizerConfig("adam", b1, b2, eps))
    alg = bare(LocalFFGG, cfg, split=split_of(np.zeros(3)), server_lr=0.1)
    new = alg.server_update(FFGGState(theta=THETA.copy()), Uploads.of({"delta": GRAD}), Round(0, [0], 5))
    m, v = (1 - b1) * GRAD, (1 - b2) * GRAD**2
    expected = THETA - 0.1 * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)
    np.testing.assert_allclose(new.theta, expected, rtol=1e-12)
    assert new.moments.steps == 1


def test_async_ffgg_delay_adaptive_step() -> None:
    """Alg. 3 with step_rule delay_adaptive: gamma(d) = gamma K / max(K, d); theta - gamma(d) Delta."""
    cfg = AsyncFFGGConfig(step_rule="delay_adaptive", concurrency=4)
    split = split_of(np.zeros(3))
    assert step_size(cfg, split, 0.5, 2) == pytest.approx(0.5)
    assert step_size(cfg, split, 0.5, 10) == pytest.approx(0.5 * 4 / 10)
    assert step_size(AsyncFFGGConfig(step_rule="constant"), split, 0.5, 10) == 0.5
    alg = bare(AsyncFFGG, cfg, split=split, gamma_theta=0.5)
    uploads = Uploads.of({"delta": GRAD}, [Result(1, {"loss": 0.0}, staleness=8)], staleness=[8])
    new = alg.server_update(FFGGState(theta=THETA.copy()), uploads, Round(0, [], 5, asynchronous=True))
    np.testing.assert_allclose(new.theta, THETA - 0.5 * 4 / 8 * GRAD, rtol=1e-12)


def test_local_gd_step() -> None:
    """Local GD: x <- mean_m x_m = x + (sum_m (x_m - x)) / M (uploads are plain sums)."""
    alg = bare(LocalGD, QuadraticBaselineConfig())
    total = np.array([0.3, -0.6, 0.9])
    new = one_step(alg, JointState(x=THETA.copy()), {"delta": total}, [0, 1, 2])
    np.testing.assert_allclose(new.x, THETA + total / 3, rtol=1e-12)


def test_scaffold_quadratic_step() -> None:
    """SCAFFOLD on the quadratic: x <- x + eta_g mean(y - x), c <- c + |S|/N mean(c_m+ - c_m)
    (|S| = N when no client is lost)."""
    alg = bare(ScaffoldQuadratic, QuadraticScaffoldConfig(server_lr=0.5), SimpleNamespace(num_clients=6))
    dx, dc = np.array([0.4, -0.8, 1.2]), np.array([2.0, 0.0, -1.0])  # plain sums over the 4 answers
    c = np.array([0.1, 0.2, 0.3])
    uploads = Uploads.of({"delta": dx, "delta_control": dc}, results_of([0, 1, 2, 3]))
    new = alg.server_update(JointState(x=THETA.copy(), control=c.copy()), uploads, Round(0, list(range(6)), 5))
    np.testing.assert_allclose(new.x, THETA + 0.5 * dx / 4, rtol=1e-12)
    np.testing.assert_allclose(new.control, c + 4 / 6 * dc / 4, rtol=1e-12)  # two of N = 6 clients lost


def test_l2gd_keeps_the_mean_model() -> None:
    """L2GD's server: x <- (1/M) sum_m x_m, the mean the next averaging step pulls toward."""
    alg = bare(L2GD, L2GDConfig())
    total = np.array([3.0, -1.5, 0.6])
    new = one_step(alg, JointState(x=THETA.copy()), {"x": total}, [0, 1, 2])
    np.testing.assert_allclose(new.x, total / 3, rtol=1e-12)
