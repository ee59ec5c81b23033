"""Pieces every decoder family shares: attention, a pre-norm block, and the model skeleton.

The skeleton is deliberately simple so that parallelism can operate on it by *name* (as torchtitan
does): ``embed`` → ``layers["0"] … layers["L-1"]`` → ``norm`` → ``output``. Pipeline splitting keeps
the layers a stage owns and sets the others (and ``embed``/``norm``/``output`` off the first/last
stage) to ``None``; tensor parallelism addresses ``layers.N.attention.wq`` etc.; recomputation wraps
``layers.N`` or ``layers.N.attention.core``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from powertrain.spec.model import ModelConfig

INIT_STD = 0.02


class AttentionCore(nn.Module):
    """Causal scaled-dot-product attention on ``(batch, seq, heads, head_dim)`` tensors.

    A module of its own (no parameters) so that *selective* recomputation can checkpoint exactly
    this part, the attention core, as Megatron's selective recompute does.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if k.size(1) != q.size(1):  # grouped-query attention: share each KV head among q heads
            rep = q.size(1) // k.size(1)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2)


def rope_table(head_dim: int, seq_len: int, theta: float = 500000.0) -> torch.Tensor:
    """Rotary position table ``(2, seq, head_dim/2)``: cos and sin of position × frequency."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` ``(batch, seq, heads, head_dim)`` by their position's angle."""
    cos, sin = rope[0, : x.size(1)][None, :, None, :], rope[1, : x.size(1)][None, :, None, :]
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    """Multi-head (``kv_heads == heads``) or grouped-query attention, optionally with RoPE.

    Head counts are read from the projection sizes at run time (``view(..., -1, head_dim)``), so the
    same code runs on a tensor-parallel shard that holds ``heads / tp`` heads.
    """

    def __init__(self, cfg: ModelConfig, bias: bool) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=bias)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=bias)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=bias)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=bias)
        self.core: nn.Module = AttentionCore()  # wrapped by selective recomputation

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        return self.wo(self.core(q, k, v).reshape(b, s, -1))


class Block(nn.Module):
    """Pre-norm residual block: ``h = x + attn(norm(x)); out = h + ffn(norm(h))``."""

    def __init__(self, attention_norm: nn.Module, attention: Attention, ffn_norm: nn.Module,
                 feed_forward: nn.Module) -> None:
        super().__init__()
        self.attention_norm = attention_norm
        self.attention = attention
        self.ffn_norm = ffn_norm
        self.feed_forward = feed_forward

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """``embed`` → blocks → ``norm`` → ``output``; any of these may be ``None`` on a pipeline stage.

    ``forward`` takes token ids on the stage that has ``embed`` and hidden states elsewhere, and
    returns logits on the stage that has ``output``.
    """

    def __init__(self, cfg: ModelConfig, embed: nn.Module, blocks: list[Block], norm: nn.Module,
                 rope: torch.Tensor | None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed: nn.Module | None = embed
        # A dict keyed by the global layer index: names stay the same when a pipeline stage drops layers.
        self.layers = nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})
        self.norm: nn.Module | None = norm
        self.output: nn.Module | None = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.register_buffer("rope", rope, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2-style init: N(0, 0.02) weights, zero biases, unit norms (deterministic given the seed)."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "norm" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            h = layer(h, self.rope)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    def moe_aux_losses(self) -> list[torch.Tensor]:
        """Load-balancing losses of the last forward (empty for dense models)."""
        return [aux for m in self.modules() if (aux := getattr(m, "last_aux", None)) is not None]
