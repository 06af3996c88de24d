"""The round pipeline's pieces, each against a hand computation: clipping, local noise, the
server's DP noise (a chi-squared test on its standard deviation), adaptive clipping, Poisson
sampling, robust combination, and the config checks that refuse what cannot be combined."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from rayfl.config import ConfigError, load_config
from rayfl.pipeline.accounting import epsilon
from rayfl.pipeline.compression import HEADER_BYTES, CompressionConfig
from rayfl.pipeline.server import RoundPipeline, adaptive_clip, cohort_size, mechanism
from rayfl.pipeline.uploads import RESIDUAL, UploadSpec, joint_norm, transform_upload
from rayfl.rng import numpy_rng


def pipeline(*overrides: str, num_clients: int = 50) -> RoundPipeline:
    """A RoundPipeline for a job, with a stand-in for the Federation's few fields it reads."""
    cfg = load_config(None, [f"partition.num_clients={num_clients}", *overrides])
    fed = SimpleNamespace(seed=cfg.run.seed, population=SimpleNamespace(num_trainable=num_clients), num_clients=num_clients,
                          dataset=SimpleNamespace(num_classes=10), client_tags={})
    return RoundPipeline(cfg, fed)


class Result(SimpleNamespace):
    def __getitem__(self, key: str) -> np.ndarray:
        return self.values[key]


def as_results(vectors: list[np.ndarray]) -> list[Result]:
    return [Result(client=i, values={"delta": v}, extra={}) for i, v in enumerate(vectors)]


def plain_sum(results: list, key: str, weights: list[float]) -> np.ndarray:
    return sum(w * np.asarray(r[key], dtype=np.float64) for r, w in zip(results, weights, strict=True))


# ---------------------------------------------------------------- client side


