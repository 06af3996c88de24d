"""ComFedL's personalized-FL baselines, one full round (client and server) against float64 hand
computations: Per-FedAvg (uniform mean of MAML local steps), federated TR-MAML (p-weighted
mean, projected ascent on p) and Ditto (global FedAvg + persistent lam-proximal personal
models), and FedAvg with the one-step adaptation at evaluation.

The model is the bias-free linear softmax regression on 3 features x 3 classes (d = 9), whose
CE gradient and Hessian have closed forms. The algorithms run under the synchronous driver on `InProcessFed`,
a Federation stand-in that runs client functions on one in-process `ClientHostImpl` (no Ray);
the real Ray engine runs Ditto on 1 and 2 hosts (determinism; the jobs in jobs/comfedl/ run the
others on Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rayfl.algorithms.ditto import Ditto, DittoConfig, ditto_client
from rayfl.algorithms.fedavg_adapt import FedAvgAdapt, FedAvgAdaptConfig
from rayfl.algorithms.local import LocalSchedule
from rayfl.algorithms.per_fedavg import PerFedAvg, PerFedAvgConfig
from rayfl.algorithms.tr_maml import TRMAML, TRMAMLConfig, project_simplex
from rayfl.config import ConfigError, RunConfig, load_config, section_config
from rayfl.data import FederatedDataset
from rayfl.driver import drive
from rayfl.engine import ClientResult
from rayfl.engine.evaluation import evaluate_arrays
from rayfl.engine.host import ClientHostImpl
from rayfl.engine.system import TaskTiming
from rayfl.models import build_model
from rayfl.results import load
from rayfl.rng import numpy_rng
from rayfl.runner import run_experiment

F_IN, C = 3, 3
D = F_IN * C
SEED = 3


# ---------------------------------------------------------------- float64 references


def ce_grad_hess(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean CE of W [C, F] (row-major flat, as nn.Linear's weight), its gradient and Hessian."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    z = x @ w.reshape(C, F_IN).T
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(p[rows, y]).mean())
    r = p.copy()
    r[rows, y] -= 1.0
    hess = sum(np.kron(np.diag(pn) - np.outer(pn, pn), np.outer(xn, xn)) for pn, xn in zip(p, x, strict=True)) / len(y)
    return loss, (r.T @ x).ravel() / len(y), hess


def hand_batches(round: int, client: int, n: int, b: int, b1: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (support, query) index pairs of `per_fedavg.support_query_batches`."""
    rng = numpy_rng(SEED, "maml.batches", round, client)
    b, b1 = min(b, n), min(b1, n)
    out = []
    for _ in range(steps):
        perm = rng.permutation(n)
        out.append((perm[:b], perm[b : b + b1] if b + b1 <= n else rng.permutation(n)[:b1]))
    return out


def hand_maml_client(w0, x, y, round, client, cfg) -> tuple[np.ndarray, float]:
    """tau steps w <- w - beta (I - alpha H_S(w)) grad l_Q(w - alpha grad l_S(w)): (delta, L_0)."""
    w = np.asarray(w0, np.float64).copy()
    first = None
    for s, q in hand_batches(round, client, len(y), cfg.batch_size, cfg.outer_batch_size, cfg.local_steps):
        _, g_s, h_s = ce_grad_hess(w, x[s], y[s])
        loss_q, g_q, _ = ce_grad_hess(w - cfg.inner_lr * g_s, x[q], y[q])
        first = loss_q if first is None else first
        w = w - cfg.lr * (g_q - cfg.inner_lr * h_s @ g_q)
    return w - w0, first


# ---------------------------------------------------------------- the tiny problem and a Ray-free federation


def tiny_dataset() -> FederatedDataset:
    """Client 0: 10 train rows (support and query disjoint), client 1: 4 (they overlap);
    3 validation rows each, 4 global test rows."""
    rng = np.random.default_rng(7)
    return FederatedDataset(
        name="tiny", num_classes=C, input_shape=(F_IN,),
        train_x=rng.normal(size=(14, F_IN)).astype(np.float32), train_y=rng.integers(0, C, 14).astype(np.int64),
        test_x=rng.normal(size=(10, F_IN)).astype(np.float32), test_y=rng.integers(0, C, 10).astype(np.int64),
        client_train=[np.arange(0, 10), np.arange(10, 14)], client_test=[np.arange(0, 3), np.arange(3, 6)],
    )


