"""GPT-3 style decoder: learned positions, LayerNorm, GELU MLP, multi-head attention (with biases)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from powertrain.spec.model import ModelConfig
from powertrain.workload.models.layers import Attention, Block, Transformer


class Embeddings(nn.Module):
    """Token embedding plus a learned absolute position embedding."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.tok(tokens) + self.pos(positions)


class GeluMLP(nn.Module):
    """``w2(gelu(w1 x))`` with biases, as in GPT-3."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn)
        self.w2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def build(cfg: ModelConfig) -> Transformer:
    blocks = [
        Block(nn.LayerNorm(cfg.hidden), Attention(cfg, bias=True), nn.LayerNorm(cfg.hidden),
              GeluMLP(cfg.hidden, cfg.ffn))
        for _ in range(cfg.layers)
    ]
    return Transformer(cfg, Embeddings(cfg), blocks, nn.LayerNorm(cfg.hidden), rope=None)
