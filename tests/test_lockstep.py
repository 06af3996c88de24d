"""Client functions without a batched twin that train with `rayfl.local_sgd` run batched: the
host runs them in lockstep (rayfl.engine.lockstep), each parking at its local SGD, which then
runs as one batched computation. The outputs, the client states and the work meters equal the
loop's to float32 rounding, whatever each client does around its local SGD."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rayfl.algorithms.ditto import ditto_client
from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.config import section_config
from rayfl.engine.context import ClientContext
from rayfl.engine.lockstep import Lockstep, solve_together
from rayfl.models import build_model

F_IN, C = 6, 3


def contexts(sizes: list[int], model_cfg: dict[str, Any], seed: int = 5) -> list[ClientContext]:
    rng = np.random.default_rng(0)
    model = build_model(section_config("model", **model_cfg), (F_IN,), C)
    out = []
    for k, n in enumerate(sizes):
        x = torch.from_numpy(rng.normal(size=(n, F_IN)).astype(np.float32))
        y = torch.from_numpy(rng.integers(0, C, n).astype(np.int64))
        out.append(ClientContext(id=k, round=2, seed=seed, model=model, device=torch.device("cpu"), x=x, y=y,
                                 test_x=None, test_y=None, state={}))
    return out


def twice_or_never(ctx: ClientContext, params: np.ndarray, lr: float, schedule: LocalSchedule) -> dict[str, Any]:
    """Client 0 trains not at all, client 1 once, the others twice (a FedDyn-like correction
    from state in between): the lockstep must handle clients parking different numbers of times."""
    x = torch.tensor(params)
    if ctx.id == 0:
        return {"delta": torch.zeros_like(x), "loss": float("nan")}
    y, loss = local_sgd(ctx, x, lr, schedule, weight_decay=0.01)
    if ctx.id > 1:
        g = ctx.state.get("g", torch.zeros_like(x)) + 0.1 * (y - x)
        ctx.state["g"] = g
        y, loss = local_sgd(ctx, y, lr, schedule, prox_mu=0.5, prox_center=x, correction=-g)
    return {"delta": y - x, "loss": loss}


def run_both(fn, sizes, model_cfg, kwargs) -> tuple[list[Any], list[Any], list[ClientContext], list[ClientContext]]:
    loop_ctxs, step_ctxs = contexts(sizes, model_cfg), contexts(sizes, model_cfg)
    loop = [fn(ctx, **kwargs) for ctx in loop_ctxs]
    calls: list[int] = []

    def solve(requests):
        calls.append(len(requests))
        solve_together(requests)

    stepped = Lockstep().run(fn, [(ctx, kwargs) for ctx in step_ctxs], solve)
    run_both.calls = calls
    return loop, stepped, loop_ctxs, step_ctxs


@pytest.mark.parametrize("model_cfg", [{"name": "mlp", "hidden": [8]}, {"name": "linear"}], ids=["mlp", "linear"])
def test_lockstep_equals_the_loop_for_clients_that_park_unequally(model_cfg):
    params = build_model(section_config("model", **model_cfg), (F_IN,), C)
    x0 = torch.cat([p.detach().flatten() for p in params.parameters()]).numpy()
    kwargs = {"params": x0, "lr": 0.1, "schedule": LocalSchedule(4, 2, None)}
    loop, stepped, lc, sc = run_both(twice_or_never, [5, 9, 13, 7], model_cfg, kwargs)
    assert run_both.calls == [3, 2]  # three clients parked first, two of them again
    for a, b, ca, cb in zip(loop, stepped, lc, sc, strict=True):
        np.testing.assert_allclose(np.asarray(b["delta"]), np.asarray(a["delta"]), atol=2e-6)
        assert (np.isnan(a["loss"]) and np.isnan(b["loss"])) or a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert (ca.work.backward_samples, ca.work.steps) == (cb.work.backward_samples, cb.work.steps)
        if "g" in ca.state:
            np.testing.assert_allclose(cb.state["g"].numpy(), ca.state["g"].numpy(), atol=2e-6)


def test_ditto_runs_its_two_local_sgd_calls_batched():
    model_cfg = {"name": "mlp", "hidden": [8]}
    x0 = np.random.default_rng(1).normal(scale=0.3, size=F_IN * 8 + 8 + 8 * C + C).astype(np.float32)
    kwargs = {"params": x0, "lr": 0.2, "personal_lr": 0.1, "lam": 0.5, "schedule": LocalSchedule(4, None, 3)}
    loop, stepped, lc, sc = run_both(ditto_client, [6, 11, 8], model_cfg, kwargs)
    assert run_both.calls == [3, 3]
    for a, b, ca, cb in zip(loop, stepped, lc, sc, strict=True):
        np.testing.assert_allclose(np.asarray(b["delta"]), np.asarray(a["delta"]), atol=2e-6)
        np.testing.assert_allclose(cb.state["personal"].numpy(), ca.state["personal"].numpy(), atol=2e-6)


def test_a_client_error_is_raised_after_every_client_ends():
    def fails_for_one(ctx, params, lr, schedule):
        y, _ = local_sgd(ctx, torch.tensor(params), lr, schedule)
        if ctx.id == 1:
            raise ValueError("client 1 is broken")
        return {"delta": y}

    kwargs = {"params": np.zeros(F_IN * C + C, np.float32), "lr": 0.1, "schedule": LocalSchedule(4, 1, None)}
    ctxs = contexts([4, 4, 4], {"name": "linear"})
    with pytest.raises(ValueError, match="client 1 is broken"):
        Lockstep().run(fails_for_one, [(c, kwargs) for c in ctxs], solve_together)
    assert all(c.lockstep is None for c in ctxs)