def test_clipping_scales_the_joint_vector_to_the_bound():
    values = {"delta": np.array([3.0, 0.0], dtype=np.float32), "delta_control": np.array([0.0, 4.0], dtype=np.float32),
              "loss": 0.5}
    out, info = transform_upload(values, {}, UploadSpec(keys=("delta", "delta_control"), clip=1.0), client=0, round=0, seed=1)
    np.testing.assert_allclose(out["delta"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out["delta_control"], [0.0, 0.8], rtol=1e-6)
    assert info.norm == pytest.approx(5.0) and info.clipped
    # float32 rounds 0.6 and 0.8 up: the bound holds on what is sent, not only before the cast
    assert joint_norm([out["delta"], out["delta_control"]]) == info.clipped_norm <= 1.0
    assert out["loss"] == 0.5 and values["delta"][0] == 3.0  # the client's own answer is untouched


def test_local_dp_with_compression_noises_then_encodes():
    """Under local DP the codec only post-processes the private vector: clip, noise, then top-k,
    with error feedback's residual the noised vector less what was sent."""
    from rayfl.pipeline.compression import CompressionConfig

    v = np.arange(1.0, 11.0, dtype=np.float32)
    spec = UploadSpec(keys=("delta",), compression=CompressionConfig(name="topk", ratio=0.2), clip=1.0, local_noise_std=0.5)
    state: dict = {}
    out, info = transform_upload({"delta": v}, state, spec, client=3, round=2, seed=1)
    noised, _ = transform_upload({"delta": v}, {}, UploadSpec(keys=("delta",), clip=1.0, local_noise_std=0.5), 3, 2, 1)
    sent = out["delta"]
    assert np.count_nonzero(sent) == 2 and info.clipped_norm <= 1.0
    kept = np.argsort(-np.abs(noised["delta"]))[:2]
    np.testing.assert_array_equal(sent[kept], noised["delta"][kept])
    np.testing.assert_allclose(state["pipeline.residual.delta"], noised["delta"] - sent, atol=1e-7)


def test_every_clipped_update_has_norm_at_most_the_bound():
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = (rng.standard_normal(50) * rng.uniform(0.01, 10)).astype(np.float32)
        out, info = transform_upload({"delta": v}, {}, UploadSpec(keys=("delta",), clip=2.0), 0, 0, 1)
        assert joint_norm([out["delta"]]) <= 2.0
        if info.norm <= 2.0:
            np.testing.assert_array_equal(out["delta"], v)  # under the bound: sent as is


def test_local_noise_is_seeded_per_client_and_round_with_the_asked_std():
    spec = UploadSpec(keys=("delta",), clip=1.0, local_noise_std=0.5)
    zero = {"delta": np.zeros(20000)}
    a, _ = transform_upload(zero, {}, spec, client=3, round=2, seed=7)
    b, _ = transform_upload(zero, {}, spec, client=3, round=2, seed=7)
    c, _ = transform_upload(zero, {}, spec, client=4, round=2, seed=7)
    np.testing.assert_array_equal(a["delta"], b["delta"])
    assert not np.array_equal(a["delta"], c["delta"])
    expected = numpy_rng(7, "privacy.local.delta", 2, 3).normal(0.0, 0.5, size=20000)
    np.testing.assert_array_equal(a["delta"], expected)


def test_compression_keeps_its_residual_as_client_state_and_charges_the_encoded_bytes():
    cfg = CompressionConfig(name="topk", k=2)
    state: dict = {}
    v = np.array([0.1, -3.0, 2.0, 0.5, -0.2], dtype=np.float32)
    out, info = transform_upload({"delta": v, "loss": np.float64(0.3)}, state, UploadSpec(keys=("delta",), compression=cfg), 0, 0, 1)
    np.testing.assert_array_equal(out["delta"], [0, -3.0, 2.0, 0, 0])
    np.testing.assert_allclose(state[RESIDUAL + "delta"], [0.1, 0, 0, 0.5, -0.2], rtol=1e-7)
    assert info.bytes_up == HEADER_BYTES + 2 * 4 + 2 * 4 + 8  # indices, values, and the float64 loss
    out2, _ = transform_upload({"delta": np.zeros(5, dtype=np.float32)}, state, UploadSpec(keys=("delta",), compression=cfg), 0, 1, 1)
    np.testing.assert_allclose(out2["delta"], [0, 0, 0, 0.5, -0.2], rtol=1e-7)  # the residual goes out next


# ---------------------------------------------------------------- server side


def test_central_noise_has_std_noise_multiplier_times_clip():
    """Zero updates, so the server's answer is its noise over the cohort: a chi-squared test of
    sum(noise^2) / (z C)^2 over 40 rounds x 500 coordinates against chi2(20000)."""
    p = pipeline("privacy.mode=central", "privacy.noise_multiplier=1.3", "privacy.clip=0.7",
                 "algorithm.clients_per_round=10", "privacy.sampling=fixed")
    draws = []
    for r in range(40):
        p.round = r
        p.upload_spec(("delta",), list(range(10)))
        out = p.combine(as_results([np.zeros(500)] * 4), "delta", [0.25] * 4, plain_sum)
        draws.append(out * p.cohort)  # (sum + noise) / m with sum 0
    noise = np.concatenate(draws)
    statistic = float(np.sum(noise**2) / (1.3 * 0.7) ** 2)
    lo, hi = stats.chi2.ppf([1e-4, 1 - 1e-4], df=noise.size)
    assert lo < statistic < hi
    assert p.noise_std == pytest.approx(1.3 * 0.7)


def test_central_dp_weights_every_client_equally_over_the_expected_cohort():
    p = pipeline("privacy.mode=central", "privacy.noise_multiplier=1.0", "algorithm.clients_per_round=4", "privacy.sampling=fixed")
    p.upload_spec(("delta",), [0, 1, 2])
    vs = [np.full(3, 1.0), np.full(3, 2.0), np.full(3, 6.0)]
    out = p.combine(as_results(vs), "delta", [0.7, 0.2, 0.1], plain_sum)
    noise = numpy_rng(p.seed, "privacy.noise.delta", 0).normal(0.0, 1.0, size=3)
    np.testing.assert_allclose(out, (9.0 + noise) / 4, rtol=1e-12)


def test_adaptive_clip_follows_the_geometric_rule():
    rng = np.random.default_rng(5)
    norms = np.array([0.5, 1.5, 0.9, 2.0])
    draw = np.random.default_rng(5).normal(0.0, 0.25)
    b = (2 + draw) / 4  # two of four within C = 1
    assert adaptive_clip(1.0, norms, 0.5, 0.2, 4, 0.25, rng) == pytest.approx(1.0 * np.exp(-0.2 * (b - 0.5)))


def test_adaptive_noise_multiplier_leaves_room_for_the_count_noise():
    p = pipeline("privacy.mode=central", "privacy.noise_multiplier=1.0", "privacy.adaptive=true",
                 "privacy.clip_count_stddev=2.0", "algorithm.clients_per_round=10")
    assert p.update_noise_multiplier == pytest.approx((1.0 - 1 / 16) ** -0.5)


def test_poisson_sampling_runs_at_the_cohort_rate():
    """The rate the cohort is drawn at (the draw itself: tests/test_sampling.py)."""
    p = pipeline("privacy.mode=central", "privacy.noise_multiplier=1.0", "algorithm.clients_per_round=10", num_clients=100)
    assert p.poisson and p.mechanism.rate == pytest.approx(0.1)


def test_epsilon_column_is_the_accountants_answer_for_the_rounds_so_far():
    p = pipeline("privacy.mode=central", "privacy.noise_multiplier=1.1", "algorithm.clients_per_round=5",
                 "privacy.delta=1e-4", num_clients=100)
    m = mechanism(p.cfg, 100, 1.1)
    assert m.sampling == "poisson" and cohort_size(p.cfg, 100) == 5
    assert p.finish_round(6)["epsilon"] == pytest.approx(epsilon(m, 7, 1e-4, "rdp"), rel=1e-12)


def test_local_dp_epsilon_is_the_most_asked_clients_own_composition():
    """Rounds asking clients {0,1,2}, {2,3} twice (two upload calls: one round), {2}, then none:
    client 2 has uploaded in 3 rounds, so epsilon is 3 local Gaussians' (z / 2 each), not 4
    rounds' worth; a checkpoint carries the counts, not the round in progress."""
    p = pipeline("privacy.mode=local", "privacy.noise_multiplier=2.0", "algorithm.clients_per_round=3",
                 "privacy.delta=1e-4", "run.rounds=6", num_clients=20)
    m = mechanism(p.cfg, 20, 2.0)
    assert m.sampling == "local"
    asked = [[[0, 1, 2]], [[2, 3], [3, 2]], [[2]], []]
    most = []
    for r, calls in enumerate(asked):
        for ids in calls:
            p.upload_spec(("delta",), ids)
        row = p.finish_round(r)
        most.append(row["dp_most_uploads"])
        want = epsilon(m, most[-1], 1e-4, "rdp") if most[-1] else 0.0
        assert row["epsilon"] == pytest.approx(want, rel=1e-12)
    assert most == [1, 2, 3, 3]
    assert p.state.uploads.tolist() == [1, 1, 3, 1] + [0] * 16
    assert p.finish_round(4)["epsilon"] < epsilon(m, 5, 1e-4, "rdp")  # below the every-round bound
    saved = p.state_dict()
    p.upload_spec(("delta",), [0])
    p.finish_round(5)
    resumed = pipeline("privacy.mode=local", "privacy.noise_multiplier=2.0", "algorithm.clients_per_round=3",
                       "privacy.delta=1e-4", "run.rounds=6", num_clients=20)
    resumed.load_state_dict(saved)
    assert resumed.state.uploads.tolist() == [1, 1, 3, 1] + [0] * 16 and p.state.uploads[0] == 2  # the checkpoint's a copy


def test_target_epsilon_calibrates_the_noise_and_max_epsilon_refuses_to_start():
    p = pipeline("privacy.mode=central", "privacy.target_epsilon=3.0", "algorithm.clients_per_round=5", "run.rounds=20",
                 num_clients=100)
    assert p.planned_epsilon <= 3.0 and p.z > 0
    with pytest.raises(ConfigError, match=r"^privacy.max_epsilon: 20 rounds"):
        pipeline("privacy.mode=central", "privacy.noise_multiplier=0.5", "privacy.max_epsilon=1.0",
                 "algorithm.clients_per_round=5", "run.rounds=20", num_clients=100)


def test_robust_median_replaces_the_mean_and_an_attack_is_crafted_into_the_stack():
    p = pipeline("robust.aggregator.name=median", "algorithm.clients_per_round=5", num_clients=6)
    p.upload_spec(("delta",), list(range(5)))
    vs = [np.array([1.0]), np.array([2.0]), np.array([3.0]), np.array([100.0]), np.array([4.0])]
    assert p.combine(as_results(vs), "delta", [0.2] * 5, plain_sum) == pytest.approx([3.0])
    q = pipeline("robust.attack.name=sign_flip", "robust.attack.count=1", "robust.attack.scale=10",
                 "algorithm.clients_per_round=6", num_clients=6)
    (bad,) = q.byzantine.byzantine
    q.upload_spec(("delta",), list(range(6)))
    res = [Result(client=c, values={"delta": np.array([1.0])}, extra={}) for c in range(6)]
    out = q.combine(res, "delta", [1 / 6] * 6, plain_sum)
    assert out == pytest.approx([(5 * 1.0 - 10.0) / 6])  # the mean, with the attacker's -10 in it
    assert bad in range(6)


# ---------------------------------------------------------------- config checks


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.name=qfedavg", "compression.name=topk", "compression.ratio=0.1"], "compression"),
    (["robust.aggregator.name=median", "engine.preaggregate=on"], "engine.preaggregate"),
    (["robust.aggregator.name=median", "privacy.mode=central", "privacy.noise_multiplier=1"], "robust"),
    (["privacy.mode=central"], "privacy.noise_multiplier"),
    (["privacy.mode=central", "privacy.noise_multiplier=1", "privacy.target_epsilon=2"], "privacy.noise_multiplier"),
    (["privacy.mode=central", "privacy.noise_multiplier=1", "privacy.sampling=fixed", "privacy.accountant=pld"], "privacy.accountant"),
    (["privacy.mode=central", "privacy.noise_multiplier=1", "privacy.delta=2"], "privacy.delta"),
    (["privacy.mode=local", "privacy.noise_multiplier=1", "privacy.adaptive=true"], "privacy.adaptive"),
    (["privacy.mode=central", "privacy.noise_multiplier=1", "algorithm.server_as_client=true", "data.server_fraction=0.1"],
     "algorithm.server_as_client"),
    (["robust.attack.name=alie"], "robust.attack.count"),
    (["robust.aggregator.name=trimmed_mean"], "robust.aggregator.trim"),
])
def test_bad_pipeline_settings_fail_in_one_line_naming_the_field(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.key == key and "\n" not in str(err.value)
