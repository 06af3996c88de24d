"""FedRZO_nn (Alg. 1 of Qiu, Shanbhag, Yousefian, NeurIPS 2023, Sec. 3) and the
zeroth-order pieces it adds to rayfl/zo: local steps against a float64 hand computation, the
one-sided estimator's unbiasedness for the smoothed gradient, every projection, and the same
run on 1 and 2 hosts.

The tiny problem: the 1-hidden-layer ReLU network `relu1` with 3 inputs, 2 hidden units and 2
classes (n = 3*2 + 2 + 2*2 + 2 = 14), mean cross-entropy on 5 rows plus lambda/2 ||x||^2, and
client i's set X_i the ball ||x|| <= 0.5 with x_r outside it (the Moreau term is active):

    v_{i,k} = eta * u,  u = sphere_from_seed(step_direction_seed(seed, r, i, k))
    g = (n / eta^2) (f(x + v) - f(x)) v,   x <- x - gamma (g + (x - P_X(x)) / eta)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.algorithms.fedrzo_nn import DIRECTION_PURPOSE, FedRZONNConfig, fedrzo_nn_client
from rayfl.config import ConfigError, load_config, section_config
from rayfl.engine import ClientContext
from rayfl.models import build_model
from rayfl.results import load
from rayfl.runner import run_experiment
from rayfl.zo import (
    ConstraintConfig,
    forward_difference_estimate,
    moreau_gradient,
    project,
    sample_sphere,
    smoothed_gradient,
    sphere_from_seed,
    step_direction_seed,
)

F_IN, HID, C = 3, 2, 2
N = F_IN * HID + HID + HID * C + C
SEED, ROUND = 7, 3


# ---------------------------------------------------------------- float64 reference


def relu_net_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray, lam: float) -> float:
    """Mean CE of relu(x W1^T + b1) W2^T + b2 (parameters in nn.Sequential order) + lam/2 |w|^2."""
    w = np.asarray(w, np.float64)
    w1, b1, w2, b2 = split(w)
    z = np.maximum(np.asarray(x, np.float64) @ w1.T + b1, 0.0) @ w2.T + b2
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean()) + 0.5 * lam * float(w @ w)


def ball(w: np.ndarray, radius: float) -> np.ndarray:
    return w * min(1.0, radius / np.linalg.norm(w))


def hand_steps(x0, data_x, data_y, client, steps, eta, lr, lam, radius):
    """FedRZO_nn's local steps, full batch, in float64 from the definitions."""
    x = np.asarray(x0, np.float64).copy()
    for k in range(steps):
        v = eta * sphere_from_seed(step_direction_seed(SEED, ROUND, client, k, DIRECTION_PURPOSE), N)
        g = (N / eta**2) * (relu_net_loss(x + v, data_x, data_y, lam) - relu_net_loss(x, data_x, data_y, lam)) * v
        x = x - lr * (g + (x - ball(x, radius)) / eta)
    return x


def split(w: np.ndarray) -> tuple[np.ndarray, ...]:
    """(W1 [HID, F_IN], b1, W2 [C, HID], b2): the flat vector in nn.Sequential's order."""
    cuts = np.cumsum([HID * F_IN, HID, C * HID])
    w1, b1, w2, b2 = np.split(w, cuts)
    return w1.reshape(HID, F_IN), b1, w2.reshape(C, HID), b2


def tiny():
    rng = np.random.default_rng(0)
    data_x = rng.normal(size=(5, F_IN)).astype(np.float32)
    data_y = np.array([0, 1, 1, 0, 1])
    x0 = (rng.normal(size=N) * 0.6).astype(np.float32)  # ||x0|| ~ 2.2 > radius 0.5
    return data_x, data_y, x0


def run_client(client: int, steps: int, x0, data_x, data_y, eta=0.2, lr=0.05, lam=0.1, radius=0.5, **over):
    model = build_model(section_config("model", name="relu1", hidden=[HID]), (F_IN,), C)
    ctx = ClientContext(id=client, round=ROUND, seed=SEED, model=model, device=torch.device("cpu"),
                        x=torch.from_numpy(data_x), y=torch.from_numpy(data_y), test_x=None, test_y=None, state={})
    out = fedrzo_nn_client(ctx, x0, steps, lr, eta, 64, ConstraintConfig(kind="ball", radius=radius), lam, **over)
    return out, ctx


