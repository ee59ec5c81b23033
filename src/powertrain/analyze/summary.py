"""``summary.json`` of one run: every metric of :mod:`powertrain.analyze.metrics`, per run, per
device, per node, per step, per pipeline stage and per expert-parallel rank.

Which devices count: the run's accelerators (every device whose kind is not ``cpu``) when it has
any; otherwise its host devices (``cpu`` rows), which is what a CPU-only run measures. Host rows of a
GPU run are reported under ``per_device`` but do not enter the accelerator metrics.

Each metric family (steps, power, energy, thermal, clocks, balance, interconnect, memory, work,
overlap) is computed by its own function in :mod:`powertrain.analyze.families`; the views (per device,
node, step, rank, stage, expert-parallel rank) are in :mod:`powertrain.analyze.views`.

A run directory whose ``run.json`` has ``kind: "prediction"`` is not re-analysed: its
``summary.json`` (written by the predictor) is returned as is, labelled ``kind: "prediction"``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from powertrain.analyze import coverage, steps, views
from powertrain.analyze.families import (
    Family,
    RunContext,
    balance_family,
    clock_family,
    energy_family,
    interconnect_family,
    memory_family,
    open_context,
    overlap_family,
    power_family,
    step_family,
    thermal_family,
    work_family,
)
from powertrain.analyze.metrics import METRIC_NAMES
from powertrain.store.rundir import RunDir, read_json, write_json_atomic
from powertrain.store.validate import check_run

# /2: energy from core.energy over the run's window, summary["window"] = {t0_ns, t1_ns, source, seconds};
# /3: sources.power, data_quality.coverage and .energy_check, data_quality.devices[].power (what each power
# figure was read from, at what rate, and what it cannot resolve). A summary.json of an older schema is
# recomputed by load_summary.
SUMMARY_SCHEMA = "powertrain.summary/3"
log = logging.getLogger(__name__)

OOM_PATTERN = re.compile(
    r"out of memory|outofmemoryerror|\boom\b|cannot allocate memory|memoryerror|oom-kill|killed by sigkill.*memory",
    re.IGNORECASE,
)


def _clean(v: Any) -> Any:
    """JSON-safe value: numpy scalars to Python, NaN/inf to None (unknown is null)."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def log_tail(run: RunDir, limit: int = 8192) -> str:
    """The last bytes of every log file of a run (for failure classification)."""
    out = []
    if run.logs_dir.is_dir():
        for p in sorted(run.logs_dir.iterdir()):
            if p.is_file():
                try:
                    with open(p, "rb") as f:
                        f.seek(max(0, p.stat().st_size - limit))
                        out.append(f.read().decode(errors="replace"))
                except OSError:
                    continue
    return "\n".join(out)


def classify_status(status: str | None, reason: str | None, logs: str = "") -> str:
    """``oom`` for a failed run whose reason or log tail says it ran out of memory; else the status.

    Only an explicit out-of-memory message counts: other crashes stay ``failed``.
    """
    if status == "failed" and (OOM_PATTERN.search(reason or "") or OOM_PATTERN.search(logs)):
        return "oom"
    return status or "failed"


def summarize_run(path: str | Path, *, probe_cpu_peak: bool = True) -> dict[str, Any]:
    """Compute the summary of the run directory ``path`` (does not write it; see :func:`write_summary`).

    A damaged run directory raises :class:`powertrain.store.validate.DamagedRun` (``RUN: file: problem``)."""
    run = RunDir(path)
    info = run.read()
    check_run(path)
    if info.get("kind") == "prediction":
        return _prediction_summary(run, info)
    status = run.effective_status()
    status = classify_status(status, info.get("reason"), log_tail(run) if status == "failed" else "")
    ctx = open_context(run, info)
    try:
        return _clean(_measured_summary(ctx, status, probe_cpu_peak))
    finally:
        ctx.close()


def _prediction_summary(run: RunDir, info: dict[str, Any]) -> dict[str, Any]:
    """A prediction's own ``summary.json`` (written by the predictor), labelled ``kind: prediction``."""
    if not run.summary_json.is_file():
        raise FileNotFoundError(f"{run.path} is a prediction without summary.json; re-run `powertrain predict`")
    summ = read_json(run.summary_json)
    summ["kind"] = "prediction"
    summ.setdefault("run", info.get("name") or run.path.name)
    summ.setdefault("status", info.get("status") or "ok")
    summ.setdefault("reason", info.get("reason"))
    summ.setdefault("config", info.get("config"))
    return summ


