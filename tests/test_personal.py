"""Partial-personalization masks on the real networks, and adapters / LoRA (FFGG, Table 1 "Adapter"):
each scheme picks exactly its parameters, adapters start as the identity edit, LoRA computes
W + (alpha / r) B A, and no model keeps buffers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rayfl.config import ConfigError, section_config
from rayfl.models.adapters import LoRAConv2d, LoRALinear
from rayfl.models.init_from import copy_by_name
from rayfl.models.networks import build_model, init_params
from rayfl.models.params import get_flat, set_flat
from rayfl.models.personal import personal_mask

RESNET = dict(name="resnet18", width=4, norm_groups=2)
TRANSFORMER = dict(name="transformer", dim=8, heads=2, ffn_dim=16, layers=3)
MLP = dict(name="mlp", hidden=[12, 10])
IMAGE, SEQ = (1, 12, 12), (5,)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks: one thread avoids thread contention on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def model(kind: dict, adapter: str = "none", rank: int = 2) -> torch.nn.Module:
    shape, classes = (SEQ, 11) if kind["name"] == "transformer" else (IMAGE, 7)
    torch.manual_seed(0)
    return build_model(section_config("model", **kind, adapter=adapter, adapter_rank=rank), shape, classes)


def picked(m: torch.nn.Module, scheme: str, patterns: tuple[str, ...] = ()) -> set[str]:
    """The parameter names the mask marks, read back through the flat vector's layout: every
    entry of a parameter must agree (a mask misaligned with the layout fails here)."""
    mask = personal_mask(m, scheme, patterns)
    assert mask.dtype == bool and len(mask) == sum(p.numel() for p in m.parameters())
    out, offset = set(), 0
    for name, p in m.named_parameters():
        part = mask[offset : offset + p.numel()]
        assert part.all() or not part.any(), f"{name} is split by the mask"
        if part.all():
            out.add(name)
        offset += p.numel()
    return out


def names(m: torch.nn.Module) -> list[str]:
    return [n for n, _ in m.named_parameters()]


def test_resnet_input_output_schemes_are_the_stem_and_the_classifier():
    m = model(RESNET)
    assert picked(m, "input") == {"conv1.weight", "norm1.weight", "norm1.bias"}
    assert picked(m, "output") == {"fc.weight", "fc.bias"}
    assert picked(m, "none") == set()
    assert picked(m, "all") == set(names(m))


def test_transformer_input_output_schemes_are_the_first_and_last_blocks():
    m = model(TRANSFORMER)
    assert picked(m, "input") == {n for n in names(m) if n.startswith("blocks.0.")}
    assert picked(m, "output") == {n for n in names(m) if n.startswith("blocks.2.")}
    assert "blocks.0.q.weight" in picked(m, "input") and "embed.weight" not in picked(m, "input")


def test_mlp_schemes_fall_back_to_first_and_last_layer():
    m = model(MLP)
    assert picked(m, "input") == {"1.weight", "1.bias"}
    assert picked(m, "output") == {"5.weight", "5.bias"}
    assert picked(m, "patterns", ("3.*",)) == {"3.weight", "3.bias"}


def test_residual_adapter_scheme_picks_exactly_the_adapters():
    m = model(RESNET, "residual")
    expected = {n for n in names(m) if ".adapter1." in n or ".adapter2." in n}
    assert len(expected) == 4 * 2 * 2 * 3  # 4 stages x 2 blocks x 2 adapters x (GN w, GN b, conv)
    assert picked(m, "adapter") == expected
    with_norms = picked(m, "adapter_norm")
    assert expected < with_norms and "layer1.0.norm1.weight" in with_norms and "layer1.0.conv1.weight" not in with_norms
    t = model(TRANSFORMER, "residual")
    assert picked(t, "adapter") == {n for n in names(t) if "_adapter." in n}
    assert len(picked(t, "adapter")) == 3 * 2 * 4  # 3 blocks x 2 adapters x (down w, b, up w, b)


def test_lora_adapter_scheme_picks_exactly_the_lora_factors():
    m = model(RESNET, "lora")
    lora = {n for n in names(m) if n.endswith(("lora_a", "lora_b"))}
    assert picked(m, "adapter") == lora
    # every conv inside the residual stages has its pair; the stem and classifier do not
    convs = [n for n, mod in m.named_modules() if isinstance(mod, LoRAConv2d)]
    assert len(lora) == 2 * len(convs) and len(convs) == 4 * 2 * 2 + 3  # + 3 shortcut convs
    assert not any(n.startswith(("conv1.", "fc.")) for n in lora)
    t = model(TRANSFORMER, "lora")
    assert picked(t, "adapter") == {n for n in names(t) if "lora_" in n}
    assert len(picked(t, "adapter")) == 3 * 6 * 2  # 3 blocks x (q, k, v, o, fc1, fc2) x (A, B)
    mlp = model(MLP, "lora")
    assert picked(mlp, "adapter") == {"3.lora_a", "3.lora_b"}


def test_adapter_scheme_without_adapters_and_unknown_schemes_fail():
    with pytest.raises(ValueError, match="adapter"):
        personal_mask(model(MLP), "adapter")
    with pytest.raises(ValueError, match="unknown"):
        personal_mask(model(MLP), "hidden")


@pytest.mark.parametrize(
    "kind,adapter",
    [(RESNET, "residual"), (RESNET, "lora"), (TRANSFORMER, "residual"), (TRANSFORMER, "lora"), (MLP, "lora")],
)
def test_adapted_model_equals_base_model_at_init_and_after_a_redraw(kind, adapter):
    base, adapted = model(kind), model(kind, adapter)
    vec = copy_by_name(base, get_flat(base).numpy(), adapted, get_flat(adapted).numpy())
    set_flat(adapted, vec)
    x = torch.randint(0, 11, (3, *SEQ)).float() if kind is TRANSFORMER else torch.rand(3, *IMAGE)
    base.eval()
    adapted.eval()
    assert torch.allclose(adapted(x), base(x), atol=1e-6)
    # FFGG's fresh w (init_params from a client's stream) keeps adapters at the identity edit
    init_params(adapted, torch.Generator().manual_seed(3))
    redrawn = {n: p.detach().clone() for n, p in adapted.named_parameters()}
    for n, p in base.named_parameters():
        with torch.no_grad():
            p.copy_(redrawn[n])
    assert torch.allclose(adapted(x), base(x), atol=1e-6)
    # ... and the adapter is not dead: its zero-initialised factor gets a gradient
    loss = adapted(x).square().mean()
    grads = torch.autograd.grad(loss, [p for n, p in adapted.named_parameters() if n in picked(adapted, "adapter")])
    assert any(float(g.abs().sum()) > 0 for g in grads)


def test_lora_linear_and_conv_compute_the_low_rank_edit():
    torch.manual_seed(1)
    lin = LoRALinear(5, 4, rank=2, alpha=3.0)
    with torch.no_grad():
        lin.lora_b.normal_()
    x = torch.randn(6, 5)
    w = lin.weight.detach().double().numpy() + 1.5 * lin.lora_b.detach().double().numpy() @ lin.lora_a.detach().double().numpy()
    expected = x.double().numpy() @ w.T + lin.bias.detach().double().numpy()
    assert np.allclose(lin(x).detach().double().numpy(), expected, atol=1e-5)

    conv = LoRAConv2d(torch.nn.Conv2d(3, 4, 3, padding=1), rank=2)
    with torch.no_grad():
        conv.lora_b.normal_()
    xi = torch.randn(2, 3, 6, 6)
    merged = conv.weight + (conv.lora_b @ conv.lora_a).reshape(conv.weight.shape)  # alpha = rank: scale 1
    assert torch.allclose(conv(xi), F.conv2d(xi, merged, conv.bias, padding=1), atol=1e-5)


@pytest.mark.parametrize("kind", [RESNET, TRANSFORMER])
@pytest.mark.parametrize("adapter", ["none", "residual", "lora"])
def test_networks_keep_no_buffers(kind, adapter):
    assert list(model(kind, adapter).buffers()) == []


def test_copy_by_name_rejects_a_source_parameter_the_target_lacks():
    base, other = model(MLP), model(dict(name="mlp", hidden=[12]))
    with pytest.raises(ConfigError, match="model.init_from"):
        copy_by_name(base, get_flat(base).numpy(), other, get_flat(other).numpy())


@pytest.mark.parametrize(
    "kw,key",
    [
        (dict(adapter="bottleneck"), "model.adapter"),
        (dict(name="mlp", adapter="residual"), "model.adapter"),
        (dict(name="transformer", dim=10, heads=4), "model.heads"),
        (dict(adapter_rank=0), "model.adapter_rank"),
        (dict(name="resnet18", width=0), "model.width"),
        (dict(init_from=""), "model.init_from"),
    ],
)
def test_bad_model_values_name_their_field(kw, key):
    with pytest.raises(ConfigError) as e:
        section_config("model", **kw).validate()
    assert e.value.key == key


def test_init_from_a_npy_vector_needs_the_exact_length(tmp_path):
    from rayfl.models.init_from import initial_vector

    m = model(MLP)
    fresh = get_flat(m).numpy()
    np.save(tmp_path / "v.npy", np.arange(len(fresh), dtype=np.float32))
    assert np.array_equal(initial_vector(m, fresh, str(tmp_path / "v.npy"), IMAGE, 7), np.arange(len(fresh)))
    np.save(tmp_path / "short.npy", np.zeros(3, dtype=np.float32))
    with pytest.raises(ConfigError, match="3 parameters"):
        initial_vector(m, fresh, str(tmp_path / "short.npy"), IMAGE, 7)
