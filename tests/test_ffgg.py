"""FFGG (Alg. 1, 2, 4) on a tiny synthetic quadratic, against float64 hand computations made
from the *design* D_m = [[H, 0, -b], [A, B, -y]] (not from the factor rows the clients train
on), so a flipped sign, a dropped term or a wrong step size fails a test:

    Alg. 2 (GD):  w_{i+1} = w_i - gamma_w D_w^T D z_i,          z = (theta, w, 1)
    Alg. 1:       Delta_m = D_theta^T D z(theta, w^tau);  theta^+ = theta - gamma_theta mean Delta
    Alg. 4:       w <- w - gamma_w grad_w f(theta_k, w); theta_{k+1} = theta_k - gamma_theta grad_theta f(theta_k, w_new)
                  Delta = theta^r - theta^{r,K};  theta^+ = theta - mean Delta

Also: personal parameters never leave the host (payload keys, sizes, charged bytes), CG solves
the w-subproblem, the quadratic's closed forms, and one Ray run per algorithm (1 vs 2 hosts)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.algorithms.ffgg import ffgg_client, local_ffgg_client
from rayfl.algorithms.finetune import FineTune, QuadraticObjective, SplitSpec, cg, exact
from rayfl.config import ConfigError, load_config, section_config
from rayfl.engine import ClientContext
from rayfl.engine.host import ClientHostImpl
from rayfl.papers.ffgg.quadratic import (
    QuadraticOracle,
    QuadraticShape,
    client_design,
    client_factor,
    factors,
)
from rayfl.results import load
from rayfl.rng import numpy_rng
from rayfl.runner import run_experiment

SEED = 3
SHAPE = QuadraticShape(clients=3, n=12, d_theta=3, d_w=2)
DT, DW = SHAPE.d_theta, SHAPE.d_w


# ---------------------------------------------------------------- float64 references


def design(m: int, shape: QuadraticShape = SHAPE, seed: int = SEED) -> np.ndarray:
    return client_design(shape, seed, m)


def grad(d: np.ndarray, theta: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(grad_theta, grad_w, loss) of 1/2 ||D (theta, w, 1)||^2 from the design."""
    z = np.concatenate([theta, w, [1.0]])
    res = d @ z
    g = d.T @ res
    return g[:DT], g[DT : DT + DW], 0.5 * float(res @ res)


def hand_gd(d: np.ndarray, theta: np.ndarray, w0: np.ndarray, steps: int, lr: float) -> np.ndarray:
    w = w0.copy()
    for _ in range(steps):
        w = w - lr * grad(d, theta, w)[1]
    return w


def w_init(round: int, m: int, seed: int = SEED) -> np.ndarray:
    return numpy_rng(seed, "ffgg.w_init", round, m).standard_normal(DW)


def hand_ffgg_round(theta: np.ndarray, round: int, tau: int, w_lr: float, server_lr: float, clients=range(3)) -> np.ndarray:
    deltas = []
    for m in clients:
        d = design(m)
        w = hand_gd(d, theta, w_init(round, m), tau, w_lr)
        deltas.append(grad(d, theta, w)[0])
    return theta - server_lr * np.mean(deltas, axis=0)


def hand_local_client(d: np.ndarray, theta: np.ndarray, w0: np.ndarray, tau: int, k: int, w_lr: float, th_lr: float) -> np.ndarray:
    w = hand_gd(d, theta, w0, tau, w_lr)
    th = theta.copy()
    for _ in range(k):
        w = w - w_lr * grad(d, th, w)[1]
        th = th - th_lr * grad(d, th, w)[0]
    return theta - th


def context(m: int, round: int = 0, state: dict | None = None, shape: QuadraticShape = SHAPE) -> ClientContext:
    rows = torch.from_numpy(client_factor(shape, SEED, m))
    return ClientContext(
        id=m, round=round, seed=SEED, model=torch.nn.Linear(1, 2), device=torch.device("cpu"), x=rows,
        y=torch.zeros(len(rows), dtype=torch.int64), test_x=None, test_y=None, state=state if state is not None else {},
    )


THETA = np.array([0.3, -1.2, 0.7])
QUAD = SplitSpec("quadratic")


# ---------------------------------------------------------------- the problem and its closed forms


