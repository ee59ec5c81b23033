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
* **power samples**: a ``power_w`` reading marked ``power_repeat`` (it repeats the driver's last value
  without a refresh) is not a sample: counts, extremes, quantiles, ramps, spectra and the cluster series
  skip it (:data:`FRESH`); energy takes every reading. Where the column is absent or null every reading
  is a sample. The driver's own buffered samples (``telemetry/power-samples/``) are a stream of their
  own, aggregated per device by :func:`buffer_stats` (their peak is the device's, ``families.power.device_peak``);
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
* a **gap** is a segment longer than 2.5 × the device's nominal sample period (``gaps``, ``gap_s``: how
  evenly it was sampled). Energy has its own, longer limit (:mod:`powertrain.core.energy`, rule 4: five
  times the device's median interval, at least the hold limit), beyond which it is not bridged;
* **time as written** (:func:`file_order`): each device's readings are also read in the order they were
  written, once, to find where its clock stepped back (a stamp earlier than the one before it: the
  analysis reads by time, where the two stretches would interleave) and its median sampling interval;
  the intervals a step back re-lived are handed to the energy integral (rule 5), which refuses a window
  they overlap. An import sorts its rows, so its importer records them in ``run.json`` ``data_quality``
  (``devices[].relived_ns``), and :func:`device_stats` takes those too;
* **implausible readings** (non-finite values, and negative ones of a quantity that cannot be negative:
  power, energy, clocks, utilisation, memory, byte counters) are null in the views every query reads
  (:func:`open_telemetry`), so no mean, peak or integral sees them; :func:`field_counts` counts them
  per device and field for ``data_quality`` and the notes, as the importers' screen does.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from powertrain.analyze import device_pass
from powertrain.analyze.device_pass import GAP_FACTOR as GAP_FACTOR
from powertrain.analyze.device_pass import INTEGRATED
from powertrain.core.energy import DEFAULT_HOLD_LIMIT_S, Intervals, merge_intervals
from powertrain.schema import COUNTER_FIELDS, TELEMETRY_FIELDS, TELEMETRY_SCHEMA, Throttle
from powertrain.store.tables import power_samples_files, telemetry_files

log = logging.getLogger(__name__)

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


# The flag the sampler writes on a power reading that repeats the driver's last value without the
# driver having refreshed it (True; False: fresh; null: unknown — older runs, imports, host rows). A file
# without the column reads as null. Rates, peaks, quantiles and spectra count the rows not marked True
# ("power samples"); the energy integral and time-weighted means take every reading, a held value being
# the sensor's output for the time it is held.
REPEAT = "power_repeat"
FRESH = f"{REPEAT} IS NOT TRUE"  # SQL: a power sample (fresh, or freshness unknown)
# every column of the views: the schema's fields, and the repeat flag whether or not the schema has it yet
VIEW_FIELDS: dict[str, pa.DataType] = {**TELEMETRY_FIELDS, REPEAT: pa.bool_()}

# name of a view -> the Parquet files behind it (an empty table for a run without telemetry)
_SOURCES: dict[tuple[int, str], list[str] | pa.Table] = {}
# name of a view -> its float fields present in the files (what field_counts screens)
_RAW_FIELDS: dict[tuple[int, str], list[str]] = {}
# Quantities that cannot be negative: a negative reading is implausible (importers.sanity's rule too).
NON_NEGATIVE = frozenset({"power_w", "power_avg_w", "power_limit_w", "energy_j", "energy_dram_j", "clock_sm_mhz",
                          "clock_mem_mhz", "util_pct", "util_mem_pct", "fan_pct", "cpu_util_pct", "mem_used_bytes",
                          "pcie_tx_bytes", "pcie_rx_bytes", "link_tx_bytes", "link_rx_bytes", "cgroup_cpu_s",
                          "cgroup_mem_bytes", "load_1m"})


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
    cols, as_written = ["t_ns", "host", "device"], ["t_ns", "host", "device"]
    screened = []
    for f in VIEW_FIELDS:
        sql_type = _sql_type(f)
        if f not in present:
            cols.append(f"CAST(NULL AS {sql_type}) AS {f}")
        elif sql_type == "BOOLEAN":  # a flag about a reading (power_repeat): nothing to screen
            cols.append(f"CAST({f} AS BOOLEAN) AS {f}")
        elif sql_type == "DOUBLE" or f in NON_NEGATIVE:
            cols.append(f"CASE WHEN {_plausible(f, sql_type)} THEN {f} END AS {f}")
            screened.append(f)
        else:
            cols.append(f)
        as_written.append(f if f in present else f"CAST(NULL AS {sql_type}) AS {f}")
    con.execute(f"CREATE OR REPLACE VIEW {name}_rows AS SELECT {', '.join(cols)}, file, file_row FROM {source}")
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {', '.join(cols)} FROM {source}")
    # the readings as written, for counting what the views keep out (field_counts)
    con.execute(f"CREATE OR REPLACE VIEW {name}_raw AS SELECT {', '.join(as_written)} FROM {source}")
    _RAW_FIELDS[(id(con), name)] = screened
    row = con.execute(f"SELECT count(*) FROM {name}").fetchall()[0]
    return int(row[0]) if row else 0


def release(con: duckdb.DuckDBPyConnection) -> None:
    """Forget the sources of ``con``'s telemetry views (call before closing it)."""
    for k in [k for k in _SOURCES if k[0] == id(con)]:
        del _SOURCES[k]
    for k in [k for k in _RAW_FIELDS if k[0] == id(con)]:
        del _RAW_FIELDS[k]


def _plausible(f: str, sql_type: str = "DOUBLE") -> str:
    """The SQL condition a reading of field ``f`` must meet to be seen by any metric: finite (DuckDB
    orders NaN above every number, so one NaN was every peak) and not negative for a quantity that
    cannot be."""
    if sql_type != "DOUBLE":
        return f"{f} >= 0"
    return f"isfinite({f}) AND {f} >= 0" if f in NON_NEGATIVE else f"isfinite({f})"


def field_counts(con: duckdb.DuckDBPyConnection, w0: int, w1: int, fields: Sequence[str], name: str = "tel"
                 ) -> tuple[set[str], dict[tuple[str, str], dict[str, dict[str, int]]]]:
    """Which of ``fields`` hold a plausible reading in [w0, w1], and per device, per field, how many
    readings the views keep out, by kind (``non_finite``, ``negative``; devices and fields without any
    are left out). One aggregate over the readings as written; a second, by kind, only for the fields
    where the first found any (most runs have none)."""
    screened = set(_RAW_FIELDS.get((id(con), name)) or [])
    win = f"t_ns BETWEEN {int(w0)} AND {int(w1)}"
    parts = [f"count(CASE WHEN {_plausible(f, _sql_type(f))} THEN 1 END)" if f in screened else f"count({f})"
             for f in fields]
    parts += [f"count({f})" for f in fields if f in screened]  # as written: what was kept out is the difference
    row = con.execute(f"SELECT {', '.join(parts)} FROM {name}_raw WHERE {win}").fetchall()[0]
    ok = dict(zip(fields, row[:len(fields)], strict=True))
    written = dict(zip([f for f in fields if f in screened], row[len(fields):], strict=True))
    present = {f for f, n in ok.items() if n}
    suspect = sorted(f for f, n in written.items() if n != ok[f])
    if not suspect:
        return present, {}
    kinds = []
    for f in suspect:
        floating = pa.types.is_floating(TELEMETRY_FIELDS[f])
        if floating:
            kinds.append(f"count(*) FILTER (WHERE {f} IS NOT NULL AND NOT isfinite({f})) AS \"{f}:non_finite\"")
        if f in NON_NEGATIVE:
            kinds.append(f"count(*) FILTER (WHERE {'isfinite(' + f + ') AND ' if floating else ''}{f} < 0) "
                         f"AS \"{f}:negative\"")
    bad: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
    for r in _rows(con, f"SELECT host, device, {', '.join(kinds)} FROM {name}_raw WHERE {win} GROUP BY host, device"):
        for k, n in r.items():
            if ":" in k and n:
                f, kind = k.split(":")
                bad.setdefault((r["host"], r["device"]), {}).setdefault(f, {})[kind] = int(n)
    return present, bad


def _sql_type(f: str) -> str:
    typ = VIEW_FIELDS[f]
    return "BIGINT" if pa.types.is_integer(typ) else "BOOLEAN" if pa.types.is_boolean(typ) else "DOUBLE"


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


MAX_RELIVED = 10_000  # re-lived intervals kept per device; beyond, one interval covering them all (refuses more)


@dataclass
class WrittenOrder:
    """One device's readings in the order they were written: steps back of its clock (how many, how
    far in all, the first one's times) and the clock intervals they re-lived; its median interval."""

    steps_back: int = 0
    stepped_back_s: float = 0.0
    first_step: tuple[int, int] | None = None  # (stamp before the step, stamp stepped back to)
    relived: list[Intervals] = field(default_factory=list)
    intervals_ms: Counter[int] = field(default_factory=Counter)  # interval (ms, floored) -> how often
    last: int | None = None
    runmax: int | None = None

    def add(self, ts: np.ndarray) -> None:
        """The device's next readings, in written order."""
        full = ts if self.last is None else np.concatenate([[self.last], ts])
        rm = np.maximum.accumulate(full)
        if self.runmax is not None:
            rm = np.maximum(rm, self.runmax)
        back = np.flatnonzero(full[1:] < full[:-1]) + 1
        if back.size:
            lo, hi = full[back], rm[back - 1]
            if self.first_step is None:
                self.first_step = (int(full[back[0] - 1]), int(lo[0]))
            self.steps_back += int(back.size)
            self.stepped_back_s += float((hi - lo).sum()) / 1e9
            self.relived.append((lo, hi))
            if sum(a.size for a, _ in self.relived) > MAX_RELIVED:
                merged = self.merged()
                self.relived = [merged if merged[0].size <= MAX_RELIVED else
                                (merged[0][:1], merged[1][-1:])]
        d = np.diff(full)
        vals, counts = np.unique(d[d > 0] // 1_000_000, return_counts=True)
        self.intervals_ms.update(dict(zip(vals.tolist(), counts.tolist(), strict=True)))
        self.last, self.runmax = int(full[-1]), int(rm[-1])

    def merged(self) -> Intervals:
        if not self.relived:
            return merge_intervals([], [])
        return merge_intervals(np.concatenate([a for a, _ in self.relived]), np.concatenate([b for _, b in self.relived]))

    @property
    def median_period_s(self) -> float | None:
        """The median interval between consecutive readings, to the millisecond (None: fewer than two)."""
        total = sum(self.intervals_ms.values())
        if not total:
            return None
        seen = 0
        for ms in sorted(self.intervals_ms):
            seen += self.intervals_ms[ms]
            if 2 * seen >= total:
                return (ms + 0.5) / 1e3
        return None  # not reached: the counts add up to total


def file_order(con: duckdb.DuckDBPyConnection, name: str = "tel") -> dict[tuple[str, str], WrittenOrder]:
    """Every device's :class:`WrittenOrder`, from one pass over the view's files in the order the
    readers concatenate them, one row group of ``t_ns``, ``host``, ``device`` at a time (memory: a row
    group; the writers keep them to tens of thousands of rows)."""
    src = _SOURCES.get((id(con), name))
    out: dict[tuple[str, str], WrittenOrder] = {}
    if not isinstance(src, list):
        return out  # no telemetry files
    for f in src:
        pf = pq.ParquetFile(f, read_dictionary=["host", "device"])
        # one row group at a time, on this thread: iter_batches reads ahead (tens of MiB more)
        for i in range(pf.num_row_groups):
            for batch in pf.read_row_group(i, columns=["t_ns", "host", "device"], use_threads=False).to_batches():
                _written_batch(batch, out)
    return out


def _written_batch(batch: pa.RecordBatch, out: dict[tuple[str, str], WrittenOrder]) -> None:
    """One batch's rows, per device in written order (a stable sort by device keeps it)."""
    if batch.num_rows == 0:
        return
    t = batch.column("t_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    host, dev = batch.column("host"), batch.column("device")
    if not isinstance(host, pa.DictionaryArray):
        host = pc.dictionary_encode(host)
    if not isinstance(dev, pa.DictionaryArray):
        dev = pc.dictionary_encode(dev)
    hosts, devs = host.dictionary.to_pylist(), dev.dictionary.to_pylist()
    code = host.indices.to_numpy(zero_copy_only=False).astype(np.int64) * len(devs) + \
        dev.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(code, kind="stable")
    code, t = code[order], t[order]
    bounds = np.r_[0, np.flatnonzero(code[1:] != code[:-1]) + 1, code.size]
    for lo, hi in itertools.pairwise(bounds):
        h, d = divmod(int(code[lo]), len(devs))
        out.setdefault((hosts[h], devs[d]), WrittenOrder()).add(t[lo:hi])


def _level_sql(present: set[str]) -> list[str]:
    """The per-device aggregates of the level statistics over the fields ``present``. Of power, the
    extremes, the count and the share near the limit are over its *samples* (readings not marked as
    repeats, :data:`FRESH`), with how many readings it has in all, how many are marked repeats and how
    many are marked either way, and the times of its first and last sample."""
    level = ["count(*) AS rows", "min(t_ns) AS t_first_ns", "max(t_ns) AS t_last_ns"]
    for f in LEVEL_FIELDS:
        if f not in present:
            continue
        only = f" FILTER (WHERE {FRESH})" if f == "power_w" else ""
        level.append(f"avg({f}) AS {f}_mean, max({f}){only} AS {f}_max, min({f}){only} AS {f}_min, "
                     f"count({f}){only} AS {f}_n")
    level += [f"max({f}) AS {f}_max" for f in MAX_FIELDS if f in present]
    if "power_w" in present:
        level += ["count(power_w) AS power_w_readings", f"count(power_w) FILTER (WHERE {REPEAT}) AS power_w_repeats",
                  f"count(power_w) FILTER (WHERE {REPEAT} IS NOT NULL) AS power_w_marked",
                  f"min(t_ns) FILTER (WHERE power_w IS NOT NULL AND {FRESH}) AS power_w_t_first_ns",
                  f"max(t_ns) FILTER (WHERE power_w IS NOT NULL AND {FRESH}) AS power_w_t_last_ns"]
    if "power_w" in present and "power_limit_w" in present:
        level += [f"avg(CASE WHEN power_w IS NULL OR power_limit_w IS NULL THEN NULL "
                  f"WHEN power_w >= {POWER_LIMIT_FRACTION} * power_limit_w THEN 1.0 ELSE 0.0 END) FILTER (WHERE {FRESH})"
                  " AS power_above_limit",
                  f"count(CASE WHEN power_w IS NOT NULL AND power_limit_w IS NOT NULL THEN 1 END) FILTER (WHERE {FRESH})"
                  " AS power_above_limit_n"]
    if "throttle" in present:
        level += [
            "count(throttle) AS throttle_n",
            f"avg(CASE WHEN throttle IS NULL THEN NULL WHEN (throttle & {NOT_IDLE}) != 0 THEN 1.0 ELSE 0.0 END)"
            " AS throttle_any",
            *[f"avg(CASE WHEN throttle IS NULL THEN NULL WHEN (throttle & {int(t)}) != 0 THEN 1.0 ELSE 0.0 END)"
              f" AS throttle_{t.name.lower()}" for t in Throttle if t.name],
        ]
    return level


def device_stats(con: duckdb.DuckDBPyConnection, w0: int, w1: int, name: str = "tel", *,
                 sub_windows: tuple[np.ndarray, np.ndarray] | None = None,
                 hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
                 spectra: Callable[[list[dict[str, Any]]], set[tuple[str, str]]] | None = None,
                 relived: dict[tuple[str, str], Intervals] | None = None,
                 step_starts: np.ndarray | None = None,
                 ) -> list[dict[str, Any]]:
    """One dict per (host, device) with level, energy, counter, ramp, gap and throttle statistics.

    Power *samples* are the readings not marked as repeats (:data:`REPEAT`): ``power_w_n`` counts them,
    ``power_w_max``/``_min``/``_p99``/``_p01``, the ramp and the spectrum are theirs, ``power_rate_hz`` is
    their mean rate ((n − 1) / (last − first)) and ``power_w_sample_period_s`` their median interval;
    ``power_w_readings`` counts every reading, ``power_w_repeats`` those marked repeats and
    ``power_w_marked`` those marked either way. ``step_starts`` (sorted): per device, the offset of its
    first power sample after each (``power_w_step_phase_ns``, :mod:`powertrain.analyze.coverage`).

    ``spectra``: given the level statistics, the devices whose power spectrum the pass should follow
    (``power_osc``: ``signal.dominant_oscillation`` of their in-window power, None when flat).

    Energy keys (from :mod:`powertrain.core.energy`): ``energy_integral`` (a ``WindowEnergy`` of
    ``power_w``), ``energy_counter`` (of ``energy_j``, where the device has readings of it) and, with
    ``sub_windows`` (arrays of starts and ends), ``step_energy_j`` (per sub-window, NaN where refused)
    with ``step_energy_why``.

    ``relived``: per device, clock intervals re-lived after steps back found elsewhere (an import's,
    whose rows are sorted); those in the files' own written order are found here (:func:`file_order`),
    with each device's median interval (its gap limit), and both go to the energy integral. Each row
    gets ``written`` (its :class:`WrittenOrder`) and ``implausible`` (:func:`field_counts`)."""
    margin = int(EDGE_MARGIN_S * 1e9)
    win = f"t_ns BETWEEN {w0} AND {w1}"
    # Which fields hold any data in the window: the heavy queries below only touch those.
    all_fields = [*LEVEL_FIELDS, *MAX_FIELDS, "throttle", *COUNTERS, "energy_j"]
    present, bad = field_counts(con, w0, w1, all_fields, name)
    level = _level_sql(present)
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
    written = file_order(con, name)
    back = {k: _all_relived(w, (relived or {}).get(k)) for k, w in written.items()}
    back.update({k: _all_relived(None, v) for k, v in (relived or {}).items() if k not in back})
    plan = device_pass.Plan(w0, w1, seg_fields, energy_fields, periods,
                            {k: int(s.get("power_w_n") or 0) for k, s in by_key.items()}, sub_windows, hold_limit_s,
                            "temp_c" if steady else None, spectra(stats) if spectra is not None else set(),
                            relived=back, gap_periods={k: w.median_period_s for k, w in written.items()},
                            step_starts=step_starts)
    for key, row in device_pass.run_pass(con, name, plan, lo, hi).items():
        if key in by_key:
            by_key[key].update(row)
    for k, s in by_key.items():
        s["written"] = written.get(k) or WrittenOrder()
        s["implausible"] = bad.get(k, {})

    for k, s in by_key.items():
        period = periods[k]
        s["period_s"] = period / 1e9 if period else None
        s["rate_hz"] = 1.0 / s["period_s"] if s["period_s"] else None
        n, first, last = s.get("power_w_n") or 0, s.get("power_w_t_first_ns"), s.get("power_w_t_last_ns")
        s["power_rate_hz"] = (n - 1) / ((last - first) / 1e9) if n > 1 and first is not None and last > first else None
    return [by_key[k] for k in sorted(by_key)]


def _all_relived(w: WrittenOrder | None, extra: Intervals | None) -> Intervals:
    """A device's re-lived intervals: those of its written order and those given (merged)."""
    parts = ([w.merged()] if w is not None else []) + ([extra] if extra is not None else [])
    if not parts:
        return merge_intervals([], [])
    return merge_intervals(np.concatenate([np.asarray(a) for a, _ in parts]),
                           np.concatenate([np.asarray(b) for _, b in parts]))


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
    ``devices`` ((host, device) pairs) limits it to those devices; None: every device. Of ``power_w``,
    only its samples count (readings not marked as repeats, :data:`FRESH`)."""
    only, args = ("", []) if devices is None else (" AND list_contains(?, [host, device])",
                                                   [[list(k) for k in sorted(devices)]])
    if field == "power_w":
        only += f" AND {FRESH}"
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


# The driver's own buffered power samples (NVML ``nvmlDeviceGetSamples``), read by the sampler between
# polls: a stream beside the telemetry rows, one row per driver sample (t_ns, host, device, power_w), in
# ``telemetry/power-samples/<host>.parquet`` (store.tables.POWER_SAMPLES_DIR), with its ``.parts``
# segments while it streams.


def buffer_stats(con: duckdb.DuckDBPyConnection, run_dir: str | Path, w0: int, w1: int
                 ) -> tuple[dict[tuple[str, str], dict[str, Any]], str | None]:
    """Per device, its buffered power samples in [w0, w1]: how many (``samples``), the highest
    (``peak_w``), the first and last times and their mean rate (``rate_hz``: (n − 1) / (last − first)).
    Non-finite and negative readings are kept out, as in the telemetry views. One aggregate; nothing
    is loaded. Second value: why the files could not be read (a note), or None."""
    files = power_samples_files(run_dir)
    if not files:
        return {}, None
    flist = "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"
    try:
        rows = _rows(con, f"""
            SELECT host, device, count(*) AS samples, max(p) AS peak_w, min(t_ns) AS t_first_ns,
                   max(t_ns) AS t_last_ns
            FROM (SELECT t_ns, host, device, CAST(power_w AS DOUBLE) AS p
                  FROM read_parquet({flist}, union_by_name=true) WHERE t_ns BETWEEN {int(w0)} AND {int(w1)})
            WHERE isfinite(p) AND p >= 0 GROUP BY host, device""")
    except duckdb.Error as exc:
        log.warning("%s: the buffered power samples cannot be read (%s); peaks come from the polled readings",
                    run_dir, exc)
        return {}, f"the driver's buffered power samples cannot be read ({str(exc).splitlines()[0][:160]}): peaks " \
                   "come from the polled readings"
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        n, t0, t1 = int(r["samples"]), int(r["t_first_ns"]), int(r["t_last_ns"])
        out[(r["host"], r["device"])] = {"samples": n, "peak_w": float(r["peak_w"]), "t_first_ns": t0,
                                         "t_last_ns": t1, "rate_hz": (n - 1) / ((t1 - t0) / 1e9) if n > 1 and t1 > t0
                                         else None}
    return out, None
