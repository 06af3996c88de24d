"""`engine.channels_last` (rayfl.models.channels_last): convolution weights train in
channels-last buffers while the client's flat vector keeps NCHW order.

The values are pinned against hand-written SGD in float64 by
tests/test_vectorized_networks.py (the channels-last loop); here: the rule a host applies, that
the convolutions really run channels-last and the vector gets every step back, that a model
which cannot run that way is refused or left alone, and the host and config plumbing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from host_fixtures import sized_host
from torch import nn

from rayfl.algorithms.fedavg import fedavg_client
from rayfl.algorithms.local import LocalSchedule, local_sgd
from rayfl.config import ConfigError, load_config, section_config
from rayfl.engine.context import ClientContext
from rayfl.models import build_model
from rayfl.models.channels_last import channels_last_rule, channels_last_weights, runs_channels_last
from rayfl.models.params import bound_to, get_flat

CL = torch.channels_last
FEMNIST = section_config("model", name="femnist_cnn", channels=[2, 3], dense=8)
SHAPE = (1, 8, 8)


class ViewFlatten(nn.Module):
    """A convnet that flattens with `.view`, which cannot reorder a channels-last tensor."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(2 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.conv(x.reshape(-1, *SHAPE)))
        return self.out(h.view(h.shape[0], -1))


def femnist() -> nn.Module:
    torch.manual_seed(0)
    return build_model(FEMNIST, SHAPE, 3)


def test_the_rule_by_mode_model_and_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert channels_last_rule("auto", femnist(), SHAPE, cpu)
    assert channels_last_rule("on", femnist(), SHAPE, cpu)
    assert not channels_last_rule("off", femnist(), SHAPE, cpu)
    assert not channels_last_rule("auto", femnist(), SHAPE, cuda)  # cuDNN's own choice, never probed
    mlp = build_model(section_config("model", name="mlp", hidden=[4]), (6,), 3)
    assert not channels_last_rule("on", mlp, (6,), cpu)  # no convolutions: nothing to change


def test_a_model_that_cannot_run_channels_last_is_left_alone_or_refused():
    model = ViewFlatten()
    problem = runs_channels_last(model, SHAPE, torch.device("cpu"))
    assert problem is not None and "view" in problem
    assert runs_channels_last(femnist(), SHAPE, torch.device("cpu")) is None
    assert not channels_last_rule("auto", model, SHAPE, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"^engine\.channels_last: .*view"):
        channels_last_rule("on", model, SHAPE, torch.device("cpu"))
    # the weights went back, and the probe's dropout drew from a forked stream
    assert model.conv.weight.is_contiguous()
    torch.manual_seed(3)
    runs_channels_last(model, SHAPE, torch.device("cpu"))
    after_probe = torch.rand(1)
    torch.manual_seed(3)
    assert torch.equal(after_probe, torch.rand(1))


def test_weights_train_channels_last_and_every_step_reaches_the_vector():
    model = femnist()
    w = get_flat(model).clone()
    with bound_to(model, w) as bound:
        convs = [m.weight for m in bound.modules() if isinstance(m, nn.Conv2d)]
        views = [p.data for p in convs]
        with channels_last_weights(bound, True) as held:
            assert len(held.held) == 2
            for p in convs:  # explicit channels-last strides, even for one input channel
                assert p.stride()[1] == 1 and p.is_contiguous(memory_format=CL)
                p.data.add_(1.0)
            assert not any(torch.equal(p.data, v) for p, v in zip(convs, views, strict=True))
        for p, v in zip(convs, views, strict=True):
            assert p.data.data_ptr() == v.data_ptr()  # bound to w's slices again
    moved = w - get_flat(femnist())
    conv_ids = {id(p) for p in convs}
    is_conv = torch.cat([torch.full((p.numel(),), float(id(p) in conv_ids)) for p in model.parameters()])
    assert int(is_conv.sum()) == sum(p.numel() for p in convs)
    torch.testing.assert_close(moved, is_conv, rtol=0, atol=1e-6)  # exactly 0 off the convolutions
    assert not moved[is_conv == 0].any()


def test_a_failed_client_writes_nothing_back():
    model = femnist()
    w = get_flat(model).clone()
    with bound_to(model, w) as bound, pytest.raises(RuntimeError, match="mid-client"), \
            channels_last_weights(bound, True):
        next(m for m in bound.modules() if isinstance(m, nn.Conv2d)).weight.data.add_(1.0)
        raise RuntimeError("mid-client")
    assert torch.equal(w, get_flat(femnist()))
    assert all(m.weight.is_contiguous() for m in model.modules() if isinstance(m, nn.Conv2d))


