"""FedRZO_bl / FedRZO_minimax (NeurIPS 2023, Alg. 2 + 3, Cor. 1) checked by hand on tiny problems.

Every rule is recomputed in float64 numpy from its definition (Alg. 2 and 3 as rayfl reads them,
their boxes being lost in extraction; clients evaluate f~_i at their own x_{i,k}, as Remark 3
and Remark 7 (App. B.1) suggest):

    v_r = eta z/||z|| (ONE per round);  y+ = LL(x_r + v_r, r), y0 = LL(x_r, r)   (two calls)
    LL: R~ rounds of  y_i <- y_i - lr grad_y h~_i(x, y_i; zeta)  (H^ steps), y <- mean_i y_i
    client: x <- x - gamma ((n / eta^2)(f~_i(x + v, y+; xi) - f~_i(x, y0; xi)) v + (x - P_X(x)) / eta)
    server: x_{r+1} = mean_i x_i

The full server loop runs in-process on a `ClientHostImpl` behind a recording stand-in for the
Federation (`HostFed`), so the exact call sequence (two oracle calls of R~ rounds, then one
upper call) is visible; one real Ray run on 1 and on 2 hosts checks determinism and that the
real Federation gives the same trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from rayfl.algorithms.fedrzo_bl import (
    DIRECTION_PURPOSE,
    SHARED_DIRECTION,
    FedRZOBLConfig,
    FedRZOMinimaxConfig,
    fedrzo_bl_client,
    run_fedrzo_bl,
)
from rayfl.config import ConfigError, ModelConfig, RunConfig, load_config
from rayfl.data import FederatedDataset
from rayfl.engine import ClientResult
from rayfl.engine.clock import SimClock
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.system import TaskTiming
from rayfl.papers.fedrzo.problems import ProblemSpec, client_problems, reference_lower
from rayfl.results import load
from rayfl.rng import numpy_rng
from rayfl.runner import run_experiment
from rayfl.zo.fl_oracle import LowerLevelConfig, fl_oracle_client, lower_rounds, run_fl_oracle
from rayfl.zo.lower_level import minibatch_indices
from rayfl.zo.projection import ConstraintConfig
from rayfl.zo.sphere import direction_seed, sphere_from_seed

F, C, HID = 4, 4, 2  # features, classes (binary label: class >= 2), hidden ReLU units
SEED = 5


# ---------------------------------------------------------------- tiny data and an in-process Federation


def tiny_dataset() -> FederatedDataset:
    """3 clients with 6 / 8 / 5 training rows and 3 / 4 / 3 test rows, 4 features, 4 classes."""
    rng = np.random.default_rng(11)
    n_train, n_test = 19, 10
    return FederatedDataset(
        name="tiny", num_classes=C, input_shape=(F,),
        train_x=rng.normal(size=(n_train, F)).astype(np.float32), train_y=rng.integers(0, C, n_train).astype(np.int64),
        test_x=rng.normal(size=(n_test, F)).astype(np.float32), test_y=rng.integers(0, C, n_test).astype(np.int64),
        client_train=[np.arange(0, 6), np.arange(6, 14), np.arange(14, 19)],
        client_test=[np.arange(0, 3), np.arange(3, 7), np.arange(7, 10)],
    )


@dataclass
class HostFed:
    """The slice of `Federation` that run_fedrzo_bl uses, running client functions on one
    in-process ClientHostImpl and recording every call in order."""

    dataset: FederatedDataset
    seed: int = SEED
    clock: SimClock = field(default_factory=SimClock)
    calls: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        ds = self.dataset
        arrays = {"train_x": ds.train_x, "train_y": ds.train_y, "test_x": ds.test_x, "test_y": ds.test_y}
        self.host = ClientHostImpl(0, arrays, dict(enumerate(ds.client_train)), dict(enumerate(ds.client_test or [])),
                                   ModelConfig(), ds.input_shape, ds.num_classes, self.seed)
        self.trainable_clients = np.arange(ds.num_clients)

    def track(self, state: Any) -> Any:
        return state

    def rounds(self, total: int) -> range:
        return range(total)

    def call(self, client_ids, fn, *, round, phase="train", per_client=None, **payload) -> list[ClientResult]:
        recs = self.host.run(fn, list(client_ids), round, payload, per_client)
        self.clock.advance_by(1.0)
        self.calls.append({"fn": fn, "phase": phase, "round": round, "ids": list(client_ids), "payload": payload,
                           "per_client": per_client, "values": {r["client"]: r["values"] for r in recs}})
        return [ClientResult(client=r["client"], host=0, values=r["values"], num_samples=r["num_samples"],
                             forward_samples=r["forward_samples"], backward_samples=r["backward_samples"],
                             local_steps=r["local_steps"], bytes_up=r["bytes_up"], bytes_down=r["bytes_down"],
                             timing=TaskTiming(0.0, 0.0, 0.0, 0.0), dispatch_time=0.0, finish_time=0.0) for r in recs]

    def log_round(self, round: int, **metrics: Any) -> None:
        self.rows.append({"round": round, **metrics})

    def log_eval(self, round: int, metrics: Any) -> None:
        pass


# ---------------------------------------------------------------- float64 references


def labels_pm(y: np.ndarray) -> np.ndarray:
    return np.where(y >= C // 2, 1.0, -1.0)


def logistic(y: np.ndarray, u: np.ndarray, lab: np.ndarray) -> tuple[float, np.ndarray]:
    v = labels_pm(lab)
    m = v * (u.astype(np.float64) @ y)
    return float(np.mean(np.log1p(np.exp(-m)))), -(u.astype(np.float64).T @ (v / (1 + np.exp(m)))) / len(m)


def relu_net(x: np.ndarray, u: np.ndarray) -> np.ndarray:
    z1, w1 = x[: HID * F].reshape(HID, F), x[HID * F : HID * (F + 1)]
    z2, w2 = x[HID * (F + 1) : HID * (F + 2)], x[-1]
    return np.maximum(u.astype(np.float64) @ z1.T + w1, 0.0) @ z2 + w2


def group_losses(x: np.ndarray, u: np.ndarray, lab: np.ndarray, all_lab: np.ndarray) -> np.ndarray:
    """(1/b) sum_l [class_l = j] (v_l - NN(u_l))^2 * N_i / N_ij."""
    sq = (labels_pm(lab) - relu_net(x, u)) ** 2
    counts = np.bincount(all_lab, minlength=C)
    out = np.zeros(C)
    for j in range(C):
        if counts[j]:
            out[j] = sq[lab == j].sum() / len(lab) * len(all_lab) / counts[j]
    return out


def fair(x: np.ndarray, y: np.ndarray, u: np.ndarray, lab: np.ndarray, all_lab: np.ndarray, lam: float) -> float:
    return float(y @ group_losses(x, u, lab, all_lab) - 0.5 * lam * y @ y)


def hand_oracle(ds, kind, x, r, y0, rounds, steps, lr, batch, reg_floor=1e-4, lam=1.0) -> np.ndarray:
    """Alg. 3 by hand: `rounds` FedAvg rounds of `steps` minibatch steps (common random numbers)."""
    y = y0.copy()
    for s in range(rounds):
        ys = []
        for i, rows in enumerate(ds.client_train):
            u, lab = ds.train_x[rows], ds.train_y[rows]
            idx = minibatch_indices(numpy_rng(SEED, f"fl_oracle.{s}", r, i), len(rows), batch, steps).numpy()
            yi = y.copy()
            for t in range(steps):
                b = idx[t]
                if kind == "hyperparam":
                    _, g = logistic(yi, u[b], lab[b])
                    yi = yi - lr * (g + max(x[i], reg_floor) * yi)
                else:  # ascent on the inner max
                    yi = yi + lr * (group_losses(x, u[b], lab[b], lab) - lam * yi)
            ys.append(yi)
        y = np.mean(ys, axis=0)
    return y


def hand_client(ds, kind, x, v, y_plus, y_zero, r, i, steps, lr, eta, batch, mu=None, lam=1.0) -> np.ndarray:
    """Alg. 2 lines 6-10 by hand for client i (evaluations at the client's own x_{i,k})."""
    if kind == "hyperparam":
        u, lab = ds.test_x[ds.client_test[i]], ds.test_y[ds.client_test[i]]
    else:
        u, lab = ds.train_x[ds.client_train[i]], ds.train_y[ds.client_train[i]]
    idx = minibatch_indices(numpy_rng(SEED, "fedrzo_bl.upper", r, i), len(lab), batch, steps).numpy()
    n = len(x)
    for k in range(steps):
        b = idx[k]
        if kind == "hyperparam":
            f_plus, f_zero = logistic(y_plus, u[b], lab[b])[0], logistic(y_zero, u[b], lab[b])[0]
        else:
            f_plus = fair(x + v, y_plus, u[b], lab[b], lab, lam)
            f_zero = fair(x, y_zero, u[b], lab[b], lab, lam)
        g = n / eta**2 * (f_plus - f_zero) * v
        moreau = (x - np.maximum(x, mu)) / eta if mu is not None else 0.0
        x = x - lr * (g + moreau)
    return x


ETA, GAMMA, MU, H = 0.1, 0.05, 0.2, 3
LOWER = LowerLevelConfig(kind="constant", rounds0=2, local_steps=2, lr=0.4, batch_size=3, init="zeros")


def hyper_cfg(**kw) -> FedRZOBLConfig:
    base = dict(local_steps=H, batch_size=2, lr=GAMMA, eta=ETA, constraint=ConstraintConfig(kind="box", low=MU), lower=LOWER)
    return FedRZOBLConfig(**{**base, **kw})


def fair_cfg(**kw) -> FedRZOMinimaxConfig:
    base = dict(local_steps=H, batch_size=3, lr=1e-3, eta=ETA, hidden=HID, lam=1.0,
                lower=LowerLevelConfig(kind="constant", rounds0=2, local_steps=2, lr=0.3, batch_size=4, init="zeros"))
    return FedRZOMinimaxConfig(**{**base, **kw})


# ---------------------------------------------------------------- client rules


def client_ctx(ds: FederatedDataset, i: int, r: int):
    fed = HostFed(ds)
    return fed.host._context(i, r, {})


def test_upper_client_steps_match_hand_computation_with_moreau_term():
    """Hyperparam client: 3 steps with x partly below mu, so (x - P_X(x)) / eta acts."""
    ds = tiny_dataset()
    rng = np.random.default_rng(0)
    x = np.array([0.05, 0.5, 1.3])
    v = ETA * sphere_from_seed(123, 3)
    y_plus, y_zero = rng.normal(size=F), rng.normal(size=F)
    spec = ProblemSpec("hyperparam", C)
    out = fedrzo_bl_client(client_ctx(ds, 1, 4), x, y_plus, y_zero, H, GAMMA, ETA, 2, spec,
                           ConstraintConfig(kind="box", low=MU), direction=v)
    want = hand_client(ds, "hyperparam", x, v, y_plus, y_zero, 4, 1, H, GAMMA, ETA, 2, mu=MU)
    np.testing.assert_allclose(out["x"], want, rtol=1e-12, atol=1e-14)
    no_moreau = hand_client(ds, "hyperparam", x, v, y_plus, y_zero, 4, 1, H, GAMMA, ETA, 2, mu=None)
    assert np.abs(no_moreau - want).max() > 1e-3  # the Moreau term is visible
    assert np.abs(want - x + GAMMA * H * (x - np.maximum(x, MU)) / ETA).max() > 1e-3  # and so is the ZO term


def test_minimax_client_evaluates_at_its_own_iterate():
    """Fair client: f~_i depends on x directly, so evaluating at x_r instead of x_{i,k} (a fully
    delayed step 8 of Alg. 2) gives a different result."""
    ds = tiny_dataset()
    rng = np.random.default_rng(1)
    spec = ProblemSpec("fair", C, lam=1.0, hidden=HID)
    n = HID * (F + 2) + 1
    x = rng.normal(size=n)
    v = ETA * sphere_from_seed(7, n)
    y_plus, y_zero = np.abs(rng.normal(size=C)), np.abs(rng.normal(size=C))
    lr = 0.02
    out = fedrzo_bl_client(client_ctx(ds, 0, 2), x, y_plus, y_zero, H, lr, ETA, 3, spec, ConstraintConfig(), direction=v)
    want = hand_client(ds, "fair", x, v, y_plus, y_zero, 2, 0, H, lr, ETA, 3, lam=1.0)
    np.testing.assert_allclose(out["x"], want, rtol=1e-11, atol=1e-13)
    # the delayed-x variant: every step's difference taken at x_r
    u, lab = ds.train_x[ds.client_train[0]], ds.train_y[ds.client_train[0]]
    idx = minibatch_indices(numpy_rng(SEED, "fedrzo_bl.upper", 2, 0), len(lab), 3, H).numpy()
    xd = x.copy()
    for k in range(H):
        b = idx[k]
        xd = xd - lr * n / ETA**2 * (fair(x + v, y_plus, u[b], lab[b], lab, 1.0) - fair(x, y_zero, u[b], lab[b], lab, 1.0)) * v
    assert np.abs(xd - want).max() > 1e-6


@pytest.mark.parametrize("kind", ["hyperparam", "fair"])
def test_oracle_client_steps_match_hand_computation(kind):
    """Alg. 3 lines 3-6: descent on the regularised logistic loss (x_i clamped at the floor),
    or ascent y + lr (L_i(x) - lam y) for the minimax inner max."""
    ds = tiny_dataset()
    rng = np.random.default_rng(2)
    spec = ProblemSpec(kind, C, hidden=HID)
    x = np.array([0.3, 0.7, 1e-6]) if kind == "hyperparam" else rng.normal(size=HID * (F + 2) + 1)
    y0 = rng.normal(size=F if kind == "hyperparam" else C)
    for i in range(3):
        ctx = client_ctx(ds, i, 3)
        out = fl_oracle_client(ctx, y0, 2, 0.4, 3, spec, "zero", 0, query=x)
        # one client's part of round s = 0: replay hand_oracle's inner loop for client i
        u, lab = ds.train_x[ds.client_train[i]], ds.train_y[ds.client_train[i]]
        idx = minibatch_indices(numpy_rng(SEED, "fl_oracle.0", 3, i), len(lab), 3, 2).numpy()
        want = y0.copy()
        for t in range(2):
            b = idx[t]
            if kind == "hyperparam":
                want = want - 0.4 * (logistic(want, u[b], lab[b])[1] + max(x[i], 1e-4) * want)
            else:
                want = want + 0.4 * (group_losses(x, u[b], lab[b], lab) - 1.0 * want)
        np.testing.assert_allclose(out["y"], want, rtol=1e-12, atol=1e-14)
        assert out["clamped"] == (2 if kind == "hyperparam" and i == 2 else 0)
        assert np.array_equal(ctx.state["fl_oracle.query.zero"], x)  # x sent once, kept for the call


# ---------------------------------------------------------------- whole rounds, in process


def run_in_process(cfg: FedRZOBLConfig, rounds: int) -> HostFed:
    fed = HostFed(tiny_dataset())
    run_fedrzo_bl(fed, cfg, RunConfig(rounds=rounds, eval_every=1))
    return fed


@pytest.mark.parametrize("which", ["fedrzo_bl", "fedrzo_bl_warm", "fedrzo_minimax"])
def test_rounds_match_alg2_by_hand_with_two_oracle_calls_and_one_shared_direction(which):
    """`fedrzo_bl_warm`: both calls of round r start at y0_{r-1} (`lower.init: warm`), else at 0."""
    if which == "fedrzo_minimax":
        cfg = fair_cfg()
    else:
        cfg = hyper_cfg(lower=LowerLevelConfig(**{**LOWER.__dict__, "init": "warm" if which.endswith("warm") else "zeros"}))
    cfg.validate()
    kind = cfg.problem
    fed = run_in_process(cfg, 2)
    ds = fed.dataset
    ll = cfg.lower
    rr = ll.rounds0
    n = 3 if kind == "hyperparam" else HID * (F + 2) + 1
    # the exact call sequence: per round, R~ rounds at x_r + v, R~ rounds at x_r, one upper call
    per_round = ["lower_plus"] * rr + ["lower_zero"] * rr + ["upper"]
    assert [c["phase"] for c in fed.calls] == per_round * 2
    assert all(c["ids"] == [0, 1, 2] for c in fed.calls)
    upper_calls = [c for c in fed.calls if c["phase"] == "upper"]
    x = upper_calls[0]["payload"]["params"]
    if kind == "hyperparam":
        np.testing.assert_array_equal(x, np.ones(3))
    y_last = None
    for r, up in enumerate(upper_calls):
        calls = fed.calls[r * len(per_round) : (r + 1) * len(per_round)]
        np.testing.assert_allclose(up["payload"]["params"], x, rtol=1e-11, atol=1e-13)
        x = up["payload"]["params"]
        v = ETA * sphere_from_seed(direction_seed(SEED, r, SHARED_DIRECTION, purpose=DIRECTION_PURPOSE), n)
        # ONE direction, broadcast to every client (not per client), the one the plus call queried
        assert up["per_client"] is None
        np.testing.assert_allclose(up["payload"]["direction"], v, rtol=0, atol=1e-15)
        np.testing.assert_allclose(calls[0]["payload"]["query"], x + v, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(calls[rr]["payload"]["query"], x)
        assert all("query" not in c["payload"] for c in calls[1:rr] + calls[rr + 1 : 2 * rr])
        start = y_last if ll.init == "warm" and r > 0 else np.zeros_like(up["payload"]["y_zero"])
        y_plus = hand_oracle(ds, kind, x + v, r, start, rr, ll.local_steps, ll.lr, ll.batch_size)
        y_zero = hand_oracle(ds, kind, x, r, start, rr, ll.local_steps, ll.lr, ll.batch_size)
        y_last = y_zero
        np.testing.assert_allclose(up["payload"]["y_plus"], y_plus, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(up["payload"]["y_zero"], y_zero, rtol=1e-11, atol=1e-13)
        assert np.abs(y_plus - y_zero).max() > 1e-6
        mu = MU if kind == "hyperparam" else None
        clients = [hand_client(ds, kind, x, v, y_plus, y_zero, r, i, H, cfg.lr, ETA, cfg.batch_size, mu=mu)
                   for i in range(3)]
        x_next = np.mean(clients, axis=0)
        assert np.abs(x_next - x).max() > 1e-6
        x = x_next
    # the communication ledger: upper = r + 1, lower = 2 R~ per round, both calls counted
    assert [row["upper_rounds_cum"] for row in fed.rows] == [1, 2]
    assert [row["lower_rounds_cum"] for row in fed.rows] == [2 * rr, 4 * rr]
    assert [row["total_rounds"] for row in fed.rows] == [1 + 2 * rr, 2 + 4 * rr]
    assert fed.rows[-1]["x_mean"] == pytest.approx(float(np.mean(x)), rel=1e-11)


def test_lower_budget_grows_with_the_upper_round():
    cfg = LowerLevelConfig(kind="growing", rounds0=5, rounds_every=10, rounds_max=7)
    assert [lower_rounds(cfg, r) for r in (0, 9, 10, 25, 100)] == [5, 5, 6, 7, 7]
    assert lower_rounds(LowerLevelConfig(kind="constant", rounds0=3), 99) == 3


def test_closed_form_inner_maximiser_matches_the_federated_ascent_oracle():
    """Full-batch ascent on y converges to y_j = L_j(x) / lam, the closed form used for evaluation."""
    ds = tiny_dataset()
    spec = ProblemSpec("fair", C, lam=2.0, hidden=HID)
    x = np.random.default_rng(3).normal(size=HID * (F + 2) + 1)
    fed = HostFed(ds)
    cfg = LowerLevelConfig(kind="constant", rounds0=40, local_steps=5, lr=0.2, batch_size=64)
    got = run_fl_oracle(fed, x, 0, "zero", cfg, np.zeros(C), spec, [0, 1, 2])
    exact = reference_lower(client_problems(ds, spec), x, spec)
    # by hand: L_j = (1/m) sum_i mean over client i's class-j rows of (v - NN(u))^2
    by_hand = np.mean([group_losses(x, ds.train_x[r], ds.train_y[r], ds.train_y[r]) for r in ds.client_train], axis=0) / 2.0
    np.testing.assert_allclose(exact, by_hand, rtol=1e-12)
    np.testing.assert_allclose(got.y, exact, rtol=1e-8, atol=1e-10)
    assert got.rounds == 40 and len(fed.calls) == 40


def test_lower_level_error_falls_as_the_budget_grows():
    """||y_eps(x) - y(x)||^2 against an L-BFGS reference, for R~ = 1, 4, 16 full-batch rounds
    (beyond that FedAvg's client-drift floor of H^ = 2 constant-size local steps shows)."""
    ds = tiny_dataset()
    spec = ProblemSpec("hyperparam", C)
    x = np.array([0.5, 0.8, 0.3])
    exact = reference_lower(client_problems(ds, spec), x, spec)
    errors = []
    for budget in (1, 4, 16):
        cfg = LowerLevelConfig(kind="constant", rounds0=budget, local_steps=2, lr=0.3, batch_size=64)
        got = run_fl_oracle(HostFed(ds), x, 0, "zero", cfg, np.zeros(F), spec, [0, 1, 2])
        errors.append(float(np.sum((got.y - exact) ** 2)))
    assert all(a > 2 * b for a, b in zip(errors, errors[1:], strict=False)), errors


@pytest.mark.parametrize("key, value", [
    ("eta", 0.0), ("participation", 0.5), ("lr", 0.5), ("lam", 0.0), ("hidden", 0), ("reg_floor", 0.0),
    ("local_steps", None),
])
def test_bad_values_name_the_field(key, value):
    cfg = hyper_cfg(**{key: value})
    if key == "local_steps":
        cfg.local_epochs = 1
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        cfg.validate()


def test_bad_lower_level_and_minimax_values_name_the_field():
    with pytest.raises(ConfigError, match="algorithm.lower.rounds0"):
        hyper_cfg(lower=LowerLevelConfig(rounds0=0)).validate()
    with pytest.raises(ConfigError, match="algorithm.lower.rounds_max"):
        hyper_cfg(lower=LowerLevelConfig(rounds0=5, rounds_max=2)).validate()
    with pytest.raises(ConfigError, match="algorithm.problem"):
        fair_cfg(problem="hyperparam").validate()


# ---------------------------------------------------------------- the real Federation, 1 and 2 hosts


def ray_run(tmp, hosts: int):
    cfg = load_config(None, [
        "data.dataset=digits", "partition.method=iid", "partition.num_clients=3", "model.bias=false",
        "run.rounds=2", "run.eval_every=1", f"run.seed={SEED}", f"engine.num_hosts={hosts}",
        f"output.dir={tmp / 'results'}", f"run.run_id=h{hosts}", "algorithm.name=fedrzo_bl",
        "algorithm.clients_per_round=null", "algorithm.participation=1.0", f"algorithm.local_steps={H}",
        "algorithm.batch_size=2", f"algorithm.lr={GAMMA}", f"algorithm.eta={ETA}",
        f"algorithm.constraint={{kind: box, low: {MU}}}",
        "algorithm.lower={kind: constant, rounds0: 2, local_steps: 2, lr: 0.4, batch_size: 3, init: zeros}",
    ])
    return load(run_experiment(cfg, dataset=tiny_dataset()).run_dir)


@pytest.fixture(scope="module")
def two_placements(ray_local, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fedrzo_bl")
    return ray_run(tmp, 1), ray_run(tmp, 2)


def test_one_and_two_hosts_give_identical_results_and_the_in_process_trajectory(two_placements):
    a, b = two_placements
    drop = ["wall_time", "host", "run_id", "experiment"]

    def same(df: pd.DataFrame) -> pd.DataFrame:
        return df.drop(columns=[c for c in drop if c in df.columns]).sort_values(["round", "task"] if "task" in df else ["round"]).reset_index(drop=True)

    pd.testing.assert_frame_equal(same(a.rounds), same(b.rounds))
    pd.testing.assert_frame_equal(same(a.clients), same(b.clients))
    assert a.clients["host"].nunique() == 1 and b.clients["host"].nunique() == 2
    local = run_in_process(hyper_cfg(), 2).rows
    rounds = a.rounds.sort_values("round").reset_index(drop=True)
    for key in ("x_mean", "upper_loss", "implicit_obj", "ll_err"):
        np.testing.assert_allclose(rounds[key].to_numpy(), [row[key] for row in local], rtol=1e-12)
    # per level in `rounds` and `clients`: 2 x 2 lower rounds and 1 upper round per upper round
    assert rounds["total_rounds"].tolist() == [5, 10] and rounds["lower_rounds"].tolist() == [4, 4]
    phases = a.clients.groupby(["round", "phase"]).size().unstack()
    assert phases.to_dict("list") == {"lower_plus": [6, 6], "lower_zero": [6, 6], "upper": [3, 3]}
    assert (rounds["lower_bytes_cum"] > 0).all() and (rounds["upper_bytes_cum"] > 0).all()
    assert rounds["lower_sim_seconds_cum"].iloc[-1] > 0


def test_fig2_report_draws_both_axes_and_the_delay_saving(two_placements, tmp_path):
    from rayfl.papers.fedrzo.fig2 import write_fedrzo_fig2

    a, b = two_placements
    root = Path(a.manifests["run_dir"].iloc[0]).parent
    lines = write_fedrzo_fig2(load(root), tmp_path)
    assert (tmp_path / "fedrzo_fig2_hyperparam.png").is_file()
    saving = pd.read_csv(tmp_path / "fedrzo_fig2_hyperparam_saving.csv")
    assert len(saving) == 4 and set(saving["H"]) == {H} and set(saving["metric"]) == {"upper_loss", "implicit_obj"}
    assert (saving["total_rounds"] >= saving["upper_rounds"] + 4).all()
    assert lines and lines[0].startswith("Fig. 2 left")
    assert write_fedrzo_fig2(load(root).__class__(*(df.iloc[0:0] for df in (a.rounds, a.clients, a.evals, a.manifests))), tmp_path) == []


def test_direction_sent_as_a_seed_is_the_same_step():
    """`send_direction: seed` (8 bytes instead of n floats) rebuilds the same v = eta z/||z||."""
    ds = tiny_dataset()
    spec, box = ProblemSpec("hyperparam", C), ConstraintConfig(kind="box", low=MU)
    x, y1, y0 = np.array([0.1, 0.6, 1.0]), np.ones(F), np.zeros(F)
    by_vector = fedrzo_bl_client(client_ctx(ds, 2, 1), x, y1, y0, H, GAMMA, ETA, 2, spec, box, direction=ETA * sphere_from_seed(99, 3))
    by_seed = fedrzo_bl_client(client_ctx(ds, 2, 1), x, y1, y0, H, GAMMA, ETA, 2, spec, box, direction_seed=99)
    np.testing.assert_array_equal(by_vector["x"], by_seed["x"])