class InProcessFed:
    """What the server loops read from a Federation, with client functions run on one
    in-process host (every task accepted and committed at once)."""

    def __init__(self, ds: FederatedDataset, x0: np.ndarray):
        self.dataset, self.x0 = ds, x0.astype(np.float32)
        arrays = {"train_x": ds.train_x, "train_y": ds.train_y, "test_x": ds.test_x, "test_y": ds.test_y}
        self.model_cfg = section_config("model", name="linear", bias=False)
        self.host = ClientHostImpl(0, arrays, dict(enumerate(ds.client_train)), dict(enumerate(ds.client_test)),
                                   self.model_cfg, ds.input_shape, ds.num_classes, SEED)
        self.calls: list[tuple[str, int, dict[str, Any]]] = []
        self.evals: list[tuple[int, int, str, dict[str, Any]]] = []
        self.logged: list[dict[str, Any]] = []
        self.server_state: Any = None

    pipeline = None

    @property
    def num_clients(self) -> int:
        return self.dataset.num_clients

    @property
    def client_sizes(self) -> np.ndarray:
        return self.dataset.client_sizes()

    def initial_params(self) -> np.ndarray:
        return self.x0.copy()

    def track(self, state):
        self.server_state = state
        return state

    def rounds(self, total: int) -> range:
        return range(total)

    def sample(self, round: int, k: int | None = None, fraction: float | None = None) -> list[int]:
        return list(range(self.num_clients))

    def client_weights(self, ids: list[int], kind: str = "samples") -> np.ndarray:
        w = self.dataset.client_sizes()[ids].astype(np.float64) if kind == "samples" else np.ones(len(ids))
        return w / w.sum()

    def call(self, ids, fn, *, round, per_client=None, phase="train", timed=True, keep=(), expect_weights=None,
             **payload):
        self.calls.append((phase, round, payload))
        recs = self.host.run(fn, list(ids), round, payload, per_client)
        return [ClientResult(client=r["client"], host=0, values=r["values"], num_samples=r["num_samples"],
                             forward_samples=0, backward_samples=0, local_steps=r["local_steps"], bytes_up=0,
                             bytes_down=0, timing=TaskTiming(0.0, 0.0, 0.0, 0.0), dispatch_time=0.0, finish_time=0.0)
                for r in recs]

    def weighted_sum(self, results, key, weights) -> np.ndarray:
        return sum(w * np.asarray(r[key], dtype=np.float64) for r, w in zip(results, weights, strict=True))

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        model = build_model(self.model_cfg, self.dataset.input_shape, C)
        return evaluate_arrays(model, params, self.dataset.test_x, self.dataset.test_y, prefix="test_")

    def log_eval(self, round, metrics, client=-1, split="test"):
        self.evals.append((round, client, split, dict(metrics)))

    def log_round(self, round, **metrics):
        self.logged.append({"round": round, **metrics})

    def eval_row(self, round: int, client: int, split: str) -> dict[str, Any]:
        (row,) = [m for r, c, s, m in self.evals if (r, c, s) == (round, client, split)]
        return row


