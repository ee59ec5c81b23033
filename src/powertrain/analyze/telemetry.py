"""Per-device telemetry statistics with DuckDB, pushed down to the Parquet files.

Nothing here loads a whole run's telemetry into Python: DuckDB scans the Parquet files (a host's
compacted file, or the segments of a run still streaming) for the level statistics and returns one
row per device; the segment pass (integrals, counter increases, ramps, gaps, steady time, power
quantiles) is :mod:`powertrain.analyze.device_pass`, which reads the rows a time chunk at a time and
carries each device's state, so memory is bounded by a chunk, not by the run's length (a 24 h,
8-device, 20 Hz run summarises in about the memory of a 1 h one: ``benchmarks/memory_scaling.py``).

Definitions (all over the window ``[w0, w1]``):

* **level statistics** (mean, max, quantiles) use the samples whose ``t_ns`` lies in the window; the
  p99 / p01 of power are exact order statistics, linearly interpolated at position (n − 1)·q;
* **energy** of each device comes from the one integral, :mod:`powertrain.core.energy`: the power
  integral (``window_energy``: trapezoid, interpolated edges, the nearest reading held up to the hold
  limit, null with the reason beyond it) and, where the device has one, its energy counter
  (``counter_window_energy``, same window and edge rule, resets un-wrapped by
  :mod:`powertrain.core.counters`). With sub-windows (the measured steps) each device's energy per
  sub-window comes from ``windows_energy`` with the run's window as the span, so they add up to the
  run. DuckDB only selects the rows; the integration is numpy, per device, in a fixed order, so the
  figures are the same on every analysis;
* **other counter increases** (link, PCIe bytes) are sums over *segments* between consecutive
  samples of a device, each clipped to the window with linearly interpolated end values. A segment
  with a null at either end contributes nothing; a negative counter step (a reset) contributes nothing;
* a **gap** is a segment longer than 2.5 × the device's nominal sample period.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from powertrain.analyze import device_pass
from powertrain.analyze.device_pass import GAP_FACTOR as GAP_FACTOR
from powertrain.analyze.device_pass import INTEGRATED
from powertrain.core.energy import DEFAULT_HOLD_LIMIT_S
from powertrain.schema import COUNTER_FIELDS, TELEMETRY_FIELDS, TELEMETRY_SCHEMA, Throttle
from powertrain.store.tables import telemetry_files

# Seconds of telemetry before and after the window that are scanned to find the samples bracketing
# the window's edges (more than any hold limit, so a reading just outside the window is found).
EDGE_MARGIN_S = 30.0
POWER_LIMIT_FRACTION = 0.9  # "near the limit": at or above 90 % of the enforced power limit

LEVEL_FIELDS = ("power_w", "power_avg_w", "temp_c", "temp_hotspot_c", "temp_mem_c", "clock_sm_mhz",
                "clock_mem_mhz", "util_pct", "util_mem_pct", "power_limit_w", "fan_pct", "cpu_util_pct",
                "load_1m")
MAX_FIELDS = ("mem_used_bytes", "cgroup_mem_bytes")
COUNTERS = tuple(c for c in COUNTER_FIELDS if c != "energy_j")  # energy_j: core.energy's counter rule
NOT_IDLE = ~int(Throttle.IDLE) & 0xFFFFFFFF
SERIES_CHUNK_ROWS = 1 << 18  # rows per query of device_mean_series (its ordered sums hold them)


# name of a view -> the Parquet files behind it (an empty table for a run without telemetry)
_SOURCES: dict[tuple[int, str], list[str] | pa.Table] = {}


def open_telemetry(con: duckdb.DuckDBPyConnection, run_dir: str | Path, name: str = "tel") -> int:
    """Create view ``name`` over a run's telemetry with every schema column; returns its row count.

    DuckDB scans the Parquet files (:func:`powertrain.store.tables.telemetry_files`: each host's
    compacted file and, for a run still streaming or left so by a crash, its readable segments), so
    nothing is loaded here. View ``<name>_rows`` adds each row's position (``file``, ``file_row``) for
    queries that need the rows in the order they were written (a host's compacted file sorts before
    its segment folder, and segments by number, so ``file`` orders as the readers concatenate).
    """
    files = [str(p) for p in telemetry_files(run_dir)]
    # The analysis reads the files in time chunks: keep each file's footer (row-group statistics)
    # instead of parsing it again for every chunk — thousands of segments otherwise cost minutes.
    con.execute("SET parquet_metadata_cache = true")
    if not files:
        table = TELEMETRY_SCHEMA.empty_table()
        con.register(f"{name}_arrow", table)
        _SOURCES[(id(con), name)] = table
        source = f"(SELECT *, '' AS file, 0 AS file_row FROM {name}_arrow)"
        present = set(table.column_names)
    else:
        _SOURCES[(id(con), name)] = files
        flist = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
        source = (f"(SELECT *, filename AS file, file_row_number AS file_row "
                  f"FROM read_parquet({flist}, union_by_name=true, filename=true, file_row_number=true))")
        present = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    cols = ["t_ns", "host", "device"]
    for f, typ in TELEMETRY_FIELDS.items():
        sql_type = "BIGINT" if pa.types.is_integer(typ) else "DOUBLE"
        cols.append(f if f in present else f"CAST(NULL AS {sql_type}) AS {f}")
    con.execute(f"CREATE OR REPLACE VIEW {name}_rows AS SELECT {', '.join(cols)}, file, file_row FROM {source}")
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {', '.join(cols)} FROM {source}")
    row = con.execute(f"SELECT count(*) FROM {name}").fetchall()[0]
    return int(row[0]) if row else 0


def release(con: duckdb.DuckDBPyConnection) -> None:
    """Forget the sources of ``con``'s telemetry views (call before closing it)."""
    for k in [k for k in _SOURCES if k[0] == id(con)]:
        del _SOURCES[k]


