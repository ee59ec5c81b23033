"""Per-device telemetry statistics with DuckDB, pushed down to the Parquet files.

Nothing here loads a run's telemetry into Python: DuckDB scans the Parquet files (or, for a run
still streaming, the Arrow table of its segments) and returns one row per device, so a sweep-scale
set (hundreds of devices × hours × 10 Hz) summarises in bounded memory.

Definitions (all over the window ``[w0, w1]``):

* **level statistics** (mean, max, quantiles) use the samples whose ``t_ns`` lies in the window;
* **integrals and counter increases** are sums over *segments* between consecutive samples of a
  device, each clipped to the window with linearly interpolated end values — so a window that starts
  or ends between two samples is integrated exactly for piecewise-linear signals. A segment with a
  null at either end contributes nothing; a negative counter step (a reset) contributes nothing;
* a **gap** is a segment longer than 2.5 × the device's nominal sample period.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from powertrain.schema import COUNTER_FIELDS, TELEMETRY_FIELDS, Throttle
from powertrain.store.tables import read_telemetry

# Seconds of telemetry before and after the window that are scanned to find the samples bracketing
# the window's edges.
EDGE_MARGIN_S = 30.0
GAP_FACTOR = 2.5

LEVEL_FIELDS = ("power_w", "power_avg_w", "temp_c", "temp_hotspot_c", "temp_mem_c", "clock_sm_mhz",
                "clock_mem_mhz", "util_pct", "util_mem_pct", "power_limit_w", "fan_pct", "cpu_util_pct",
                "load_1m")
MAX_FIELDS = ("mem_used_bytes", "cgroup_mem_bytes")
INTEGRATED = ("power_w",)
COUNTERS = tuple(c for c in COUNTER_FIELDS)
NOT_IDLE = ~int(Throttle.IDLE) & 0xFFFFFFFF


def open_telemetry(con: duckdb.DuckDBPyConnection, run_dir: str | Path, name: str = "tel") -> int:
    """Create view ``name`` over a run's telemetry with every schema column; returns its row count.

    Finished hosts are scanned from their Parquet files; a run with unfinished segment folders is read
    through :func:`powertrain.store.read_telemetry` (which skips torn segments) instead.
    """
    folder = Path(run_dir) / "telemetry"
    files = sorted(str(p) for p in folder.glob("*.parquet")) if folder.is_dir() else []
    parts = list(folder.glob("*.parts")) if folder.is_dir() else []
    if parts or not files:
        table = read_telemetry(run_dir)
        con.register(f"{name}_arrow", table)
        source = f"{name}_arrow"
        present = set(table.column_names)
    else:
        flist = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
        source = f"read_parquet({flist}, union_by_name=true)"
        present = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    cols = ["t_ns", "host", "device"]
    for f, typ in TELEMETRY_FIELDS.items():
        sql_type = "BIGINT" if pa.types.is_integer(typ) else "DOUBLE"
        cols.append(f if f in present else f"CAST(NULL AS {sql_type}) AS {f}")
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {', '.join(cols)} FROM {source}")
    row = con.execute(f"SELECT count(*) FROM {name}").fetchall()[0]
    return int(row[0]) if row else 0


def span(con: duckdb.DuckDBPyConnection, name: str = "tel") -> tuple[int, int] | None:
    row = con.execute(f"SELECT min(t_ns), max(t_ns) FROM {name}").fetchall()[0]
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def device_stats(con: duckdb.DuckDBPyConnection, w0: int, w1: int, name: str = "tel") -> list[dict[str, Any]]:
    """One dict per (host, device) with level, integral, counter, ramp, gap and throttle statistics."""
    margin = int(EDGE_MARGIN_S * 1e9)
    win = f"t_ns BETWEEN {w0} AND {w1}"
    level = [
        "count(*) AS rows", "min(t_ns) AS t_first_ns", "max(t_ns) AS t_last_ns",
        *[f"avg({f}) AS {f}_mean, max({f}) AS {f}_max, min({f}) AS {f}_min, count({f}) AS {f}_n"
          for f in LEVEL_FIELDS],
        "quantile_cont(power_w, 0.99) AS power_w_p99", "quantile_cont(power_w, 0.01) AS power_w_p01",
        *[f"max({f}) AS {f}_max" for f in MAX_FIELDS],
        "count(throttle) AS throttle_n",
        f"avg(CASE WHEN throttle IS NULL THEN NULL WHEN (throttle & {NOT_IDLE}) != 0 THEN 1.0 ELSE 0.0 END)"
        " AS throttle_any",
        *[f"avg(CASE WHEN throttle IS NULL THEN NULL WHEN (throttle & {int(t)}) != 0 THEN 1.0 ELSE 0.0 END)"
          f" AS throttle_{t.name.lower()}" for t in Throttle if t.name],
    ]
    stats = _rows(con, f"SELECT host, device, {', '.join(level)} FROM {name} WHERE {win} GROUP BY host, device")
    if not stats:
        return []
    by_key = {(s["host"], s["device"]): s for s in stats}
    # Nominal period per device: the mean interval of its in-window samples.
    periods = {k: ((s["t_last_ns"] - s["t_first_ns"]) / (s["rows"] - 1) if s["rows"] > 1 else None)
               for k, s in by_key.items()}
    con.register("_periods", pa.table({
        "host": [k[0] for k in periods], "device": [k[1] for k in periods],
        "period_ns": [p for p in periods.values()],
    }))

    seg_fields = (*INTEGRATED, *COUNTERS)
    leads = ", ".join(f"{f} AS {f}_0, lead({f}) OVER w AS {f}_1" for f in seg_fields)
    a = f"greatest(t0, {w0})"
    b = f"least(t1, {w1})"

    def interp(f: str, at: str) -> str:
        return f"({f}_0 + ({f}_1 - {f}_0) * ({at} - t0) / (t1 - t0))"

    aggs = [
        f"sum(CAST({b} - {a} AS DOUBLE)) / 1e9 AS covered_s",
        f"max(CASE WHEN t0 >= {w0} AND t1 <= {w1} THEN (t1 - t0) END) / 1e9 AS max_interval_s",
        f"count(CASE WHEN t0 >= {w0} AND t1 <= {w1} AND p.period_ns IS NOT NULL "
        f"AND (t1 - t0) > {GAP_FACTOR} * p.period_ns THEN 1 END) AS gaps",
        f"sum(CASE WHEN t0 >= {w0} AND t1 <= {w1} AND p.period_ns IS NOT NULL "
        f"AND (t1 - t0) > {GAP_FACTOR} * p.period_ns THEN (t1 - t0) END) / 1e9 AS gap_s",
    ]
    for f in INTEGRATED:
        aggs.append(
            f"sum(CAST({b} - {a} AS DOUBLE) / 1e9 * ({interp(f, a)} + {interp(f, b)}) / 2) AS {f}_integral")
        aggs.append(f"sum(CASE WHEN {f}_1 IS NOT NULL AND {f}_0 IS NOT NULL THEN CAST({b} - {a} AS DOUBLE) END)"
                    f" / 1e9 AS {f}_integral_s")
        aggs.append(f"max(CASE WHEN t0 >= {w0} AND t1 <= {w1} THEN abs({f}_1 - {f}_0) / ((t1 - t0) / 1e9) END)"
                    f" AS {f}_ramp_max")
    for f in COUNTERS:
        aggs.append(
            f"sum(CASE WHEN {f}_1 >= {f}_0 THEN CAST({f}_1 - {f}_0 AS DOUBLE) * ({b} - {a}) / (t1 - t0) END)"
            f" AS {f}_delta")
        aggs.append(f"sum(CASE WHEN {f}_1 IS NOT NULL AND {f}_0 IS NOT NULL THEN CAST({b} - {a} AS DOUBLE) END)"
                    f" / 1e9 AS {f}_delta_s")
    sql = f"""
        WITH s AS (
            SELECT host, device, t_ns AS t0, lead(t_ns) OVER w AS t1, {leads}
            FROM {name} WHERE t_ns BETWEEN {w0 - margin} AND {w1 + margin}
            WINDOW w AS (PARTITION BY host, device ORDER BY t_ns)
        )
        SELECT s.host, s.device, {', '.join(aggs)}
        FROM s LEFT JOIN _periods p ON s.host = p.host AND s.device = p.device
        WHERE t1 IS NOT NULL AND t1 > t0 AND t1 > {w0} AND t0 < {w1}
        GROUP BY s.host, s.device
    """
    for row in _rows(con, sql):
        key = (row.pop("host"), row.pop("device"))
        if key in by_key:
            by_key[key].update(row)
    con.unregister("_periods")
    for k, s in by_key.items():
        s["period_s"] = periods[k] / 1e9 if periods[k] else None
        s["rate_hz"] = 1.0 / s["period_s"] if s["period_s"] else None
    return [by_key[k] for k in sorted(by_key)]


def device_mean_series(con: duckdb.DuckDBPyConnection, w0: int, w1: int, bucket_ns: int, field: str = "power_w",
                       name: str = "tel") -> pa.Table:
    """Per time bucket: mean over devices and sum over devices of ``field`` (each device first averaged
    within the bucket), and how many devices reported. Columns ``t_ns, mean, total, n``."""
    sql = f"""
        WITH d AS (
            SELECT (t_ns - {w0}) // {bucket_ns} AS b, host, device, avg({field}) AS v
            FROM {name} WHERE t_ns BETWEEN {w0} AND {w1} AND {field} IS NOT NULL
            GROUP BY b, host, device
        )
        SELECT {w0} + b * {bucket_ns} + {bucket_ns // 2} AS t_ns, avg(v) AS mean, sum(v) AS total,
               count(*) AS n
        FROM d GROUP BY b ORDER BY b
    """
    return con.sql(sql).to_arrow_table()


def device_series(con: duckdb.DuckDBPyConnection, host: str, device: str, fields: list[str], w0: int, w1: int,
                  name: str = "tel") -> pa.Table:
    """One device's samples in the window (for figures and spectra of small runs)."""
    cols = ", ".join(["t_ns", *fields])
    return con.sql(
        f"SELECT {cols} FROM {name} WHERE host = {_lit(host)} AND device = {_lit(device)} "
        f"AND t_ns BETWEEN {int(w0)} AND {int(w1)} ORDER BY t_ns").to_arrow_table()


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
