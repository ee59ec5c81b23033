"""Steps: step-time statistics, throughput and straggler spread (see :mod:`powertrain.analyze.steps`)."""

from __future__ import annotations

from powertrain.analyze import steps
from powertrain.analyze.families.context import Family, RunContext


def step_family(ctx: RunContext) -> Family:
    """``step_time_*``, ``tokens_per_s``, ``samples_per_s``, ``straggler_spread_pct``; the notes say how the
    measured steps were chosen when no step carried a window, and what was kept out or is missing (impossible
    step events, counts below zero, reused step numbers, ranks without measured steps)."""
    fam = Family()
    if ctx.sd is not None and ctx.sd.window_rule:
        fam.notes.append(ctx.sd.window_rule)
    dropped = steps.screen_steps(ctx.events)[1]  # impossible step events, dropped before any metric
    notes = [steps.dropped_steps_note(dropped), steps.negative_counts_note(dropped)]
    if ctx.sd is not None:
        notes += [steps.repeated_steps_note(ctx.sd.repeated), steps.missing_ranks_note(ctx.sd.missing)]
    fam.notes += [n for n in notes if n]
    fam.metrics, fam.why_null = steps.step_stats(ctx.sd, dropped)
    return fam