def test_local_steps_match_the_hand_computation_and_directions_are_per_client_and_step():
    """Two local steps of clients 0 and 1 on the same data from the same x_r equal the float64
    hand computation with each client's own v_{i,k}. A flipped sign, a dropped n / eta^2, a
    missing Moreau term or a direction shared by clients or steps moves the result by far more
    than the tolerance (checked below against the hand variants)."""
    data_x, data_y, x0 = tiny()
    eta, lr, lam, radius = 0.2, 0.05, 0.1, 0.5
    outs = {}
    for client in (0, 1):
        out, ctx = run_client(client, 2, x0, data_x, data_y, eta, lr, lam, radius)
        hand = hand_steps(x0, data_x, data_y, client, 2, eta, lr, lam, radius)
        np.testing.assert_allclose(x0 + out["delta"], hand, rtol=1e-5, atol=1e-6)
        assert out["delta"].dtype == np.float32
        assert ctx.work.forward_samples == 2 * 2 * 5 and ctx.work.steps == 2
        assert out["loss"] == pytest.approx(np.mean([relu_net_loss(x0, data_x, data_y, lam),
                                                     relu_net_loss(hand_steps(x0, data_x, data_y, client, 1, eta, lr, lam, radius),
                                                                   data_x, data_y, lam)]), rel=1e-6)
        outs[client] = x0 + out["delta"]
    # the two clients saw the same data and x_r: only their directions differ
    assert np.abs(outs[0] - outs[1]).max() > 1e-2
    # the hand variants a planted bug would produce are all far from the right answer
    x = x0.astype(np.float64)
    v = eta * sphere_from_seed(step_direction_seed(SEED, ROUND, 0, 0, DIRECTION_PURPOSE), N)
    diff = relu_net_loss(x + v, data_x, data_y, lam) - relu_net_loss(x, data_x, data_y, lam)
    good = x - lr * ((N / eta**2) * diff * v + (x - ball(x, radius)) / eta)
    one, _ = run_client(0, 1, x0, data_x, data_y, eta, lr, lam, radius)
    np.testing.assert_allclose(x0 + one["delta"], good, rtol=1e-5, atol=1e-6)
    for bad in (x - lr * (-(N / eta**2) * diff * v + (x - ball(x, radius)) / eta),  # flipped sign
                x - lr * (diff * v + (x - ball(x, radius)) / eta),                    # no n / eta^2
                x - lr * (N / eta**2) * diff * v):                                    # no Moreau term
        assert np.abs(x0 + one["delta"] - bad).max() > 100 * 1e-5 * np.abs(good).max()


def test_without_a_set_there_is_no_moreau_pull_and_central_form_is_the_zo_hfl_one():
    data_x, data_y, x0 = tiny()
    eta, lr = 0.2, 0.05
    model = build_model(section_config("model", name="relu1", hidden=[HID]), (F_IN,), C)
    ctx = ClientContext(id=2, round=ROUND, seed=SEED, model=model, device=torch.device("cpu"),
                        x=torch.from_numpy(data_x), y=torch.from_numpy(data_y), test_x=None, test_y=None, state={})
    out = fedrzo_nn_client(ctx, x0, 1, lr, eta, 64, ConstraintConfig(), 0.0, estimator="central")
    u = sphere_from_seed(step_direction_seed(SEED, ROUND, 2, 0, DIRECTION_PURPOSE), N)
    x = x0.astype(np.float64)
    g = (N / (2 * eta)) * (relu_net_loss(x + eta * u, data_x, data_y, 0) - relu_net_loss(x - eta * u, data_x, data_y, 0)) * u
    np.testing.assert_allclose(x0 + out["delta"], x - lr * g, rtol=1e-5, atol=1e-6)
    assert ctx.work.forward_samples == 3 * 5


# ---------------------------------------------------------------- the estimator


