"""BR-FFGG (Alg. 5): the robust server step (`rayfl.robust.server.ByzantineServer`) picks the
seeded Byzantine clients, replaces exactly their uploads by the attack's vectors, aggregates with
ARAgg, and marks them in the `clients` table; one Ray round equals a float64 hand computation."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import pytest

from rayfl.config import load_config
from rayfl.papers.ffgg.quadratic import QuadraticOracle, QuadraticShape, client_design, factors
from rayfl.results import load
from rayfl.rng import numpy_rng
from rayfl.robust import AttackConfig, RobustConfig, choose_byzantine
from rayfl.robust.server import ByzantineServer
from rayfl.runner import run_experiment


@dataclass
class FakeFed:
    num_clients: int
    seed: int
    client_tags: dict = field(default_factory=dict)


@dataclass
class Upload:
    client: int
    values: dict

    def __getitem__(self, key: str):
        return self.values[key]


def uploads(n: int, d: int = 3) -> list[Upload]:
    rng = np.random.default_rng(7)
    return [Upload(c, {"delta": rng.standard_normal(d)}) for c in range(n)]


def test_byzantine_clients_are_the_seeded_ones_and_tagged():
    fed = FakeFed(10, seed=4)
    attack = AttackConfig(name="sign_flip", fraction=0.2)
    server = ByzantineServer(fed, RobustConfig(), attack)
    expect = set(choose_byzantine(10, attack, numpy_rng(4, "byzantine")).tolist())
    assert server.byzantine == expect and len(expect) == 2
    assert {c for c, tag in fed.client_tags.items() if tag["byzantine"]} == expect
    assert set(fed.client_tags) == set(range(10))
    assert server.per_client(list(range(10))) is None  # model attacks tell nobody
    flip = ByzantineServer(FakeFed(10, 4), RobustConfig(), AttackConfig(name="label_flip", count=2))
    assert set(flip.per_client(list(range(10)))) == flip.byzantine
    none = FakeFed(10, 4)
    ByzantineServer(none, RobustConfig(), AttackConfig())
    assert none.client_tags == {}  # no column without an attack


def test_only_byzantine_rows_are_replaced_sign_flip_and_alie():
    ups = uploads(6)
    honest_rows = np.stack([u["delta"] for u in ups])
    server = ByzantineServer(FakeFed(6, 1), RobustConfig(), AttackConfig(name="sign_flip", count=2))
    bad = sorted(server.byzantine)
    stack = server.vectors(ups, "delta", 0)
    for c in range(6):
        np.testing.assert_array_equal(stack[c], -honest_rows[c] if c in bad else honest_rows[c])
    np.testing.assert_allclose(server.combine(ups, "delta", 0), stack.mean(axis=0))

    alie = ByzantineServer(FakeFed(6, 1), RobustConfig(), AttackConfig(name="alie", count=2))
    good = [c for c in range(6) if c not in alie.byzantine]
    h = honest_rows[good]
    s = np.floor(6 / 2 + 1) - 2  # Baruch et al.: s = floor(n/2 + 1) - f, z = Phi^-1((n - s) / n)
    z = NormalDist().inv_cdf((6 - s) / 6)
    crafted = h.mean(axis=0) - z * h.std(axis=0)
    stack = alie.vectors(ups, "delta", 0)
    for c in alie.byzantine:
        np.testing.assert_allclose(stack[c], crafted)
    np.testing.assert_array_equal(stack[good], h)


def test_median_resists_sign_flip_where_the_mean_does_not():
    ups = [Upload(c, {"delta": np.array([1.0 + 0.1 * c, 2.0])}) for c in range(10)]
    attack = AttackConfig(name="sign_flip", count=3, scale=100.0)
    mean = ByzantineServer(FakeFed(10, 0), RobustConfig(), attack).combine(ups, "delta", 0)
    med = ByzantineServer(FakeFed(10, 0), RobustConfig(name="median"), attack).combine(ups, "delta", 0)
    assert mean[1] < 0 and 1.0 <= med[0] <= 2.0 and med[1] == 2.0


SEED = 2
SHAPE = QuadraticShape(clients=5, n=10, d_theta=3, d_w=2)
DT, DW = SHAPE.d_theta, SHAPE.d_w


def test_br_ffgg_round_by_hand_and_clients_marked(ray_local, tmp_path):
    cfg = load_config(None, [
        "data.dataset=ffgg_quadratic", f"data.n={SHAPE.n}", f"data.d_theta={DT}",
        f"data.d_w={DW}", "partition.method=natural", f"partition.num_clients={SHAPE.clients}",
        "algorithm.name=br_ffgg", "algorithm.solver=exact", "algorithm.server_lr=0.05",
        "algorithm.aggregator={name: median, bucket_size: 1}", "algorithm.attack={name: sign_flip, count: 2}",
        f"run.seed={SEED}", "run.rounds=1", f"output.dir={tmp_path}", "run.run_id=br",
    ])
    res = load(run_experiment(cfg).run_dir)
    byz = set(choose_byzantine(SHAPE.clients, cfg.algorithm.attack, numpy_rng(SEED, "byzantine")).tolist())
    marked = res.clients.set_index("client")["byzantine"]
    assert {c for c, b in marked.items() if b} == byz and len(marked) == SHAPE.clients
    o = QuadraticOracle.from_factors(factors(SHAPE, SEED), DT)
    theta = np.zeros(DT)
    rows = []
    for m in range(SHAPE.clients):  # exact fine-tuning: Delta_m = F_m(theta), from the design
        d = client_design(SHAPE, SEED, m)
        b_mat, rhs = d[:, DT : DT + DW], -(d[:, :DT] @ theta + d[:, -1])
        w = np.linalg.lstsq(b_mat, rhs, rcond=None)[0]
        g = (d.T @ (d @ np.concatenate([theta, w, [1.0]])))[:DT]
        rows.append(-g if m in byz else g)
    theta = theta - 0.05 * np.median(np.stack(rows), axis=0)
    assert res.rounds["F_norm"].iloc[0] == pytest.approx(np.linalg.norm(o.operator(theta)), rel=1e-9)
