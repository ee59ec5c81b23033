"""Data parallelism: PyTorch DDP for a whole replicated model, or an explicit gradient all-reduce.

:func:`apply_ddp` wraps a model that is replicated as a whole (pure data parallelism; bucketed
all-reduce overlapped with backward). When the replica is itself sharded — tensor-parallel DTensor
parameters, one pipeline stage, or experts that live on some ranks only — :class:`GradSync`
all-reduces each parameter's gradient over the ranks that hold a replica of it, flattened into one
buffer per group, after the last micro-batch's backward.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, bucket_mb: float) -> DDP:
    """``model`` replicated over ``dp_mesh`` with gradients averaged in buckets during backward."""
    return DDP(model, process_group=dp_mesh.get_group(), bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True,
               forward_sync_buffers=False)  # buffers (RoPE tables) are constants: nothing to sync


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class GradSync:
    """Average gradients over replica groups: ``[(params, group), …]`` (one flat all-reduce per group)."""

    def __init__(self, groups: Iterable[tuple[list[nn.Parameter], dist.ProcessGroup | None]]) -> None:
        self.groups = [(params, g, dist.get_world_size(g)) for params, g in groups
                       if params and g is not None and dist.get_world_size(g) > 1]

    def __bool__(self) -> bool:
        return bool(self.groups)

    @torch.no_grad()
    def __call__(self) -> None:
        for params, group, size in self.groups:
            grads = [_local(p.grad) for p in params if p.grad is not None]
            if not grads:
                continue
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            flat.div_(size)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
