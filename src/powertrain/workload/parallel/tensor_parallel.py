"""Tensor parallelism (Megatron-style, with DTensor ``parallelize_module``), optionally sequence parallel.

Per block: q/k/v and the MLP's up projections are column-parallel (each rank holds heads/tp heads and
ffn/tp columns), the attention output and MLP down projection are row-parallel (partial sums
all-reduced, or reduce-scattered along the sequence under sequence parallelism). The token embedding
is row-parallel over the vocabulary; the output projection is column-parallel and gathers full logits.
With ``sequence_parallel`` the norms and the residual stream between blocks are sharded along the
sequence (all-gather before attention/MLP, reduce-scatter after).

MoE experts are not tensor-sharded (expert-TP = 1): the MoE input is gathered to the full sequence
and every TP rank routes the same tokens, so expert parallelism is what splits expert work.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from powertrain.workload.models.layers import Transformer


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False) -> Transformer:
    sp = sequence_parallel
    act = Shard(1) if sp else Replicate()  # layout of the residual stream between blocks
    top: dict[str, ParallelStyle] = {}
    if model.embed is not None:
        top["embed.tok"] = RowwiseParallel(input_layouts=Replicate())
        if sp:  # positions are added in full; then each rank keeps its slice of the sequence
            top["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=act, output_layouts=Replicate())
    parallelize_module(model, tp_mesh, top)

    for block in model.layers.values():
        plan: dict[str, ParallelStyle] = {
            "attention": PrepareModuleInput(input_layouts=(act, None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=act),
        }
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        if hasattr(block.feed_forward, "router"):  # MoE: full sequence in, back to the stream's layout out
            if sp:
                plan["feed_forward"] = PrepareModuleInputOutput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
                    output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),))
        else:
            plan["feed_forward"] = PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),))
            plan["feed_forward.w1"] = ColwiseParallel()
            plan["feed_forward.w2"] = RowwiseParallel(output_layouts=act)
            if hasattr(block.feed_forward, "w3"):
                plan["feed_forward.w3"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)
    return model
