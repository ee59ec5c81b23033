"""Mixtral style decoder: Llama-3 blocks whose MLP is a top-k routed mixture of SwiGLU experts.

Routing is dropless (every token reaches its ``top_k`` experts; no capacity factor), so a token's
output does not depend on which other tokens share its batch — the property that lets every layout
reproduce a single-process run. The load-balancing loss (Switch/Mixtral:
``experts · Σ_e f_e · P_e``, ``f_e`` the share of routed slots that went to expert ``e``, ``P_e`` the
mean router probability) is computed **per sequence** and averaged, for the same reason, and enters
the gradient through :class:`AddAuxLoss` so that pipeline stages need not return it.

With expert parallelism each rank holds ``experts / ep`` experts; tokens travel to their experts'
ranks and back with two differentiable ``all_to_all_single`` calls (see
:mod:`powertrain.workload.parallel.expert_parallel`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from powertrain.spec.model import ModelConfig
from powertrain.workload.models import llama
from powertrain.workload.models.layers import INIT_STD, Transformer, rope_table

if TYPE_CHECKING:
    from powertrain.hooks import Recorder


class AddAuxLoss(torch.autograd.Function):
    """Identity on ``x``; in backward, also sends gradient ``coeff`` into ``aux`` (so ``aux`` is minimised)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor, coeff: float) -> torch.Tensor:
        ctx.coeff = coeff
        ctx.aux_shape, ctx.aux_dtype = aux.shape, aux.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return grad, torch.full(ctx.aux_shape, ctx.coeff, dtype=ctx.aux_dtype, device=grad.device), None


class MoE(nn.Module):
    """Top-k routed SwiGLU experts with weights stacked as ``(experts, …)`` tensors."""

    def __init__(self, cfg: ModelConfig, aux_coeff: float = 0.01) -> None:
        super().__init__()
        self.experts, self.top_k, self.aux_coeff = cfg.experts, cfg.top_k, aux_coeff
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(cfg.experts, cfg.hidden, cfg.ffn))
        self.w3 = nn.Parameter(torch.empty(cfg.experts, cfg.hidden, cfg.ffn))
        self.w2 = nn.Parameter(torch.empty(cfg.experts, cfg.ffn, cfg.hidden))
        for w in (self.w1, self.w3, self.w2):
            nn.init.normal_(w, std=INIT_STD)
        # Expert parallelism (set by parallel.expert_parallel): which experts live here, and the group.
        self.ep_group: dist.ProcessGroup | None = None
        self.recorder: Recorder | None = None  # set by the trainer to mark the expert all-to-alls
        self.last_aux: torch.Tensor | None = None

    def expert_ffn(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Run consecutive groups of ``x`` (sorted by local expert, ``counts`` rows each) through them."""
        outs = []
        for e, xe in enumerate(torch.split(x, counts)):
            outs.append((F.silu(xe @ self.w1[e]) * (xe @ self.w3[e])) @ self.w2[e])
        return torch.cat(outs) if outs else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        probs = F.softmax(self.router(x).float(), dim=-1)  # (b, s, E)
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        weights = (top_p / top_p.sum(-1, keepdim=True)).type_as(x)
        # Per-sequence load-balancing loss, averaged over the sequences.
        f = F.one_hot(top_i, self.experts).sum(2).float().mean(1) / self.top_k  # (b, E)
        aux = self.experts * (f * probs.mean(1)).sum(-1).mean()
        self.last_aux = aux.detach()

        flat_e = top_i.reshape(-1)  # (b·s·k,) expert of each routed slot
        order = torch.argsort(flat_e, stable=True)
        routed = x.reshape(-1, h)[order // self.top_k]
        counts = torch.bincount(flat_e, minlength=self.experts)
        if self.ep_group is None:
            out = self.expert_ffn(routed, counts.tolist())
        else:
            from powertrain.workload.parallel.expert_parallel import dispatch_combine

            out = dispatch_combine(self, routed, counts)
        slots = torch.empty_like(out).index_copy(0, order, out).view(b, s, self.top_k, h)
        y = (slots * weights.unsqueeze(-1)).sum(2)
        if self.training and self.aux_coeff > 0 and torch.is_grad_enabled():
            y = AddAuxLoss.apply(y, aux, self.aux_coeff)
        return y


def build(cfg: ModelConfig, aux_coeff: float = 0.01) -> Transformer:
    blocks = [llama.block(cfg, MoE(cfg, aux_coeff)) for _ in range(cfg.layers)]
    return Transformer(cfg, llama.Embeddings(cfg), blocks, llama.norm(cfg),
                       rope=rope_table(cfg.head_dim, cfg.seq_len))