def span(con: duckdb.DuckDBPyConnection, name: str = "tel") -> tuple[int, int] | None:
    row = con.execute(f"SELECT min(t_ns), max(t_ns) FROM {name}").fetchall()[0]
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _in_order(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    """``_rows`` of a query run on one thread: its sums (means) then add the rows in file order, so they
    are the same to the last digit on every call however the files are cut into row groups (DuckDB's
    threads otherwise add row groups' partial sums in the order they happen to finish)."""
    threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
    con.execute("SET threads = 1")
    try:
        return _rows(con, sql)
    finally:
        con.execute(f"SET threads = {int(threads)}")


def device_stats(con: duckdb.DuckDBPyConnection, w0: int, w1: int, name: str = "tel", *,
                 sub_windows: tuple[np.ndarray, np.ndarray] | None = None,
                 hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
                 spectra: Callable[[list[dict[str, Any]]], set[tuple[str, str]]] | None = None
                 ) -> list[dict[str, Any]]:
    """One dict per (host, device) with level, energy, counter, ramp, gap and throttle statistics.

    ``spectra``: given the level statistics, the devices whose power spectrum the pass should follow
    (``power_osc``: ``signal.dominant_oscillation`` of their in-window power, None when flat).

    Energy keys (from :mod:`powertrain.core.energy`): ``energy_integral`` (a ``WindowEnergy`` of
    ``power_w``), ``energy_counter`` (of ``energy_j``, where the device has readings of it) and, with
    ``sub_windows`` (arrays of starts and ends), ``step_energy_j`` (per sub-window, NaN where refused)
    with ``step_energy_why``."""
    margin = int(EDGE_MARGIN_S * 1e9)
    win = f"t_ns BETWEEN {w0} AND {w1}"
    # Which fields hold any data in the window: the heavy queries below only touch those.
    all_fields = [*LEVEL_FIELDS, *MAX_FIELDS, "throttle", *COUNTERS, "energy_j"]
    counts = con.execute(f"SELECT {', '.join(f'count({f})' for f in all_fields)} FROM {name} WHERE {win}"
                         ).fetchall()[0]
    present = {f for f, c in zip(all_fields, counts, strict=True) if c}
    level = [
        "count(*) AS rows", "min(t_ns) AS t_first_ns", "max(t_ns) AS t_last_ns",
        *[f"avg({f}) AS {f}_mean, max({f}) AS {f}_max, min({f}) AS {f}_min, count({f}) AS {f}_n"
          for f in LEVEL_FIELDS if f in present],
        *[f"max({f}) AS {f}_max" for f in MAX_FIELDS if f in present],
    ]
    if "power_w" in present and "power_limit_w" in present:
        level += [f"avg(CASE WHEN power_w IS NULL OR power_limit_w IS NULL THEN NULL "
                  f"WHEN power_w >= {POWER_LIMIT_FRACTION} * power_limit_w THEN 1.0 ELSE 0.0 END) AS power_above_limit",
                  "count(CASE WHEN power_w IS NOT NULL AND power_limit_w IS NOT NULL THEN 1 END) AS power_above_limit_n"]
    if "throttle" in present:
        level += [
            "count(throttle) AS throttle_n",
            f"avg(CASE WHEN throttle IS NULL THEN NULL WHEN (throttle & {NOT_IDLE}) != 0 THEN 1.0 ELSE 0.0 END)"
            " AS throttle_any",
            *[f"avg(CASE WHEN throttle IS NULL THEN NULL WHEN (throttle & {int(t)}) != 0 THEN 1.0 ELSE 0.0 END)"
              f" AS throttle_{t.name.lower()}" for t in Throttle if t.name],
        ]
    stats = _in_order(con, f"SELECT host, device, {', '.join(level)} FROM {name} WHERE {win} GROUP BY host, device")
    if not stats:
        return []
    by_key = {(s["host"], s["device"]): s for s in stats}
    # Nominal period per device: the mean interval of its in-window samples.
    periods = {k: ((s["t_last_ns"] - s["t_first_ns"]) / (s["rows"] - 1) if s["rows"] > 1 else None)
               for k, s in by_key.items()}
    seg_fields = [f for f in (*INTEGRATED, *COUNTERS) if f in present]
    energy_fields: list[str] = [f for f in ("power_w", "energy_j") if f in present]
    # Time to thermal steady state looks at the whole run (warm-up included), so then the pass reads it all.
    steady = "temp_c" in present
    lo, hi = (None, None) if steady else (w0 - margin, w1 + margin)
    plan = device_pass.Plan(w0, w1, seg_fields, energy_fields, periods,
                            {k: int(s.get("power_w_n") or 0) for k, s in by_key.items()}, sub_windows, hold_limit_s,
                            "temp_c" if steady else None, spectra(stats) if spectra is not None else set())
    for key, row in device_pass.run_pass(con, name, plan, lo, hi).items():
        if key in by_key:
            by_key[key].update(row)

    for k, s in by_key.items():
        period = periods[k]
        s["period_s"] = period / 1e9 if period else None
        s["rate_hz"] = 1.0 / s["period_s"] if s["period_s"] else None
    return [by_key[k] for k in sorted(by_key)]


def device_mean_series(con: duckdb.DuckDBPyConnection, w0: int, w1: int, bucket_ns: int, field: str = "power_w",
                       name: str = "tel", devices: Sequence[tuple[Any, Any]] | None = None) -> pa.Table:
    """:func:`device_mean_chunks` as one table (for short windows and tests: it has a row per bucket)."""
    parts = list(device_mean_chunks(con, w0, w1, bucket_ns, field, name, devices))
    return pa.concat_tables(parts) if parts else con.sql(
        "SELECT 0::BIGINT AS t_ns, 0::DOUBLE AS mean, 0::DOUBLE AS total, 0::BIGINT AS n LIMIT 0").to_arrow_table()


def device_mean_chunks(con: duckdb.DuckDBPyConnection, w0: int, w1: int, bucket_ns: int, field: str = "power_w",
                       name: str = "tel", devices: Sequence[tuple[Any, Any]] | None = None) -> Iterator[pa.Table]:
    """Per time bucket (one sample period): the mean and the sum of ``field`` over the samples in it,
    and how many samples that was. With one sample per device per period (the sampler's design),
    ``total`` is the cluster sum when ``n`` equals the number of devices. Columns ``t_ns, mean, total, n``.
    The sums run in (host, device, time) order, so they are the same to the last digit on every call
    (DuckDB's parallel sums otherwise add rows from several files in varying order). The buckets come
    a span of about ``SERIES_CHUNK_ROWS`` rows at a time (each bucket wholly in one span), in time
    order, so neither the ordered sums nor the caller hold more than that many rows, however long the run.
    ``devices`` ((host, device) pairs) limits it to those devices; None: every device."""
    only, args = ("", []) if devices is None else (" AND list_contains(?, [host, device])",
                                                   [[list(k) for k in sorted(devices)]])
    rows = con.execute(f"SELECT count({field}) FROM {name} WHERE t_ns BETWEEN {w0} AND {w1}{only}",
                       args).fetchall()[0][0]
    n_buckets = (w1 - w0) // bucket_ns + 1
    per_chunk = max(1, int(SERIES_CHUNK_ROWS * n_buckets / max(int(rows or 0), 1)))
    for b_lo in range(0, n_buckets, per_chunk):
        lo, hi = w0 + b_lo * bucket_ns, min(w1, w0 + (b_lo + per_chunk) * bucket_ns - 1)
        yield con.sql(f"""
            SELECT {w0} + b * {bucket_ns} + {bucket_ns // 2} AS t_ns, avg(v ORDER BY host, device, t) AS mean,
                   sum(v ORDER BY host, device, t) AS total, count(*) AS n
            FROM (SELECT (t_ns - {w0}) // {bucket_ns} AS b, {field} AS v, host, device, t_ns AS t FROM {name}
                  WHERE t_ns BETWEEN {lo} AND {hi} AND {field} IS NOT NULL{only})
            GROUP BY b ORDER BY b
        """, params=args or None).to_arrow_table()
