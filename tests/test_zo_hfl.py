"""ZO-HFL: the client's two lower-level solves, what it pays in bytes, the toy bilevel problem,
the baselines' matched budget, and short end-to-end runs on a real local Ray."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.algorithms.zo_hfl import aggregation_weights, zo_hfl_client
from rayfl.config import Config, ConfigError, load_config, section_config
from rayfl.engine.host import ClientHostImpl
from rayfl.papers.zo_hfl.toy import implicit_value, lower_level, run_toy
from rayfl.results import load
from rayfl.runner import run_experiment
from rayfl.zo import ConstraintConfig, direction_seed, sphere_from_seed

D = 8 * 8 * 4  # inputs 8x8, 4 classes, no bias


def make_host(n: int = 60, seed: int = 0) -> ClientHostImpl:
    rng = np.random.default_rng(0)
    arrays = {
        "train_x": rng.normal(size=(2 * n, 1, 8, 8)).astype(np.float32),
        "train_y": rng.integers(0, 4, 2 * n).astype(np.int64),
        "test_x": np.zeros((1, 1, 8, 8), np.float32),
        "test_y": np.zeros(1, np.int64),
    }
    clients = {0: np.arange(n, dtype=np.int64), 1: np.arange(n, 2 * n, dtype=np.int64)}
    return ClientHostImpl(0, arrays, clients, None, section_config("model", name="linear", bias=False), (1, 8, 8), 4, seed,
                          flops_per_sample=1.0)


def payload(**over):
    base = dict(params=np.full(D, 0.01, np.float32), eta=0.1, lam=1.0, mu=0.1, lr=0.1, lr_offset=1.0,
                batch_size=16, constraint=ConstraintConfig(), randomness="common", client_init="warm", upload="models")
    base.update(over)
    return base


def solve(host: ClientHostImpl, round: int = 0, steps: int = 5, client: int = 0, seed_mode: bool = False, **over):
    s = direction_seed(11, round, client)
    extra = {"steps": steps, **({"direction_seed": s} if seed_mode else {"direction": sphere_from_seed(s, D).astype(np.float32)})}
    (rec,) = host.run(zo_hfl_client, [client], round, payload(**over), {client: extra})
    return rec


def test_client_sends_and_receives_what_the_options_say():
    vector, seeded = solve(make_host()), solve(make_host(), seed_mode=True)
    np.testing.assert_array_equal(vector["values"]["y_plus"], seeded["values"]["y_plus"])  # same v, rebuilt from 8 bytes
    assert vector["bytes_down"] - seeded["bytes_down"] == 4 * D - 8
    assert vector["bytes_up"] == 2 * 4 * D + 8  # y+, y- in float32 and the loss
    assert vector["local_steps"] == 10 and vector["backward_samples"] == 10 * 16  # 2 H gradient steps
    scalars = solve(make_host(), upload="scalars")
    assert scalars["bytes_up"] == 4 * 8 and set(scalars["values"]) == {"f_plus", "f_minus", "gap", "loss"}
    y_p, y_m, x = vector["values"]["y_plus"], vector["values"]["y_minus"], np.full(D, 0.01, np.float32)
    v = sphere_from_seed(direction_seed(11, 0, 0), D).astype(np.float32)
    f_plus = 0.5 * np.sum((x + np.float32(0.1) * v - y_p).astype(np.float64) ** 2)
    assert scalars["values"]["f_plus"] == pytest.approx(f_plus, rel=1e-5)
    assert scalars["values"]["gap"] == pytest.approx(np.sum((x - (y_p + y_m) / 2).astype(np.float64) ** 2), rel=1e-5)


def test_common_random_numbers_pair_the_two_solves():
    """With eta -> 0 both solves face the same problem: under common random numbers they are
    identical; independent minibatches make them differ by SGD noise."""
    common = solve(make_host(), eta=0.0)["values"]
    np.testing.assert_array_equal(common["y_plus"], common["y_minus"])
    indep = solve(make_host(), eta=0.0, randomness="independent")["values"]
    assert np.abs(indep["y_plus"] - indep["y_minus"]).max() > 1e-4
    np.testing.assert_array_equal(solve(make_host(), eta=0.0)["values"]["y_plus"], common["y_plus"])  # reproducible


def test_warm_start_straggler_and_ball_constraint():
    host = make_host()
    first = solve(host, round=0, steps=8)["values"]
    idle = solve(host, round=1, steps=0)  # H = 0: both solves return the projected warm start
    y_bar = (first["y_plus"] + first["y_minus"]) / 2
    np.testing.assert_allclose(idle["values"]["y_plus"], y_bar, atol=1e-7)
    np.testing.assert_allclose(idle["values"]["y_minus"], y_bar, atol=1e-7)
    assert idle["local_steps"] == 0 and np.isnan(idle["values"]["loss"])
    ball = ConstraintConfig(kind="ball", radius=0.05)
    out = solve(make_host(), steps=20, lr=1.0, constraint=ball)["values"]
    x = np.full(D, 0.01, np.float32)
    v = sphere_from_seed(direction_seed(11, 0, 0), D).astype(np.float32)
    assert np.linalg.norm(out["y_plus"] - (x + 0.1 * v)) <= 0.05 + 1e-5
    assert np.linalg.norm(out["y_minus"] - (x - 0.1 * v)) <= 0.05 + 1e-5
    unconstrained = solve(make_host(), steps=20, lr=1.0)["values"]
    assert np.linalg.norm(unconstrained["y_plus"] - (x + 0.1 * v)) > 0.1


def test_toy_bilevel_problem_decreases_f():
    """The appendix toy: f(x) = 1/2||x + 1 - Pi_+[x]||^2 = sum g(x_i); ZO-HFL from (-2, -2)
    reaches the minimiser x = (-1, -1) region, and from a kink-straddling start it still descends."""
    assert implicit_value(np.array([-2.0, 0.7])) == pytest.approx(0.5 * 1.0 + 0.5)
    np.testing.assert_allclose(lower_level(np.array([-1.0, 0.7]), steps=40), [0.0, 0.7], atol=1e-3)
    run = run_toy(np.array([-2.0, -2.0]), rounds=200, seed=1)
    assert run.f[0] == pytest.approx(1.0) and run.f[-1] < 0.02
    np.testing.assert_allclose(run.x[-1], [-1.0, -1.0], atol=0.15)
    kinked = run_toy(np.array([0.5, -2.5]), rounds=200, seed=2)
    assert kinked.f[-1] < kinked.f[0] - 1.0  # 1.625 -> about 0.5 (the plateau coordinate stays)


def test_aggregation_weights():
    rho = np.array([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(aggregation_weights(rho, [1, 3], 2, "participants"), [1 / 3, 2 / 3])
    np.testing.assert_allclose(aggregation_weights(rho, [1, 3], 2, "unbiased"), [0.4, 0.8])
    assert aggregation_weights(rho, [], 2, "participants").size == 0


def test_configs_name_their_mistakes():
    with pytest.raises(ConfigError, match="local_schedule"):
        load_config(None, ["algorithm.name=zo_hfl", "algorithm.local_steps=5"])
    with pytest.raises(ConfigError, match="local_schedule"):
        load_config(None, ["algorithm.name=fedavg", "algorithm.local_schedule={kind: sqrt, tau: 5}"])
    with pytest.raises(ConfigError, match="algorithm.eta"):
        load_config(None, ["algorithm.name=zo_hfl", "algorithm.eta=0"])
    with pytest.raises(ConfigError, match="weight_decay"):
        load_config(None, ["algorithm.name=zo_hfl", "algorithm.weight_decay=0.1"])
    cfg = load_config(None, ["algorithm.name=scaffold", "algorithm.local_epochs=null",
                             "algorithm.local_schedule={kind: constant, tau: 3}"])
    assert cfg.algorithm.local_schedule.tau == 3


# ---------------------------------------------------------------- end to end on Ray


def digits(results_dir, *extra: str):
    return load_config(None, [
        "data.dataset=digits", "data.test_fraction=0.1", "data.server_fraction=0.3",
        "partition.method=dirichlet", "partition.num_clients=6", "partition.alpha=1", "partition.min_size=10",
        "model.bias=false", "run.rounds=4", "run.eval_every=2", f"output.dir={results_dir}",
        "algorithm.clients_per_round=null", "algorithm.participation=0.5", *extra,
    ])


def zo(results_dir, *extra: str):
    return digits(results_dir, "algorithm.name=zo_hfl", "algorithm.local_schedule={kind: sqrt, tau: 3}",
                  "algorithm.server_lr=0.05", *extra)


@pytest.fixture(scope="module")
def zo_run(ray_local, tmp_path_factory):
    """ZO-HFL with models uploaded and vectors sent, on one host (shared by the tests below)."""
    out = tmp_path_factory.mktemp("zo") / "results"
    return out, load(run_experiment(zo(out, "run.run_id=models", "engine.num_hosts=1")).run_dir)


def test_zo_hfl_runs_identically_on_2_hosts_and_in_every_message_mode(zo_run):
    out, a = zo_run
    b = load(run_experiment(zo(out, "run.run_id=scalars", "engine.num_hosts=2", "engine.num_cpus_per_host=0.5",
                               "algorithm.upload=scalars", "algorithm.send_direction=seed")).run_dir)
    ra, rb = a.rounds.sort_values("round"), b.rounds.sort_values("round")
    assert {"global_loss", "f1", "penalty", "train_ce", "server_loss", "zo_grad_norm"} <= set(ra.columns)
    assert ra["num_updates"].tolist() == [3, 3, 3, 3]
    for col in ("test_accuracy", "f1", "train_ce", "server_loss", "zo_grad_norm"):  # the same trajectory
        np.testing.assert_allclose(ra[col].to_numpy(float), rb[col].to_numpy(float), rtol=1e-4, equal_nan=True)
    assert ra["zo_grad_norm"].iloc[0] > 0 and ra["test_accuracy"].notna().sum() == 2
    # the logged penalty is exact for the current x with models, from last reported gaps with scalars
    assert (ra["penalty"].dropna() > 0).all() and (rb["penalty"].dropna() > 0).all()
    ca, cb = a.clients.sort_values(["round", "client"]), b.clients.sort_values(["round", "client"])
    assert ca["local_steps"].tolist() == cb["local_steps"].tolist()
    first = [c[c["round"] == 0]["local_loss"].to_numpy() for c in (ca, cb)]  # x_0 = 0 in both: bit for bit
    np.testing.assert_array_equal(first[0], first[1])
    assert set(ca.groupby("round")["local_steps"].first()) == {2 * 3, 2 * 5, 2 * 6}  # 2 ceil(3 sqrt(r+1))
    assert cb["bytes_up"].max() == 32 and ca["bytes_up"].min() == 2 * 4 * 640 + 8
    assert (ca["host"] == 0).all() and cb["host"].nunique() == 2


def test_baselines_share_the_budget_and_can_use_server_data(zo_run):
    out, zo_results = zo_run
    served = load(run_experiment(digits(
        out, "algorithm.name=scaffold", "run.run_id=served", "algorithm.server_as_client=true",
        "algorithm.local_epochs=null", "algorithm.local_schedule={kind: sqrt, tau: 3}",
        "algorithm.lr_schedule=harmonic", "algorithm.lr=0.1", "algorithm.batch_size=16")).run_dir)
    steps = served.clients.groupby("round")["local_steps"].agg(["min", "max"])
    assert steps["min"].tolist() == steps["max"].tolist() == [3, 5, 6, 6]  # H = ceil(3 sqrt(r + 1))
    pd.testing.assert_series_equal(  # the same clients in every round, whatever the method
        served.clients.groupby("round")["client"].apply(list), zo_results.clients.groupby("round")["client"].apply(list))
    assert served.rounds["num_updates"].tolist() == [4, 4, 4, 4]  # 3 clients + the server's always-on update
    lam0 = zo(out, "run.run_id=lam0", "algorithm.lam=0")
    server_only = load(run_experiment(lam0).run_dir)
    assert server_only.rounds["num_updates"].tolist() == [0, 0, 0, 0] and server_only.clients.empty
    # lam = 0: plain SGD on f1, x_{r+1} = x_r - gamma_r grad f1(x_r; xi_r), replayed by hand on
    # the server's own minibatches; from round 1 on the logged f1 depends on which batches they were
    logged = server_only.rounds.sort_values("round")["server_loss"].to_numpy(float)
    expected, wrong_batch = replay_server_sgd(lam0)
    np.testing.assert_allclose(logged, expected, rtol=1e-5)
    assert np.all(np.abs(logged[1:] - wrong_batch[1:]) > 1e-3)  # another minibatch: visibly different
    assert server_only.rounds["test_accuracy"].notna().sum() == 2


def softmax_ce(w: np.ndarray, x: np.ndarray, y: np.ndarray, classes: int) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of the bias-free linear model w (classes x features, row-major) and
    its gradient, in float64 (independent of rayfl's kernels)."""
    feats = x.reshape(len(x), -1).astype(np.float64)
    z = feats @ w.reshape(classes, -1).T
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    onehot = np.eye(classes)[y]
    grad = (np.exp(logp) - onehot).T @ feats / len(x)
    return float(-(logp * onehot).sum() / len(x)), grad.ravel()