def _measured_summary(ctx: RunContext, status: str, probe_cpu_peak: bool) -> dict[str, Any]:
    """Every metric family in a fixed order (the order of ``why_null`` and ``notes``), then the views."""
    step = step_family(ctx)
    power = power_family(ctx)
    energy = energy_family(ctx, step)
    per_node = views.per_node(ctx.counted)
    work = work_family(ctx, step, probe_cpu_peak)
    overlap = overlap_family(ctx)
    families = [step, Family(notes=ctx.notes), power, energy, thermal_family(ctx, per_node), clock_family(ctx),
                balance_family(ctx), interconnect_family(ctx), memory_family(ctx), work, overlap]
    metrics: dict[str, Any] = dict.fromkeys(METRIC_NAMES)
    why: dict[str, str] = {}
    notes: list[str] = []
    for fam in families:
        metrics.update(fam.metrics)
        why.update(fam.why_null)
        notes += fam.notes
    per_device = views.per_device(ctx)
    per_rank = views.per_rank(ctx.sd, ctx.coords)
    summary = {
        "schema": SUMMARY_SCHEMA,
        "kind": "measured",
        "run": ctx.info.get("name") or ctx.run.path.name,
        "path": str(ctx.run.path),
        "status": status,
        "reason": ctx.info.get("reason"),
        "config": ctx.config,
        "metrics": metrics,
        "why_null": {k: v for k, v in why.items() if metrics.get(k) is None},
        "window": {**ctx.window, "measured_steps": ctx.sd.n if ctx.sd is not None else 0},
        "sources": {"model_flops": work.flops_source, "peak_flops": work.peak_source, "energy": energy.source,
                    "devices_counted": "accelerators" if ctx.accel else "host",
                    "power": coverage.power_sources(ctx, energy.source)},
        "per_device": per_device,
        "per_node": per_node,
        "per_step": views.per_step(ctx.sd, power),
        "per_rank": per_rank,
        "per_stage": views.with_rank_times(views.group_view(per_device, "pp"), per_rank, "pp"),
        "per_expert_rank": views.with_rank_times(views.group_view(per_device, "ep"), per_rank, "ep"),
        "phases": ctx.sd.phases if ctx.sd is not None else [],
        "profiles": overlap.profiles,
        "data_quality": {**views.data_quality(ctx.info, ctx.dev_stats, ctx.window_s),
                         "dropped_steps": steps.screen_steps(ctx.events)[1],  # impossible step events
                         # step numbers a rank used more than once (each kept as a step of its own)
                         "repeated_steps": ctx.sd.repeated if ctx.sd is not None else dict(steps.NO_REPEATS),
                         # ranks of the rank map without measured steps (events file missing)
                         "missing_ranks": ctx.sd.missing if ctx.sd is not None else dict(steps.NO_MISSING),
                         # which sampled devices the run-level metrics count, and why (families.context)
                         "device_selection": {k: v for k, v in ctx.selection.items() if k != "note"}},
        "notes": notes,
    }
    if power.per_step_why:
        notes.append(f"per-step energy: {power.per_step_why}")
    _power_quality(summary["data_quality"], ctx, energy.check, notes)
    for k in METRIC_NAMES:  # every null metric says why
        if metrics[k] is None and k not in summary["why_null"]:
            summary["why_null"][k] = ctx.no_tel or "not measured in this run"
    return summary


def _power_quality(dq: dict[str, Any], ctx: RunContext, check: dict[str, Any] | None, notes: list[str]) -> None:
    """Each device's power field and sampling (``devices[].power``), the coverage of the steps by the power
    fields (``coverage``, its warnings also in ``notes``) and the energy counter against ∫power (``energy_check``)."""
    by_key = {(s["host"], s["device"]): s for s in ctx.dev_stats}
    for row in dq["devices"]:
        s = by_key.get((row["host"], row["device"]))
        row["power"] = coverage.device_power(ctx, s) if s is not None else None
    dq["coverage"] = coverage.coverage(ctx)
    notes += dq["coverage"]["warnings"]
    dq["energy_check"] = check


def window_text(summary: dict[str, Any]) -> str:
    """The window a summary reports over, in one line (``summarize``, ``report`` and ``compare`` print it)."""
    w = summary.get("window") or {}
    if not w:
        return "window: not stated (a summary written before windows were recorded: summarize --refresh)"
    secs = w.get("seconds")
    length = f"{secs:.3f} s" if isinstance(secs, (int, float)) else "length unknown"
    t0, t1 = w.get("t0_ns"), w.get("t1_ns")
    when = ""
    if isinstance(t0, int) and isinstance(t1, int) and t0 > 0:
        when = f", {_utc(t0)} → {_utc(t1)}"
    return f"window: {w.get('source') or 'source not named'}, {length}{when}"


def _utc(t_ns: int) -> str:
    return _dt.datetime.fromtimestamp(t_ns / 1e9, _dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_summary(path: str | Path, summary: dict[str, Any] | None = None) -> Path:
    """Compute (unless given) and write ``summary.json`` atomically; returns its path.

    A prediction's summary is the predictor's; it is never overwritten here.
    """
    run = RunDir(path)
    summary = summary if summary is not None else summarize_run(path)
    if summary.get("kind") == "prediction":
        return run.summary_json
    write_json_atomic(run.summary_json, summary)
    return run.summary_json


def _cached_summary(run: RunDir) -> dict[str, Any] | None:
    """A measured run's ``summary.json``, or None when it cannot be read (it is derived: recomputed, with a warning)."""
    try:
        summ = read_json(run.summary_json)
    except (OSError, ValueError) as exc:
        log.warning("%s: summary.json: unreadable (%s); computing it again from the run's data", run.path, exc)
        return None
    return summ if isinstance(summ, dict) else None


def load_summary(path: str | Path, *, refresh: bool = False) -> dict[str, Any]:
    """The summary of a run: computed and written when missing (or when ``refresh``), read otherwise.

    A summary older than the run's ``run.json`` is recomputed.
    """
    run = RunDir(path)
    info = run.read()
    if info.get("kind") == "prediction":
        return summarize_run(path)
    if (not refresh and run.summary_json.is_file()
            and run.summary_json.stat().st_mtime >= run.run_json.stat().st_mtime):
        check_run(path)
        summ = _cached_summary(run)
        if summ is not None and summ.get("schema") == SUMMARY_SCHEMA:
            return summ
    summ = summarize_run(path)
    if summ.get("status") != "running":
        write_summary(path, summ)
    return summ
