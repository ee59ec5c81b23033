"""``layout.distributed_optimizer``: ZeRO-1 — optimizer states sharded over the data-parallel replicas.

Every replica group (the data-parallel ranks holding the same parameters: the dp group for dense
parameters, the expert-data-parallel group for experts) splits its parameters among its ranks,
greedily by size in a fixed order so every rank computes the same split. A rank keeps AdamW state
(two moments) only for the parameters it owns and updates only those; after the step each owner
broadcasts its updated parameters to the rest of its group. Gradients are averaged before the step
as without it (DDP or :class:`~powertrain.workload.parallel.ddp.GradSync`), so the update — and the
loss curve — is the same as plain AdamW; what changes is optimizer memory (÷ replicas) and one
broadcast per parameter after the step (Megatron's distributed optimizer reduce-scatters the
gradients instead; this is the simple form of the same sharding).

With FSDP the optimizer states are sharded already, and with one replica there is nothing to
shard: the trainer uses plain AdamW there and the planner counts the knob as changing nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t  # the storage itself, for an in-place broadcast


class ShardedAdamW:
    """AdamW whose state each rank keeps for its own share of every replica group's parameters.

    ``groups``: ``[(params, process group), …]`` — each group's ranks hold the same parameters.
    """

    def __init__(self, groups: Sequence[tuple[list[nn.Parameter], dist.ProcessGroup | None]], lr: float) -> None:
        self.params: list[nn.Parameter] = []
        self._sources: list[tuple[nn.Parameter, dist.ProcessGroup, int]] = []  # (param, group, owner's global rank)
        own: list[nn.Parameter] = []
        for params, group in groups:
            size = dist.get_world_size(group) if group is not None else 1
            me = dist.get_rank(group) if group is not None else 0
            loads = [0] * size
            for p in params:
                owner = loads.index(min(loads))
                loads[owner] += _local(p).numel()
                self.params.append(p)
                if owner == me:
                    own.append(p)
                if group is not None and size > 1:
                    self._sources.append((p, group, dist.get_global_rank(group, owner)))
        self.owned = own
        self.inner = torch.optim.AdamW(own, lr=lr) if own else None

    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        with torch.no_grad():
            for p, group, src in self._sources:
                dist.broadcast(_local(p.data), src=src, group=group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
