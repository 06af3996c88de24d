"""Models: shapes, parameter counts, the flat-vector round trip and reproducible initialisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.config import ModelConfig, section_config
from rayfl.models import (
    build_model,
    flat_grad,
    functional_logits,
    get_flat,
    init_params,
    num_params,
    set_flat,
    unflatten,
)

SHAPES = [(1, 28, 28), (3, 32, 32), (1, 8, 8)]
CONFIGS = {
    "linear": section_config("model", name="linear"),
    "mlp": section_config("model", name="mlp", hidden=[16, 8]),
    "relu1": section_config("model", name="relu1", hidden=[12]),
    "conv4": section_config("model", name="conv4", conv_channels=6),
}


def seeded(cfg: ModelConfig, shape: tuple[int, ...], classes: int = 10, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg, shape, classes)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_shape(name, shape):
    model = seeded(CONFIGS[name], shape, classes=7)
    out = model(torch.randn(5, *shape))
    assert out.shape == (5, 7)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_conv4_accepts_a_single_sample_and_flat_inputs(shape):
    model = seeded(CONFIGS["conv4"], shape)
    x = torch.randn(1, *shape)
    assert model(x).shape == (1, 10)
    torch.testing.assert_close(model(x.flatten(1)), model(x))


def test_linear_parameter_counts_match_zo_hfl():
    assert num_params(build_model(section_config("model", name="linear", bias=False), (1, 28, 28), 10)) == 7840
    assert num_params(build_model(section_config("model", name="linear", bias=True), (1, 28, 28), 10)) == 7850


def test_mlp_and_relu1_parameter_counts():
    mlp = build_model(section_config("model", name="mlp", hidden=[200, 200]), (1, 28, 28), 10)
    assert num_params(mlp) == (784 * 200 + 200) + (200 * 200 + 200) + (200 * 10 + 10)
    relu1 = build_model(section_config("model", name="relu1", hidden=[50, 999]), (60,), 10)
    assert num_params(relu1) == (60 * 50 + 50) + (50 * 10 + 10)
    no_bias = build_model(section_config("model", name="relu1", hidden=[50], bias=False), (60,), 10)
    assert num_params(no_bias) == 60 * 50 + 50 * 10


def test_conv4_parameter_count_by_hand():
    # MNIST, 32 filters: conv 1->32 (288 + 32 bias) + BN (32 + 32); three conv 32->32
    # (9216 + 32) + BN (64); spatial 28 -> 14 -> 7 -> 3 -> 1, so 32 features -> Linear 32*10+10.
    model = build_model(section_config("model", name="conv4", conv_channels=32), (1, 28, 28), 10)
    assert num_params(model) == (288 + 32 + 64) + 3 * (9216 + 32 + 64) + (320 + 10)
    assert num_params(model) == 28650
    # CIFAR: 32 -> 16 -> 8 -> 4 -> 2, so 32 * 2 * 2 = 128 features.
    cifar = build_model(section_config("model", name="conv4", conv_channels=32), (3, 32, 32), 10)
    assert num_params(cifar) == (864 + 32 + 64) + 3 * (9216 + 32 + 64) + (128 * 10 + 10)


def test_conv4_feature_sizes_for_small_inputs():
    sizes = {shape: build_model(CONFIGS["conv4"], shape, 10).feature_shape for shape in SHAPES}
    assert sizes == {(1, 28, 28): (6, 1, 1), (3, 32, 32): (6, 2, 2), (1, 8, 8): (6, 1, 1)}


def test_conv4_has_no_buffers():
    model = build_model(CONFIGS["conv4"], (3, 32, 32), 10)
    assert list(model.buffers()) == []
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_flat_round_trip_is_exact(name):
    model = seeded(CONFIGS[name], (1, 8, 8))
    vec = torch.randn(num_params(model), generator=torch.Generator().manual_seed(3))
    set_flat(model, vec)
    out = get_flat(model)
    assert out.dtype == torch.float32 and out.dim() == 1
    assert torch.equal(out, vec)
    # a numpy vector works too, and get_flat is a copy, not a view
    set_flat(model, np.zeros(num_params(model), dtype=np.float32))
    assert torch.equal(out, vec)
    assert torch.count_nonzero(get_flat(model)) == 0


def test_flat_order_follows_named_parameters():
    model = seeded(CONFIGS["mlp"], (1, 8, 8))
    expected = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
    assert torch.equal(get_flat(model), expected)
    views = unflatten(model, expected)
    assert list(views) == [name for name, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        assert torch.equal(views[name], p)


def test_set_flat_rejects_a_wrong_length():
    model = seeded(CONFIGS["linear"], (1, 8, 8))
    with pytest.raises(ValueError, match="650"):
        set_flat(model, torch.zeros(649))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_functional_logits_equals_forward(name):
    model = seeded(CONFIGS[name], (1, 28, 28))
    x = torch.randn(4, 1, 28, 28)
    vec = torch.randn(num_params(model), generator=torch.Generator().manual_seed(1)) * 0.1
    before = get_flat(model)
    logits = functional_logits(model, vec, x)
    assert torch.equal(get_flat(model), before)  # the module's own parameters are untouched
    set_flat(model, vec)
    torch.testing.assert_close(logits, model(x))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradient_through_the_flat_vector_matches_backward(name):
    model = seeded(CONFIGS[name], (1, 8, 8))
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 10, (6,))
    vec = get_flat(model).requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(functional_logits(model, vec, x), y)
    (grad,) = torch.autograd.grad(loss, vec)

    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.testing.assert_close(grad, flat_grad(model))
    assert grad.abs().sum() > 0


def test_flat_grad_counts_missing_gradients_as_zero():
    model = seeded(CONFIGS["linear"], (1, 8, 8))
    assert torch.equal(flat_grad(model), torch.zeros(num_params(model)))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_seed_same_init(name):
    a = get_flat(seeded(CONFIGS[name], (3, 32, 32), seed=5))
    b = get_flat(seeded(CONFIGS[name], (3, 32, 32), seed=5))
    c = get_flat(seeded(CONFIGS[name], (3, 32, 32), seed=6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_init_params_is_reproducible_from_a_generator(name):
    model = build_model(CONFIGS[name], (1, 28, 28), 10)
    a = get_flat(init_params(model, torch.Generator().manual_seed(9)))
    torch.manual_seed(1234)  # the global stream must not matter
    b = get_flat(init_params(build_model(CONFIGS[name], (1, 28, 28), 10), torch.Generator().manual_seed(9)))
    c = get_flat(init_params(model, torch.Generator().manual_seed(10)))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_init_params_matches_default_init_ranges():
    model = init_params(build_model(CONFIGS["conv4"], (3, 32, 32), 10), torch.Generator().manual_seed(0))
    first_conv = model.features[0][0]
    bound = 1 / np.sqrt(3 * 3 * 3)
    assert first_conv.weight.abs().max() <= bound
    assert first_conv.weight.abs().max() > 0.8 * bound
    bn = model.features[0][1]
    assert torch.equal(bn.weight, torch.ones_like(bn.weight))
    assert torch.equal(bn.bias, torch.zeros_like(bn.bias))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="conv4"):
        build_model(CONFIGS["conv4"], (60,), 10)
    with pytest.raises(ValueError, match="unknown model"):
        build_model(ModelConfig(name="resnet"), (1, 28, 28), 10)  # the base class: build_model itself refuses it
