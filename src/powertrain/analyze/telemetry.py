"""Per-device telemetry statistics with DuckDB, pushed down to the Parquet files.

Nothing here loads a whole run's telemetry into Python: DuckDB scans the Parquet files (a host's
compacted file, or the segments of a run still streaming) for the level statistics and returns one
row per device; the segment pass (integrals, counter increases, ramps, gaps) streams one device at a
time through numpy, which avoids a window sort over the whole run. A
sweep-scale set (hundreds of devices × hours × 10 Hz) so summarises in bounded memory.

Definitions (all over the window ``[w0, w1]``):

* **level statistics** (mean, max, quantiles) use the samples whose ``t_ns`` lies in the window;
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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from powertrain.analyze.signal import time_to_steady
from powertrain.core.counters import unwrap
from powertrain.core.energy import DEFAULT_HOLD_LIMIT_S, counter_window_energy, window_energy, windows_energy
from powertrain.schema import COUNTER_FIELDS, TELEMETRY_FIELDS, TELEMETRY_SCHEMA, Throttle
from powertrain.store.tables import telemetry_files

# Seconds of telemetry before and after the window that are scanned to find the samples bracketing
# the window's edges (more than any hold limit, so a reading just outside the window is found).
EDGE_MARGIN_S = 30.0
GAP_FACTOR = 2.5
POWER_LIMIT_FRACTION = 0.9  # "near the limit": at or above 90 % of the enforced power limit

LEVEL_FIELDS = ("power_w", "power_avg_w", "temp_c", "temp_hotspot_c", "temp_mem_c", "clock_sm_mhz",
                "clock_mem_mhz", "util_pct", "util_mem_pct", "power_limit_w", "fan_pct", "cpu_util_pct",
                "load_1m")
MAX_FIELDS = ("mem_used_bytes", "cgroup_mem_bytes")
INTEGRATED = ("power_w",)
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
                 hold_limit_s: float = DEFAULT_HOLD_LIMIT_S) -> list[dict[str, Any]]:
    """One dict per (host, device) with level, energy, counter, ramp, gap and throttle statistics.

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
    if "power_w" in present:
        level += ["quantile_cont(power_w, 0.99) AS power_w_p99", "quantile_cont(power_w, 0.01) AS power_w_p01"]
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
    seg: dict[tuple[str, str], dict[str, Any]] = {}
    # Time to thermal steady state looks at the whole run (warm-up included), so then the pass reads it all.
    steady = "temp_c" in present
    lo, hi = (None, None) if steady else (w0 - margin, w1 + margin)
    cols = ["t_ns", "host", "device", *dict.fromkeys([*seg_fields, *energy_fields]), *(["temp_c"] if steady else [])]
    for batch in _batches(con, name, cols, lo, hi):
        seg.update(_segments(batch, w0, w1, seg_fields, periods, steady_field="temp_c" if steady else None))
        for key, row in _energies(batch, w0, w1, energy_fields, sub_windows, hold_limit_s).items():
            seg.setdefault(key, {}).update(row)
    for key, row in seg.items():
        if key in by_key:
            by_key[key].update(row)

    for k, s in by_key.items():
        period = periods[k]
        s["period_s"] = period / 1e9 if period else None
        s["rate_hz"] = 1.0 / s["period_s"] if s["period_s"] else None
    return [by_key[k] for k in sorted(by_key)]


def device_mean_series(con: duckdb.DuckDBPyConnection, w0: int, w1: int, bucket_ns: int, field: str = "power_w",
                       name: str = "tel") -> pa.Table:
    """Per time bucket (one sample period): the mean and the sum of ``field`` over the samples in it,
    and how many samples that was. With one sample per device per period (the sampler's design),
    ``total`` is the cluster sum when ``n`` equals the number of devices. Columns ``t_ns, mean, total, n``.
    The sums run in (host, device, time) order, so they are the same to the last digit on every call
    (DuckDB's parallel sums otherwise add rows from several files in varying order). The buckets are
    computed a span of about ``SERIES_CHUNK_ROWS`` rows at a time (each bucket wholly in one span), so
    the ordered sums never hold more than that many rows, however long the run."""
    rows = con.execute(f"SELECT count({field}) FROM {name} WHERE t_ns BETWEEN {w0} AND {w1}").fetchall()[0][0]
    n_buckets = (w1 - w0) // bucket_ns + 1
    per_chunk = max(1, int(SERIES_CHUNK_ROWS * n_buckets / max(int(rows or 0), 1)))
    parts = []
    for b_lo in range(0, n_buckets, per_chunk):
        lo, hi = w0 + b_lo * bucket_ns, min(w1, w0 + (b_lo + per_chunk) * bucket_ns - 1)
        parts.append(con.sql(f"""
            SELECT {w0} + b * {bucket_ns} + {bucket_ns // 2} AS t_ns, avg(v ORDER BY host, device, t) AS mean,
                   sum(v ORDER BY host, device, t) AS total, count(*) AS n
            FROM (SELECT (t_ns - {w0}) // {bucket_ns} AS b, {field} AS v, host, device, t_ns AS t FROM {name}
                  WHERE t_ns BETWEEN {lo} AND {hi} AND {field} IS NOT NULL)
            GROUP BY b ORDER BY b
        """).to_arrow_table())
    return pa.concat_tables(parts) if parts else con.sql(
        "SELECT 0::BIGINT AS t_ns, 0::DOUBLE AS mean, 0::DOUBLE AS total, 0::BIGINT AS n LIMIT 0").to_arrow_table()


