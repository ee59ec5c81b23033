"""Pipeline parallelism with ``torch.distributed.pipelining``: stage splitting and schedules.

The model's layers are cut into ``pp × virtual_stages`` stages by ``Layout.stage_layer_counts``
(even, the study's uneven split, or an explicit list). Stage ``s`` runs on pipeline rank
``s mod pp`` (looped placement, as interleaved 1F1B expects); the first stage keeps the embedding,
the last the final norm and output. Each stage is a pruned copy of the full model, so its parameter
names (``layers.7.…``) are the single-process names.

With a recorder, every stage call the schedule makes is marked as an event (:func:`time_stage_calls`):
one ``forward`` and one ``backward`` row per micro-batch per stage (``name`` ``stage<s>.mb<k>``,
``microbatch`` k, ``attrs.stage`` s), and on the last stage one ``forward`` row per micro-batch for
the loss (``attrs.part`` ``loss``). The gaps between them on a rank are the pipeline bubble and the
point-to-point waits; the order of the rows is the schedule's (GPipe, 1F1B, interleaved 1F1B).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from powertrain.hooks import Recorder
from powertrain.spec.layout import Layout
from powertrain.workload.models.layers import Transformer

_ONE_STAGE_PER_RANK: dict[str, type[PipelineScheduleSingle]] = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
SCHEDULES = {**_ONE_STAGE_PER_RANK, "interleaved_1f1b": ScheduleInterleaved1F1B}


def stage_ids(layout: Layout, pp_rank: int) -> list[int]:
    """Global stage indices held by ``pp_rank`` (looped: r, r+pp, r+2pp, …)."""
    return [pp_rank + k * layout.pp for k in range(layout.virtual_stages)]


def split_model(model: Transformer, layout: Layout, pp_rank: int) -> list[tuple[int, Transformer]]:
    """``[(stage index, stage module), …]`` of this pipeline rank, pruned copies of ``model``."""
    counts = layout.stage_layer_counts(len(model.layers))
    bounds = [sum(counts[:i]) for i in range(len(counts) + 1)]
    out = []
    for s in stage_ids(layout, pp_rank):
        stage = copy.deepcopy(model)
        keep = {str(i) for i in range(bounds[s], bounds[s + 1])}
        for name in [n for n in stage.layers if n not in keep]:
            del stage.layers[name]
        if s != 0:
            stage.embed = None
        if s != layout.stages - 1:
            stage.norm, stage.output = None, None
        out.append((s, stage))
    return out


def time_stage_calls(stage: PipelineStage, recorder: Recorder) -> None:
    """Mark each ``forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk`` call of
    ``stage`` as a forward / backward event of its micro-batch.

    The stage's own methods are wrapped (on this instance only), not the stage module: the schedule
    calls exactly these once per micro-batch and direction, while shape inference at the first step
    runs the module outside them and must not count as a micro-batch. The receive / send waits stay
    outside the events, so they show as the gaps (bubble) between them.
    """
    idx = stage.stage_index
    fwd, bwd, bwd_w = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        with recorder.phase("forward", f"stage{idx}.mb{fwd_chunk_id}", microbatch=fwd_chunk_id, stage=idx):
            return fwd(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        # full_backward=False (zero-bubble schedules) computes only the input gradients here; the
        # weight gradients follow in backward_weight_one_chunk, marked as their own part.
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        extra = {} if full else {"part": "input"}
        with recorder.phase("backward", f"stage{idx}.mb{bwd_chunk_id}", microbatch=bwd_chunk_id, stage=idx,
                            **extra):
            return bwd(bwd_chunk_id, *args, **kwargs)

    def backward_weight_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        with recorder.phase("backward", f"stage{idx}.mb{bwd_chunk_id}.weight", microbatch=bwd_chunk_id,
                            stage=idx, part="weight"):
            return bwd_w(bwd_chunk_id, *args, **kwargs)

    # Replacing methods on this one instance is the point (see above); mypy flags any method assignment.
    stage.forward_one_chunk = forward_one_chunk  # type: ignore[method-assign]  # instance-level wrapper
    stage.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]  # instance-level wrapper
    stage.backward_weight_one_chunk = backward_weight_one_chunk  # type: ignore[method-assign]  # instance-level wrapper


def _time_loss_calls(schedule: Any, recorder: Recorder) -> None:
    """Mark the last stage's loss computation (the schedule computes it outside the stage's forward)
    as a forward event of its micro-batch, so it does not read as bubble."""
    compute = schedule._maybe_compute_loss

    def maybe_compute_loss(stage: PipelineStage, output: Any, target_mbs: Any, mb_index: int,
                           *args: Any, **kwargs: Any) -> Any:
        if not stage.is_last:
            return compute(stage, output, target_mbs, mb_index, *args, **kwargs)
        with recorder.phase("forward", f"stage{stage.stage_index}.mb{mb_index}.loss", microbatch=mb_index,
                            stage=stage.stage_index, part="loss"):
            return compute(stage, output, target_mbs, mb_index, *args, **kwargs)

    schedule._maybe_compute_loss = maybe_compute_loss


def build_schedule(stages: Sequence[tuple[int, nn.Module]], layout: Layout, n_microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device,
                   group: dist.ProcessGroup | None,
                   recorder: Recorder | None = None) -> PipelineScheduleSingle | PipelineScheduleMulti:
    """The schedule object whose ``step(inputs, target=…, losses=…)`` runs one pipelined batch.

    With an enabled ``recorder``, every micro-batch's forward and backward on each stage (and the
    loss on the last stage) becomes an event row (see :func:`time_stage_calls`).
    """
    pstages = [PipelineStage(mod, s, layout.stages, device, group=group) for s, mod in stages]
    timer = recorder if recorder is not None and recorder.enabled else None
    if timer is not None:
        for st in pstages:
            time_stage_calls(st, timer)
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    if layout.pp_schedule == "interleaved_1f1b":
        schedule = ScheduleInterleaved1F1B(
            pstages,  # type: ignore[arg-type]  # torch wants list[_PipelineStageBase] (invariant), only reads it
            n_microbatches=n_microbatches, loss_fn=loss_fn)
    else:
        schedule = _ONE_STAGE_PER_RANK[layout.pp_schedule](pstages[0], n_microbatches=n_microbatches,
                                                          loss_fn=loss_fn)
    if timer is not None:
        _time_loss_calls(schedule, timer)
    return schedule