def test_forward_estimator_is_unbiased_for_the_smoothed_gradient_of_a_quadratic():
    """For h(x) = 1/2 x^T A x + b^T x the ball is symmetric, so grad h^eta = A x + b exactly.
    The mean of 20,000 one-sided estimates (n / eta^2)(h(x + v) - h(x)) v must lie within 4.5
    empirical standard errors of it in every coordinate (fixed seed: deterministic). Dropping
    the n / eta^2 factor or flipping the sign moves the mean by 90 or more standard errors."""
    n, eta, samples = 6, 0.5, 20000
    rng = np.random.default_rng(11)
    q = rng.normal(size=(n, n))
    a, b, x = q @ q.T, rng.normal(size=n), rng.normal(size=n)

    def h(z: np.ndarray) -> float:
        return 0.5 * float(z @ a @ z) + float(b @ z)

    grad = a @ x + b
    us = sample_sphere(np.random.default_rng(12), n, samples)
    est = np.array([forward_difference_estimate(h(x + eta * u), h(x), eta * u, eta) for u in us])
    mean, se = est.mean(axis=0), est.std(axis=0) / np.sqrt(samples)
    assert np.all(np.abs(mean - grad) < 4.5 * se), (mean, grad, se)
    assert np.abs(-mean - grad).max() > 100 * se.max()
    assert np.abs(mean * eta**2 / n - grad).max() > 50 * se.max()
    # the Monte-Carlo helper takes the same form
    np.testing.assert_allclose(smoothed_gradient(h, x, eta, np.random.default_rng(12), 2000, form="forward"),
                               est[:2000].mean(axis=0), rtol=1e-9)


def test_forward_estimator_gives_the_smoothed_gradient_of_the_absolute_value():
    """Lemma 1 on a nonsmooth function, exactly: in one dimension the sphere is {-eta, +eta},
    so the mean of the two estimates is (|x + eta| - |x - eta|) / (2 eta) = d/dx |.|^eta,
    which is x / eta inside (-eta, eta) and sign(x) outside."""
    eta = 0.5
    for x, expect in ((0.2, 0.4), (-0.1, -0.2), (1.3, 1.0), (-2.0, -1.0)):
        g = [forward_difference_estimate(abs(x + v), abs(x), np.array([v]), eta)[0] for v in (eta, -eta)]
        assert np.mean(g) == pytest.approx(expect, rel=1e-12)


# ---------------------------------------------------------------- projections


SETS = {
    "box": ConstraintConfig(kind="box", low=-0.3, high=0.5),
    "ball": ConstraintConfig(kind="ball", radius=0.7),
    "halfspace": ConstraintConfig(kind="halfspace", normal=[1.0, -2.0, 0.5, 0.0, 3.0], offset=0.4),
    "halfspace_ones": ConstraintConfig(kind="halfspace", offset=-1.0),
    "simplex": ConstraintConfig(kind="simplex", radius=2.0),
}


def members(kind: str, rng: np.random.Generator, k: int) -> np.ndarray:
    """k points of the set, for the variational inequality."""
    cfg = SETS[kind]
    if kind == "box":
        return rng.uniform(cfg.low, cfg.high, size=(k, 5))
    if kind == "ball":
        return sample_sphere(rng, 5, k) * rng.uniform(0, cfg.radius, size=(k, 1))
    if kind == "simplex":
        return rng.dirichlet(np.ones(5), size=k) * cfg.radius
    a = np.asarray(cfg.normal) if cfg.normal else np.ones(5)
    z = rng.normal(size=(k, 5)) * 3
    return z - np.maximum(z @ a - cfg.offset, 0)[:, None] / (a @ a) * a


