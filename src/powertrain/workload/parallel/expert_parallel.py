"""Expert parallelism: each rank of an expert group keeps ``experts/ep`` experts; tokens travel.

Dispatch (as in Megatron/DeepSpeed-MoE): a rank sorts its routed token slots by expert, tells every
peer how many slots it will send to each of the peer's experts (an all-to-all of counts), then sends
the slots with ``all_to_all_single`` using uneven splits. The receiver regroups them by local expert,
runs its experts, and a second all-to-all returns the results in the original order. Both token
all-to-alls are differentiable (``all_to_all_single_autograd`` of PyTorch's functional collectives,
which replaces the deprecated ``torch.distributed.nn.functional.all_to_all_single``), so backward
sends gradients the opposite way. When the trainer sets ``moe.recorder``, each forward all-to-all
is marked as a ``comm`` event (``moe_dispatch`` / ``moe_combine``, with bytes sent and received);
gloo collectives are synchronous, so on CPU the interval is the transfer itself.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from powertrain.workload.models.mixtral import MoE


def apply_ep(model: nn.Module, ep_group: dist.ProcessGroup | None, ep_rank: int, ep: int) -> nn.Module:
    """Keep only this rank's block of experts in every MoE layer and point the layer at ``ep_group``."""
    for module in model.modules():
        if isinstance(module, MoE):
            per = module.experts // ep
            keep = slice(ep_rank * per, (ep_rank + 1) * per)
            for name in ("w1", "w3", "w2"):
                full = getattr(module, name)
                # a frozen expert (LoRA trains adapters only) stays frozen in its shard
                setattr(module, name, nn.Parameter(full.data[keep].clone(), requires_grad=full.requires_grad))
            module.ep_group = ep_group
    return model


def is_expert_param(name: str) -> bool:
    """Expert weights are the stacked ``feed_forward.w1/w2/w3`` of MoE layers (not the router)."""
    return ".feed_forward.w" in name and not name.endswith(".weight")


def dispatch_combine(moe: MoE, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Expert outputs for ``routed`` slots (sorted by global expert, ``counts`` per expert)."""
    group = moe.ep_group
    assert group is not None, "dispatch_combine runs only on a layer apply_ep gave a group"
    ep = dist.get_world_size(group)
    per = moe.experts // ep
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    rc = recv_counts.view(ep, per).tolist()  # rc[src][e]: slots from rank src for my local expert e
    send_splits = counts.view(ep, per).sum(1).tolist()
    recv_splits = [sum(row) for row in rc]
    rec = moe.recorder  # a hooks.Recorder when the trainer marks communication
    width = routed.size(1) * routed.element_size()
    if rec is not None:
        rec.begin("comm", "moe_dispatch", send_bytes=sum(send_splits) * width, recv_bytes=sum(recv_splits) * width)
    recv = _all_to_all(routed, recv_splits, send_splits, group)
    if rec is not None:
        rec.end()
    # Received slots are ordered (src, expert); regroup them (expert, src) for the expert loop.
    starts, offset = [], 0
    for row in rc:
        starts.append([offset + sum(row[:e]) for e in range(per)])
        offset += sum(row)
    perm = torch.cat([torch.arange(starts[s][e], starts[s][e] + rc[s][e]) for e in range(per) for s in range(ep)]
                     or [torch.zeros(0, dtype=torch.long)]).to(routed.device)
    out = moe.expert_ffn(recv[perm], [sum(rc[s][e] for s in range(ep)) for e in range(per)])
    back = torch.empty_like(out).index_copy(0, perm, out)
    if rec is not None:
        rec.begin("comm", "moe_combine", send_bytes=sum(recv_splits) * width, recv_bytes=sum(send_splits) * width)
    combined = _all_to_all(back, send_splits, recv_splits, group)
    if rec is not None:
        rec.end()
    return combined


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: dist.ProcessGroup) -> torch.Tensor:
    """Differentiable uneven all-to-all (its backward is the reverse all-to-all)."""
    out = funcol.all_to_all_single_autograd(x, out_splits, in_splits, group)
    return funcol.wait_tensor(out)
