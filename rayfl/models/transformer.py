"""The causal transformer language model of FFGG's StackOverflow experiment (arXiv 2305.18285,
App. E: "similar in size to BERT Mini": 4 blocks, 4 heads, hidden 256, FFN 1024).

Next-word prediction: a sample is a sequence of `seq_len` token ids and its target the same
sequence shifted by one. The logits come out as [N, vocab, T] (class axis second), so
`F.cross_entropy(logits, y)` with y [N, T] is the per-token loss, and targets set to -100 (the
padding, rayfl.data.tff) are ignored by it. Every weight matrix is a `nn.Linear`, so LoRA can
wrap each of them; no buffers (the causal mask and positions are built per call).

Blocks are pre-LayerNorm: x + attn(LN(x)) [+ adapter], then x + FFN(LN(x)) [+ adapter].
`adapter: residual` adds Pillutla et al.'s bottleneck adapters (d -> rank -> d) after the
attention and the FFN of every block; `lora` wraps the q, k, v, output and FFN matrices of every
block. FFGG's input / output schemes for this model are the first / last block (App. E.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from rayfl.config import ConfigError, ModelConfig
from rayfl.models.adapters import BottleneckAdapter, add_lora


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn_dim: int, adapter: bool, rank: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.attn_adapter = BottleneckAdapter(dim, rank) if adapter else nn.Identity()
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.ffn_adapter = BottleneckAdapter(dim, rank) if adapter else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (proj(h).reshape(n, t, self.heads, d // self.heads).transpose(1, 2) for proj in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_adapter(self.o(a.transpose(1, 2).reshape(n, t, d)))
        return x + self.ffn_adapter(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TransformerLM(nn.Module):
    """Token + learned position embeddings, `layers` pre-LN blocks, a final LayerNorm and a
    linear head over the vocabulary (see the module docstring)."""

    def __init__(
        self,
        seq_len: int,
        vocab: int,
        dim: int = 256,
        layers: int = 4,
        heads: int = 4,
        ffn_dim: int = 1024,
        adapter: str = "none",
        rank: int = 16,
    ):
        super().__init__()
        self.seq_len = seq_len
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn_dim, adapter == "residual", rank) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.personal_groups = {"input": ("blocks.0.",), "output": (f"blocks.{layers - 1}.",)}
        if adapter == "lora":
            for block in self.blocks:
                add_lora(block, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(x.shape[0], -1).long()
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos(positions)[None]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)).transpose(1, 2)


@dataclass
class TransformerConfig(ModelConfig):
    """A causal transformer language model over token sequences (FFGG's StackOverflow model):
    `layers` pre-LN blocks of width `dim` with `heads` attention heads and an `ffn_dim`
    feed-forward layer. Builds its own adapters (residual bottlenecks, or LoRA in its blocks)."""

    name: str = "transformer"
    # The model width: token embedding and residual stream (> 0, divisible by heads).
    dim: int = 256
    # Pre-LN transformer blocks (> 0).
    layers: int = 4
    # Attention heads per block (> 0).
    heads: int = 4
    # The feed-forward layer's hidden width in each block (> 0).
    ffn_dim: int = 1024
    builds_adapters: ClassVar[bool] = True

    def validate(self) -> None:
        super().validate()
        for key in ("dim", "layers", "heads", "ffn_dim"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model.{key}", f"must be > 0, got {getattr(self, key)}")
        if self.dim % self.heads:
            raise ConfigError("model.heads", f"model.dim={self.dim} must be divisible by heads={self.heads}")


def build_transformer(
    input_shape: tuple[int, ...], num_classes: int, dim: int = 256, layers: int = 4, heads: int = 4,
    ffn_dim: int = 1024, adapter: str = "none", adapter_rank: int = 16,
) -> nn.Module:
    if len(input_shape) != 1:
        raise ValueError(f"transformer needs token sequences of shape (seq_len,), got {input_shape}")
    return TransformerLM(input_shape[0], num_classes, dim, layers, heads, ffn_dim, adapter, adapter_rank)