def _batches(con: duckdb.DuckDBPyConnection, name: str, columns: list[str], t_lo: int | None, t_hi: int | None
             ) -> Iterator[pa.Table]:
    """The view's rows in [t_lo, t_hi] (all rows when not given), one device at a time in the order
    they were written (time, then file and row within it, as the whole-run readers order them), so
    memory stays bounded by one device's rows rather than a host's or the whole run's."""
    if (id(con), name) not in _SOURCES:
        raise KeyError(f"no telemetry view {name!r} on this connection (open_telemetry first)")
    win = f" AND t_ns BETWEEN {int(t_lo)} AND {int(t_hi)}" if t_lo is not None and t_hi is not None else ""
    keys = con.execute(f"SELECT DISTINCT host, device FROM {name} ORDER BY host, device").fetchall()
    for host, device in keys:
        yield con.sql(f"SELECT {', '.join(columns)} FROM {name}_rows WHERE host = ? AND device = ?{win} "
                      "ORDER BY t_ns, file, file_row", params=[host, device]).to_arrow_table()


def _segments(t: pa.Table, w0: int, w1: int, fields: list[str], periods: dict[tuple[str, str], float | None],
              steady_field: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """Integrals, counter increases, ramps and gaps per device over segments clipped to [w0, w1]
    (see the module docstring), vectorised with numpy over one batch of rows."""
    if t.num_rows < 2:
        return {}
    rows = _DeviceRows.of(t)
    seg = _Segs.of(rows, w0, w1)
    period = np.array([periods.get(k) or np.nan for k in rows.keys], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        gap = seg.inside & (seg.dt > GAP_FACTOR * period[seg.g])
    cov, ncov = seg.per_key_sum(seg.valid, seg.clip)
    maxint = seg.per_key_max(seg.inside, seg.dt)
    gaps, _ = seg.per_key_sum(gap, np.ones_like(seg.dt))
    gap_s, ngap = seg.per_key_sum(gap, seg.dt)
    cols = _field_sums(t, fields, rows, seg)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for i, k in enumerate(rows.keys):
        row: dict[str, Any] = {
            "covered_s": float(cov[i]) / 1e9 if ncov[i] else None,
            "max_interval_s": float(maxint[i]) / 1e9 if np.isfinite(maxint[i]) else None,
            "gaps": int(gaps[i]),
            "gap_s": float(gap_s[i]) / 1e9 if ngap[i] else None,
        }
        for name, (vals, n) in cols.items():
            row[name] = float(vals[i]) if n[i] else None
        out[k] = row
    if steady_field is not None:
        _add_steady_times(out, t, steady_field, rows)
    return out


def _energies(t: pa.Table, w0: int, w1: int, fields: Sequence[str], sub_windows: tuple[np.ndarray, np.ndarray] | None,
              hold_limit_s: float) -> dict[tuple[str, str], dict[str, Any]]:
    """Per device in this batch: its energy over [w0, w1] from :mod:`powertrain.core.energy` — the
    power integral, the energy counter where it has readings, and per sub-window the power integral
    with the window as the span (see :func:`device_stats`)."""
    if t.num_rows == 0 or not fields:
        return {}
    rows = _DeviceRows.of(t)
    series = {f: rows.ordered(t, f) for f in fields}
    bounds = np.r_[0, np.flatnonzero(~rows.same) + 1, len(rows.codes)]
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        ts = rows.ts[lo:hi]
        row: dict[str, Any] = {}
        if "power_w" in series:
            p = series["power_w"][lo:hi]
            ok = ~np.isnan(p)
            row["energy_integral"] = window_energy(ts[ok], p[ok], w0, w1, hold_limit_s=hold_limit_s)
            if sub_windows is not None:
                row["step_energy_j"], row["step_energy_why"] = windows_energy(
                    ts[ok], p[ok], sub_windows[0], sub_windows[1], span=(w0, w1), hold_limit_s=hold_limit_s)
        if "energy_j" in series:
            c = series["energy_j"][lo:hi]
            ok = ~np.isnan(c)
            if ok.any():  # a device without counter readings has no counter figure (not a refused one)
                # a drop is a reset (the sampler already un-wrapped known moduli): the total continues
                unwrapped = np.asarray(unwrap(c[ok].tolist(), None), dtype=np.float64)
                row["energy_counter"] = counter_window_energy(ts[ok], unwrapped, w0, w1, hold_limit_s=hold_limit_s)
        out[rows.keys[rows.codes[lo]]] = row
    return out


def _split_key(key: str) -> tuple[str, str]:
    host, device = key.split("\x00", 1)
    return host, device


@dataclass
class _DeviceRows:
    """One batch's rows ordered by device, then time: ``order`` indexes the batch, ``codes`` and ``ts``
    are the device code and time of each ordered row, ``same[i]``: rows i and i+1 are one device's."""

    keys: list[tuple[str, str]]
    order: np.ndarray
    codes: np.ndarray
    ts: np.ndarray
    same: np.ndarray

    @classmethod
    def of(cls, t: pa.Table) -> _DeviceRows:
        key = pc.binary_join_element_wise(t["host"], t["device"], "\x00")
        enc = pc.dictionary_encode(key).combine_chunks()
        codes = enc.indices.to_numpy()
        keys = [_split_key(k) for k in enc.dictionary.to_pylist()]
        tn = t["t_ns"].to_numpy()
        order = np.argsort(codes, kind="stable")  # rows usually arrive in time order: a stable sort keeps it
        c, ts = codes[order], tn[order]
        same = c[1:] == c[:-1]
        if np.any(np.diff(ts)[same] < 0):
            order = np.lexsort((tn, codes))
            c, ts = codes[order], tn[order]
            same = c[1:] == c[:-1]
        return cls(keys, order, c, ts, same)

    def ordered(self, t: pa.Table, field: str) -> np.ndarray:
        """Column ``field`` as float64 (NaN for nulls), in this order."""
        return np.asarray(pc.cast(t[field], pa.float64()).to_numpy(zero_copy_only=False)[self.order])


@dataclass
class _Segs:
    """The segments between consecutive samples of one device: device code ``g``, ends ``t0``/``t1``
    and length ``dt``; ``a``/``b`` the ends clipped to the window and ``clip`` the clipped length (0 where
    not ``valid``); ``inside``: the whole segment lies in the window."""

    g: np.ndarray
    nk: int
    t0: np.ndarray
    dt: np.ndarray
    a: np.ndarray
    b: np.ndarray
    clip: np.ndarray
    valid: np.ndarray
    inside: np.ndarray

    @classmethod
    def of(cls, rows: _DeviceRows, w0: int, w1: int) -> _Segs:
        ts = rows.ts
        t0, t1 = ts[:-1], ts[1:]
        dt = (t1 - t0).astype(np.float64)
        valid = rows.same & (t1 > t0) & (t1 > w0) & (t0 < w1)
        a = np.maximum(t0, w0)
        b = np.minimum(t1, w1)
        clip = np.where(valid, (b - a).astype(np.float64), 0.0)
        inside = valid & (t0 >= w0) & (t1 <= w1)
        return cls(rows.codes[:-1], len(rows.keys), t0, dt, a, b, clip, valid, inside)

    def per_key_sum(self, mask: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per device: the sum of ``weights`` over the segments in ``mask``, and how many there were."""
        return (np.bincount(self.g[mask], weights=weights[mask], minlength=self.nk),
                np.bincount(self.g[mask], minlength=self.nk))

    def per_key_max(self, mask: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Per device: the largest of ``values`` over the segments in ``mask`` (−inf where none)."""
        out = np.full(self.nk, -np.inf)
        np.maximum.at(out, self.g[mask], values[mask])
        return out


def _field_sums(t: pa.Table, fields: list[str], rows: _DeviceRows, seg: _Segs
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per device and field: (values, counts) of the steepest ramp of an integrated field, or of the
    increase and covered time of a counter."""
    cols: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    safe_dt = np.where(seg.dt > 0, seg.dt, 1.0)
    for f in fields:
        v = rows.ordered(t, f)
        v0, v1 = v[:-1], v[1:]
        ok = seg.valid & ~np.isnan(v0) & ~np.isnan(v1)
        if f in INTEGRATED:  # its integral is core.energy's (see _energies); here only the steepest ramp
            ramp = seg.per_key_max(ok & seg.inside, np.abs(v1 - v0) / (safe_dt / 1e9))
            cols[f"{f}_ramp_max"] = (ramp, np.isfinite(ramp).astype(np.int64))
        else:
            d = v1 - v0
            okc = ok & (d >= 0)  # a negative step is a counter reset: it contributes nothing
            cols[f"{f}_delta"] = seg.per_key_sum(okc, d * seg.clip / safe_dt)
            cols[f"{f}_delta_s"] = seg.per_key_sum(ok, seg.clip / 1e9)
    return cols


def _add_steady_times(out: dict[tuple[str, str], dict[str, Any]], t: pa.Table, field: str, rows: _DeviceRows
                      ) -> None:
    """Per device: 1 s means of ``field``, then the time it takes to settle (signal.time_to_steady)."""
    v = rows.ordered(t, field)
    c, ts = rows.codes, rows.ts
    bounds = np.r_[0, np.flatnonzero(~rows.same) + 1, len(c)]
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        vv, tt = v[lo:hi], ts[lo:hi]
        ok = ~np.isnan(vv)
        if not ok.any():
            continue
        sec = tt[ok] // 1_000_000_000
        uniq, inv = np.unique(sec, return_inverse=True)
        means = np.bincount(inv, weights=vv[ok]) / np.bincount(inv)
        out[rows.keys[c[lo]]][f"{field}_steady_s"] = time_to_steady(uniq.astype(np.float64), means)
