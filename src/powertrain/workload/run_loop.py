"""The measurement protocol around :class:`Trainer`: warm-up steps, a measured window, profiling.

The measured window lasts ``protocol.measured_steps`` steps **and** at least ``min_measured_s``
seconds (rank 0 decides when both hold and tells the others). ``torch.profiler`` traces, when asked,
are taken for the chosen steps on the chosen ranks (default: the last warm-up step, one rank per
pipeline stage) and saved as Chrome traces under ``<run>/profiles/``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from powertrain.spec.run import RunConfig
from powertrain.workload.trainer import StepResult, Trainer

MAX_MEASURED_STEPS = 100_000


def profiled_steps(cfg: RunConfig) -> list[int]:
    prof, proto = cfg.profile, cfg.protocol
    if not prof.enabled:
        return []
    steps = prof.steps if prof.steps is not None else [max(proto.warmup_steps - 1, 0)]
    if not prof.in_measured:
        steps = [s for s in steps if s < proto.warmup_steps]
    return steps


def profiles_rank(cfg: RunConfig, trainer: Trainer) -> bool:
    ranks = cfg.profile.ranks
    if ranks == "all":
        return True
    if ranks == "per_stage":
        c = trainer.coords
        return c["dp"] == 0 and c["tp"] == 0 and c["cp"] == 0
    return trainer.meshes.rank in ranks


def run_protocol(trainer: Trainer, run_dir: Path | None,
                 on_step: Callable[[StepResult], None] | None = None) -> list[StepResult]:
    """Run warm-up then measured steps; returns every step's result."""
    cfg = trainer.cfg
    proto = cfg.protocol
    rec = trainer.rec
    trace_steps = set(profiled_steps(cfg)) if run_dir is not None and profiles_rank(cfg, trainer) else set()
    results = []

    def one(i: int) -> None:
        ctx: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        prof = None
        if i in trace_steps:
            prof = torch.profiler.profile(record_shapes=False, with_stack=False)
            ctx = prof
        with ctx:
            res = trainer.step(i)
        if prof is not None and run_dir is not None:
            out = run_dir / "profiles"
            out.mkdir(exist_ok=True)
            prof.export_chrome_trace(str(out / f"rank-{trainer.meshes.rank}-step-{i}.json"))
        results.append(res)
        if on_step is not None:
            on_step(res)

    rec.set_window("warmup")
    for i in range(proto.warmup_steps):
        one(i)
    rec.set_window("measured")
    t0 = time.monotonic()
    i = proto.warmup_steps
    for m in range(MAX_MEASURED_STEPS):
        one(i)
        i += 1
        if m + 1 >= proto.measured_steps and _agree(time.monotonic() - t0 >= proto.min_measured_s, trainer):
            break
    rec.set_window(None)
    return results


def _agree(done: bool, trainer: Trainer) -> bool:
    """Rank 0's decision, shared so every rank stops at the same step."""
    if not dist.is_initialized() or trainer.cfg.protocol.min_measured_s == 0:
        return done
    flag = torch.tensor([1 if done else 0], device=trainer.device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())
