"""ZO-HFL's batched client function (`zo_hfl_clients`) against the plain loop (`zo_hfl_client`).

Without Ray: two identical in-process ClientHostImpl hosts run the same calls with `vectorize:
off` and `on`; every record (work meter, bytes, state_changed) must be identical, the values
and each client's warm-start state y_bar equal to float32 tolerance, over several rounds, every
message mode, unequal clients (one empty, one with a short batch, one with H = 0), per-client
constraint radii and a deadline's work budget. A spy checks that the twin really ran (a twin
that silently declined would make every comparison pass)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from host_fixtures import sized_host

from rayfl.algorithms.zo_hfl import zo_hfl_client, zo_hfl_clients
from rayfl.config import section_config
from rayfl.engine.host import ClientHostImpl, _Job
from rayfl.engine.vectorized import batched_version, use_batched
from rayfl.zo import ConstraintConfig, direction_seed, sphere_from_seed

F_IN, C = 6, 3
SIZES = {0: 30, 1: 12, 2: 5, 3: 0, 4: 20}  # b = 8, 8, 5 (short), 0 (empty), 8
STEPS = {0: 6, 1: 4, 2: 7, 3: 3, 4: 0}  # unequal H, client 4 a straggler (H = 0)
TOL = dict(rtol=1e-5, atol=2e-6)
RECORD_KEYS = ("client", "num_samples", "forward_samples", "backward_samples", "local_steps", "truncated",
               "bytes_up", "bytes_down", "state_changed")


def make_host(vectorize: str, bias: bool = True, model: str = "linear") -> ClientHostImpl:
    return sized_host(SIZES, F_IN, C, section_config("model", name=model, bias=bias, **({} if model == "linear" else {"hidden": [4]})), 5, 1.0, vectorize)


def dim(bias: bool = True) -> int:
    return C * F_IN + (C if bias else 0)


def broadcast(bias: bool = True, **over) -> dict:
    x = np.random.default_rng(7).normal(scale=0.3, size=dim(bias)).astype(np.float32)
    base = dict(params=x, eta=0.1, lam=1.0, mu=0.1, lr=0.5, lr_offset=1.0, batch_size=8,
                constraint=ConstraintConfig(), randomness="common", client_init="warm", upload="models")
    return base | over


def per_client(r: int, seed_mode: bool = False, bias: bool = True, clients=tuple(SIZES), steps=None) -> dict:
    steps = STEPS if steps is None else steps
    out = {}
    for c in clients:
        s = direction_seed(11, r, c)
        out[c] = {"steps": steps[c], **({"direction_seed": s} if seed_mode else
                                         {"direction": sphere_from_seed(s, dim(bias)).astype(np.float32)})}
    return out


class Spy:
    """Counts the twin's answers (None: it declined and the host looped)."""

    def __init__(self):
        self.answers: list[bool] = []

    def __enter__(self):
        def spy(ctxs, kwargs):
            out = zo_hfl_clients(ctxs, kwargs)
            self.answers.append(out is not None)
            return out

        zo_hfl_client.__rayfl_batched__ = spy
        return self

    def __exit__(self, *exc):
        zo_hfl_client.__rayfl_batched__ = zo_hfl_clients


def run_both(rounds: int = 1, clients=tuple(SIZES), budgets=None, seed_mode=False, bias=True, steps=None, **over):
    """(loop records, loop host), (batched records, batched host) after `rounds` calls; the
    twin must have answered every batched call."""
    out = {}
    for mode in ("off", "on"):
        host = make_host(mode, bias)
        with Spy() as spy:
            for r in range(rounds):
                recs = host.run(zo_hfl_client, list(clients), r, broadcast(bias, **over),
                                per_client(r, seed_mode, bias, clients, steps), budgets)
        assert spy.answers == ([] if mode == "off" else [True] * rounds)
        out[mode] = (recs, host)
    return out["off"], out["on"]


def assert_match(loop, vec) -> None:
    (recs_l, host_l), (recs_v, host_v) = loop, vec
    assert len(recs_l) == len(recs_v)
    for a, b in zip(recs_l, recs_v, strict=True):
        for key in RECORD_KEYS:
            assert a[key] == b[key], (key, a["client"], a[key], b[key])
        assert a["values"].keys() == b["values"].keys()
        for key, v in a["values"].items():
            np.testing.assert_allclose(b["values"][key], v, **TOL, err_msg=f"{key} of client {a['client']}")
    for c in SIZES:
        a, b = host_l.states[c].get("y_bar"), host_v.states[c].get("y_bar")
        assert (a is None) == (b is None), c
        if a is not None:
            np.testing.assert_allclose(b.numpy(), a.numpy(), **TOL, err_msg=f"y_bar of client {c}")


