"""Partial personalization: which entries of the flat parameter vector are personal (w, kept in
the client's host state and never uploaded) and which are global (theta, shared).

The split is a boolean mask over the flat vector of `rayfl.models.params`, so algorithms keep
working on flat vectors: theta = flat[~mask], w = flat[mask]. Schemes follow FFGG's
experiments (arXiv 2305.18285, Table 1): `input` (the first parameterised layer), `output` (the
last one), `adapter` (exactly the parameters adapters added: rayfl.models.adapters, residual or
LoRA), `adapter_norm` (adapters plus every normalisation layer: the split of Pillutla et al.'s
code, on which FFGG's App. E.1 says its experiments are built), `all` (full fine-tuning), or `patterns` (parameter names matching any glob).

A network may say what its input and output layers are with a `personal_groups` attribute
({"input": name prefixes, "output": name prefixes}): ResNet-18's input layer is its stem conv and
its GroupNorm (FFGG's App. E.2 says only "input layer" and "prediction layer"), the
transformer's the first block (App. E.2: "the initial transformer layer"); other networks use the first
and last parameterised module."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import numpy as np
from torch import nn

from rayfl.models.adapters import is_adapter_param

SCHEMES = ("none", "input", "output", "adapter", "adapter_norm", "all", "patterns")
NORMS = (nn.GroupNorm, nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)


def personal_mask(model: nn.Module, scheme: str, patterns: Sequence[str] = ()) -> np.ndarray:
    """True where the flat parameter is personal (w), False where it is global (theta)."""
    named = list(model.named_parameters())
    if scheme not in SCHEMES:
        raise ValueError(f"unknown personalization scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    layers = _layer_prefixes([name for name, _ in named])
    groups = getattr(model, "personal_groups", None) or {}
    if scheme == "none":
        personal = set()
    elif scheme == "all":
        personal = {n for n, _ in named}
    elif scheme in ("input", "output") and scheme in groups:
        personal = {n for n, _ in named if n.startswith(tuple(groups[scheme]))}
    elif scheme == "input":
        personal = {n for n, _ in named if _prefix(n) == layers[0]}
    elif scheme == "output":
        personal = {n for n, _ in named if _prefix(n) == layers[-1]}
    elif scheme in ("adapter", "adapter_norm"):
        personal = {n for n, _ in named if is_adapter_param(n)}
        if not personal:
            raise ValueError("the adapter scheme needs a model with adapters (model.adapter: residual or lora)")
        if scheme == "adapter_norm":
            norms = {name for name, m in model.named_modules() if isinstance(m, NORMS)}
            personal |= {n for n, _ in named if _prefix(n) in norms}
    else:
        if not patterns:
            raise ValueError("the patterns scheme needs at least one parameter-name glob")
        personal = {n for n, _ in named if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    return np.concatenate([np.full(p.numel(), n in personal) for n, p in named]) if named else np.zeros(0, bool)


def _prefix(name: str) -> str:
    """The module a parameter belongs to: '2.weight' -> '2'."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def _layer_prefixes(names: list[str]) -> list[str]:
    """Parameterised modules in forward (registration) order, each once."""
    out: list[str] = []
    for n in names:
        if _prefix(n) not in out:
            out.append(_prefix(n))
    return out
