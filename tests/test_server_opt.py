"""Server optimizers (FedAdam) and the clients' round-wise learning rate: the update rules by
hand / against torch.optim.Adam, and FedAvg's loop using both (in process, no Ray)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rayfl.algorithms.fedavg import FedAvg, FedAvgConfig, ScaffoldConfig, fedavg_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.algorithms.round_lr import RoundLRConfig, round_lr
from rayfl.algorithms.server_opt import AdamMoments, ServerOptimizerConfig, server_step
from rayfl.config import ConfigError, RunConfig, load_config
from rayfl.driver import Algorithm, drive
from rayfl.driver.server_optimizer import ServerOptimizer
from rayfl.driver.settings import ServerConfig
from tests.test_maml_baselines import InProcessFed, tiny_dataset, x0


def torch_adam(x: np.ndarray, grads: list[np.ndarray], lr: float, betas=(0.9, 0.999), eps=1e-8) -> list[np.ndarray]:
    """torch's Adam, float64, on the given gradients: the iterates after each step."""
    p = torch.nn.Parameter(torch.tensor(x, dtype=torch.float64))
    opt = torch.optim.Adam([p], lr=lr, betas=betas, eps=eps)
    out = []
    for g in grads:
        opt.zero_grad()
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


def test_fedadam_steps_are_torch_adam_on_minus_the_mean_delta():
    x = np.array([0.3, -1.0, 2.0])
    deltas = [np.array([0.5, -2.0, 0.0]), np.array([1.0, 1.0, -0.25]), np.array([-0.1, 0.3, 0.2])]
    cfg, moments = ServerOptimizerConfig(name="adam", beta1=0.8, beta2=0.99, eps=1e-3), AdamMoments()
    expected = torch_adam(x, [-d for d in deltas], lr=0.05, betas=(0.8, 0.99), eps=1e-3)
    for delta, want in zip(deltas, expected, strict=True):
        x = server_step(x, delta, 0.05, cfg, moments)
        np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-15)
    assert moments.steps == 3


def test_first_fedadam_step_moves_each_coordinate_by_lr_along_the_delta():
    """Bias correction makes step 1 lr * g / (|g| + eps): lr times the delta's sign."""
    x = server_step(np.zeros(2), np.array([4.0, -0.5]), 0.1, ServerOptimizerConfig(name="adam"), AdamMoments())
    np.testing.assert_allclose(x, [0.1, -0.1], rtol=1e-6)


def test_sgd_step_is_x_plus_lr_delta():
    x, d = np.array([1.0, 2.0]), np.array([0.5, -4.0])
    np.testing.assert_array_equal(server_step(x, d, 0.5, ServerOptimizerConfig(), None), x + 0.5 * d)


def test_round_lr_by_hand():
    lin = RoundLRConfig(kind="linear", warmup_fraction=0.1)
    # 20 rounds: W = 2 warm-up rounds (lr/2, lr), then lr (20 - r) / 18: lr at r = 2, lr/18 at r = 19
    assert [round_lr(lin, 0.9, r, 20) for r in (0, 1, 2, 11, 19)] == pytest.approx([0.45, 0.9, 0.9, 0.45, 0.05])
    step = RoundLRConfig(kind="step", step_rounds=500, factor=0.5)
    assert [round_lr(step, 0.5, r, 2000) for r in (0, 499, 500, 1000, 1999)] == pytest.approx([0.5, 0.5, 0.25, 0.125, 0.0625])
    assert round_lr(RoundLRConfig(), 0.3, 7, 10) == 0.3


def test_bad_server_optimizer_and_round_lr_name_their_fields():
    with pytest.raises(ConfigError, match=r"algorithm\.server_optimizer\.beta2"):
        load_config(None, ["algorithm.name=fedavg", "algorithm.server_optimizer={name: adam, beta2: 1.0}"])
    with pytest.raises(ConfigError, match=r"algorithm\.round_lr\.kind"):
        load_config(None, ["algorithm.name=fedavg", "algorithm.round_lr={kind: cosine}"])
    with pytest.raises(ConfigError, match=r"algorithm\.server_optimizer\.name"):
        ScaffoldConfig(server_optimizer=ServerOptimizerConfig(name="adam")).validate()