@pytest.mark.parametrize("kind", list(SETS))
def test_projection_is_in_the_set_idempotent_and_the_nearest_point(kind):
    """P(y) in X, P(P(y)) = P(y), and (y - P(y))^T (z - P(y)) <= 0 for every z in X (the
    characterisation of the Euclidean projection), for 200 random points and 200 members."""
    cfg = SETS[kind]
    rng = np.random.default_rng(3)
    y = torch.from_numpy(rng.normal(size=(200, 5)) * 3)
    center = torch.zeros(5, dtype=torch.float64)
    p = project(y, center, cfg)
    np.testing.assert_allclose(project(p, center, cfg).numpy(), p.numpy(), atol=1e-12)
    pn = p.numpy()
    if kind == "box":
        assert pn.min() >= cfg.low - 1e-12 and pn.max() <= cfg.high + 1e-12
    elif kind == "ball":
        assert np.linalg.norm(pn, axis=1).max() <= cfg.radius + 1e-12
    elif kind == "simplex":
        assert pn.min() >= 0 and np.allclose(pn.sum(axis=1), cfg.radius, atol=1e-12)
    else:
        a = np.asarray(cfg.normal) if cfg.normal else np.ones(5)
        assert (pn @ a).max() <= cfg.offset + 1e-9
    z = members(kind, rng, 200)
    vi = np.einsum("id,ijd->ij", y.numpy() - pn, z[None, :, :] - pn[:, None, :])
    assert vi.max() <= 1e-9
    assert not np.allclose(pn, y.numpy())  # the test points do leave the set


def test_projections_on_hand_examples():
    two = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    half = ConstraintConfig(kind="halfspace", normal=[1.0, 2.0], offset=1.0)  # excess 2, |a|^2 = 5
    np.testing.assert_allclose(project(two, two[0], half).numpy(), [[0.6, 0.2]], atol=1e-12)
    inside = torch.tensor([[0.2, 0.1]], dtype=torch.float64)
    np.testing.assert_allclose(project(inside, two[0], half).numpy(), inside.numpy())
    simplex = ConstraintConfig(kind="simplex")
    y = torch.tensor([[0.5, 0.5, 2.0], [0.2, 0.3, 0.1]], dtype=torch.float64)
    np.testing.assert_allclose(project(y, y[0], simplex).numpy(), [[0, 0, 1.0], [0.2 + 0.4 / 3, 0.3 + 0.4 / 3, 0.1 + 0.4 / 3]], atol=1e-12)


@pytest.mark.parametrize("kind", ["box", "ball", "halfspace", "simplex"])
def test_moreau_gradient_is_the_gradient_of_the_envelope(kind):
    """(1/eta)(x - P(x)) against central differences of (1/2eta) dist^2(x, X)."""
    cfg, eta = SETS[kind], 0.3
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.normal(size=5) * 2)
    center = torch.zeros(5, dtype=torch.float64)

    def envelope(z: torch.Tensor) -> float:
        return float(((z - project(z, center, cfg)) ** 2).sum()) / (2 * eta)

    h = 1e-6
    fd = np.array([(envelope(x + h * e) - envelope(x - h * e)) / (2 * h) for e in torch.eye(5, dtype=torch.float64)])
    np.testing.assert_allclose(moreau_gradient(x, center, cfg, eta).numpy(), fd, atol=1e-5)
    assert not moreau_gradient(x, center, ConstraintConfig(), eta).any()


# ---------------------------------------------------------------- configuration


def test_configs_name_their_mistakes():
    with pytest.raises(ConfigError, match="algorithm.eta"):
        load_config(None, ["algorithm.name=fedrzo_nn", "algorithm.eta=0"])
    with pytest.raises(ConfigError, match="algorithm.lr"):  # gamma > eta with a set: the Moreau step overshoots
        load_config(None, ["algorithm.name=fedrzo_nn", "algorithm.lr=0.1", "algorithm.eta=0.01",
                           "algorithm.constraint={kind: ball, radius: 1}"])
    with pytest.raises(ConfigError, match=r"algorithm.client_constraints\[1\].radius"):
        load_config(None, ["algorithm.name=fedrzo_nn", "algorithm.client_constraints=[{kind: none}, {kind: simplex, radius: 0}]"])
    with pytest.raises(ConfigError, match="algorithm.constraint.normal"):
        load_config(None, ["algorithm.name=fedrzo_nn", "algorithm.constraint={kind: halfspace, normal: [0, 0]}"])
    with pytest.raises(ConfigError, match="algorithm.local_steps"):
        load_config(None, ["algorithm.name=fedrzo_nn", "algorithm.local_steps=-1"])
    cfg = load_config(None, ["algorithm.name=fedrzo_nn", "algorithm.client_constraints=[{kind: box, low: 0}]"])
    assert isinstance(cfg.algorithm, FedRZONNConfig) and cfg.algorithm.client_constraints[0].low == 0
    assert cfg.algorithm.participation == 1.0 and cfg.algorithm.clients_per_round is None


