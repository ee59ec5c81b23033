"""Long-format per-GPU CSV exports ("PowerTraces": one row per GPU per sample) → telemetry.

Columns (header-driven; any subset): ``timestamp`` (ISO-8601, ``Z`` = UTC; a timestamp without a
zone is read in ``tz``), ``gpu_id``, ``power_w``, ``sm_clock_mhz``, ``gpu_util_pct``,
``memory_util_pct``, ``memory_used_mb`` (MiB), ``temperature_c``; ``run_id``, ``time_relative_s``,
``memory_total_mb`` and ``stage`` are recorded or dropped as listed in ``run.json``. Empty cells are
null.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from powertrain.importers.common import (
    RunBuilder,
    SourceFormatError,
    open_text,
    parse_float,
    resolve_zone,
    telemetry_table,
)

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
REQUIRED = ("timestamp", "gpu_id")


def _iso_ns(s: str, tz: dt.tzinfo) -> int:
    d = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    if d.tzinfo is None:
        d = d.replace(tzinfo=tz)
    # integer arithmetic keeps microseconds exact
    return (int(d.replace(microsecond=0).timestamp()) * 1_000_000 + d.microsecond) * 1000


def read_powertraces(path: Path, builder: RunBuilder, host: str, tz: dt.tzinfo) -> None:
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
        plan = [(header.index(c), col, scale) for c, (col, scale) in COLUMNS.items() if c in header]
        for c in header:
            if c not in COLUMNS and c not in REQUIRED:
                builder.drop(f"{c}: {'run label, kept in run.json' if c == 'run_id' else 'no telemetry column for it'}")
        for i, col, _ in plan:
            builder.mapped[header[i]] = col
        t: list[int] = []
        dev: list[str] = []
        vals: dict[str, list[float]] = {col: [] for _, col, _ in plan}
        run_ids: set[str] = set()
        ri = header.index("run_id") if "run_id" in header else None
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) != len(header):
                raise SourceFormatError(path, lineno, f"expected {len(header)} values like the header, found {len(row)}")
            try:
                t.append(_iso_ns(row[ti], tz))
            except ValueError:
                raise SourceFormatError(path, lineno, f"timestamp {row[ti]!r} is not ISO-8601") from None
            g = row[gi].strip()
            if not g.isdigit():
                raise SourceFormatError(path, lineno, f"gpu_id {g!r} is not a GPU index")
            dev.append(f"gpu{g}")
            for i, col, scale in plan:
                try:
                    v = parse_float(row[i])
                except ValueError:
                    raise SourceFormatError(path, lineno, f"{header[i]} value {row[i]!r} is not a number") from None
                vals[col].append(np.nan if v is None else v * scale)
            if ri is not None:
                run_ids.add(row[ri])
    if not t:
        raise SourceFormatError(path, None, "no data rows after the header")
    fields = {col: np.asarray(v, dtype=np.float64) for col, v in vals.items()}
    builder.add_telemetry(telemetry_table(t, host, dev, fields))
    for d in sorted(set(dev), key=lambda s: int(s[3:])):
        builder.add_device(host, d, kind="gpu", vendor=None, index=int(d[3:]))
    if run_ids:
        builder.info.setdefault("source_run_ids", []).extend(sorted(run_ids))


def import_powertraces(paths: Sequence[str | Path], tz: str | None = None, name: str | None = None) -> RunBuilder:
    tzinfo, tzname = resolve_zone(tz)
    b = RunBuilder(format="powertraces", name=name)
    b.info["import_timezone"] = {"zone": tzname, "note": "used only for timestamps without a zone"}
    for i, p in enumerate(map(Path, paths)):
        b.add_source(p, role="telemetry")
        read_powertraces(p, b, f"node{i}", tzinfo)
        meta = p.with_name(p.name.removesuffix(".csv") + ".meta.json")
        if meta.is_file():
            import json

            b.add_source(meta, role="exporter_metadata")
            b.info.setdefault("source_metadata", {})[p.name] = json.loads(meta.read_text())
    return b
