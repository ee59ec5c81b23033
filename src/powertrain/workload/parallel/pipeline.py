"""Pipeline parallelism with ``torch.distributed.pipelining``: stage splitting and schedules.

The model's layers are cut into ``pp × virtual_stages`` stages by ``Layout.stage_layer_counts``
(even, the study's uneven split, or an explicit list). Stage ``s`` runs on pipeline rank
``s mod pp`` (looped placement, as interleaved 1F1B expects); the first stage keeps the embedding,
the last the final norm and output. Each stage is a pruned copy of the full model, so its parameter
names (``layers.7.…``) are the single-process names.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from powertrain.spec.layout import Layout

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def stage_ids(layout: Layout, pp_rank: int) -> list[int]:
    """Global stage indices held by ``pp_rank`` (looped: r, r+pp, r+2pp, …)."""
    return [pp_rank + k * layout.pp for k in range(layout.virtual_stages)]


def split_model(model: nn.Module, layout: Layout, pp_rank: int) -> list[tuple[int, nn.Module]]:
    """``[(stage index, stage module), …]`` of this pipeline rank, pruned copies of ``model``."""
    counts = layout.stage_layer_counts(len(model.layers))  # type: ignore[arg-type]
    bounds = [sum(counts[:i]) for i in range(len(counts) + 1)]
    out = []
    for s in stage_ids(layout, pp_rank):
        stage = copy.deepcopy(model)
        keep = {str(i) for i in range(bounds[s], bounds[s + 1])}
        for name in [n for n in stage.layers if n not in keep]:  # type: ignore[union-attr]
            del stage.layers[name]  # type: ignore[union-attr]
        if s != 0:
            stage.embed = None
        if s != layout.stages - 1:
            stage.norm, stage.output = None, None
        out.append((s, stage))
    return out


def build_schedule(stages: list[tuple[int, nn.Module]], layout: Layout, n_microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device,
                   group: object) -> object:
    """The schedule object whose ``step(inputs, target=…, losses=…)`` runs one pipelined batch."""
    pstages = [PipelineStage(mod, s, layout.stages, device, group=group) for s, mod in stages]  # type: ignore[arg-type]
    cls = SCHEDULES[layout.pp_schedule]
    if cls is ScheduleInterleaved1F1B:
        return cls(pstages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    return cls(pstages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