def client_data(ds: FederatedDataset, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    tr, te = ds.client_train[c], ds.client_test[c]
    return ds.train_x[tr], ds.train_y[tr], ds.test_x[te], ds.test_y[te]


def x0() -> np.ndarray:
    return np.random.default_rng(11).normal(scale=0.5, size=D).astype(np.float32)


# ---------------------------------------------------------------- Per-FedAvg


def test_per_fedavg_round_is_the_uniform_mean_of_second_order_maml_steps():
    """x1 = x0 + (delta_0 + delta_1) / 2 (uniform, although the clients hold 10 and 4 rows),
    each delta two second-order MAML steps; the personalized evaluation adapts with the inner
    lr: client 1's validation loss after w <- x1 - alpha grad l(x1) on its 4 rows."""
    ds, start = tiny_dataset(), x0()
    cfg = PerFedAvgConfig(lr=0.3, inner_lr=0.4, local_steps=2, batch_size=4, outer_batch_size=3, clients_per_round=2)
    fed = InProcessFed(ds, start)
    drive(fed, PerFedAvg, cfg, RunConfig(rounds=1, eval_every=1))
    deltas = [hand_maml_client(start, *client_data(ds, c)[:2], 0, c, cfg)[0] for c in (0, 1)]
    hand = start + 0.5 * (deltas[0] + deltas[1])
    np.testing.assert_allclose(fed.server_state.x, hand, rtol=1e-5, atol=2e-6)
    xtr, ytr, xva, yva = client_data(ds, 1)
    adapted = hand - 0.4 * ce_grad_hess(hand, xtr, ytr)[1]
    got = fed.eval_row(0, 1, "pers_val")
    assert got["test_loss"] == pytest.approx(ce_grad_hess(adapted, xva, yva)[0], rel=1e-5)
    assert {"pers_avg_val_accuracy", "pers_worst_val_accuracy", "test_accuracy"} <= set(fed.logged[0])


# ---------------------------------------------------------------- TR-MAML


def test_project_simplex():
    np.testing.assert_allclose(project_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_simplex(np.array([2.0, 0.0])), [1.0, 0.0])
    np.testing.assert_allclose(project_simplex(np.array([0.6, 0.6, -1.0])), [0.5, 0.5, 0.0])
    v = np.random.default_rng(0).normal(size=7)
    p = project_simplex(v)
    lo, hi = v.min() - 1, v.max()  # p = max(v - theta, 0) with sum 1: bisection on theta
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.maximum(v - mid, 0).sum() > 1 else (lo, mid)
    np.testing.assert_allclose(p, np.maximum(v - lo, 0), atol=1e-12)


def test_tr_maml_two_rounds_weight_clients_by_p_and_raise_p_of_the_worse_client():
    """Round 0: p0 uniform, x1 = x0 + mean delta; p1 = Proj(p0 + weight_lr tau (n/m) L) with
    L_i the post-adaptation loss at x0. Round 1: x2 = x1 + sum p1_i delta_i (p1 is far from
    uniform), p2 likewise from the losses at x1."""
    ds, start = tiny_dataset(), x0()
    cfg = TRMAMLConfig(lr=0.3, inner_lr=0.4, weight_lr=0.5, local_steps=2, batch_size=4, outer_batch_size=3,
                       clients_per_round=2)
    fed = InProcessFed(ds, start)
    drive(fed, TRMAML, cfg, RunConfig(rounds=2, eval_every=2))
    x, p = start.astype(np.float64), np.full(2, 0.5)
    for r in range(2):
        outs = [hand_maml_client(x, *client_data(ds, c)[:2], r, c, cfg) for c in (0, 1)]
        x = x + p[0] * outs[0][0] + p[1] * outs[1][0]
        p = project_simplex(p + 0.5 * 2 * np.array([outs[0][1], outs[1][1]]))
        if r == 0:
            assert abs(p[0] - p[1]) > 0.05  # round 1's weights are not uniform
    np.testing.assert_allclose(fed.server_state.x, x, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(fed.server_state.p, p, rtol=1e-5, atol=1e-6)
    assert fed.logged[1]["p_max"] == pytest.approx(p.max(), rel=1e-5)
    (eval_payload,) = [pl for phase, _, pl in fed.calls if phase == "eval"]
    assert eval_payload["adapt_lr"] == 0.4 and eval_payload["adapt_steps"] == 1


# ---------------------------------------------------------------- Ditto


def hand_ditto(w0, v0, x, y, cfg) -> tuple[np.ndarray, np.ndarray]:
    """Full-batch (b >= n): tau steps on the global model, tau lam-proximal steps on v."""
    w, v = np.asarray(w0, np.float64).copy(), np.asarray(v0, np.float64).copy()
    for _ in range(cfg.local_steps):
        w = w - cfg.lr * ce_grad_hess(w, x, y)[1]
    for _ in range(cfg.local_steps):
        v = v - cfg.personal_lr * (ce_grad_hess(v, x, y)[1] + cfg.lam * (v - w0))
    return w - w0, v


def test_ditto_two_rounds_keep_personal_models_in_state_and_evaluate_them():
    """v_k starts at x0, moves with grad F_k(v) + lam (v - x_r) and persists into round 1;
    x is FedAvg with a uniform mean; the evaluation measures v_k itself (no adaptation)."""
    ds, start = tiny_dataset(), x0()
    cfg = DittoConfig(lr=0.3, personal_lr=0.2, lam=0.5, local_steps=2, batch_size=16, clients_per_round=2)
    fed = InProcessFed(ds, start)
    drive(fed, Ditto, cfg, RunConfig(rounds=2, eval_every=2))
    x, v = start.astype(np.float64), {0: start.astype(np.float64), 1: start.astype(np.float64)}
    for _ in range(2):
        outs = {c: hand_ditto(x, v[c], *client_data(ds, c)[:2], cfg) for c in (0, 1)}
        x = x + 0.5 * (outs[0][0] + outs[1][0])
        v = {c: outs[c][1] for c in (0, 1)}
    np.testing.assert_allclose(fed.server_state.x, x, rtol=1e-5, atol=2e-6)
    for c in (0, 1):
        np.testing.assert_allclose(fed.host.states[c]["personal"].numpy(), v[c], rtol=1e-5, atol=2e-6)
        _, _, xva, yva = client_data(ds, c)
        assert fed.eval_row(1, c, "pers_val")["test_loss"] == pytest.approx(ce_grad_hess(v[c], xva, yva)[0], rel=1e-5)
    assert np.abs(v[0] - x).max() > 1e-2  # the personal model is not the global one


def test_ditto_personal_model_commits_only_with_its_task():
    """Staged under its task id: a rejected task leaves no personal model, an accepted one
    commits exactly what it computed; the personal model is never uploaded."""
    ds = tiny_dataset()
    fed = InProcessFed(ds, x0())
    host, sched = fed.host, LocalSchedule(16, None, 2)
    payload = dict(params=x0(), lr=0.3, personal_lr=0.2, lam=0.5, schedule=sched)
    (rec,) = host.run(ditto_client, [1], 0, payload, task_ids={1: 7})
    assert set(rec["values"]) == {"delta", "loss", "personal_loss"}
    assert "personal" not in host.states[1]
    host.settle({7: False})
    assert "personal" not in host.states[1]
    host.run(ditto_client, [1], 0, payload, task_ids={1: 8})
    host.settle({8: True})
    cfg = DittoConfig(lr=0.3, personal_lr=0.2, lam=0.5, local_steps=2)
    _, v = hand_ditto(x0(), x0(), *client_data(ds, 1)[:2], cfg)
    np.testing.assert_allclose(host.states[1]["personal"].numpy(), v, rtol=1e-5, atol=2e-6)


# ---------------------------------------------------------------- FedAvg with one adaptation step


def test_fedavg_adapt_trains_like_fedavg_and_adapts_at_its_lr():
    ds, start = tiny_dataset(), x0()
    cfg = FedAvgAdaptConfig(lr=0.3, local_steps=2, batch_size=16, clients_per_round=2)
    fed = InProcessFed(ds, start)
    drive(fed, FedAvgAdapt, cfg, RunConfig(rounds=1, eval_every=1))
    deltas = []
    for c in (0, 1):
        xtr, ytr, _, _ = client_data(ds, c)
        w = start.astype(np.float64)
        for _ in range(2):
            w = w - 0.3 * ce_grad_hess(w, xtr, ytr)[1]
        deltas.append(w - start)
    hand = start + (10 * deltas[0] + 4 * deltas[1]) / 14  # size-weighted, as FedAvg
    np.testing.assert_allclose(fed.server_state.x, hand, rtol=1e-5, atol=2e-6)
    xtr, ytr, xva, yva = client_data(ds, 1)
    adapted = hand - 0.3 * ce_grad_hess(hand, xtr, ytr)[1]
    assert fed.eval_row(0, 1, "pers_val")["test_loss"] == pytest.approx(ce_grad_hess(adapted, xva, yva)[0], rel=1e-5)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("name, key, value", [
    ("per_fedavg", "inner_lr", "0"),
    ("per_fedavg", "outer_batch_size", "0"),
    ("per_fedavg", "eval_adapt_steps", "-1"),
    ("per_fedavg", "eval_adapt_lr", "0"),
    ("per_fedavg", "local_steps", "null"),
    ("tr_maml", "weight_lr", "-0.1"),
    ("tr_maml", "inner_lr", "-1"),
    ("ditto", "personal_lr", "0"),
    ("ditto", "lam", "-1"),
    ("fedavg_adapt", "server_as_client", "true"),
    ("fedavg_adapt", "eval_adapt_steps", "-2"),
])
def test_configs_name_their_mistakes(name, key, value):
    extra = ["algorithm.local_epochs=1"] if (key, value) == ("local_steps", "null") else []
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"algorithm.name={name}", f"algorithm.{key}={value}", *extra])
    assert err.value.key == f"algorithm.{key}"