def test_factor_rows_are_the_design_and_the_oracle_is_exact():
    rng = np.random.default_rng(0)
    o = QuadraticOracle.from_factors(factors(SHAPE, SEED), DT)
    for m in range(3):
        d, r = design(m), client_factor(SHAPE, SEED, m)
        z = rng.standard_normal(DT + DW + 1)
        assert np.linalg.norm(r @ z) == pytest.approx(np.linalg.norm(d @ z), rel=1e-12)
        # Example 1: w* = B^+ (y - A theta); F_m = H^T (H theta - b) + A^T (I - B B^+)(A theta - y)
        h, a, b_mat = d[: SHAPE.n, :DT], d[SHAPE.n :, :DT], d[SHAPE.n :, DT : DT + DW]
        b, y = -d[: SHAPE.n, -1], -d[SHAPE.n :, -1]
        w_star = np.linalg.pinv(b_mat) @ (y - a @ THETA)
        np.testing.assert_allclose(o.w_star(m, THETA), w_star, rtol=1e-9, atol=1e-10)
        proj = np.eye(SHAPE.n) - b_mat @ np.linalg.pinv(b_mat)
        f_m = h.T @ (h @ THETA - b) + a.T @ proj @ (a @ THETA - y)
        np.testing.assert_allclose(o.client_operator(m, THETA), f_m, rtol=1e-9, atol=1e-10)
    # planted: every client's operator vanishes at the common theta*, which F's root is
    for m in range(3):
        assert np.linalg.norm(o.client_operator(m, o.theta_star)) < 1e-9
    theta_true = numpy_rng(SEED, "ffgg.quadratic.theta_true").standard_normal(DT)
    np.testing.assert_allclose(o.theta_star, theta_true, atol=1e-8)
    b_all = [design(m)[SHAPE.n :, DT : DT + DW] for m in range(3)]
    assert o.L_w == pytest.approx(max(np.linalg.eigvalsh(b.T @ b)[-1] for b in b_all), rel=1e-10)


def test_cg_solves_the_w_subproblem():
    ctx = context(1)
    obj = QuadraticObjective(ctx, DT)
    th = torch.from_numpy(THETA)
    w0 = torch.from_numpy(w_init(0, 1))
    d = design(1)
    b_mat, rhs = d[:, DT : DT + DW], -(d[:, :DT] @ THETA + d[:, -1])
    w_star = np.linalg.lstsq(b_mat, rhs, rcond=None)[0]
    # CG is exact after d_w steps on a d_w-dimensional SPD system
    np.testing.assert_allclose(cg(obj, th, w0, DW).numpy(), w_star, rtol=1e-8)
    np.testing.assert_allclose(exact(obj, th).numpy(), w_star, rtol=1e-8)
    # one CG step is the exact line search along the residual (steepest descent from w0)
    k = b_mat.T @ b_mat
    r0 = b_mat.T @ rhs - k @ w_init(0, 1)
    one = w_init(0, 1) + (r0 @ r0) / (r0 @ k @ r0) * r0
    np.testing.assert_allclose(cg(obj, th, w0, 1).numpy(), one, rtol=1e-10)
    scipy_cg = pytest.importorskip("scipy.sparse.linalg").cg
    ref, _ = scipy_cg(k, b_mat.T @ rhs, x0=w_init(0, 1), maxiter=1, rtol=0.0, atol=0.0)
    np.testing.assert_allclose(cg(obj, th, w0, 1).numpy(), ref, rtol=1e-10)


# ---------------------------------------------------------------- client rules by hand


@pytest.mark.parametrize("tau", [0, 1, 3])
def test_ffgg_client_gd_by_hand(tau):
    ctx = context(2, round=5)
    out = ffgg_client(ctx, THETA, QUAD, FineTune("gd", tau, 0.07, "random"))
    d = design(2)
    w = hand_gd(d, THETA, w_init(5, 2), tau, 0.07)
    g_theta, _, loss = grad(d, THETA, w)
    np.testing.assert_allclose(out["delta"].numpy(), g_theta, rtol=1e-10)
    assert out["loss"] == pytest.approx(loss, rel=1e-10)
    np.testing.assert_allclose(ctx.state["w"].numpy(), w, rtol=1e-10)  # kept on the host
    assert ctx.work.steps == tau + 1  # tau fine-tuning steps + the Delta evaluation


def test_ffgg_client_inits():
    zero = ffgg_client(context(0), THETA, QUAD, FineTune("gd", 2, 0.07, "zero"))
    d = design(0)
    np.testing.assert_allclose(zero["delta"].numpy(), grad(d, THETA, hand_gd(d, THETA, np.zeros(DW), 2, 0.07))[0], rtol=1e-10)
    warm_w = np.array([0.5, -0.25])
    warm = ffgg_client(context(0, state={"w": torch.from_numpy(warm_w)}), THETA, QUAD, FineTune("gd", 2, 0.07, "warm"))
    np.testing.assert_allclose(warm["delta"].numpy(), grad(d, THETA, hand_gd(d, THETA, warm_w, 2, 0.07))[0], rtol=1e-10)