class SummingFed(InProcessFed):
    """The stand-in with FedAvg's two extra needs: `keep` (nothing kept here) and the sum."""

    def call(self, ids, fn, *, keep=(), expect_weights=None, **kwargs):
        return super().call(ids, fn, **kwargs)

    def weighted_sum(self, results, key, weights):
        return sum(w * np.asarray(r[key], dtype=np.float64) for r, w in zip(results, weights, strict=True))


def test_fedavg_with_fedadam_and_a_step_schedule_equals_its_two_rounds_by_hand():
    """Round r: clients run local SGD at 0.3 * 0.5**r (the schedule reaches them), the server
    takes torch's Adam step on -(sample-weighted mean delta)."""
    ds, start = tiny_dataset(), x0()
    cfg = FedAvgConfig(lr=0.3, local_steps=2, local_epochs=None, batch_size=4, clients_per_round=2, server_lr=0.05,
                       server_optimizer=ServerOptimizerConfig(name="adam"),
                       round_lr=RoundLRConfig(kind="step", step_rounds=1, factor=0.5))
    fed = SummingFed(ds, start)
    out = drive(fed, FedAvg, cfg, RunConfig(rounds=2, eval_every=5))

    ref = InProcessFed(ds, start)  # the clients again, called by hand with each round's lr
    p = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    opt = torch.optim.Adam([p], lr=0.05)
    x = start.astype(np.float32)
    for r in range(2):
        res = ref.call([0, 1], fedavg_client, round=r, params=x, lr=0.3 * 0.5**r, weight_decay=0.0, prox_mu=0.0,
                       schedule=LocalSchedule(4, None, 2, None))
        w = ref.client_weights([0, 1])
        mean = sum(wi * np.asarray(rr["delta"], dtype=np.float64) for rr, wi in zip(res, w, strict=True))
        opt.zero_grad()
        p.grad = torch.tensor(-mean)
        opt.step()
        p.data = p.data.float().double()  # the server keeps x in float32 between rounds
        x = p.detach().numpy().astype(np.float32)
    np.testing.assert_allclose(out["final_params"], x, rtol=1e-6, atol=1e-7)
    assert fed.server_state.moments.steps == 2


def test_momentum_is_fedavgm_by_hand():
    """v_1 = delta_1, v_2 = beta v_1 + delta_2; x_t = x_{t-1} + lr v_t (the extending guide's
    FedAvgM, as a built-in server optimizer)."""
    cfg, moments = ServerOptimizerConfig(name="momentum", beta1=0.5), AdamMoments()
    x0, d1, d2 = np.array([1.0, -1.0]), np.array([0.2, 0.4]), np.array([-0.6, 0.1])
    x1 = server_step(x0, d1, 2.0, cfg, moments)
    np.testing.assert_allclose(x1, [1.4, -0.2], rtol=1e-15)
    x2 = server_step(x1, d2, 2.0, cfg, moments)
    np.testing.assert_allclose(x2, [1.4 + 2.0 * (0.1 - 0.6), -0.2 + 2.0 * (0.2 + 0.1)], rtol=1e-14)
    np.testing.assert_allclose(moments.m, [-0.5, 0.3], rtol=1e-14)
    assert moments.steps == 2


def test_yogi_steps_by_hand():
    """FedYogi (Reddi et al., Alg. 2) with g = -delta: v starts at tau^2 and moves by
    -(1 - b2) g^2 sign(v - g^2), so it grows while g^2 exceeds it and shrinks after; no bias
    correction."""
    b1, b2, tau, lr = 0.5, 0.9, 0.1, 0.2
    cfg, moments = ServerOptimizerConfig(name="yogi", beta1=b1, beta2=b2, eps=tau), AdamMoments()
    x = server_step(np.array([0.0]), np.array([-1.0]), lr, cfg, moments)  # g = 1
    m, v = 0.5 * 1.0, 0.01 + 0.1 * 1.0  # v < g^2: it grows by (1 - b2) g^2
    np.testing.assert_allclose(x, [-lr * m / (np.sqrt(v) + tau)], rtol=1e-14)
    x = server_step(x, np.array([-0.1]), lr, cfg, moments)  # g = 0.1, g^2 = 0.01 < v: it shrinks
    m2, v2 = 0.5 * m + 0.5 * 0.1, v - 0.1 * 0.01
    np.testing.assert_allclose(x, [-lr * m / (np.sqrt(v) + tau) - lr * m2 / (np.sqrt(v2) + tau)], rtol=1e-14)
    np.testing.assert_allclose([moments.m[0], moments.v[0]], [m2, v2], rtol=1e-14)


