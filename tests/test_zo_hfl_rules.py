"""ZO-HFL's update rules, checked by hand on a tiny problem (Alg. 1 and 2 of arXiv 2504.01839).

The model is a linear softmax regression on 3 features x 2 classes without bias (d = 6), so
every quantity of one round can be recomputed in float64 numpy from its definition:

    client (Alg. 2):  y_{t+1} = y_t - a_t (grad CE(y_t) + mu (y_t - c)),  a_t = lr / (t + Gamma),
                      c = x_r +- eta v, from the warm start y_bar (x_r at a client's first call)
    server (Alg. 1):  g_i = (d / 2 eta)(f2(x_r + eta v, y+) - f2(x_r - eta v, y-)) v
                      x_{r+1} = x_r - gamma_r (grad f1~(x_r, xi_r) + sum_i w_i g_i),
                      gamma_r = gamma_0 / (r + 1)^p

The end-to-end test runs the real server loop on the local Ray and spies on `fed.call` to see
x_r, v_{i,r} and the clients' y+- of every round; the other tests call the client function on
a real host and the server-side functions the loop calls (`zo_estimate`, `server_step`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.algorithms.zo_hfl import (
    ZOHFLConfig,
    client_directions,
    server_step,
    zo_estimate,
    zo_hfl_client,
)
from rayfl.config import ConfigError, load_config, section_config
from rayfl.data import FederatedDataset
from rayfl.engine import ClientContext, ClientResult, ServerData
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.system import TaskTiming
from rayfl.results import load
from rayfl.runner import run_experiment
from rayfl.zo import ConstraintConfig, sample_sphere
from rayfl.zo.sphere import direction_seed, sphere_from_seed

F_IN, C = 3, 2
D = F_IN * C


# ---------------------------------------------------------------- float64 references


def ce_loss_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of the bias-free linear model W [C, F] (flattened row-major, as
    nn.Linear's weight) and its gradient (P - onehot)^T X / B."""
    x = np.asarray(x, np.float64)
    z = x @ np.asarray(w, np.float64).reshape(C, F_IN).T
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    rows = np.arange(len(y))
    p = np.exp(logp)
    p[rows, y] -= 1.0
    return float(-logp[rows, y].mean()), (p.T @ x).ravel() / len(y)


def f2(center: np.ndarray, y: np.ndarray, lam: float) -> float:
    e = np.asarray(center, np.float64) - np.asarray(y, np.float64)
    return 0.5 * lam * float(e @ e)


def two_point(x: np.ndarray, v: np.ndarray, eta: float, y_plus: np.ndarray, y_minus: np.ndarray, lam: float) -> np.ndarray:
    x, v = np.asarray(x, np.float64), np.asarray(v, np.float64)
    return (x.size / (2 * eta)) * (f2(x + eta * v, y_plus, lam) - f2(x - eta * v, y_minus, lam)) * v


def hand_solve(y0, center, x, y, steps: int, lr: float, lr_offset: float, mu: float) -> np.ndarray:
    """Alg. 2 with full-batch gradients (batch_size >= the client's rows), no constraint."""
    yt, c = np.asarray(y0, np.float64).copy(), np.asarray(center, np.float64)
    for t in range(steps):
        a = lr / (t + lr_offset)
        yt = yt - a * (ce_loss_grad(yt, x, y)[1] + mu * (yt - c))
    return yt


def result(values: dict, client: int = 0) -> ClientResult:
    return ClientResult(client=client, host=0, values=values, num_samples=0, forward_samples=0, backward_samples=0,
                        local_steps=0, bytes_up=0, bytes_down=0, timing=TaskTiming(0.0, 0.0, 0.0, 0.0),
                        dispatch_time=0.0, finish_time=0.0)


# ---------------------------------------------------------------- server side, as the loop calls it


