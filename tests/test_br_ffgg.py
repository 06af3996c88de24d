"""BR-FFGG (Alg. 5): FFGG under the job's `robust:` section. The round pipeline's robust path
(`rayfl.robust.server.ByzantineServer`, `rayfl.pipeline.server.RoundPipeline`) picks the seeded
Byzantine clients, replaces exactly their uploads by the attack's vectors, aggregates with ARAgg,
and marks them in the `clients` table; one Ray round equals a float64 hand computation, and on
the quadratic an attack that derails the mean leaves the median on the attack-free path."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pytest

from rayfl.config import ConfigError, load_config
from rayfl.papers.ffgg.quadratic import QuadraticOracle, QuadraticShape, client_design, factors
from rayfl.pipeline.server import RoundPipeline
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
    extra: dict = field(default_factory=dict)

    def __getitem__(self, key: str):
        return self.values[key]


def pipeline(num_clients: int, *robust: str) -> RoundPipeline:
    """The robust pipeline of a br_ffgg job, with the Federation's few fields it reads."""
    cfg = load_config(None, ["algorithm.name=br_ffgg", f"partition.num_clients={num_clients}", *robust])
    fed = SimpleNamespace(seed=cfg.run.seed, num_clients=num_clients, population=SimpleNamespace(num_trainable=num_clients),
                          dataset=SimpleNamespace(num_classes=10), client_tags={})
    p = RoundPipeline(cfg, fed)
    p.upload_spec(("delta",), list(range(num_clients)))
    return p


def no_sum(*_):
    raise AssertionError("the robust path never takes the plain sum")


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
    flip = pipeline(10, "robust.aggregator.name=median", "robust.attack={name: label_flip, count: 2}")
    spec = flip.upload_spec(("delta",), list(range(10)))  # a data attack: the hosts flip their labels
    assert spec.flip_labels == flip.byzantine.byzantine and len(spec.flip_labels) == 2 and spec.num_classes == 10
    model = pipeline(10, "robust.aggregator.name=median", "robust.attack={name: sign_flip, count: 2}")
    assert model.upload_spec(("delta",), list(range(10))).flip_labels == frozenset()  # model attacks tell nobody
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
    p = pipeline(6, "robust.aggregator={name: mean, bucket_size: 2}", "robust.attack={name: sign_flip, count: 2}",
                 "run.seed=1")
    assert p.byzantine.byzantine == server.byzantine
    np.testing.assert_allclose(p.combine(ups, "delta", [1 / 6] * 6, no_sum), stack.mean(axis=0), rtol=1e-12)

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
    attack = "robust.attack={name: sign_flip, count: 3, scale: 100.0}"
    mean = pipeline(10, "robust.aggregator={name: mean, bucket_size: 2}", attack).combine(ups, "delta", [0.1] * 10, no_sum)
    med = pipeline(10, "robust.aggregator.name=median", attack).combine(ups, "delta", [0.1] * 10, no_sum)
    assert mean[1] < 0 and 1.0 <= med[0] <= 2.0 and med[1] == 2.0


def test_br_ffgg_needs_a_robust_aggregator_and_labels_for_label_flip():
    default = load_config(None, ["algorithm.name=br_ffgg", "robust.attack={name: sign_flip, count: 1}"]).robust.aggregator
    assert (default.name, default.bucket_size) == ("median", 2)  # the authors' run, where the job names none
    with pytest.raises(ConfigError, match=r"^robust\.aggregator: br_ffgg is ffgg with a robust aggregator; set "):
        load_config(None, ["algorithm.name=br_ffgg", "robust.aggregator={name: mean}"])
    load_config(None, ["algorithm.name=ffgg", "robust.attack={name: sign_flip, count: 1}"])  # the plain-mean control
    quad = ["data.dataset=ffgg_quadratic", "partition.method=natural", "robust.aggregator.name=median"]
    with pytest.raises(ConfigError, match=r"^robust\.attack\.name: label_flip needs labels; data\.dataset 'ffgg_quadratic'"):
        load_config(None, ["algorithm.name=br_ffgg", *quad, "robust.attack={name: label_flip, count: 1}"])
    with pytest.raises(ConfigError, match=r"^robust\.attack\.count: 16 Byzantine of 32 clients is not < 1/2$"):
        load_config(None, ["algorithm.name=br_ffgg", *quad, "partition.num_clients=32", "robust.attack={name: alie, count: 16}"])
    for old in ("aggregator={name: median}", "attack.name=sign_flip"):
        key = old.partition("=")[0].partition(".")[0]
        with pytest.raises(ConfigError, match=rf"^algorithm\.{key}: this key moved: it is now robust\.{key} "):
            load_config(None, ["algorithm.name=br_ffgg", f"algorithm.{old}"])


SEED = 2
SHAPE = QuadraticShape(clients=5, n=10, d_theta=3, d_w=2)
DT, DW = SHAPE.d_theta, SHAPE.d_w


def test_br_ffgg_round_by_hand_and_clients_marked(ray_local, tmp_path):
    cfg = load_config(None, [
        "data.dataset=ffgg_quadratic", f"data.n={SHAPE.n}", f"data.d_theta={DT}",
        f"data.d_w={DW}", "partition.method=natural", f"partition.num_clients={SHAPE.clients}",
        "algorithm.name=br_ffgg", "algorithm.solver=exact", "algorithm.server_lr=0.05",
        "robust.aggregator={name: median, bucket_size: 1}", "robust.attack={name: sign_flip, count: 2}",
        f"run.seed={SEED}", "run.rounds=1", f"output.dir={tmp_path}", "run.run_id=br",
    ])
    res = load(run_experiment(cfg).run_dir)
    byz = set(choose_byzantine(SHAPE.clients, cfg.robust.attack, numpy_rng(SEED, "byzantine")).tolist())
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