@pytest.mark.parametrize("objective", ["sgd", "prox"])
def test_local_sgd_runs_its_convolutions_channels_last(objective):
    """The convolutions see channels-last weights on every step of both paths (plain SGD and
    the flat-gradient path of FedProx), and the result is NCHW's to float32 rounding."""
    seen: list[bool] = []
    model = femnist()
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_pre_hook(lambda mod, args: seen.append(mod.weight.is_contiguous(memory_format=CL)
                                                                      and mod.weight.stride()[1] == 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, *SHAPE, generator=g), torch.randint(0, 3, (10,), generator=g)
    start = get_flat(model)
    kw = {"prox_mu": 0.1, "prox_center": start} if objective == "prox" else {}
    out = {}
    for flag in (False, True):
        seen.clear()
        ctx = ClientContext(id=1, round=0, seed=2, model=model, device=torch.device("cpu"), x=x, y=y,
                            test_x=None, test_y=None, state={}, channels_last=flag)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out[flag] = local_sgd(ctx, start, 0.1, LocalSchedule(4, 2, None), **kw)[0]
        # the flat gradient's views get channels-last buffers too: autograd accumulates in layout
        assert not [w for w in caught if "layout contract" in str(w.message)]
        assert seen == [flag] * 12  # 2 convolutions x 3 minibatches x 2 passes
    assert (out[True] - start).abs().max() > 1e-2
    np.testing.assert_allclose(out[True].numpy(), out[False].numpy(), rtol=1e-5, atol=1e-6)


def test_hosts_apply_the_setting():
    sizes = {0: 6, 1: 9}
    hosts = {mode: sized_host(sizes, SHAPE, 3, FEMNIST, 3, 10.0, "off", "cpu", channels_last=mode)
             for mode in ("auto", "off")}
    assert hosts["auto"].channels_last and not hosts["off"].channels_last
    broadcast = {"params": get_flat(femnist()).numpy(), "lr": 0.1, "schedule": LocalSchedule(4, 1, None)}
    auto, off = (hosts[m].run(fedavg_client, list(sizes), 0, broadcast) for m in ("auto", "off"))
    for a, b in zip(auto, off, strict=True):
        assert a["local_steps"] == b["local_steps"] > 0
        np.testing.assert_allclose(a["values"]["delta"], b["values"]["delta"], rtol=1e-5, atol=1e-6)
    assert all(m.weight.is_contiguous() for m in hosts["auto"].model.modules() if isinstance(m, nn.Conv2d))


def test_the_config_field_is_checked():
    assert load_config(None, []).engine.channels_last == "auto"
    with pytest.raises(ConfigError, match=r"^engine\.channels_last"):
        load_config(None, ["engine.channels_last=sometimes"])


def test_a_weight_two_convolutions_share_trains_once():
    """One Parameter in two Conv2d modules: one buffer, and its steps reach the vector."""
    conv = nn.Conv2d(2, 2, 3, padding=1)
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), conv, nn.Conv2d(2, 2, 3, padding=1))
    model[2].weight = conv.weight
    w = get_flat(model).clone()
    before = w.clone()
    with bound_to(model, w) as bound, channels_last_weights(bound, True) as held:
        assert len(held.held) == 2 and model[2].weight is conv.weight
        conv.weight.data.add_(1.0)
    start = model[0].weight.numel() + model[0].bias.numel()  # conv's weight follows the first layer's
    shared = slice(start, start + conv.weight.numel())
    torch.testing.assert_close(w[shared], before[shared] + 1.0, rtol=0, atol=1e-6)
    rest = torch.ones_like(w, dtype=torch.bool)
    rest[shared] = False
    assert torch.equal(w[rest], before[rest])


VIEW_NET = '''
from torch import nn


class ViewNet(nn.Module):
    """Flattens a convolution's output with `.view`."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.out = nn.Linear(2 * 16, num_classes)

    def forward(self, x):
        h = self.conv(x.reshape(x.shape[0], 1, 4, 4))
        return self.out(h.view(h.shape[0], -1))


def build(input_shape, num_classes):
    return ViewNet(input_shape, num_classes)
'''


def test_a_user_model_that_cannot_run_channels_last(tmp_path):
    """A model of the user's, outside the repository: `on` stops the run at host start with
    one line naming the key and status 2, leaving no run directory behind; `auto` then trains
    it in NCHW under the same run id."""
    import os
    import subprocess
    import sys

    from guide_blocks import environment

    (tmp_path / "viewnet.py").write_text(VIEW_NET)
    env = {**environment(), "PYTHONPATH": str(tmp_path)}
    keys = ["model.name=viewnet:build", "data.features=16", "run.rounds=2", "engine.num_hosts=1", "engine.pool=off",
            f"output.dir={tmp_path / 'results'}", "run.experiment=ex", "run.run_id=viewnet"]

    def run(mode: str) -> subprocess.CompletedProcess:
        args = [a for k in (*keys, f"engine.channels_last={mode}") for a in ("--set", k)]
        rayfl = os.path.join(os.path.dirname(sys.executable), "rayfl")
        return subprocess.run([rayfl, "run", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    refused = run("on")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("rayfl: error")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-3000:]
    assert errors[0] == refused.stderr.strip().splitlines()[-1]  # the last line: nothing after it
    assert errors[0].startswith("rayfl: error: engine.channels_last:") and "view" in errors[0]
    assert not (tmp_path / "results" / "ex" / "viewnet").exists()
    done = run("auto")
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"num_updates": 10' in done.stdout.splitlines()[-1]