def test_personalized_methods_need_client_validation_sets():
    ds = tiny_dataset()
    ds.client_test = None
    fed = InProcessFed(tiny_dataset(), x0())
    fed.dataset = ds
    with pytest.raises(ConfigError) as err:
        drive(fed, PerFedAvg, PerFedAvgConfig(), RunConfig(rounds=1))
    assert err.value.key == "partition.client_test"


@pytest.mark.parametrize("method", ["comfedl", "per_fedavg", "tr_maml", "ditto", "fedavg"])
def test_fig4_jobs_validate_offline(method):
    """Every method of the MAML comparison, offline with one --set: the real MNIST subset."""
    job = Path(__file__).resolve().parents[1] / "jobs" / "comfedl" / f"maml_{method}.yaml"
    cfg = load_config(job, ["data.source=test_only"])
    assert cfg.partition.client_test == "proportional" and cfg.algorithm.local_steps == 5
    assert cfg.algorithm.clients_per_round == cfg.partition.num_clients == 10


# ---------------------------------------------------------------- end to end on Ray


def digits_cfg(results_dir, name: str, *extra: str):
    return load_config(None, [
        "data.dataset=digits", "data.test_fraction=0.3", "partition.method=dominant_class", "partition.num_clients=4",
        "partition.rho=0.4", "partition.samples_per_client=60", "partition.client_test=proportional",
        "model.name=linear", "run.rounds=2", "run.eval_every=1", f"output.dir={results_dir}",
        f"algorithm.name={name}", "algorithm.clients_per_round=3", "algorithm.local_steps=2", "algorithm.local_epochs=null",
        *extra,
    ])