def test_every_server_optimizer_is_accepted_and_an_unknown_one_named():
    for name in ("sgd", "momentum", "adam", "yogi"):
        load_config(None, ["algorithm.name=fedavg", f"algorithm.server_optimizer={{name: {name}}}"])
    with pytest.raises(ConfigError, match=r"algorithm\.server_optimizer\.name.*'momentum', 'adam', 'yogi'"):
        load_config(None, ["algorithm.name=fedavg", "algorithm.server_optimizer={name: adagrad}"])


@dataclass
class TwoModels:
    x: np.ndarray
    other: float = 0.0


def test_the_drivers_momentum_steps_any_algorithms_model_change_by_hand():
    """x' from the algorithm's own update; the driver sets x_t = x_{t-1} + lr v_t with
    v_t = beta v_{t-1} + (x' - x_{t-1}), and keeps the rest of the state as the update made it."""
    alg = Algorithm.__new__(Algorithm)
    opt = ServerOptimizer(alg, ServerConfig(optimizer="momentum", lr=2.0, beta1=0.5), AdamMoments())
    x0 = np.array([1.0, -1.0], dtype=np.float32)
    s1 = opt(opt.start(TwoModels(x0)), TwoModels(x0 + np.float32([0.25, 0.5]), other=3.0))
    np.testing.assert_array_equal(s1.x, np.float32([1.5, 0.0]))
    assert s1.x.dtype == np.float32 and s1.other == 3.0
    s2 = opt(opt.start(s1), TwoModels(s1.x + np.float32([-0.5, 0.25])))
    np.testing.assert_allclose(s2.x, [1.5 + 2.0 * (0.125 - 0.5), 0.0 + 2.0 * (0.25 + 0.25)], rtol=1e-7)
    assert opt.moments.steps == 2


def test_the_servers_section_on_fedavg_equals_fedavgs_own_optimizer():
    """`server: {optimizer: yogi}` applied by the driver to FedAvg's plain average is
    `algorithm.server_optimizer: {name: yogi}` (to float32 rounding of the averaged step)."""
    ds, start = tiny_dataset(), x0()
    yogi = ServerOptimizerConfig(name="yogi", beta1=0.5, beta2=0.9, eps=0.01)
    common = dict(lr=0.3, local_steps=2, local_epochs=None, batch_size=4, clients_per_round=2)
    own = SummingFed(ds, start)
    out_own = drive(own, FedAvg, FedAvgConfig(**common, server_lr=0.05, server_optimizer=yogi), RunConfig(rounds=3, eval_every=5))
    driven = SummingFed(ds, start)
    driven.cfg = SimpleNamespace(server=ServerConfig(optimizer="yogi", lr=0.05, beta1=0.5, beta2=0.9, eps=0.01))
    driven.driver_state = {}
    out_driven = drive(driven, FedAvg, FedAvgConfig(**common), RunConfig(rounds=3, eval_every=5))
    np.testing.assert_allclose(out_driven["final_params"], out_own["final_params"], rtol=1e-5, atol=1e-6)
    assert driven.driver_state["server_optimizer"].steps == 3
    assert np.abs(out_driven["final_params"] - start).max() > 0.05  # three steps of 0.05 or so moved it


def test_the_server_section_names_what_it_cannot_do():
    with pytest.raises(ConfigError, match=r"^server\.optimizer: algorithm\.server_optimizer is already adam"):
        load_config(None, ["algorithm.name=fedavg", "algorithm.server_optimizer={name: adam}", "server.optimizer=momentum"])
    with pytest.raises(ConfigError, match=r"^server\.optimizer: 'fedrzo_bl' is a hand-written server loop"):
        load_config(None, ["algorithm.name=fedrzo_bl", "server.optimizer=momentum"])
    with pytest.raises(ConfigError, match=r"^server\.beta1"):
        load_config(None, ["algorithm.name=ditto", "server.optimizer=momentum", "server.beta1=1.0"])
    load_config(None, ["algorithm.name=ffgg", "server.optimizer=momentum"])  # FFGG writes theta back