def quad_f_norms(out, run_id: str, *extra: str) -> np.ndarray:
    """||F(theta)|| per round of exact-FFGG runs on the quadratic, every client every round."""
    cfg = load_config(None, [
        "data.dataset=ffgg_quadratic", f"data.n={SHAPE.n}", f"data.d_theta={DT}", f"data.d_w={DW}",
        "partition.method=natural", f"partition.num_clients={SHAPE.clients}", "algorithm.clients_per_round=null",
        "algorithm.participation=1.0", "algorithm.solver=exact", f"run.seed={SEED}", "run.rounds=6",
        f"output.dir={out}", f"run.run_id={run_id}", *extra,
    ])
    return load(run_experiment(cfg).run_dir).rounds.sort_values("round")["F_norm"].to_numpy()


def test_a_scaled_sign_flip_derails_the_mean_but_not_the_median(ray_local, tmp_path):
    """Alg. 5's claim in small: one attacker of five flips its Delta ten times over. Plain FFGG
    (the pipeline's mean) moves away from the solution; BR-FFGG (median) keeps converging."""
    attack = "robust.attack={name: sign_flip, count: 1, scale: 10}"
    clean = quad_f_norms(tmp_path, "clean", "algorithm.name=ffgg")
    mean = quad_f_norms(tmp_path, "mean", "algorithm.name=ffgg", attack)
    median = quad_f_norms(tmp_path, "median", "algorithm.name=br_ffgg", "robust.aggregator.name=median", attack)
    assert clean[-1] < clean[0] and median[-1] < median[0] and median[-1] < 1.5 * clean[-1]
    assert mean[-1] > mean[0] and mean[-1] > 10 * median[-1]


def test_the_report_reads_robust_settings_from_either_place():
    """Runs recorded with FFGG's own algorithm.aggregator (the robust section then unused) and
    runs with the `robust:` section group alike; the plain-mean control is ffgg under attack."""
    import pandas as pd

    from rayfl.papers.ffgg.report import quadratic_runs
    from rayfl.results.load import Results

    nan = float("nan")
    manifests = pd.DataFrame({
        "experiment": ["b"] * 3, "run_id": ["old", "new", "control"], "data.dataset": ["ffgg_quadratic"] * 3,
        "algorithm.name": ["br_ffgg", "br_ffgg", "ffgg"],
        "algorithm.aggregator.name": ["median", nan, nan], "algorithm.attack.name": ["alie", nan, nan],
        "robust.aggregator.name": ["mean", "krum", "mean"], "robust.attack.name": ["none", "ipm", "ipm"],
    })
    rounds = pd.DataFrame({"experiment": ["b"] * 3, "run_id": ["old", "new", "control"], "round": [0] * 3,
                           "F_norm": [1.0, 2.0, 3.0]})
    runs = quadratic_runs(Results(rounds, pd.DataFrame(), pd.DataFrame(), manifests)).set_index("run_id")
    assert runs.loc["old", ["aggregator", "attack"]].tolist() == ["median", "alie"]
    assert runs.loc["new", ["aggregator", "attack"]].tolist() == ["krum", "ipm"]
    assert runs.loc["control", ["algorithm", "aggregator", "attack"]].tolist() == ["ffgg", "mean", "ipm"]


def test_the_reports_curves_are_one_band_per_setting_over_its_seeds():
    """The seeds of one setting are one curve (their median in a min-max band); a setting run
    for two horizons is two curves; an overflowed value leaves a gap, not an infinite band."""
    import numpy as np
    import pandas as pd

    from rayfl.papers.ffgg.report import seed_bands
    from rayfl.results.load import Results

    ids = ["t1_s0", "t1_s1", "t40_s0", "t40_long_s0"]
    lengths = {"t1_s0": 3, "t1_s1": 3, "t40_s0": 2, "t40_long_s0": 4}
    rounds = pd.concat([pd.DataFrame({"experiment": "a", "run_id": i, "round": np.arange(n),
                                      "F_norm": [np.inf if i == "t1_s1" and k == 2 else 10.0 ** -k for k in range(n)]})
                        for i, n in lengths.items()])
    runs = pd.DataFrame({"experiment": "a", "run_id": ids, "tau": [1, 1, 40, 40], "rounds": [lengths[i] for i in ids]})
    bands = dict(seed_bands(Results(rounds, pd.DataFrame(), pd.DataFrame(), pd.DataFrame()), runs,
                            lambda r: f"tau = {r['tau']}"))
    assert sorted(bands) == ["tau = 1", "tau = 40, 2 rounds", "tau = 40, 4 rounds"]
    assert bands["tau = 1"].shape == (3, 2)
    assert np.isnan(bands["tau = 1"].loc[2, "t1_s1"]) and bands["tau = 1"].loc[2, "t1_s0"] == 0.01
    assert bands["tau = 40, 4 rounds"].shape == (4, 1)
    from rayfl.papers.ffgg.report import baseline_label

    assert baseline_label(pd.Series({"algorithm": "l2gd", "alpha_scale": 0.03125})) == "L2GD, alpha x 0.03125"
    assert baseline_label(pd.Series({"algorithm": "l2gd", "alpha_scale": 1.0})) == "L2GD"
