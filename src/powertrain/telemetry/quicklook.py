"""A first look at a run's telemetry: per device, the mean and peak of each measured field.

This is what ``powertrain monitor`` prints when the command ends; the full metrics live in
:mod:`powertrain.analyze`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from powertrain.schema import COUNTER_FIELDS, TELEMETRY_FIELDS

# Fields worth a mean/peak line, in display order (counters are shown as totals instead).
LEVEL_FIELDS = [f for f in TELEMETRY_FIELDS if f not in COUNTER_FIELDS and f != "throttle"]


def per_device(table: pa.Table) -> list[dict[str, Any]]:
    """One dict per (host, device): rows, duration, rate and {field: (mean, peak)} of non-null fields.

    Counters (energy, bytes) are reported as the increase over the run.
    """
    out: list[dict[str, Any]] = []
    if table.num_rows == 0:
        return out
    keys = table.select(["host", "device"]).group_by(["host", "device"]).aggregate([]).to_pylist()
    for key in sorted(keys, key=lambda k: (k["host"], k["device"])):
        mask = pc.and_(pc.equal(table["host"], key["host"]), pc.equal(table["device"], key["device"]))
        sub = table.filter(mask)
        t = sub["t_ns"]
        duration = (pc.max(t).as_py() - pc.min(t).as_py()) / 1e9
        levels = {}
        for f in LEVEL_FIELDS:
            col = sub[f]
            if col.null_count < len(col):
                levels[f] = (pc.mean(col).as_py(), pc.max(col).as_py())
        totals = {}
        for f in COUNTER_FIELDS:
            col = pc.drop_null(sub[f])
            if len(col) >= 2:
                totals[f] = col[-1].as_py() - col[0].as_py()
        throttle = pc.drop_null(sub["throttle"])
        out.append({
            **key,
            "rows": sub.num_rows,
            "duration_s": duration,
            "rate_hz": (sub.num_rows - 1) / duration if duration > 0 else None,
            "levels": levels,
            "totals": totals,
            "throttled_share": (pc.sum(pc.not_equal(throttle, 0)).as_py() / len(throttle)) if len(throttle) else None,
        })
    return out