@pytest.mark.parametrize("randomness", ["common", "independent"])
@pytest.mark.parametrize("client_init", ["warm", "input"])
@pytest.mark.parametrize("upload", ["models", "scalars"])
def test_batched_equals_loop_over_rounds(randomness, client_init, upload):
    loop, vec = run_both(rounds=3, randomness=randomness, client_init=client_init, upload=upload)
    assert_match(loop, vec)
    recs = vec[0]
    assert [r["local_steps"] for r in recs] == [12, 8, 14, 0, 0]  # 2 H gradient steps; nothing charged without data
    assert [r["backward_samples"] for r in recs] == [96, 64, 70, 0, 0]
    if upload == "models":
        v = recs[0]["values"]
        assert np.abs(v["y_plus"] - v["y_minus"]).max() > 1e-3 and np.isfinite(v["loss"])
        assert np.isnan(recs[3]["values"]["loss"]) and np.isnan(recs[4]["values"]["loss"])


def test_direction_as_seed_and_no_bias():
    assert_match(*run_both(rounds=2, seed_mode=True, bias=False))
    assert_match(*run_both(rounds=1, seed_mode=True, randomness="independent", upload="scalars"))


@pytest.mark.parametrize("constraint", [
    ConstraintConfig(kind="ball", radius=0.05, client_radius=[0.02, 0.05, 0.1, 0.03, 0.2]),
    ConstraintConfig(kind="ball", radius=0.04),
    ConstraintConfig(kind="box", low=-0.2, high=0.3),
    ConstraintConfig(kind="halfspace", offset=-3.0),
    ConstraintConfig(kind="simplex", radius=1.0, client_radius=[1.0, 2.0, 0.5, 1.0, 3.0]),
], ids=["ball_per_client", "ball", "box", "halfspace", "simplex_per_client"])
def test_constraints_project_every_row_like_the_loop(constraint):
    loop, vec = run_both(rounds=2, constraint=constraint)
    assert_match(loop, vec)
    if constraint.kind == "ball":
        x = broadcast()["params"]
        v = sphere_from_seed(direction_seed(11, 1, 2), dim()).astype(np.float32)
        gap = np.linalg.norm(vec[0][2]["values"]["y_plus"] - (x + np.float32(0.1) * v))
        assert gap == pytest.approx(constraint.radius_of(2), rel=1e-4)  # the projection binds
    if constraint.kind == "halfspace":
        assert vec[0][0]["values"]["y_plus"].sum() <= -3.0 + 1e-5 < broadcast()["params"].sum()  # x is outside it


def test_work_budget_truncates_each_client_like_the_loop():
    budgets = {0: 3.0 * 2 * 8 * 4, 1: 3.0 * 2 * 8 * 1 + 5, 2: 0.0, 3: 0.0}  # 4 steps, 1 step, none, none (no data)
    loop, vec = run_both(rounds=2, budgets=budgets)
    assert_match(loop, vec)
    recs = vec[0]
    assert [r["local_steps"] for r in recs] == [8, 2, 0, 0, 0]
    assert [r["truncated"] for r in recs] == [True, True, True, False, False]


def test_one_client_alone_and_independent_of_its_batch_mates():
    for c in (0, 2, 3):
        assert_match(*run_both(rounds=2, clients=(c,)))
    _, (together, _) = run_both(rounds=1)
    for c in (0, 1, 2):
        _, ((alone,), _) = run_both(rounds=1, clients=(c,))
        for key, v in alone["values"].items():
            np.testing.assert_allclose(together[c]["values"][key], v, **TOL)


def test_equal_steps_and_no_mu():
    assert_match(*run_both(rounds=2, mu=0.0, steps=dict.fromkeys(SIZES, 5)))


def test_declines_what_it_does_not_batch():
    assert batched_version(zo_hfl_client) is zo_hfl_clients
    assert use_batched("auto", zo_hfl_client, 2) is zo_hfl_clients and use_batched("off", zo_hfl_client, 5) is None
    mlp = make_host("on", model="mlp")
    d = sum(p.numel() for p in mlp.model.parameters())
    x = np.zeros(d, np.float32)
    extra = {c: {"steps": 2, "direction_seed": direction_seed(1, 0, c)} for c in (0, 1)}
    with Spy() as spy:
        recs = mlp.run(zo_hfl_client, [0, 1], 0, broadcast(params=x), extra)
    assert spy.answers == [False] and [r["local_steps"] for r in recs] == [4, 4]  # the loop ran instead
    host = make_host("on")
    ctxs = [host._prepare(_Job(c, 0, {}, {}))[1] for c in (0, 1)]
    kws = [broadcast() | per_client(0)[c] for c in (0, 1)]
    kws[1]["lr"] = 0.3  # a setting that differs between clients
    assert zo_hfl_clients(ctxs, kws) is None
    assert all(c.work.steps == 0 for c in ctxs)  # declining charged nothing


def test_state_rows_are_independent_tensors():
    _, (recs, host) = run_both(rounds=1)
    y_bar = host.states[0]["y_bar"]
    assert y_bar.shape == (dim(),) and y_bar.untyped_storage().nbytes() == 4 * dim()  # not a view of the batch
    assert isinstance(y_bar, torch.Tensor)
