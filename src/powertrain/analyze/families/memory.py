"""Memory and utilisation: peak memory per device, and the mean device and host CPU utilisation."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from powertrain.analyze.events import RunEvents
from powertrain.analyze.families.context import Family, RunContext


def memory_family(ctx: RunContext) -> Family:
    """``mem_per_device_bytes`` from the ranks' ``mem_peak_bytes`` events when there are any, else from
    the devices' ``mem_used_bytes`` telemetry; ``util_mean_pct``; ``cpu_util_mean_pct`` (every device
    with host CPU utilisation, counted or not)."""
    fam = Family()
    m, why = fam.metrics, fam.why_null
    mem_ev = event_mem_peak(ctx.events)
    mem_tel = [s["mem_used_bytes_max"] for s in ctx.counted if s.get("mem_used_bytes_max") is not None]
    if mem_ev is not None:
        m["mem_per_device_bytes"] = mem_ev
    elif mem_tel:
        m["mem_per_device_bytes"] = int(max(mem_tel))
    else:
        why["mem_per_device_bytes"] = "no mem_peak_bytes in events and no mem_used_bytes telemetry"
    ut = ctx.have("util_pct")
    if ut:
        m["util_mean_pct"] = float(np.mean([s["util_pct_mean"] for s in ut]))
    else:
        why["util_mean_pct"] = ctx.no_tel or "no utilisation field on these devices"
    cu = [s for s in ctx.dev_stats if s.get("cpu_util_pct_n")]
    if cu:
        m["cpu_util_mean_pct"] = float(np.mean([s["cpu_util_pct_mean"] for s in cu]))
    else:
        why["cpu_util_mean_pct"] = ctx.no_tel or "no host CPU utilisation field"
    return fam


def event_mem_peak(events: RunEvents | pa.Table) -> int | None:
    """The largest ``mem_peak_bytes`` of the run's events (a query where they lie), None when none has one."""
    if isinstance(events, RunEvents):
        return events.mem_peak_max()
    v = pc.max(events["mem_peak_bytes"]).as_py() if events.num_rows else None
    return None if v is None else int(v)
