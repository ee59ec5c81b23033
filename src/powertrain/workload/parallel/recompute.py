"""Activation recomputation: ``full`` checkpoints whole blocks, ``selective`` only the attention core.

Checkpointing is PyTorch's non-reentrant ``torch.utils.checkpoint``: activations inside the wrapped
module are dropped after forward and recomputed during backward. ``selective`` follows Megatron's
selective recompute (the attention core, whose activations grow with seq² but cost little to redo).
"""

from __future__ import annotations

from typing import Any, cast

from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from powertrain.workload.models.layers import Block, Transformer


class Checkpointed(nn.Module):
    """Runs ``inner`` under activation checkpointing.

    ``early_stop`` is PyTorch's default: the recomputation in backward stops once it has rebuilt every
    saved tensor. With tensor-parallel collectives inside ``inner`` that can leave a collective it
    already started unwaited (seen with LoRA, whose frozen layers save fewer tensors, under sequence
    parallelism); ``early_stop=False`` recomputes the whole module, as Megatron does, so each one is
    consumed."""

    def __init__(self, inner: nn.Module, early_stop: bool = True) -> None:
        super().__init__()
        self.inner = inner
        self.early_stop = early_stop

    def forward(self, *args: Any) -> Any:
        if self.early_stop:
            return checkpoint(self.inner, *args, use_reentrant=False)
        with set_checkpoint_early_stop(False):
            return checkpoint(self.inner, *args, use_reentrant=False)


def apply_recompute(model: Transformer, mode: str, *, early_stop: bool = True) -> Transformer:
    """Wrap ``model``'s blocks (``full``) or attention cores (``selective``); ``early_stop``: see
    :class:`Checkpointed` (False for LoRA blocks under tensor parallelism)."""
    if mode == "none":
        return model
    for name, block in list(model.layers.items()):
        if mode == "full":
            model.layers[name] = Checkpointed(block, early_stop)
        elif mode == "selective":
            attention = cast(Block, block).attention  # every block of the skeleton is a Block
            attention.core = Checkpointed(attention.core, early_stop)
        else:
            raise ValueError(f"recompute must be none, selective or full, got {mode!r}")
    return model
