"""Thermal: mean and peak temperature, time to thermal steady state, and the spread across the devices
of one node."""

from __future__ import annotations

from typing import Any

import numpy as np

from powertrain.analyze.families.context import Family, RunContext


def thermal_family(ctx: RunContext, per_node: list[dict[str, Any]]) -> Family:
    """``per_node``: the node view (:func:`powertrain.analyze.views.per_node`), whose per-node spreads
    give the run's worst one."""
    fam = Family()
    m, why = fam.metrics, fam.why_null
    tc = ctx.have("temp_c")
    if tc:
        m["temp_mean_c"] = float(np.mean([s["temp_c_mean"] for s in tc]))
        m["temp_peak_c"] = float(max(s["temp_c_max"] for s in tc))
    else:
        for k in ("temp_mean_c", "temp_peak_c", "temp_spread_c", "temp_spread_pct", "temp_time_to_steady_s"):
            why[k] = ctx.no_tel or "no temperature field on these devices"
    steady: dict[tuple[str, str], float | None] = {(s["host"], s["device"]): s.get("temp_c_steady_s") for s in tc}
    settled = [v for v in steady.values() if v is not None]
    if tc and len(steady) == len(tc) and len(settled) == len(steady):
        m["temp_time_to_steady_s"] = max(settled)
    elif tc:
        why["temp_time_to_steady_s"] = "some device's temperature did not settle within ±1 °C before the run ended"
    spreads = [n for n in per_node if n.get("temp_spread_c") is not None]
    if spreads:
        worst = max(spreads, key=lambda n: n["temp_spread_c"])
        m["temp_spread_c"] = worst["temp_spread_c"]
        m["temp_spread_pct"] = worst["temp_spread_pct"]
    elif tc:
        why["temp_spread_c"] = why["temp_spread_pct"] = "needs at least two devices with temperature on one node"
    return fam
