"""Building the networks FFGG's real-data experiments need (ResNet-18-GN, the transformer LM)
and networks with adapters, for `rayfl.models.networks.build_model`.

Kept apart from networks.py so the base networks stay as they are: `build_model` hands any
config naming one of these models, or asking for an adapter, to `build_adapted`."""

from __future__ import annotations

import dataclasses

from torch import nn

from rayfl.config import ModelConfig
from rayfl.models.adapters import add_lora
from rayfl.models.resnet import ResNet18GN
from rayfl.models.transformer import TransformerLM

EXTENDED = ("resnet18", "transformer")


def build_adapted(cfg: ModelConfig, shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """`cfg.name` with `cfg.adapter` inserted (adapters start as the identity edit)."""
    if cfg.name == "resnet18":
        return ResNet18GN(shape, num_classes, cfg.width, cfg.norm_groups, cfg.adapter, cfg.adapter_rank)
    if cfg.name == "transformer":
        if len(shape) != 1:
            raise ValueError(f"transformer needs token sequences of shape (seq_len,), got {shape}")
        return TransformerLM(shape[0], num_classes, cfg.dim, cfg.layers, cfg.heads, cfg.ffn_dim, cfg.adapter, cfg.adapter_rank)
    if cfg.adapter == "residual":
        raise ValueError(f"residual adapters exist for resnet18 and transformer, not {cfg.name!r}")
    from rayfl.models.networks import build_model

    base = build_model(dataclasses.replace(cfg, adapter="none"), shape, num_classes)
    layers = [n for n, m in base.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    # LoRA on the hidden layers of the small networks; the first and last stay plain (they are
    # the input / output schemes' layers) unless there is nothing else.
    skip = (layers[0], layers[-1]) if len(layers) > 2 else ()
    return add_lora(base, cfg.adapter_rank, skip=skip)
