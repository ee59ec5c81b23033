"""Llama-3 style decoder: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no biases."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from powertrain.spec.model import ModelConfig
from powertrain.workload.models.layers import Attention, Block, Transformer, rope_table

NORM_EPS = 1e-5


class Embeddings(nn.Module):
    """Token embedding only: positions enter through RoPE inside attention."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def norm(cfg: ModelConfig) -> nn.Module:
    return nn.RMSNorm(cfg.hidden, eps=NORM_EPS)


def block(cfg: ModelConfig, feed_forward: nn.Module) -> Block:
    return Block(norm(cfg), Attention(cfg, bias=False), norm(cfg), feed_forward)


def build(cfg: ModelConfig) -> Transformer:
    blocks = [block(cfg, SwiGLU(cfg.hidden, cfg.ffn)) for _ in range(cfg.layers)]
    return Transformer(cfg, Embeddings(cfg), blocks, norm(cfg), rope=rope_table(cfg.head_dim, cfg.seq_len))