def replay_server_sgd(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """The f1 values ZO-HFL with lam = 0 logs (x_0 = 0), and what it would log if each round's
    f1 were taken on the next round's minibatch instead."""
    from rayfl.data import build_federated_dataset
    from rayfl.engine.evaluation import ServerData

    ds = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    idx = ds.server_train
    server = ServerData(torch.from_numpy(ds.train_x[idx]), torch.from_numpy(ds.train_y[idx]), cfg.run.seed)
    alg, c = cfg.algorithm, ds.num_classes
    batches = [server.batch(alg.server_batch_size, r, purpose="zo_hfl.server_batch") for r in range(cfg.run.rounds + 1)]
    batches = [(bx.numpy(), by.numpy()) for bx, by in batches]
    x = np.zeros(int(np.prod(ds.input_shape)) * c)
    losses, others = [], []
    for r in range(cfg.run.rounds):
        x32 = x.astype(np.float32).astype(np.float64)
        loss, grad = softmax_ce(x32, *batches[r], c)
        losses.append(loss)
        others.append(softmax_ce(x32, *batches[r + 1], c)[0])
        x = x - alg.server_lr / (r + 1) ** alg.server_lr_power * grad
    return np.array(losses), np.array(others)


def test_linear_fast_path_keeps_fedavg_trajectory():
    """The closed-form gradient draws the same minibatches and computes the same update as the
    autograd path it replaced (run here on a model the fast path does not recognise)."""
    from torch import nn

    from rayfl.algorithms.local import LocalSchedule, local_sgd
    from rayfl.engine.context import ClientContext

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 8, 8, generator=gen), torch.randint(0, 4, (40,), generator=gen)
    start = torch.randn(D, generator=gen) * 0.1
    outs = []
    for model in (nn.Sequential(nn.Flatten(), nn.Linear(64, 4, bias=False)),
                  nn.Sequential(nn.Flatten(), nn.Linear(64, 4, bias=False), nn.Identity())):
        ctx = ClientContext(id=0, round=1, seed=5, model=model, device=torch.device("cpu"), x=x, y=y,
                            test_x=None, test_y=None, state={})
        outs.append(local_sgd(ctx, start, 0.1, LocalSchedule(8, None, 12, 1.0), prox_mu=0.1, prox_center=start))
        assert ctx.work.steps == 12
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-6, rtol=1e-5)
    assert outs[0][1] == pytest.approx(outs[1][1], rel=1e-5)
