"""Activation recomputation: ``full`` checkpoints whole blocks, ``selective`` only the attention core.

Checkpointing is PyTorch's non-reentrant ``torch.utils.checkpoint``: activations inside the wrapped
module are dropped after forward and recomputed during backward. ``selective`` follows Megatron's
selective recompute (the attention core, whose activations grow with seq² but cost little to redo).
"""

from __future__ import annotations

from typing import Any, cast

from torch import nn
from torch.utils.checkpoint import checkpoint

from powertrain.workload.models.layers import Block, Transformer


class Checkpointed(nn.Module):
    """Runs ``inner`` under activation checkpointing."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return checkpoint(self.inner, *args, use_reentrant=False)


def apply_recompute(model: Transformer, mode: str) -> Transformer:
    if mode == "none":
        return model
    for name, block in list(model.layers.items()):
        if mode == "full":
            model.layers[name] = Checkpointed(block)
        elif mode == "selective":
            attention = cast(Block, block).attention  # every block of the skeleton is a Block
            attention.core = Checkpointed(attention.core)
        else:
            raise ValueError(f"recompute must be none, selective or full, got {mode!r}")
    return model