# ---------------------------------------------------------------- end to end on Ray


def job(results_dir, *extra: str):
    return load_config(None, [
        "data.dataset=digits", "data.test_fraction=0.2", "partition.method=iid", "partition.num_clients=4",
        "model.name=relu1", "model.hidden=[4]", "run.rounds=2", "run.eval_every=1", f"output.dir={results_dir}",
        "algorithm.name=fedrzo_nn", "algorithm.local_steps=3", "algorithm.lr=0.002", "algorithm.eta=0.01",
        "algorithm.weight_decay=0.0001", "algorithm.batch_size=32",
        "algorithm.client_constraints=[{kind: ball, radius: 3}, {kind: box, low: -0.2, high: 0.2}]", *extra,
    ])


def test_fedrzo_nn_runs_identically_on_1_and_2_hosts(ray_local, tmp_path):
    """The same job on one host and on two: the same x_r every round (the objective at x_r and
    each client's local loss agree bit for bit), personal sets active (infeasibility logged)."""
    a = load(run_experiment(job(tmp_path, "run.run_id=one", "engine.num_hosts=1")).run_dir)
    b = load(run_experiment(job(tmp_path, "run.run_id=two", "engine.num_hosts=2", "engine.num_cpus_per_host=0.5")).run_dir)
    ra, rb = a.rounds.sort_values("round"), b.rounds.sort_values("round")
    assert ra["num_updates"].tolist() == [4, 4]
    for col in ("objective", "log_objective", "train_loss", "test_loss", "infeasibility"):
        np.testing.assert_array_equal(ra[col].to_numpy(float), rb[col].to_numpy(float))
    assert (ra["infeasibility"] > 0).all() and np.isfinite(ra["objective"]).all()
    ca, cb = a.clients.sort_values(["round", "client"]), b.clients.sort_values(["round", "client"])
    np.testing.assert_array_equal(ca["local_loss"].to_numpy(), cb["local_loss"].to_numpy())
    assert (ca["local_steps"] == 3).all() and cb["host"].nunique() == 2


# ---------------------------------------------------------------- report


def test_report_draws_fig1_and_its_final_losses_from_runs_it_recognises(tmp_path):
    import pandas as pd

    from rayfl.papers.fedrzo.report import write_fedrzo_report
    from rayfl.results.load import Results

    runs = [("a", 0.1, 1, 2.0), ("b", 0.1, 5, 1.2), ("c", 0.01, 5, 1.3), ("d", 0.01, 5, 1.5)]
    manifests = pd.DataFrame([{"experiment": "fedrzo_fig1", "run_id": rid, "algorithm.name": "fedrzo_nn",
                               "algorithm.eta": eta, "algorithm.local_steps": h, "model.hidden": "[4]",
                               "model.activation": "relu", "run.seed": k, "run.rounds": 2}
                              for k, (rid, eta, h, _) in enumerate(runs)]
                             + [{"experiment": "other", "run_id": "z", "algorithm.name": "fedavg"}])
    rounds = pd.DataFrame([{"experiment": "fedrzo_fig1", "run_id": rid, "round": r, "objective": last + (1 - r)}
                           for rid, _, _, last in runs for r in (0, 1)]
                          + [{"experiment": "other", "run_id": "z", "round": 0, "objective": 9.0}])
    empty = pd.DataFrame()
    lines = write_fedrzo_report(Results(rounds, empty, empty, manifests), tmp_path)
    assert (tmp_path / "fedrzo_fig1.png").is_file() and not (tmp_path / "fedrzo_fig3.png").exists()
    table = pd.read_csv(tmp_path / "fedrzo_fig1_final.csv").set_index(["eta", "H"])
    assert table.loc[(0.1, 1), "final_objective"] == 2.0 and table.loc[(0.01, 5), "seeds"] == 2
    assert table.loc[(0.01, 5), "final_objective"] == pytest.approx(1.4)
    assert any("Fig. 1" in line for line in lines)
    assert write_fedrzo_report(Results(rounds[rounds.experiment == "other"], empty, empty,
                                       manifests[manifests.experiment == "other"]), tmp_path / "none") == []
