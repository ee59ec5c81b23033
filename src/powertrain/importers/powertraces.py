"""Long-format per-GPU CSV exports ("PowerTraces": one row per GPU per sample) → telemetry.

Columns (header-driven; any subset): ``timestamp`` (ISO-8601, ``Z`` = UTC; a timestamp without a
zone is read in ``tz``), ``gpu_id``, ``power_w``, ``sm_clock_mhz``, ``gpu_util_pct``,
``memory_util_pct``, ``memory_used_mb`` (MiB), ``temperature_c``; ``run_id``, ``time_relative_s``,
``memory_total_mb`` and ``stage`` are recorded or dropped as listed in ``run.json``. Empty cells are
null.

Units: the column names' own units are honoured, in any of three spellings — a suffix
(``power_mw``, ``power_kw``, ``sm_clock_ghz``, ``memory_used_gib``), brackets or parentheses
(``power [kW]``, ``temperature (K)``); a cell may carry its own unit (``250 W``), which wins.
``memory_used_mb`` is MiB (the exporter copies nvidia-smi's MiB). An unknown unit on a known
quantity (``power [hp]``) is an error naming the column. Implausible readings (negative or
> 3000 W power — these exports do not name the GPU model —, temperatures outside −40..150 °C, …)
are kept out and counted (:mod:`powertrain.importers.sanity`).
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from powertrain.core.names import check_name
from powertrain.importers.common import (
    NULL_WORDS,
    RunBuilder,
    SourceFormatError,
    open_text,
    read_text,
    resolve_zone,
    telemetry_table,
)
from powertrain.importers.sanity import screen
from powertrain.importers.units import UNITS, UnitError, conversion, dimension, split_header_unit, split_value

COLUMNS: dict[str, tuple[str, float]] = {  # source column → (telemetry column, scale)
    "power_w": ("power_w", 1.0),
    "sm_clock_mhz": ("clock_sm_mhz", 1.0),
    "mem_clock_mhz": ("clock_mem_mhz", 1.0),
    "gpu_util_pct": ("util_pct", 1.0),
    "memory_util_pct": ("util_mem_pct", 1.0),
    "memory_used_mb": ("mem_used_bytes", float(1 << 20)),
    "temperature_c": ("temp_c", 1.0),
    "power_limit_w": ("power_limit_w", 1.0),
}
# quantity name (without its unit) → telemetry column; the unit comes from the header (see module doc)
BASES: dict[str, str] = {
    "power": "power_w", "power_draw": "power_w", "sm_clock": "clock_sm_mhz", "mem_clock": "clock_mem_mhz",
    "gpu_util": "util_pct", "memory_util": "util_mem_pct", "memory_used": "mem_used_bytes",
    "temperature": "temp_c", "power_limit": "power_limit_w", "energy": "energy_j",
}
REQUIRED = ("timestamp", "gpu_id")


def _iso_ns(s: str, tz: dt.tzinfo) -> tuple[int, bool]:
    """(epoch ns, whether the stamp had no zone of its own and was read in ``tz``)."""
    d = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    local = d.tzinfo is None
    if local:
        d = d.replace(tzinfo=tz)
    # integer arithmetic keeps microseconds exact
    return (int(d.replace(microsecond=0).timestamp()) * 1_000_000 + d.microsecond) * 1000, local


def column_of(path: Path, header: str) -> tuple[str, float, float, str] | None:
    """``(telemetry column, scale, offset, unit)`` of a header cell, ``None`` when it is not a reading."""
    if header in COLUMNS:
        col, scale = COLUMNS[header]
        return col, scale, 0.0, "MiB" if header == "memory_used_mb" else ""
    name, unit = split_header_unit(header)
    key = name.lower().replace(" ", "_").replace(".", "_")
    if unit and key in BASES:
        col = BASES[key]
    else:
        base, _, suffix = key.rpartition("_")
        col = BASES.get(base, "")
        dim = dimension(col) if col else None
        if dim is None or suffix not in UNITS[dim]:
            return None  # not a reading this importer knows (listed as dropped)
        unit = suffix
    try:
        scale, offset = conversion(col, unit, header)
    except UnitError as exc:
        raise SourceFormatError(path, 1, str(exc)) from None
    return col, scale, offset, unit


def read_powertraces(path: Path, builder: RunBuilder, host: str, tz: dt.tzinfo) -> None:
    check_name(host, f"{path}: host")  # it becomes telemetry/<host>.parquet: refused naming the source
    with open_text(path) as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise SourceFormatError(path, None, "the file is empty") from None
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise SourceFormatError(path, 1, f"missing column(s) {', '.join(missing)} (expected a long-format "
                                             "export with timestamp,gpu_id,power_w,...)")
        ti, gi = header.index("timestamp"), header.index("gpu_id")
        plan: list[tuple[int, str, float, float, str]] = []
        for i, c in enumerate(header):
            found = column_of(path, c) if c not in REQUIRED else None
            if found is not None and any(col == found[0] for _, col, *_ in plan):
                builder.drop(f"{c}: another column already fills {found[0]}")
            elif found is not None:
                plan.append((i, *found))
                builder.mapped[c] = found[0]
            elif c not in REQUIRED:
                builder.drop(f"{c}: {'run label, kept in run.json' if c == 'run_id' else 'no telemetry column for it'}")
        t: list[int] = []
        dev: list[str] = []
        lines: list[int] = []
        vals: dict[str, list[float]] = {col: [] for _, col, *_ in plan}
        run_ids: set[str] = set()
        ri = header.index("run_id") if "run_id" in header else None
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) != len(header):
                raise SourceFormatError(path, lineno, f"expected {len(header)} values like the header, found {len(row)}")
            try:
                ns, local = _iso_ns(row[ti], tz)
            except ValueError:
                raise SourceFormatError(path, lineno, f"timestamp {row[ti]!r} is not ISO-8601") from None
            t.append(ns)
            builder.read_local_times |= local
            g = row[gi].strip()
            if not g.isdigit():
                raise SourceFormatError(path, lineno, f"gpu_id {g!r} is not a GPU index")
            dev.append(f"gpu{g}")
            lines.append(lineno)
            for i, col, scale, offset, _unit in plan:
                vals[col].append(_cell(path, lineno, header[i], row[i], col, scale, offset))
            if ri is not None:
                run_ids.add(row[ri])
    if not t:
        raise SourceFormatError(path, None, "no data rows after the header")
    where = np.array([f"{path.name}:{n}" for n in lines])
    fields = {col: screen(builder, col, np.asarray(v, dtype=np.float64), where=where) for col, v in vals.items()}
    builder.add_telemetry(telemetry_table(t, host, dev, fields))
    for d in sorted(set(dev), key=lambda s: int(s[3:])):
        builder.add_device(host, d, kind="gpu", vendor=None, index=int(d[3:]))
    if run_ids:
        builder.info.setdefault("source_run_ids", []).extend(sorted(run_ids))


def _cell(path: Path, lineno: int, name: str, cell: str, col: str, scale: float, offset: float) -> float:
    """One value in the column's unit; empty / N/A cells are NaN (null); a unit in the cell wins."""
    text = cell.strip()
    if not text or text.strip("[]").lower() in NULL_WORDS:
        return np.nan
    try:
        x, unit = split_value(text)
        if unit:
            scale, offset = conversion(col, unit, name)
    except UnitError as exc:
        raise SourceFormatError(path, lineno, str(exc)) from None
    except ValueError:
        raise SourceFormatError(path, lineno, f"{name} value {cell!r} is not a number") from None
    return x * scale + offset


def import_powertraces(paths: Sequence[str | Path], tz: str | None = None, name: str | None = None) -> RunBuilder:
    tzinfo, tzname = resolve_zone(tz)
    b = RunBuilder(format="powertraces", name=name)
    b.info["import_timezone"] = {"zone": tzname, "note": "used only for timestamps without a zone"}
    for i, p in enumerate(map(Path, paths)):
        b.add_source(p, role="telemetry")
        before = b.read_local_times
        b.read_local_times = False
        read_powertraces(p, b, f"node{i}", tzinfo)
        if not b.read_local_times:
            b.times_without_zone(p, "every timestamp carries its own zone (Z or ±HH:MM)")
        b.read_local_times |= before
        meta = p.with_name(p.name.removesuffix(".csv") + ".meta.json")
        if meta.is_file():
            import json

            b.add_source(meta, role="exporter_metadata")
            b.info.setdefault("source_metadata", {})[p.name] = json.loads(read_text(meta))
    return b
