"""``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits] -lms N`` logs → telemetry.

The header decides everything: any set of query fields, in any order, with or without units in the
header (``power.draw [W]``) or in the values (``71.25 W``). Known fields map to telemetry columns
(:data:`FIELD_MAP`); others are listed as dropped in ``run.json``. ``[N/A]``, ``[Not Supported]``,
``N/A`` and empty cells are null.

Which GPU a row is: the ``index`` column when present, else ``uuid`` / ``pci.bus_id`` (numbered in
order of first appearance). Without any of them nvidia-smi still writes one row per GPU per sample in
GPU order, so row ``i`` is GPU ``i mod N``; ``N`` is inferred from the gaps between samples (rows of
one sample are milliseconds apart, samples are a period apart) or given with ``gpus=N``.

Timestamps are the local time of the machine that logged them (``YYYY/MM/DD HH:MM:SS.mmm``); the
zone is an option (``tz``), defaulting to this machine's zone, and is recorded in ``run.json``. Each
GPU's times are checked in the order the log wrote them (:func:`powertrain.importers.sanity.screen_time`):
a step back of the clock (an NTP step, a log appended to after a reboot) and a gap longer than energy
bridges (a logger stopped for an hour) are counted and named in ``run.json`` ``data_quality``, with a
warning, and the clock intervals a step back re-lived are recorded there for the analysis, which
refuses energy over a window either falls in.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from powertrain.core.throttle import throttle_from_nvml
from powertrain.importers.common import (
    NULL_WORDS,
    RunBuilder,
    SourceFormatError,
    open_text,
    resolve_zone,
    telemetry_table,
)
from powertrain.importers.sanity import screen, screen_time
from powertrain.importers.units import UnitError, conversion, dimension, split_value

# One mapping of NVML reason bits for live sampling and imports alike.
nvml_reasons_to_throttle = throttle_from_nvml


def _num(v: str, header_unit: str) -> float:
    """A plain number (the column's unit is checked by the caller: :func:`_physical` for units)."""
    return split_value(v)[0]


def _bytes(v: str, header_unit: str) -> float:
    """Memory: the cell's unit, else the header's, else MiB (what nvidia-smi writes)."""
    x, unit = split_value(v)
    scale, _ = conversion("mem_used_bytes", unit or header_unit or "MiB")
    return x * scale


def _hexmask(v: str, header_unit: str) -> float:
    return float(nvml_reasons_to_throttle(int(v.split()[0], 16)))


# query field (as in the header, lower case, units stripped) → (column, parser)
FIELD_MAP: dict[str, tuple[str, Callable[[str, str], float]]] = {
    "power.draw.instant": ("power_w", _num),
    "power.draw": ("power_w", _num),  # → power_avg_w when power.draw.instant is also logged
    "power.draw.average": ("power_avg_w", _num),
    "enforced.power.limit": ("power_limit_w", _num),
    "power.limit": ("power_limit_w", _num),  # used only when enforced.power.limit is absent
    "temperature.gpu": ("temp_c", _num),
    "temperature.memory": ("temp_mem_c", _num),
    "clocks.sm": ("clock_sm_mhz", _num),
    "clocks.current.sm": ("clock_sm_mhz", _num),
    "clocks.mem": ("clock_mem_mhz", _num),
    "clocks.current.memory": ("clock_mem_mhz", _num),
    "utilization.gpu": ("util_pct", _num),
    "utilization.memory": ("util_mem_pct", _num),
    "memory.used": ("mem_used_bytes", _bytes),
    "fan.speed": ("fan_pct", _num),
    "clocks_throttle_reasons.active": ("throttle", _hexmask),
    "clocks_event_reasons.active": ("throttle", _hexmask),
    "clocks_event_reasons": ("throttle", _hexmask),
}
ID_FIELDS = ("index", "uuid", "pci.bus_id", "gpu_uuid", "gpu_bus_id")
INFO_FIELDS = ("name", "serial", "driver_version", "vbios_version", "memory.total", "power.max_limit",
               "power.default_limit", "clocks.max.sm", "clocks.max.memory")


def split_header(cell: str) -> tuple[str, str]:
    """``' power.draw [W]'`` → ``('power.draw', 'W')``."""
    cell = cell.strip()
    if cell.endswith("]") and " [" in cell:
        name, unit = cell[:-1].split(" [", 1)
        return name.strip().lower(), unit.strip()
    return cell.lower(), ""


class _Clock:
    """Local ``YYYY/MM/DD HH:MM:SS(.fff)`` → epoch ns, caching the whole-second part (fast, DST-safe)."""

    def __init__(self, tz: dt.tzinfo) -> None:
        self.tz = tz
        self.cache: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        s = s.strip()
        head, _, frac = s.partition(".")
        sec = self.cache.get(head)
        if sec is None:
            fmt = "%Y/%m/%d %H:%M:%S" if "/" in head else "%Y-%m-%d %H:%M:%S"
            sec = int(dt.datetime.strptime(head, fmt).replace(tzinfo=self.tz).timestamp())
            self.cache[head] = sec
        ns = int((frac + "000000000")[:9]) if frac else 0
        return sec * 1_000_000_000 + ns


def infer_gpu_count(t_ns: np.ndarray, max_gpus: int = 64) -> int | None:
    """GPUs per sample from the timing of rows without an index column (see module doc)."""
    if t_ns.size < 4:
        return None
    gaps = np.diff(t_ns)
    big = gaps > max(20_000_000, 0.25 * np.percentile(gaps, 99))  # > 20 ms and a sizable share of the period
    cuts = np.flatnonzero(big)
    if cuts.size < 2:
        return None
    sizes = np.diff(cuts)
    sizes = sizes[(sizes > 0) & (sizes <= max_gpus)]
    if sizes.size == 0:
        return None
    vals, counts = np.unique(sizes, return_counts=True)
    return int(vals[np.argmax(counts)])


# One column of the log read into telemetry: (cell index, column, parser, unit in the header).
_Plan = list[tuple[int, str, Callable[[str, str], float], str]]


def read_nvsmi(path: Path, builder: RunBuilder, host: str, tz: dt.tzinfo, gpus: int | None = None) -> None:
    """Parse one nvidia-smi CSV log into ``builder`` as telemetry of ``host``."""
    with open_text(path) as f:
        reader = csv.reader(f, skipinitialspace=True)
        try:
            header = next(reader)
        except StopIteration:
            raise SourceFormatError(path, None, "the file is empty") from None
        names = [split_header(c) for c in header]
        keys = [n for n, _ in names]
        plan = _column_plan(path, names, builder)
        ts_i = keys.index("timestamp") if "timestamp" in keys else None
        if ts_i is None:
            raise SourceFormatError(path, 1, "no timestamp column: add `timestamp` to --query-gpu")
        id_i = next((keys.index(k) for k in ID_FIELDS if k in keys), None)
        rows = _read_rows(path, reader, keys, plan, ts_i, id_i, _Clock(tz))
    if not rows.t:
        raise SourceFormatError(path, None, "no data rows after the header")
    t_arr = np.asarray(rows.t, dtype=np.int64)
    id_key = keys[id_i] if id_i is not None else None
    dev_idx = _device_indices(path, id_key, rows.ids, t_arr, gpus, builder)
    devices = [f"gpu{i}" for i in dev_idx]
    fields: dict[str, Any] = {}
    where = np.array([f"{path.name}:{n}" for n in rows.lines])
    dev_names = _row_device_names(id_key, dev_idx, rows)
    for col, values in rows.cols.items():
        arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        fields[col] = _screened(builder, col, arr, where, dev_names)
    idx = np.asarray(dev_idx)
    for i in sorted(set(dev_idx)):  # time as the log wrote it, per GPU, before the rows are sorted
        sel = idx == i
        screen_time(builder, host, f"gpu{i}", t_arr[sel], where=where[sel])
    builder.add_telemetry(telemetry_table(t_arr, host, devices, fields))
    _add_devices(builder, host, id_key, dev_idx, rows)


def _cell_value(fn: Callable[[str, str], float], col: str, cell: str, unit: str, key: str) -> float:
    """One cell in the column's unit: a unit in the cell (``0.5 kW``) wins over the header's."""
    if fn is _hexmask:
        return fn(cell, unit)
    x, cell_unit = split_value(cell)
    u = cell_unit or unit or ("MiB" if fn is _bytes else "")
    scale, offset = conversion(col, u, f"{key} [{u}]")
    return x * scale + offset


def _row_device_names(id_key: str | None, dev_idx: list[int], rows: _Rows) -> np.ndarray | None:
    """The logged GPU name of every row (for the TDP bound of power); ``None`` when the log has none."""
    if id_key is None or not rows.infos or not any(i.get("name") for i in rows.infos.values()):
        return None
    return np.array([rows.infos.get(ident, {}).get("name") or "" for ident in rows.ids])


def _screened(b: RunBuilder, col: str, arr: np.ndarray, where: np.ndarray, names: np.ndarray | None) -> np.ndarray:
    """Implausible readings of one column → NaN (counted in data_quality), per GPU model for power."""
    if dimension(col) is None:
        return arr
    if names is None or dimension(col) != "power":
        return screen(b, col, arr, where=where)
    out = np.empty_like(arr)
    for name in np.unique(names):
        sel = names == name
        out[sel] = screen(b, col, arr[sel], where=where[sel], device_name=str(name) or None)
    return out


def _column_plan(path: Path, names: list[tuple[str, str]], builder: RunBuilder) -> _Plan:
    """Which header fields fill which telemetry column; the rest are recorded as dropped."""
    keys = [n for n, _ in names]
    if not any(k in FIELD_MAP for k in keys):
        raise SourceFormatError(path, 1, "no known nvidia-smi query field in the header "
                                         f"({', '.join(keys[:6])}); was it written with --format=csv "
                                         "and a header (not noheader)?")
    has_instant = "power.draw.instant" in keys
    has_enforced = "enforced.power.limit" in keys
    plan: _Plan = []
    for i, (k, unit) in enumerate(names):
        if k in FIELD_MAP:
            col, fn = FIELD_MAP[k]
            if k == "power.draw" and has_instant:
                col = "power_avg_w"
            if k == "power.limit" and has_enforced:
                builder.drop(f"{k}: enforced.power.limit is used for power_limit_w")
                continue
            if any(c == col for _, c, _, _ in plan):
                builder.drop(f"{k}: another field already fills {col}")
                continue
            if fn is not _hexmask:
                try:
                    conversion(col, unit, f"{k} [{unit}]")
                except UnitError as exc:
                    raise SourceFormatError(path, 1, str(exc)) from None
            plan.append((i, col, fn, unit))
            builder.mapped[f"{k}{' [' + unit + ']' if unit else ''}"] = col
        elif k not in ID_FIELDS and k != "timestamp" and k not in INFO_FIELDS:
            builder.drop(f"{k}: no telemetry column for it")
    return plan


@dataclass
class _Rows:
    """The data rows of one log: times, device identifiers, column values, static info per device."""

    t: list[int] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    cols: dict[str, list[float | None]] = field(default_factory=dict)
    infos: dict[str, dict[str, str]] = field(default_factory=dict)


def _read_rows(path: Path, reader: Iterator[list[str]], keys: list[str], plan: _Plan, ts_i: int,
               id_i: int | None, clock: _Clock) -> _Rows:
    info_i = {k: keys.index(k) for k in INFO_FIELDS if k in keys}
    ncol = len(keys)
    rows = _Rows(cols={c: [] for _, c, _, _ in plan})
    for lineno, row in enumerate(reader, 2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != ncol:
            if row[0].strip().lower().startswith("timestamp"):
                continue  # a repeated header (nvidia-smi restarted into the same file)
            raise SourceFormatError(path, lineno, f"expected {ncol} comma-separated values like the header, "
                                                  f"found {len(row)}")
        rows.lines.append(lineno)
        try:
            rows.t.append(clock(row[ts_i]))
        except ValueError:
            raise SourceFormatError(path, lineno, f"timestamp {row[ts_i]!r} is not YYYY/MM/DD HH:MM:SS.fff") from None
        for i, col, fn, unit in plan:
            cell = row[i].strip()
            if not cell or cell.strip("[]").lower() in NULL_WORDS:
                rows.cols[col].append(None)
                continue
            try:
                rows.cols[col].append(_cell_value(fn, col, cell, unit, keys[i]))
            except UnitError as exc:
                raise SourceFormatError(path, lineno, str(exc)) from None
            except (ValueError, IndexError):
                raise SourceFormatError(path, lineno, f"{keys[i]} value {cell!r} is not a number") from None
        if id_i is not None:
            ident = row[id_i].strip()
            rows.ids.append(ident)
            if ident not in rows.infos:
                rows.infos[ident] = {k: row[j].strip() for k, j in info_i.items()}
    return rows


def _device_indices(path: Path, id_key: str | None, ids: list[str], t_arr: np.ndarray, gpus: int | None,
                    builder: RunBuilder) -> list[int]:
    """GPU index of every row: the index column, else order of first appearance of the id, else row order.

    ``gpus`` splits a log without an index or uuid column into devices; with one it is a check on the count
    (a count that disagrees with the log's own is refused, not ignored)."""
    if id_key is not None and gpus is not None and len(set(ids)) != gpus:
        raise ValueError(f"{path}: --gpus {gpus}, but the log's {id_key} column names {len(set(ids))} GPU(s); drop "
                         "--gpus (it splits logs without an index or uuid column) or import the right file")
    if id_key == "index":
        try:
            return [int(x) for x in ids]
        except ValueError:
            raise SourceFormatError(path, None, "the index column holds a non-integer") from None
    if id_key is not None:
        order: dict[str, int] = {}
        dev_idx = [order.setdefault(x, len(order)) for x in ids]
        builder.mapped[id_key] = "device gpu<i>, i = order of first appearance"
        return dev_idx
    n = gpus or infer_gpu_count(t_arr)
    if n is None:
        n = 1
        builder.warn(f"{path}: no index/uuid column and the GPU count could not be inferred; "
                     "treating every row as GPU 0 (pass --gpus N)")
    if len(t_arr) % n:
        builder.warn(f"{path}: {len(t_arr)} rows is not a multiple of {n} GPUs; the last sample is partial")
    builder.mapped["(row order)"] = f"device gpu<row mod {n}>: no index column, {n} rows per sample"
    return list(np.arange(len(t_arr)) % n)


def _add_devices(builder: RunBuilder, host: str, id_key: str | None, dev_idx: list[int], rows: _Rows) -> None:
    """One device entry per GPU seen, with what the log says about it (name, uuid or PCI bus id)."""
    seen: dict[int, str | None] = {}
    idents: list[str | None] = list(rows.ids) if rows.ids else [None] * len(dev_idx)
    for i, ident in zip(dev_idx, idents, strict=True):
        seen.setdefault(int(i), ident)
    for i, ident in sorted(seen.items()):
        info = rows.infos.get(ident, {}) if ident else {}
        extra: dict[str, Any] = {"index": i, "name": info.get("name") or None}
        if ident and id_key in ("uuid", "gpu_uuid"):
            extra["uuid"] = ident
        if ident and id_key in ("pci.bus_id", "gpu_bus_id"):
            extra["pci_bus_id"] = ident
        builder.add_device(host, f"gpu{i}", kind="gpu", vendor="nvidia", **extra)


def import_nvsmi(
    paths: Sequence[str | Path],
    tz: str | None = None,
    hosts: Sequence[str] | None = None,
    gpus: int | None = None,
    name: str | None = None,
) -> RunBuilder:
    """Import nvidia-smi CSV logs; file ``i`` becomes host ``hosts[i]`` (default ``node<i>``)."""
    tzinfo, tzname = resolve_zone(tz)
    b = RunBuilder(format="nvsmi", name=name)
    b.info["import_timezone"] = {"zone": tzname, "given": tz is not None,
                                 "note": "nvidia-smi timestamps are local time of the logging machine"}
    files = [Path(p) for p in paths]
    if hosts is not None and len(hosts) != len(files):
        raise ValueError(f"{len(hosts)} host names for {len(files)} files: give one per file")
    for i, f in enumerate(files):
        b.add_source(f, role="telemetry")
        read_nvsmi(f, b, hosts[i] if hosts else f"node{i}", tzinfo, gpus)
        b.read_local_times = True  # its timestamp column is always local time
    return b
