"""Steps: step-time statistics, throughput and straggler spread (see :mod:`powertrain.analyze.steps`)."""

from __future__ import annotations

from powertrain.analyze import steps
from powertrain.analyze.families.context import Family, RunContext


def step_family(ctx: RunContext) -> Family:
    """``step_time_*``, ``tokens_per_s``, ``samples_per_s``, ``straggler_spread_pct``; the note says how the
    measured steps were chosen when no step carried a window."""
    fam = Family()
    if ctx.sd is not None and ctx.sd.window_rule:
        fam.notes.append(ctx.sd.window_rule)
    dropped = steps.screen_steps(ctx.events)[1]  # impossible step events, dropped before any metric
    note = steps.dropped_steps_note(dropped)
    if note:
        fam.notes.append(note)
    note = steps.repeated_steps_note(ctx.sd.repeated) if ctx.sd is not None else None
    if note:
        fam.notes.append(note)
    fam.metrics, fam.why_null = steps.step_stats(ctx.sd, dropped)
    return fam
