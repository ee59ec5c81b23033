"""Apply a layout to a freshly built model, in one fixed order (torchtitan's, plus PP and EP):

1. **pipeline split** — keep this rank's stage(s) of the model (``parallel.pipeline``);
2. **expert parallel** — keep this rank's experts, route tokens over the ep group;
3. **tensor parallel** (+ sequence parallel) — DTensor plans on the dp-replicated modules;
4. **activation recomputation** — wrap blocks or attention cores;
5. **data parallel** — FSDP2 over dp, or DDP for a model replicated whole, or an explicit
   gradient all-reduce (:class:`~powertrain.workload.parallel.ddp.GradSync`) for replicas that are
   themselves sharded (TP, PP, EP).

Every family shares the same skeleton (``models.layers.Transformer``), so one function serves all.
LoRA adapters (``models.lora``) are on the model before step 1, so every step handles them with their
base layers; the gradient reduction and the optimizer's replica groups hold only parameters that
train (all of them, or the adapters alone with every base weight frozen).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from powertrain.spec.run import RunConfig
from powertrain.workload.mesh import Meshes
from powertrain.workload.models.layers import Transformer
from powertrain.workload.models.lora import trainable
from powertrain.workload.parallel.async_tp import apply_async_tp, async_tp_unavailable
from powertrain.workload.parallel.ddp import GradSync, apply_ddp
from powertrain.workload.parallel.expert_parallel import apply_ep, is_expert_param
from powertrain.workload.parallel.fsdp import apply_fsdp
from powertrain.workload.parallel.pipeline import split_model
from powertrain.workload.parallel.recompute import apply_recompute
from powertrain.workload.parallel.tensor_parallel import apply_tp


@dataclass
class Parallelized:
    """This rank's part of the model and how its gradients are synchronised."""

    stages: Sequence[tuple[int, nn.Module]]  # (global stage index, module); one (0, model) without PP
    dp_mode: str  # "none" | "ddp" | "fsdp" | "allreduce"
    grad_sync: GradSync | None = None
    notes: list[str] = field(default_factory=list)
    # (params, group) whose ranks hold the same parameters: what a distributed optimizer shards over
    replica_groups: list[tuple[list[nn.Parameter], dist.ProcessGroup | None]] = field(default_factory=list)

    @property
    def module(self) -> nn.Module:
        return self.stages[0][1]


def parallelize(model: Transformer, cfg: RunConfig, meshes: Meshes, *, skip_grad_sync: bool = False) -> Parallelized:
    """This rank's share of ``model`` under ``meshes.layout``.

    ``skip_grad_sync`` deliberately breaks data parallelism (no gradient averaging); it exists so that
    the loss-equivalence check can prove it would notice.
    """
    lay, knobs = meshes.layout, cfg.knobs
    assert lay.dp is not None
    coords = meshes.coords
    stages = split_model(model, lay, coords["pp"]) if lay.pp > 1 else [(0, model)]
    notes: list[str] = []
    for _, mod in stages:
        if lay.ep > 1:
            apply_ep(mod, meshes.group("ep"), coords["ep"], lay.ep)
        if lay.tp > 1:
            tp_mesh = meshes.sub("tp")
            assert tp_mesh is not None
            apply_tp(mod, tp_mesh, sequence_parallel=lay.sequence_parallel)
        # a LoRA block under TP starts collectives its early-stopped recomputation would not wait for
        apply_recompute(mod, knobs.recompute, early_stop=not (cfg.task.is_lora and lay.tp > 1))
    if lay.tp > 1 and knobs.overlap.async_tp:  # refused, never skipped, where PyTorch cannot do it
        tp_mesh = meshes.sub("tp")
        assert tp_mesh is not None
        why = async_tp_unavailable(tp_mesh.device_type)
        if why:
            raise RuntimeError(f"knobs.overlap.async_tp: {why}; set it false for this run")
        for _, mod in stages:
            notes += apply_async_tp(mod, tp_mesh)

    replicas = lay.dp * lay.cp
    if replicas == 1 or skip_grad_sync:
        return Parallelized(stages, "none", notes=notes + (["gradient sync skipped on purpose"] if skip_grad_sync else []))
    if lay.fsdp:
        dp_mesh = meshes.sub("dp")
        assert dp_mesh is not None
        for _, mod in stages:
            apply_fsdp(mod, dp_mesh, reshard_after_forward=knobs.overlap.fsdp_reshard_after_forward,
                       prefetch=knobs.overlap.fsdp_prefetch)
        return Parallelized(stages, "fsdp", notes=notes)
    whole = lay.pp == 1 and lay.tp == 1 and lay.ep == 1
    if whole and knobs.overlap.grad_reduce_in_backward:
        dp_mesh = meshes.sub("dp")
        assert dp_mesh is not None
        ddp = apply_ddp(stages[0][1], dp_mesh, knobs.overlap.ddp_bucket_mb)
        return Parallelized([(0, ddp)], "ddp", notes=notes,
                            replica_groups=[(trainable(list(ddp.parameters())), meshes.group("dp"))])
    dense: list[nn.Parameter] = []
    experts: list[nn.Parameter] = []
    for _, mod in stages:
        for name, p in mod.named_parameters():
            if p.requires_grad:  # a frozen (LoRA base) weight has no gradient to reduce or state to shard
                (experts if lay.ep > 1 and is_expert_param(name) else dense).append(p)
    groups = [(dense, meshes.group("dp"))]
    if experts:
        groups.append((experts, meshes.group("edp")))
    return Parallelized(stages, "allreduce", GradSync(groups), notes=notes, replica_groups=groups)


def parameters(par: Parallelized) -> list[torch.nn.Parameter]:
    return [p for _, m in par.stages for p in m.parameters()]


def trainable_parameters(par: Parallelized) -> list[torch.nn.Parameter]:
    """This rank's parameters that train: all of them, or with LoRA only the adapters."""
    return trainable(parameters(par))
