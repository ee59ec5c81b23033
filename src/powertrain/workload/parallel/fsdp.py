"""Fully sharded data parallelism with FSDP2 (``fully_shard``) over the data-parallel mesh dim.

Each transformer block is its own FSDP unit (all-gathered just before it runs, freed after when
``reshard_after_forward``); the root unit holds embeddings, final norm and output. On a 2-D mesh the
block's parameters may already be tensor-parallel DTensors: FSDP then shards them further over dp
(the study's TP8+FSDP). ``prefetch`` sets explicit forward prefetch of the next block's all-gather;
without it FSDP2 only overlaps what its default implicit prefetching does, and backward prefetch is
switched off.
"""

from __future__ import annotations

import itertools

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from powertrain.workload.models.layers import Transformer


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, *, reshard_after_forward: bool = True,
               prefetch: bool = True) -> Transformer:
    # fully_shard turns each module into an FSDPModule in place and returns it
    blocks = [fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
              for block in model.layers.values()]
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    for cur, nxt in itertools.pairwise(blocks):
        if prefetch:
            cur.set_modules_to_forward_prefetch([nxt])
        else:
            nxt.set_modules_to_backward_prefetch([])
    return model