@pytest.fixture(scope="module")
def ditto_runs(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("ditto") / "results"
    one = load(run_experiment(digits_cfg(out, "ditto", "run.run_id=one", "engine.num_hosts=1")).run_dir)
    two = load(run_experiment(digits_cfg(out, "ditto", "run.run_id=two", "engine.num_hosts=2",
                                         "engine.num_cpus_per_host=0.5")).run_dir)
    return one, two


def test_ditto_runs_identically_on_1_and_2_hosts(ditto_runs):
    a, b = ditto_runs
    ra, rb = a.rounds.sort_values("round"), b.rounds.sort_values("round")
    for col in ("train_loss", "personal_loss", "test_accuracy", "pers_avg_val_accuracy", "pers_worst_val_accuracy"):
        np.testing.assert_array_equal(ra[col].to_numpy(float), rb[col].to_numpy(float))
    ea = a.evals[a.evals.split == "pers_val"].sort_values(["round", "client"])
    eb = b.evals[b.evals.split == "pers_val"].sort_values(["round", "client"])
    assert len(ea) == 2 * 4  # every client, every round, sampled or not
    np.testing.assert_array_equal(ea["test_accuracy"].to_numpy(), eb["test_accuracy"].to_numpy())
    assert b.clients["host"].nunique() == 2


def test_maml_report_lists_the_ditto_runs_and_skips_other_results(ditto_runs, tmp_path):
    from rayfl.papers.comfedl.maml_report import write_comfedl_maml_report

    a, _ = ditto_runs
    lines = write_comfedl_maml_report(a, tmp_path)
    assert any("Ditto" in line and "1 seed(s)" in line for line in lines)
    assert (tmp_path / "comfedl_maml_final.csv").is_file() and list(tmp_path.glob("comfedl_fig4_*.png"))
    empty = type(a)(a.rounds.iloc[:0], a.clients.iloc[:0], a.evals.iloc[:0], a.manifests.iloc[:0])
    assert write_comfedl_maml_report(empty, tmp_path / "none") == []
