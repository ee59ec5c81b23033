"""Work: model FLOPs per step, TFLOP/s per device, MFU and HFU (formulas in :mod:`powertrain.analyze.work`),
and tokens per second per device of the job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from powertrain.analyze import steps, work
from powertrain.analyze.families.context import Family, RunContext

WORK_METRICS = ("model_flops_per_step", "tflops_per_device", "mfu", "hfu")


@dataclass
class WorkFamily(Family):
    """The work metrics, and where the model FLOPs and the peak FLOP/s came from."""

    flops_source: str | None = None
    peak_source: str | None = None


def work_family(ctx: RunContext, step: Family, probe_cpu_peak: bool) -> WorkFamily:
    """``step``: the step family (throughput and its null reasons); ``probe_cpu_peak``: whether a CPU run
    without a recorded host probe may measure this host's peak FLOP/s."""
    fam = WorkFamily()
    config, sd, tokens = ctx.config, ctx.sd, ctx.tokens
    if isinstance(config, dict) and config.get("model") and tokens and sd is not None:
        try:
            _model_flops(ctx, config, sd, tokens, probe_cpu_peak, fam)
        except (KeyError, ValueError, TypeError) as exc:
            for k in WORK_METRICS:
                fam.why_null[k] = f"model in run.json config not understood: {exc}"
    else:
        reason = "run.json has no model configuration" if not (isinstance(config, dict) and config.get("model")) \
            else (step.why_null.get("tokens_per_s") or "no token counts")
        for k in WORK_METRICS:
            fam.why_null[k] = reason
    _tokens_per_device(ctx, step, fam)
    return fam


def _model_flops(ctx: RunContext, config: dict[str, Any], sd: steps.StepData, tokens: float, probe_cpu_peak: bool,
                 fam: WorkFamily) -> None:
    """Model FLOPs per step and TFLOP/s per rank; MFU and HFU where the device's peak is known."""
    m = fam.metrics
    task = config.get("task")  # LoRA counts its own step's work (core.flops)
    fpt, fam.flops_source = work.model_flops_per_token(config["model"], task)
    recompute = (config.get("knobs") or {}).get("recompute", "none")
    m["model_flops_per_step"] = fpt * tokens / sd.n
    ranks = len(sd.ranks) or 1
    step_s = float(np.sum(sd.step_time_s)) / sd.n
    m["tflops_per_device"] = m["model_flops_per_step"] / step_s / ranks / 1e12
    world = config.get("hardware", {}) or {}
    device = world.get("device")
    precision = (config.get("knobs") or {}).get("precision", "fp32")
    per_host = max(1, int(world.get("devices_per_node") or ranks))
    # a CPU run's own recorded host probe, so MFU does not change on re-analysis
    probe = ctx.info.get("host_probe") if isinstance(ctx.info.get("host_probe"), dict) else None
    peak, fam.peak_source = work.peak_flops_per_device(device, precision, per_host, probe) if (
        probe_cpu_peak or probe or (device or "").lower() != "cpu") else (None, "CPU probe disabled")
    if peak:
        m["mfu"] = m["tflops_per_device"] * 1e12 / peak
        hpt = work.hardware_flops_per_token(config["model"], recompute, task)
        m["hfu"] = m["mfu"] * hpt / fpt
    else:
        fam.why_null["mfu"] = fam.why_null["hfu"] = fam.peak_source or "unknown peak FLOP/s"


def _tokens_per_device(ctx: RunContext, step: Family, fam: WorkFamily) -> None:
    """Per device = per device of the job: an import states the job's count (run.json job_device_count,
    null when its sources do not say), since the ranks that logged may be one rank of a 512-GPU job."""
    n_ranks = len(ctx.sd.ranks) if ctx.sd is not None else None
    n_devices = ctx.info.get("job_device_count", n_ranks)
    tokens_per_s = step.metrics.get("tokens_per_s")
    if tokens_per_s is not None and n_devices:
        fam.metrics["tokens_per_s_per_device"] = tokens_per_s / n_devices
    elif tokens_per_s is not None:
        fam.why_null["tokens_per_s_per_device"] = (
            f"the job's device count is unknown ({ctx.info.get('job_device_count_source') or 'run.json job_device_count'})")
    else:
        fam.why_null["tokens_per_s_per_device"] = step.why_null.get("tokens_per_s", "no token counts")