def test_local_ffgg_client_by_hand():
    ctx = context(1, round=2)
    out = local_ffgg_client(ctx, THETA, QUAD, FineTune("gd", 3, 0.07, "random"), theta_lr=0.05, local_steps=4)
    expect = hand_local_client(design(1), THETA, w_init(2, 1), 3, 4, 0.07, 0.05)
    np.testing.assert_allclose(out["delta"].numpy(), expect, rtol=1e-10)


# ---------------------------------------------------------------- privacy: w never leaves the host


def quadratic_host(shape: QuadraticShape) -> ClientHostImpl:
    rows = factors(shape, SEED)
    arrays = {"train_x": np.concatenate(rows), "train_y": np.zeros(len(rows) * shape.width, np.int64),
              "test_x": np.zeros((0, shape.width)), "test_y": np.zeros(0, np.int64)}
    clients = {m: np.arange(m * shape.width, (m + 1) * shape.width, dtype=np.int64) for m in range(shape.clients)}
    return ClientHostImpl(0, arrays, clients, None, section_config("model", name="linear"), (shape.width,), 2, SEED)


def test_personal_parameters_never_leave_the_host_quadratic():
    tune = FineTune("gd", 2, 0.05, "random")
    records = {}
    for d_w in (2, 7):  # the upload and download do not grow with the personal part
        shape = QuadraticShape(clients=2, n=12, d_theta=DT, d_w=d_w)
        host = quadratic_host(shape)
        (rec,) = host.run(ffgg_client, [1], 0, {"theta": THETA, "split": QUAD, "tune": tune})
        assert set(rec["values"]) == {"delta", "loss"} and rec["values"]["delta"].shape == (DT,)
        assert rec["bytes_up"] == DT * 8 + 8  # theta-sized float64 gradient + the loss scalar
        assert host.states[1]["w"].shape == (d_w,)  # w stays in the host's state
        records[d_w] = rec
    assert records[2]["bytes_down"] == records[7]["bytes_down"]
    (rec,) = host.run(local_ffgg_client, [0], 0, {"theta": THETA, "split": QUAD, "tune": tune, "theta_lr": 0.1, "local_steps": 2})
    assert set(rec["values"]) == {"delta", "loss"} and rec["bytes_up"] == DT * 8 + 8