def test_server_step_is_x_minus_gamma_r_times_f1_gradient_plus_weighted_estimates():
    """Line 8 at r = 3: gamma_3 = 0.3 / sqrt(4) = 0.15 (a constant gamma_0 would give 0.3);
    the f1 gradient and the ZO term enter with the same (descent) sign."""
    rng = np.random.default_rng(0)
    x, g1, e0, e1 = rng.normal(size=(4, D))
    w = np.array([0.25, 0.75])
    cfg = ZOHFLConfig(server_lr=0.3, server_lr_power=0.5)
    x_next, g_zo, gamma = server_step(x, 3, g1, [e0, e1], w, cfg)
    assert gamma == pytest.approx(0.15, rel=1e-12)
    np.testing.assert_allclose(g_zo, 0.25 * e0 + 0.75 * e1, rtol=1e-12)
    np.testing.assert_allclose(x_next, x - 0.15 * (g1 + 0.25 * e0 + 0.75 * e1), rtol=1e-12, atol=1e-12)
    assert server_step(x, 0, g1, [e0, e1], w, cfg)[2] == pytest.approx(0.3, rel=1e-12)
    x_alone, g_alone, _ = server_step(x, 9, g1, [], np.zeros(0), ZOHFLConfig(server_lr=0.3, server_lr_power=1.0))
    np.testing.assert_allclose(x_alone, x - 0.03 * g1, rtol=1e-12)  # no clients (lam = 0): SGD on f1, p = 1
    assert not g_alone.any()


