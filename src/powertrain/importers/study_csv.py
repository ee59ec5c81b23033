"""The study's artifact layout: one header-less CSV per metric and rank, ``<metric>_<rank>.csv``.

Each line is ``<epoch seconds>,<value>``; ``-1`` means the value was unknown (null here). Rank ``r``
ran on host ``node<r // gpus_per_node>`` as device ``gpu<r % gpus_per_node>`` (8 per node in the
study). The metrics of one rank are joined on their timestamps: one telemetry row per distinct
timestamp, with null where a metric has no reading at that instant.

Byte counters (NVLink / PCIe) were read from 32-bit registers and wrap at 2**32; they are un-wrapped
with :func:`powertrain.core.counters.unwrap` into 64-bit cumulative totals. Metric names are
matched against :data:`METRICS` (aliases included); files with other names are listed as dropped.
A metric name may carry its unit as a suffix (``power_mw``, ``power_kw``, ``energy_kj``,
``mem_used_mib``, ``sm_clock_ghz``): it is honoured (:mod:`powertrain.importers.units`).

Implausible readings (negative or > 3000 W power — the files do not name the GPU model —,
temperatures outside −40..150 °C, an energy counter that goes backwards, non-finite values) are
kept out (null) and counted per field with the first ``file:line`` (:mod:`powertrain.importers.sanity`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from powertrain.core.counters import unwrap
from powertrain.importers.common import RunBuilder, SourceFormatError, open_text, telemetry_table
from powertrain.importers.nvsmi import nvml_reasons_to_throttle
from powertrain.importers.sanity import default_limits, screen, screen_counter
from powertrain.importers.units import UNITS, conversion, dimension

WRAP_32 = 2**32

# metric file prefix → (telemetry column, scale to the column's unit, counter modulus or None)
METRICS: dict[str, tuple[str, float, int | None]] = {
    "power": ("power_w", 1.0, None),
    "power_w": ("power_w", 1.0, None),
    "power_mw": ("power_w", 1e-3, None),
    "energy": ("energy_j", 1.0, None),
    "energy_j": ("energy_j", 1.0, None),
    "energy_mj": ("energy_j", 1e-3, None),
    "temp": ("temp_c", 1.0, None),
    "temperature": ("temp_c", 1.0, None),
    "gpu_temp": ("temp_c", 1.0, None),
    "mem_temp": ("temp_mem_c", 1.0, None),
    "memory_temp": ("temp_mem_c", 1.0, None),
    "sm_clock": ("clock_sm_mhz", 1.0, None),
    "clock_sm": ("clock_sm_mhz", 1.0, None),
    "sm_clk": ("clock_sm_mhz", 1.0, None),
    "mem_clock": ("clock_mem_mhz", 1.0, None),
    "clock_mem": ("clock_mem_mhz", 1.0, None),
    "util": ("util_pct", 1.0, None),
    "gpu_util": ("util_pct", 1.0, None),
    "mem_util": ("util_mem_pct", 1.0, None),
    "mem_used": ("mem_used_bytes", 1.0, None),
    "power_limit": ("power_limit_w", 1.0, None),
    "fan": ("fan_pct", 1.0, None),
    "throttle": ("throttle", 1.0, None),  # NVML reason mask, mapped to Throttle bits
    "nvlink_tx": ("link_tx_bytes", 1.0, WRAP_32),
    "nvlink_rx": ("link_rx_bytes", 1.0, WRAP_32),
    "link_tx": ("link_tx_bytes", 1.0, WRAP_32),
    "link_rx": ("link_rx_bytes", 1.0, WRAP_32),
    "pcie_tx": ("pcie_tx_bytes", 1.0, WRAP_32),
    "pcie_rx": ("pcie_rx_bytes", 1.0, WRAP_32),
}


def metric_spec(metric: str) -> tuple[str, float, int | None] | None:
    """``(column, scale, modulus)`` of a metric file name: a known name, or a known name plus a unit."""
    if metric in METRICS:
        return METRICS[metric]
    base, _, unit = metric.rpartition("_")
    spec = METRICS.get(base)
    dim = dimension(spec[0]) if spec else None
    if spec is None or dim is None or unit not in UNITS[dim]:
        return None
    return spec[0], conversion(spec[0], unit)[0], spec[2]


_NAME_RE = re.compile(r"^(?P<metric>.+)_(?P<rank>\d+)\.csv(\.gz)?$")


def read_metric_file(path: Path) -> tuple[np.ndarray, list[float | None], list[int]]:
    """``(t_ns, values, line numbers)`` of one ``<metric>_<rank>.csv``; ``-1`` becomes ``None``."""
    t: list[int] = []
    v: list[float | None] = []
    lines: list[int] = []
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            parts = line.split(",")
            if len(parts) != 2:
                raise SourceFormatError(path, lineno, f"expected '<epoch seconds>,<value>', found {len(parts)} fields")
            try:
                sec = float(parts[0])
                val = float(parts[1])
            except ValueError:
                if lineno == 1 and not parts[0].strip().replace(".", "").isdigit():
                    raise SourceFormatError(path, 1, "the study's CSVs have no header line; this one starts "
                                                     f"with {line[:40]!r}") from None
                raise SourceFormatError(path, lineno, f"not numbers: {line[:60]!r}") from None
            if sec < 1e8:
                raise SourceFormatError(path, lineno, f"time {parts[0]} is not epoch seconds (before 1973)")
            t.append(round(sec * 1e9))
            v.append(None if val == -1 else val)
            lines.append(lineno)
    if not t:
        raise SourceFormatError(path, None, "the file is empty")
    return np.asarray(t, dtype=np.int64), v, lines


def import_study_csv(paths: Sequence[str | Path], gpus_per_node: int = 8, name: str | None = None) -> RunBuilder:
    """Import ``<metric>_<rank>.csv`` files (or folders holding them)."""
    b = RunBuilder(format="study_csv", name=name)
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(x for x in p.iterdir() if _NAME_RE.match(x.name)) if p.is_dir() else [p]
    if not files:
        raise SourceFormatError(paths[0], None, "no <metric>_<rank>.csv files found")
    # rank → column → (t_ns, values, line numbers, file name, (scale, modulus))
    by_rank: dict[int, dict[str, tuple[np.ndarray, list[float | None], list[int], str, str, float, int | None]]] = {}
    for f in files:
        m = _NAME_RE.match(f.name)
        if not m:
            raise SourceFormatError(f, None, "file name is not <metric>_<rank>.csv")
        metric, rank = m.group("metric").lower(), int(m.group("rank"))
        spec = metric_spec(metric)
        if spec is None:
            b.drop(f"{f.name}: metric {metric!r} has no telemetry column (known: {', '.join(sorted(METRICS))})")
            continue
        b.add_source(f, role=f"{metric} rank {rank}")
        col, scale, modulus = spec
        if col in by_rank.setdefault(rank, {}):
            raise SourceFormatError(f, None, f"a second file for {col} of rank {rank}")
        by_rank[rank][col] = (*read_metric_file(f), f.name, metric, scale, modulus)
        b.mapped[f"{metric}_<rank>.csv"] = col + (" (un-wrapped from 32 bits)" if modulus else "") + (
            f" (x {scale:g})" if scale != 1.0 else "")
    wraps = 0
    for rank, cols in sorted(by_rank.items()):
        t_all = np.unique(np.concatenate([c[0] for c in cols.values()]))
        fields: dict[str, np.ndarray] = {}
        for col, (t, vals, lines, fname, metric, scale, modulus) in cols.items():
            where = [f"{fname}:{n}" for n in lines]
            if metric == "throttle":
                arr = np.array([np.nan if x is None else float(nvml_reasons_to_throttle(int(x))) for x in vals])
            else:
                raw = np.array([np.nan if x is None else x for x in vals], dtype=np.float64)
                if modulus:
                    raw = screen(b, col, raw, where=where)
                    good = raw[~np.isnan(raw)]
                    wraps += int(np.sum(np.diff(good) < 0)) if good.size > 1 else 0
                    raw = np.array([np.nan if x is None else x for x in unwrap(
                        [None if np.isnan(x) else float(x) for x in raw], modulus)], dtype=np.float64)
                elif col in ("energy_j", "energy_dram_j"):
                    raw = screen_counter(b, col, raw, where=where)
                else:  # screened in the file's unit against the column's limits (1e308 kW stays "too high")
                    (lo, hi), why = default_limits(col)
                    raw = screen(b, col, raw, where=where, limits=(lo / scale, hi / scale),
                                 limits_source=why if scale == 1.0 else f"{why}, in the file's unit (x {scale:g})")
                arr = raw * scale
            full = np.full(t_all.size, np.nan)
            full[np.searchsorted(t_all, t)] = arr
            fields[col] = full
        host, dev = f"node{rank // gpus_per_node}", f"gpu{rank % gpus_per_node}"
        b.add_telemetry(telemetry_table(t_all, host, dev, fields))
        b.add_device(host, dev, kind="gpu", vendor="nvidia", index=rank % gpus_per_node, rank=rank)
    b.info["rank_map"] = [{"rank": r, "host": f"node{r // gpus_per_node}", "local_rank": r % gpus_per_node,
                           "device": f"gpu{r % gpus_per_node}"} for r in sorted(by_rank)]
    b.info["study_csv"] = {"gpus_per_node": gpus_per_node, "counter_wraps_unwrapped": wraps,
                           "null_marker": -1}
    return b
