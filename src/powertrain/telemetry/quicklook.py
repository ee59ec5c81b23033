"""A first look at a run's telemetry: per device, the mean and peak of each measured field.

This is what ``powertrain monitor`` prints when the command ends; the full metrics live in
:mod:`powertrain.analyze`. It is one DuckDB aggregate over the run's Parquet files, so its memory
does not grow with the length of the run (a 24 h run is never loaded whole to print a table).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from powertrain.schema import COUNTER_FIELDS, FLAG_FIELDS, TELEMETRY_FIELDS

# Fields worth a mean/peak line, in display order (counters are shown as totals instead; a flag such as
# power_repeat is about another reading, not a level).
LEVEL_FIELDS = [f for f in TELEMETRY_FIELDS if f not in COUNTER_FIELDS and f != "throttle" and f not in FLAG_FIELDS]


def _select(fields: set[str]) -> str:
    parts = ["host", "device", "count(*) AS rows", "min(t_ns) AS t0", "max(t_ns) AS t1"]
    for f in LEVEL_FIELDS:
        if f in fields:
            parts += [f'avg("{f}") AS "mean_{f}"', f'max("{f}") AS "peak_{f}"']
    for f in COUNTER_FIELDS:
        if f in fields:
            # the increase over the run: last minus first non-null reading, in time order
            parts += [f'count("{f}") AS "n_{f}"',
                      f'arg_max("{f}", t_ns) FILTER (WHERE "{f}" IS NOT NULL) '
                      f'- arg_min("{f}", t_ns) FILTER (WHERE "{f}" IS NOT NULL) AS "total_{f}"']
    if "throttle" in fields:
        parts += ['count(throttle) AS n_throttle', 'count(*) FILTER (WHERE throttle <> 0) AS throttled']
    return ", ".join(parts)


def per_device(files: Sequence[Path]) -> list[dict[str, Any]]:
    """One dict per (host, device): rows, duration, rate and {field: (mean, peak)} of non-null fields.

    Counters (energy, bytes) are reported as the increase over the run.
    """
    if not files:
        return []
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        scan = con.read_parquet([str(p) for p in files], union_by_name=True)
        fields = set(scan.columns)
        cur = con.execute(f"SELECT {_select(fields)} FROM scan GROUP BY host, device ORDER BY host, device")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    out = []
    for r in rows:
        duration = (r["t1"] - r["t0"]) / 1e9
        levels = {f: (r[f"mean_{f}"], r[f"peak_{f}"]) for f in LEVEL_FIELDS
                  if f in fields and r[f"mean_{f}"] is not None}
        totals = {f: r[f"total_{f}"] for f in COUNTER_FIELDS if f in fields and r[f"n_{f}"] >= 2}
        n_thr = r.get("n_throttle") or 0
        out.append({
            "host": r["host"], "device": r["device"], "rows": r["rows"], "duration_s": duration,
            "rate_hz": (r["rows"] - 1) / duration if duration > 0 else None,
            "levels": levels, "totals": totals,
            "throttled_share": r["throttled"] / n_thr if n_thr else None,
        })
    return out
