"""Clocks and throttling: mean SM clock and its drop below the device's maximum, and the share of samples
throttled, in all and per throttle reason."""

from __future__ import annotations

import numpy as np

from powertrain.analyze.families.context import Family, RunContext
from powertrain.analyze.metrics import THROTTLE_REASONS


def clock_family(ctx: RunContext) -> Family:
    fam = Family()
    m, why = fam.metrics, fam.why_null
    ck = ctx.have("clock_sm_mhz")
    if ck:
        m["clock_sm_mean_mhz"] = float(np.mean([s["clock_sm_mhz_mean"] for s in ck]))
        drops = []
        observed_max = max(s["clock_sm_mhz_max"] for s in ck)
        for s in ck:
            # the device's stated maximum clock; without one, the highest clock any device reached
            props = (ctx.kinds.get((s["host"], s["device"])) or {}).get("properties") or {}
            ref = props.get("clock_sm_max_mhz") or props.get("max_clock_sm_mhz") or observed_max
            drops.append((ref - s["clock_sm_mhz_mean"]) / ref * 100 if ref else np.nan)
        m["clock_sm_drop_pct"] = float(np.nanmean(drops))
    else:
        why["clock_sm_mean_mhz"] = why["clock_sm_drop_pct"] = ctx.no_tel or "no SM clock field on these devices"
    th = ctx.have("throttle")
    if th:
        total = sum(s["throttle_n"] for s in th)
        m["throttle_share"] = sum(s["throttle_any"] * s["throttle_n"] for s in th) / total
        for r in THROTTLE_REASONS:
            m[f"throttle_share_{r}"] = sum(s[f"throttle_{r}"] * s["throttle_n"] for s in th) / total
    else:
        reason = ctx.no_tel or "no throttle-reason field on these devices"
        why["throttle_share"] = reason
        for r in THROTTLE_REASONS:
            why[f"throttle_share_{r}"] = reason
    return fam