@pytest.mark.parametrize("upload", ["models", "scalars"])
def test_zo_estimate_is_the_two_point_formula(upload):
    """g_i = (d / 2 eta)(f2(x + eta v, y+) - f2(x - eta v, y-)) v, d = 6, eta = 0.2, lam = 1.5:
    from the uploaded models (y+ and y- each on its own side) or from the client's scalars."""
    rng = np.random.default_rng(1)
    x32 = rng.normal(size=D).astype(np.float32)
    v = sample_sphere(rng, D).astype(np.float32).astype(np.float64)
    y_plus, y_minus = rng.normal(size=(2, D)).astype(np.float32)
    cfg = ZOHFLConfig(eta=0.2, lam=1.5, upload=upload)
    fp, fm = f2(x32 + 0.2 * v, y_plus, 1.5), f2(x32 - 0.2 * v, y_minus, 1.5)
    values = {"y_plus": y_plus, "y_minus": y_minus} if upload == "models" else {"f_plus": fp, "f_minus": fm}
    got = zo_estimate(result(values), x32, v, cfg)
    np.testing.assert_allclose(got, (6 / (2 * 0.2)) * (fp - fm) * v, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- client side (Alg. 2, twice)


def test_client_solves_include_the_mu_prox_term():
    """Two steps of Alg. 2 from a warm start y_bar far from x: with mu = 0.8 the returned y+-
    are the hand-computed steps with mu (y - c+-); mu = 0 gives other points (each side's
    distance to the hand mu = 0.8 solution exceeds the tolerance 500 times over)."""
    rng = np.random.default_rng(2)
    n = 5
    arrays = {"train_x": rng.normal(size=(n, F_IN)).astype(np.float32), "train_y": np.array([0, 1, 1, 0, 1]),
              "test_x": np.zeros((1, F_IN), np.float32), "test_y": np.zeros(1, np.int64)}
    x32 = rng.normal(size=D).astype(np.float32)
    v32 = sample_sphere(rng, D).astype(np.float32)
    y_bar = (x32 + rng.normal(size=D)).astype(np.float32)
    eta, lr, lr_offset, steps = 0.3, 0.5, 1.0, 2
    outs, hands = {}, {}
    for mu in (0.8, 0.0):
        host = ClientHostImpl(0, arrays, {0: np.arange(n)}, None, section_config("model", name="linear", bias=False), (F_IN,), C,
                              seed=4)
        host.states[0]["y_bar"] = torch.from_numpy(y_bar.copy())
        (rec,) = host.run(zo_hfl_client, [0], 1, dict(
            params=x32, eta=eta, lam=1.0, mu=mu, lr=lr, lr_offset=lr_offset, batch_size=64,  # full batch
            constraint=ConstraintConfig(), randomness="common", client_init="warm", upload="models",
        ), {0: {"steps": steps, "direction": v32}})
        outs[mu] = rec["values"]
        for side, sign in (("y_plus", 1.0), ("y_minus", -1.0)):
            center = x32.astype(np.float64) + sign * eta * v32
            hands[mu, side] = hand_solve(y_bar, center, arrays["train_x"], arrays["train_y"], steps, lr, lr_offset, mu)
            np.testing.assert_allclose(outs[mu][side], hands[mu, side], atol=2e-6, rtol=1e-5)
        np.testing.assert_allclose(host.states[0]["y_bar"].numpy(), (outs[mu]["y_plus"] + outs[mu]["y_minus"]) / 2)
    for side in ("y_plus", "y_minus"):
        assert np.abs(outs[0.0][side] - hands[0.8, side]).max() > 1e-3


def test_client_pipeline_estimate_is_unbiased_for_the_smoothed_gradient():
    """A client without data has the quadratic lower level h(y) = mu/2 ||y - c||^2, and H steps
    of Alg. 2 from the warm start y_bar give y_H(c) = c + k (y_bar - c) with k = prod_t (1 - a_t mu)
    = 0.5 * 0.75 * (5/6) here. The implicit penalty F(x) = f2(x, y_H(x)) = lam k^2/2 ||x - y_bar||^2
    is quadratic, so grad F^eta = grad F = b = lam k^2 (x - y_bar) and the central difference is
    exact: every client answer plus the server's `zo_estimate` gives g = d (v.b) v. Its mean over
    N directions must be b; with E[v v^T v v^T]-moments of the sphere,
    Cov g = d/(d+2) (|b|^2 I + 2 b b^T) - b b^T, and N (m - b)^T Cov^-1 (m - b) ~ chi^2_6, which
    exceeds 30 with probability 4e-5 (the seed is fixed, so the check is deterministic).
    A dropped mu (k = 1) moves the mean to lam (x - y_bar), ten times b; a flipped sign or a
    dropped d / 2 eta moves it by |b| or 97% of |b|, i.e. by 40 standard errors."""
    eta, lam, mu, lr, steps, n_dirs = 0.1, 2.0, 1.0, 0.5, 3, 4000
    cfg = ZOHFLConfig(eta=eta, lam=lam, mu=mu, lr=lr, lr_offset=1.0)
    rng = np.random.default_rng(3)
    x32 = rng.normal(size=D).astype(np.float32)
    y_bar = (x32 + rng.normal(size=D)).astype(np.float32)
    kappa = float(np.prod([1 - lr / (t + 1.0) * mu for t in range(steps)]))
    b = lam * kappa**2 * (x32.astype(np.float64) - y_bar)
    model = nn.Sequential(nn.Flatten(), nn.Linear(F_IN, C, bias=False))
    empty_x, empty_y = torch.zeros(0, F_IN), torch.zeros(0, dtype=torch.int64)
    dirs = sample_sphere(np.random.default_rng(5), D, n_dirs).astype(np.float32)
    g = np.empty((n_dirs, D))
    for k, v32 in enumerate(dirs):
        ctx = ClientContext(id=0, round=0, seed=0, model=model, device=torch.device("cpu"), x=empty_x, y=empty_y,
                            test_x=None, test_y=None, state={"y_bar": torch.from_numpy(y_bar)})
        out = zo_hfl_client(ctx, x32, steps, eta, lam, mu, lr, 1.0, 64, ConstraintConfig(), direction=v32)
        res = result({key: val.numpy() if isinstance(val, torch.Tensor) else val for key, val in out.items()})
        g[k] = zo_estimate(res, x32, v32.astype(np.float64), cfg)
    v = dirs.astype(np.float64)
    np.testing.assert_allclose(g[:50], D * (v[:50] @ b)[:, None] * v[:50], rtol=1e-4, atol=1e-5 * np.linalg.norm(b))
    cov = D / (D + 2) * (b @ b * np.eye(D) + 2 * np.outer(b, b)) - np.outer(b, b)
    err = g.mean(axis=0) - b
    chi2 = n_dirs * err @ np.linalg.solve(cov, err)
    assert chi2 < 30.0, (chi2, g.mean(axis=0), b)


# ---------------------------------------------------------------- the server loop on Ray


def tiny_dataset() -> FederatedDataset:
    """3 clients of 3, 6 and 4 rows (rho = 3/13, 6/13, 4/13), 8 server rows, 4 test rows."""
    rng = np.random.default_rng(7)
    n_train = 3 + 6 + 4 + 8
    return FederatedDataset(
        name="tiny", num_classes=C, input_shape=(F_IN,),
        train_x=rng.normal(size=(n_train, F_IN)).astype(np.float32), train_y=rng.integers(0, C, n_train).astype(np.int64),
        test_x=rng.normal(size=(4, F_IN)).astype(np.float32), test_y=np.array([0, 1, 0, 1], np.int64),
        client_train=[np.arange(0, 3), np.arange(3, 9), np.arange(9, 13)], server_train=np.arange(13, n_train),
    )


ETA, LAM, MU, LR, GAMMA0, SERVER_BATCH, ROUNDS = 0.5, 1.0, 1.0, 0.5, 0.5, 4, 4


@pytest.fixture(scope="module")
def spied_run(ray_local, tmp_path_factory):
    """A real 4-round ZO-HFL run, 2 of 3 clients per round, H = 2 full-batch steps, with a spy
    on `fed.call` keeping every round's broadcast x_r, directions and client answers."""
    ds = tiny_dataset()
    cfg = load_config(None, [
        "data.dataset=digits", "partition.method=iid", "partition.num_clients=3", "model.bias=false",
        f"run.rounds={ROUNDS}", "run.eval_every=2", "run.seed=3", "engine.num_hosts=1",
        f"output.dir={tmp_path_factory.mktemp('zo_rules') / 'results'}", "run.run_id=rules",
        "algorithm.name=zo_hfl", "algorithm.clients_per_round=2", "algorithm.local_schedule={kind: constant, tau: 2}",
        "algorithm.batch_size=64", f"algorithm.lr={LR}", "algorithm.lr_offset=1.0", f"algorithm.mu={MU}",
        f"algorithm.lam={LAM}", f"algorithm.eta={ETA}", f"algorithm.server_lr={GAMMA0}", "algorithm.server_lr_power=0.5",
        f"algorithm.server_batch_size={SERVER_BATCH}", "algorithm.init=model",
    ])
    calls: list[dict] = []

    def spy_on(run_dir, fed) -> None:
        real = fed.call

        def call(client_ids, fn, **kw):
            results = real(client_ids, fn, **kw)
            calls.append({**kw, "fn": fn, "results": results})
            return results

        fed.call = call

    outcome = run_experiment(cfg, dataset=ds, on_start=spy_on)
    return ds, cfg, calls, load(outcome.run_dir).rounds.sort_values("round").reset_index(drop=True)


def test_real_run_matches_alg1_and_alg2_by_hand(spied_run):
    """Every client answer of every round is Alg. 2 from its warm start (x_r at a client's
    first call, its last (y+ + y-)/2 after), and every server step r -> r + 1 (r = 0, 1, 2:
    gamma_r = 0.5, 0.354, 0.289) is x_r - gamma_r (grad f1~(x_r; xi_r) + sum_i w_i g_i) on
    the minibatch xi_r the server draws, with w_i = rho_i / sum_{j in S_r} rho_j."""
    ds, cfg, calls, rounds = spied_run
    assert [c["round"] for c in calls] == list(range(ROUNDS)) and all(c["fn"] is zo_hfl_client for c in calls)
    rho = ds.client_sizes() / ds.client_sizes().sum()
    server = ServerData(torch.from_numpy(ds.train_x[ds.server_train]), torch.from_numpy(ds.train_y[ds.server_train]),
                        cfg.run.seed)
    y_bar: dict[int, np.ndarray] = {}
    mu_matters = 0.0
    for r, call in enumerate(calls):
        x = call["params"].astype(np.float64)
        assert call["mu"] == MU and len(call["results"]) == 2
        g_zo = np.zeros(D)
        clients = [res.client for res in call["results"]]
        for res in call["results"]:
            i, extra = res.client, call["per_client"][res.client]
            v = extra["direction"].astype(np.float64)
            assert extra["steps"] == 2 and abs(np.linalg.norm(v) - 1) < 1e-6
            rows = ds.client_train[i]
            start = y_bar.get(i, x)
            for side, sign in (("y_plus", 1.0), ("y_minus", -1.0)):
                want = hand_solve(start, x + sign * ETA * v, ds.train_x[rows], ds.train_y[rows], 2, LR, 1.0, MU)
                np.testing.assert_allclose(res[side], want, atol=5e-6, rtol=1e-5, err_msg=f"round {r} client {i} {side}")
                no_mu = hand_solve(start, x + sign * ETA * v, ds.train_x[rows], ds.train_y[rows], 2, LR, 1.0, 0.0)
                mu_matters = max(mu_matters, float(np.abs(no_mu - want).max()))
            y_bar[i] = (res["y_plus"].astype(np.float64) + res["y_minus"]) / 2
            g_zo += rho[i] / rho[clients].sum() * two_point(x, v, ETA, res["y_plus"], res["y_minus"], LAM)
        xb, yb = server.batch(SERVER_BATCH, r, purpose="zo_hfl.server_batch")
        f1_loss, g1 = ce_loss_grad(x, xb.numpy(), yb.numpy())
        gamma = GAMMA0 / np.sqrt(r + 1)
        row = rounds.iloc[r]
        assert row["server_lr"] == pytest.approx(gamma, rel=1e-12)
        assert row["server_loss"] == pytest.approx(f1_loss, rel=1e-5)
        assert row["zo_grad_norm"] == pytest.approx(np.linalg.norm(g_zo), rel=1e-5)
        assert row["num_updates"] == 2
        if r + 1 < len(calls):
            x_next = x - gamma * (g1 + g_zo)
            np.testing.assert_allclose(calls[r + 1]["params"], x_next, atol=2e-6, rtol=1e-5, err_msg=f"x_{r + 1}")
            assert np.abs(gamma * g1).max() > 1e-2 and np.abs(gamma * g_zo).max() > 1e-2  # both terms visible
    assert mu_matters > 1e-2  # the mu (y - c) term moves y+- far beyond the tolerance
    assert len(y_bar) == 3  # every client was sampled at least once, most of them warm-started


# ---------------------------------------------------------------- readings the paper leaves open


def test_zo_dimension_sets_the_n_of_n_over_2_eta():
    """`zo_dimension: 3` (Sec. IV's n as a feature count) gives (3 / 2 eta)(f+ - f-) v for a
    d = 6 model: half of the default (d / 2 eta) estimate, computed by hand."""
    rng = np.random.default_rng(5)
    x32 = rng.normal(size=D).astype(np.float32)
    v = sample_sphere(rng, D).astype(np.float32).astype(np.float64)
    y_plus, y_minus = rng.normal(size=(2, D)).astype(np.float32)
    fp, fm = f2(x32 + 0.2 * v, y_plus, 1.5), f2(x32 - 0.2 * v, y_minus, 1.5)
    res = result({"y_plus": y_plus, "y_minus": y_minus})
    got = zo_estimate(res, x32, v, ZOHFLConfig(eta=0.2, lam=1.5, zo_dimension=3))
    np.testing.assert_allclose(got, (3 / (2 * 0.2)) * (fp - fm) * v, rtol=1e-9, atol=1e-12)
    default = zo_estimate(res, x32, v, ZOHFLConfig(eta=0.2, lam=1.5))
    np.testing.assert_allclose(default, (6 / (2 * 0.2)) * (fp - fm) * v, rtol=1e-9, atol=1e-12)


def test_direction_radius_eta_sends_and_uses_v_on_eta_sphere():
    """`direction_radius: eta` (Sec. II's v in eta S): client i gets v = eta u, u its unit
    direction of round r, so it solves at x +- eta^2 u, and g_i = (d / 2 eta)(f2(x + eta^2 u, y+)
    - f2(x - eta^2 u, y-)) eta u, by hand; `unit` sends u itself."""
    eta, r, seed = 0.3, 4, 11
    x32 = np.arange(D, dtype=np.float32) / 10
    for radius, scale in (("eta", eta), ("unit", 1.0)):
        directions = client_directions(seed, r, [0, 2], D, ZOHFLConfig(eta=eta, lam=2.0, direction_radius=radius))
        for i in (0, 2):
            u = sphere_from_seed(direction_seed(seed, r, i), D)
            assert directions[i][0] == direction_seed(seed, r, i)
            np.testing.assert_allclose(directions[i][1], (scale * u).astype(np.float32))
    shared = client_directions(seed, r, [0, 2], D, ZOHFLConfig(directions="shared"))
    np.testing.assert_array_equal(shared[0][1], shared[2][1])
    v = client_directions(seed, r, [0], D, ZOHFLConfig(eta=eta, lam=2.0, direction_radius="eta"))[0][1].astype(np.float64)
    u = v / eta
    rng = np.random.default_rng(6)
    y_plus, y_minus = rng.normal(size=(2, D))
    hand = (D / (2 * eta)) * (f2(x32 + eta**2 * u, y_plus, 2.0) - f2(x32 - eta**2 * u, y_minus, 2.0)) * eta * u
    got = zo_estimate(result({"y_plus": y_plus, "y_minus": y_minus}), x32, v,
                      ZOHFLConfig(eta=eta, lam=2.0, direction_radius="eta"))
    np.testing.assert_allclose(got, hand, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.zo_dimension=0", "algorithm.zo_dimension"),
        ("algorithm.zo_dimension=-784", "algorithm.zo_dimension"),
        ("algorithm.zo_dimension=7.5", "algorithm.zo_dimension"),
        ("algorithm.direction_radius=half", "algorithm.direction_radius"),
    ],
)
def test_bad_open_reading_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=zo_hfl", override])
    assert e.value.key == key


def test_eta_radius_with_seed_directions_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=zo_hfl", "algorithm.direction_radius=eta", "algorithm.send_direction=seed"])
    assert e.value.key == "algorithm.direction_radius"