def test_personal_parameters_never_leave_the_host_network():
    from rayfl.models import build_model
    from rayfl.models.personal import personal_mask

    rng = np.random.default_rng(0)
    arrays = {"train_x": rng.normal(size=(40, 6)).astype(np.float32), "train_y": rng.integers(0, 3, 40).astype(np.int64),
              "test_x": np.zeros((1, 6), np.float32), "test_y": np.zeros(1, np.int64)}
    cfg = section_config("model", name="mlp", hidden=[5])
    host = ClientHostImpl(0, arrays, {0: np.arange(40, dtype=np.int64)}, None, cfg, (6,), 3, SEED)
    mask = personal_mask(build_model(cfg, (6,), 3), "output")
    theta = np.zeros(int((~mask).sum()), np.float32)
    split = SplitSpec("network", "output", (), 8)
    (rec,) = host.run(ffgg_client, [0], 0, {"theta": theta, "split": split, "tune": FineTune("gd", 3, 0.1, "random")})
    assert set(rec["values"]) == {"delta", "loss"}
    assert rec["values"]["delta"].shape == theta.shape and rec["bytes_up"] == theta.nbytes + 8
    assert host.states[0]["w"].numel() == int(mask.sum()) == 5 * 3 + 3
    assert rec["bytes_down"] < theta.nbytes + 200  # theta and a few scalars/strings, never w


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "override,key",
    [
        ("algorithm.tau=-1", "algorithm.tau"),
        ("algorithm.server_lr=0", "algorithm.server_lr"),
        ("algorithm.w_lr=-0.1", "algorithm.w_lr"),
        ("algorithm.solver=newton", "algorithm.solver"),
        ("algorithm.personal_scheme=middle", "algorithm.personal_scheme"),
        ("algorithm.tau_epochs=0", "algorithm.tau_epochs"),
        ("robust.attack={name: sign_flip, fraction: 0.6}", "robust.attack.fraction"),
        ("robust.aggregator={name: krum, byzantine: -1}", "robust.aggregator.byzantine"),
        ("algorithm.attack={name: sign_flip, count: 1}", "algorithm.attack"),  # moved to robust.attack
    ],
)
def test_bad_config_names_the_field(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.dataset=ffgg_quadratic", "algorithm.name=ffgg", override])
    assert e.value.key == key


def test_bad_local_and_br_config():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=local_ffgg", "algorithm.theta_lr=0"])
    assert e.value.key == "algorithm.theta_lr"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=br_ffgg", "algorithm.participation=0.5", "robust.aggregator.name=median"])
    assert e.value.key == "algorithm.participation"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=br_ffgg", "robust.aggregator.name=mean"])  # Alg. 5 with the mean is ffgg
    assert e.value.key == "robust.aggregator"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.dataset=ffgg_quadratic", "data.d_w=0"])
    assert e.value.key == "data.d_w"


# ---------------------------------------------------------------- Ray: the server loop by hand, 1 vs 2 hosts

ROUNDS = 2


def quad_run(results_dir, run_id: str, *extra: str):
    cfg = load_config(None, [
        "data.dataset=ffgg_quadratic", f"data.n={SHAPE.n}", f"data.d_theta={DT}",
        f"data.d_w={DW}", "partition.method=natural", f"partition.num_clients={SHAPE.clients}",
        "algorithm.clients_per_round=null", "algorithm.participation=1.0", f"run.seed={SEED}", f"run.rounds={ROUNDS}",
        f"output.dir={results_dir}", f"run.run_id={run_id}", *extra,
    ])
    return load(run_experiment(cfg).run_dir)


@pytest.fixture(scope="module")
def ffgg_runs(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("ffgg")
    common = ["algorithm.name=ffgg", "algorithm.solver=gd", "algorithm.tau=3", "algorithm.w_lr=0.07", "algorithm.server_lr=0.05"]
    return {
        hosts: quad_run(out, f"h{hosts}", *common, f"engine.num_hosts={hosts}", "engine.num_cpus_per_host=0.5")
        for hosts in (1, 2)
    }


def oracle() -> QuadraticOracle:
    return QuadraticOracle.from_factors(factors(SHAPE, SEED), DT)


def test_ffgg_rounds_equal_the_hand_computation(ffgg_runs):
    theta, o = np.zeros(DT), oracle()
    rounds = ffgg_runs[1].rounds.sort_values("round")
    for r in range(ROUNDS):
        theta = hand_ffgg_round(theta, r, tau=3, w_lr=0.07, server_lr=0.05)
        row = rounds.iloc[r]
        assert row["F_norm"] == pytest.approx(np.linalg.norm(o.operator(theta)), rel=1e-9)
        assert row["dist_sq"] == pytest.approx(np.sum((theta - o.theta_star) ** 2), rel=1e-9)


def test_ffgg_is_identical_on_1_and_2_hosts(ffgg_runs):
    a, b = ffgg_runs[1], ffgg_runs[2]
    assert a.clients["host"].nunique() == 1 and b.clients["host"].nunique() == 2
    drop = ["wall_time", "host", "run_id"]
    pd.testing.assert_frame_equal(a.rounds.drop(columns=drop, errors="ignore").reset_index(drop=True),
                                  b.rounds.drop(columns=drop, errors="ignore").reset_index(drop=True))
    pd.testing.assert_frame_equal(a.clients.drop(columns=drop, errors="ignore").reset_index(drop=True),
                                  b.clients.drop(columns=drop, errors="ignore").reset_index(drop=True))
    # bytes charged on the clock: theta down (float64) plus a few scalars, theta up plus the loss
    assert (a.clients["bytes_up"] == DT * 8 + 8).all()


def test_local_ffgg_round_equals_the_hand_computation(ray_local, tmp_path):
    res = quad_run(tmp_path, "local", "algorithm.name=local_ffgg", "algorithm.tau=2", "algorithm.w_lr=0.07",
                   "algorithm.theta_lr=0.05", "algorithm.local_epochs=null", "algorithm.local_steps=3", "run.rounds=1")
    theta = np.zeros(DT)
    deltas = [hand_local_client(design(m), theta, w_init(0, m), 2, 3, 0.07, 0.05) for m in range(3)]
    theta = theta - np.mean(deltas, axis=0)  # server_lr 1 (Alg. 4 line 11)
    o = oracle()
    assert res.rounds["F_norm"].iloc[0] == pytest.approx(np.linalg.norm(o.operator(theta)), rel=1e-9)


def test_local_ffgg_with_fedadam_and_a_step_schedule_equals_the_hand_computation(ray_local, tmp_path):
    """Table 2's server FedAdam and client-LR scheduler: round r's clients step at 0.07 / 0.05
    times 0.5**r (w and theta), the server takes torch's Adam step on mean Delta_m."""
    res = quad_run(tmp_path, "local_adam", "algorithm.name=local_ffgg", "algorithm.tau=2", "algorithm.w_lr=0.07",
                   "algorithm.theta_lr=0.05", "algorithm.local_epochs=null", "algorithm.local_steps=3",
                   "algorithm.server_lr=0.05", "algorithm.server_optimizer={name: adam}",
                   "algorithm.round_lr={kind: step, step_rounds: 1, factor: 0.5}")
    p = torch.nn.Parameter(torch.zeros(DT, dtype=torch.float64))
    opt, o = torch.optim.Adam([p], lr=0.05), oracle()
    for r in range(ROUNDS):
        theta, scale = p.detach().numpy().copy(), 0.5**r
        deltas = [hand_local_client(design(m), theta, w_init(r, m), 2, 3, 0.07 * scale, 0.05 * scale) for m in range(3)]
        opt.zero_grad()
        p.grad = torch.tensor(np.mean(deltas, axis=0))
        opt.step()
        want = np.linalg.norm(o.operator(p.detach().numpy()))
        assert res.rounds.sort_values("round")["F_norm"].iloc[r] == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- the quadratic baselines (Fig. 1b-d)


def joint_grad_hand(d: np.ndarray, x: np.ndarray) -> np.ndarray:
    z = np.concatenate([x, [1.0]])
    return (d.T @ (d @ z))[:-1]


X0 = np.array([0.3, -1.2, 0.7, 0.2, -0.4])


def test_local_gd_and_scaffold_clients_by_hand():
    from rayfl.algorithms.l2gd import local_gd_client, scaffold_client

    d = design(0)
    y = X0.copy()
    for _ in range(3):
        y = y - 0.05 * joint_grad_hand(d, y)
    out = local_gd_client(context(0), X0, DT, 3, 0.05)
    np.testing.assert_allclose(out["delta"].numpy(), y - X0, rtol=1e-10)

    c, c_m = np.array([0.1, 0.0, -0.2, 0.3, 0.05]), np.array([-0.1, 0.2, 0.0, 0.1, 0.0])
    ctx = context(0, state={"control": torch.from_numpy(c_m)})
    out = scaffold_client(ctx, X0, c, DT, 3, 0.05, "I")
    y = X0.copy()
    for _ in range(3):
        y = y - 0.05 * (joint_grad_hand(d, y) - c_m + c)
    np.testing.assert_allclose(out["delta"].numpy(), y - X0, rtol=1e-10)
    np.testing.assert_allclose(out["delta_control"].numpy(), joint_grad_hand(d, X0) - c_m, rtol=1e-10)
    out2 = scaffold_client(context(0, state={"control": torch.from_numpy(c_m)}), X0, c, DT, 3, 0.05, "II")
    np.testing.assert_allclose(out2["delta_control"].numpy(), (c_m - c + (X0 - y) / (3 * 0.05)) - c_m, rtol=1e-10)


def test_l2gd_client_and_steps_by_hand():
    from rayfl.algorithms.l2gd import L2GDConfig, l2gd_client, l2gd_steps

    d, mean = design(1), np.array([0.0, 0.5, 0.5, -0.5, 1.0])
    ctx = context(1, state={"x": torch.from_numpy(X0)})
    out = l2gd_client(ctx, mean, DT, 2, 0.01, 0.3)
    x = X0 - 0.3 * (X0 - mean)
    for _ in range(2):
        x = x - 0.01 * joint_grad_hand(d, x)
    np.testing.assert_allclose(out["x"].numpy(), x, rtol=1e-10)
    p, local, mix = l2gd_steps(L2GDConfig(tau=100, lam=0.1), 32, 85.0)
    alpha = 32 / (2 * max(85.0 / 0.99, 0.1 / 0.01))
    assert p == 0.01 and local == pytest.approx(alpha / (32 * 0.99)) and mix == pytest.approx(alpha * 0.1 / (32 * 0.01))
    # alpha_scale = 1/M: the step without the factor M, both steps 32x smaller
    assert l2gd_steps(L2GDConfig(tau=100, lam=0.1, alpha_scale=1 / 32), 32, 85.0) == pytest.approx((p, local / 32, mix / 32))


@pytest.mark.parametrize("key,value", [("lam", 0.0), ("p", 1.0), ("alpha", -1.0), ("alpha_scale", 0.0)])
def test_bad_l2gd_config_names_the_key(key, value):
    from rayfl.algorithms.l2gd import L2GDConfig
    from rayfl.config import ConfigError

    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        L2GDConfig(tau=100, **{key: value}).validate()
