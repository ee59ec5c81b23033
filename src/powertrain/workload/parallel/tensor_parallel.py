"""Tensor parallelism (Megatron-style, with DTensor ``parallelize_module``), optionally sequence parallel.

Per block: q/k/v and the MLP's up projections are column-parallel (each rank holds heads/tp heads and
ffn/tp columns), the attention output and MLP down projection are row-parallel (partial sums
all-reduced, or reduce-scattered along the sequence under sequence parallelism). The token embedding
is row-parallel over the vocabulary; the output projection is column-parallel and gathers full logits.
With ``sequence_parallel`` the norms and the residual stream between blocks are sharded along the
sequence (all-gather before attention/MLP, reduce-scatter after).

MoE experts are not tensor-sharded (expert-TP = 1): the MoE input is gathered to the full sequence
and every TP rank routes the same tokens, so expert parallelism is what splits expert work.

LoRA adapters (:class:`~powertrain.workload.models.lora.LoRALinear`) are split the way Megatron-Core's
``ParallelLinearAdapter`` splits them, with the same DTensor styles as their base layer:

* column-parallel base (q/k/v, the MLP's gate/up): ``A`` column-parallel over the rank with its output
  gathered (every rank then holds the whole ``A x``: an all-gather of ``n·r/tp`` values forward, an
  all-reduce of ``n·r`` backward), ``B`` column-parallel like the base (``d_out/tp`` rows each), so
  the update lands in the base output's own shard;
* row-parallel base (attention output, MLP down): ``A`` row-parallel on the input the base already
  holds sharded (partial ``A x`` all-reduced, ``n·r`` values), ``B`` column-parallel with its output
  redistributed to the residual stream's layout (gathered, or along the sequence under sequence
  parallelism), so the update is added to the base's reduced output exactly once.

Every adapter weight is then a DTensor split over tp (``A`` of a column-parallel base needs ``rank``
divisible by tp: ``spec.validate`` rule ``lora_divisible_by_tp``), and its gradient comes out whole
on each rank's shard: no extra reduction over tp is needed.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard
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
from powertrain.workload.models.lora import LoRALinear


def _column(block: nn.Module, path: str) -> dict[str, ParallelStyle]:
    """A column-parallel linear layer at ``path``; with a LoRA adapter, its A gathered and its B split alike."""
    if not isinstance(block.get_submodule(path), LoRALinear):
        return {path: ColwiseParallel()}
    return {f"{path}.base": ColwiseParallel(), f"{path}.lora_a": ColwiseParallel(output_layouts=Replicate()),
            f"{path}.lora_b": ColwiseParallel()}


def _row(block: nn.Module, path: str, out: Placement) -> dict[str, ParallelStyle]:
    """A row-parallel linear layer at ``path`` whose output goes to layout ``out``; with a LoRA adapter, its
    A row-parallel on the same input shard and its B column-parallel, redistributed to ``out``."""
    if not isinstance(block.get_submodule(path), LoRALinear):
        return {path: RowwiseParallel(output_layouts=out)}
    return {f"{path}.base": RowwiseParallel(output_layouts=out),
            f"{path}.lora_a": RowwiseParallel(output_layouts=Replicate()),
            f"{path}.lora_b": ColwiseParallel(input_layouts=Replicate(), output_layouts=out)}


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False) -> Transformer:
    # torch's SequenceParallel re-creates the norms' weights as new Parameters that require grad (torch
    # 2.13), which would train the frozen norms of a LoRA run: put back what each parameter had
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    _apply_plans(model, tp_mesh, sequence_parallel)
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return model


def _apply_plans(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
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
            **_column(block, "attention.wq"), **_column(block, "attention.wk"), **_column(block, "attention.wv"),
            **_row(block, "attention.wo", act),
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
            plan.update(_column(block, "feed_forward.w1"))
            plan.update(_row(block, "feed_forward.w2", act))
            if hasattr(block.feed_forward, "w3"):
                plan.update(_column(block, "feed_forward.w3"))
        parallelize_module(block, tp_mesh, plan)
