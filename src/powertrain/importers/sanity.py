"""Implausible readings: kept out of the metrics, counted, located, and warned about once per field.

Every importer passes each physical column it read through :func:`screen` before it builds the
telemetry table. An implausible entry becomes NaN (null in the table, so no metric sees it) and is
counted in ``run.json["data_quality"]["implausible"][field]``::

    {"count": n, "first": "file:line", "kinds": {"negative": n, "too_high": n, "non_finite": n},
     "first_of_kind": {"negative": "file:line", ...}, "limits": [lo, hi], "limits_source": "..."}

with one :class:`~powertrain.importers.common.ImportWarning_` line per field (the first screen of a
field that finds anything warns; later files only add to the counts).

What is implausible (:func:`default_limits`):

* any non-finite value (NaN that was not a null in the source, ±inf; 1e308 is caught as too high);
* power (``power_w``, ``power_avg_w``, ``power_limit_w``): below 0 W, or above 3 × the device's TDP
  when its name resolves in the hardware catalog (:func:`powertrain.hardware.get_device`), else
  above :data:`ABSOLUTE_MAX_POWER_W` (3000 W: no single accelerator draws that; a whole node logged
  as one "device" should pass its own ``limits``);
* temperatures (``temp_c``, ``temp_hotspot_c``, ``temp_mem_c``): below −40 °C or above 150 °C;
* percentages: below 0 or above 100 (a small tolerance of 1 point for rounding);
* clocks, memory, fan, byte and energy quantities: below 0 (clocks above 10 GHz).

Cumulative counters (energy, bytes) that go *backwards* by more than a wrap can explain are screened
by :func:`screen_counter`: with a known modulus a drop is one wrap (kept, un-wrapped by
:mod:`powertrain.core.counters`); without one, a drop is implausible and that reading is null.

Time is data quality too (:func:`screen_time`): each device's reading times, in the order the source
wrote them, are checked for steps back of the clock and for gaps longer than energy bridges; both are
counted and named per device, and the clock intervals a step back re-lived are recorded so the
analysis (which reads the sorted rows) refuses energy over them as the importer's own figures do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from powertrain.core.energy import (
    DEFAULT_HOLD_LIMIT_S,
    Intervals,
    gap_limit_s,
    median_period_s,
    merge_intervals,
    relived_intervals,
)
from powertrain.importers.common import RunBuilder

ABSOLUTE_MAX_POWER_W = 3000.0
TDP_FACTOR = 3.0
TEMP_LIMITS = (-40.0, 150.0)

_POWER_FIELDS = ("power_w", "power_avg_w", "power_limit_w")
_TEMP_FIELDS = ("temp_c", "temp_hotspot_c", "temp_mem_c")
_PCT_FIELDS = ("util_pct", "util_mem_pct", "fan_pct", "cpu_util_pct")
_CLOCK_FIELDS = ("clock_sm_mhz", "clock_mem_mhz")
_NONNEG_FIELDS = ("mem_used_bytes", "energy_j", "energy_dram_j", "pcie_tx_bytes", "pcie_rx_bytes",
                  "link_tx_bytes", "link_rx_bytes", "cgroup_cpu_s", "cgroup_mem_bytes", "load_1m")


def device_tdp_w(device_name: str | None) -> float | None:
    """The catalog TDP of a device name as logged (``NVIDIA H100 80GB HBM3``, ``A100``…); ``None`` if
    the name does not resolve."""
    from powertrain.hardware import get_device
    from powertrain.hardware.catalog import is_cpu_name

    if not device_name or is_cpu_name(device_name):
        return None

    candidates = [device_name, device_name.replace("NVIDIA", "").strip()]
    words = device_name.replace("NVIDIA", "").replace("-", " ").split()
    candidates += [" ".join(words[:n]) for n in range(len(words), 0, -1)]
    for cand in candidates:
        if not cand:
            continue
        try:
            return float(get_device(cand).tdp_w)
        except (KeyError, ValueError):
            continue  # not this spelling; try a shorter one (a lookup, not a formula swap)
    return None


def default_limits(field: str, device_name: str | None = None) -> tuple[tuple[float, float], str]:
    """``((lo, hi), why)`` for ``field``; power uses the device's TDP when its name resolves."""
    if field in _POWER_FIELDS:
        tdp = device_tdp_w(device_name)
        if tdp is not None:
            return (0.0, TDP_FACTOR * tdp), f"0 W .. 3 x TDP of {device_name} ({tdp:g} W, hardware catalog)"
        return (0.0, ABSOLUTE_MAX_POWER_W), (f"0 W .. {ABSOLUTE_MAX_POWER_W:g} W (device "
                                             f"{'unknown' if not device_name else repr(device_name) + ' not in the catalog'}"
                                             ": absolute bound)")
    if field in _TEMP_FIELDS:
        return TEMP_LIMITS, "-40 .. 150 degC"
    if field in _PCT_FIELDS:
        return (0.0, 101.0), "0 .. 100 % (1 point rounding tolerance)"
    if field in _CLOCK_FIELDS:
        return (0.0, 10_000.0), "0 .. 10000 MHz"
    if field in _NONNEG_FIELDS:
        return (0.0, math.inf), "non-negative"
    return (-math.inf, math.inf), "finite"


def _where_of(where: Sequence[str] | np.ndarray | None, i: int) -> str | None:
    if where is None:
        return None
    return str(where[i])


def screen(
    b: RunBuilder,
    field: str,
    values: np.ndarray,
    *,
    where: list[str] | np.ndarray | None,
    limits: tuple[float, float] | None = None,
    device_name: str | None = None,
    limits_source: str | None = None,
) -> np.ndarray:
    """A float copy of ``values`` with implausible entries NaN, counted in ``b.info["data_quality"]``.

    ``where`` labels each entry (``"file:line"``, same length as ``values``) so the first of each
    kind can be named; ``limits`` overrides :func:`default_limits` (``device_name`` picks the TDP for
    power; ``limits_source`` says where given ``limits`` come from). NaN entries already in ``values`` are nulls the source wrote (``N/A``) and are not
    counted; +-inf are."""
    out = np.array(values, dtype=np.float64, copy=True).ravel()
    if where is not None and len(where) != out.size:
        raise ValueError(f"screen({field}): {len(where)} locations for {out.size} values")
    if limits is None:
        limits, why = default_limits(field, device_name)
    else:
        why = limits_source or "given by the importer"
    lo, hi = float(limits[0]), float(limits[1])
    nan = np.isnan(out)
    inf = np.isinf(out)
    finite = ~nan & ~inf
    with np.errstate(invalid="ignore"):
        low = finite & (out < lo)
        high = finite & (out > hi)
    kinds = {"negative" if lo == 0.0 else "too_low": low, "too_high": high, "non_finite": inf}
    bad = low | high | inf
    if bad.any():
        _count(b, field, kinds, where, (lo, hi), why)
    out[bad] = np.nan
    return out


def screen_counter(
    b: RunBuilder,
    field: str,
    values: np.ndarray,
    *,
    where: list[str] | np.ndarray | None,
    modulus: float | None = None,
) -> np.ndarray:
    """Screen a cumulative counter: non-finite or negative entries, and (without ``modulus``) any
    reading below the last good one (a counter going backwards no wrap explains) become NaN. With a
    modulus, a drop is one wrap and is kept (un-wrap it with :mod:`powertrain.core.counters`)."""
    out = screen(b, field, values, where=where)
    back = np.zeros(out.size, dtype=bool)
    if modulus is None:
        last = -math.inf
        for i, v in enumerate(out):
            if math.isnan(v):
                continue
            if v < last:
                back[i] = True
            else:
                last = v
    if back.any():
        _count(b, field, {"backwards": back}, where, (0.0, math.inf),
               "cumulative: never decreases (no wrap modulus known)")
        out[back] = np.nan
    return out


def _count(b: RunBuilder, field: str, kinds: dict[str, np.ndarray], where: Sequence[str] | np.ndarray | None,
           limits: tuple[float, float], why: str) -> None:
    dq = b.info.setdefault("data_quality", {})
    imp = dq.setdefault("implausible", {})
    new = field not in imp
    entry: dict[str, Any] = imp.setdefault(field, {"count": 0, "first": None, "kinds": {}, "first_of_kind": {},
                                                   "limits": [_json_num(limits[0]), _json_num(limits[1])],
                                                   "limits_source": why})
    for kind, mask in kinds.items():
        n = int(mask.sum())
        if not n:
            continue
        entry["count"] += n
        entry["kinds"][kind] = entry["kinds"].get(kind, 0) + n
        entry["first_of_kind"].setdefault(kind, _where_of(where, int(np.flatnonzero(mask)[0])))
    if entry["first"] is None:
        any_bad = np.logical_or.reduce(list(kinds.values()))
        entry["first"] = _where_of(where, int(np.flatnonzero(any_bad)[0]))
    if new:
        parts = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in entry["kinds"].items())
        b.warn(f"{field}: {entry['count']} implausible reading(s) kept out of the metrics ({parts}; "
               f"limits {why}); first at {entry['first'] or 'unknown line'}")


def _json_num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def implausible_total(b: RunBuilder) -> int:
    """How many readings :func:`screen` has kept out of this import so far."""
    imp = b.info.get("data_quality", {}).get("implausible", {})
    return int(sum(v.get("count", 0) for v in imp.values()))


def screen_time(b: RunBuilder, host: str, device: str, t_ns: np.ndarray, *,
                where: Sequence[str] | np.ndarray | None, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S
                ) -> tuple[Intervals, float | None]:
    """Check one device's reading times **in the order the source wrote them** (before any sort):
    steps back of the clock (a time earlier than the one before it) and gaps that energy will not
    bridge (:mod:`powertrain.core.energy`, rules 4 and 5). Records them in ``run.json`` ``data_quality``
    — per device ``clock_steps_back``, ``clock_stepped_back_s``, ``first_step_back`` (file:line),
    ``relived_ns`` (the clock intervals the readings after each step live again, merged: the analysis
    needs them, since the import sorts the rows), ``median_interval_s``, ``long_gaps``, ``long_gap_s``,
    ``first_long_gap``; totals under ``data_quality.time`` — and warns once per device.

    Returns the merged re-lived intervals and the median interval (s), which the importer's own energy
    figures pass to the integral."""
    t = np.asarray(t_ns, dtype=np.int64).ravel()
    lo, hi = relived_intervals(t)
    period = median_period_s(t)
    limit = gap_limit_s(period, hold_limit_s)
    ts = np.sort(t)
    d = np.diff(ts)
    long = np.flatnonzero(d > limit * 1e9) if limit is not None else np.empty(0, dtype=np.int64)
    merged = merge_intervals(lo, hi)
    entry = b.device_quality(host, device, median_interval_s=period)
    if lo.size:
        first = int(np.flatnonzero(t[1:] < t[:-1])[0]) + 1
        entry.update(clock_steps_back=int(lo.size), clock_stepped_back_s=float((hi - lo).sum() / 1e9),
                     first_step_back=_where_of(where, first),
                     relived_ns=[[int(a), int(z)] for a, z in zip(*merged, strict=True)])
        b.warn(f"{host}/{device}: the clock goes backwards {lo.size} time(s) in the log ({(hi - lo).sum() / 1e9:.1f} s in "
               f"all; first at {_where_of(where, first) or 'unknown line'}, by {(hi[0] - lo[0]) / 1e9:.1f} s): energy "
               "over a window a step back falls in is unknown")
    if long.size:
        k = int(long[0])
        entry.update(long_gaps=int(long.size), long_gap_s=float(d[long].sum() / 1e9),
                     first_long_gap={"from_ns": int(ts[k]), "seconds": float(d[k] / 1e9)})
        b.warn(f"{host}/{device}: {long.size} gap(s) in the readings longer than the {limit:.3g} s energy bridges "
               f"(the longest {d[long].max() / 1e9:.1f} s, {d[long].sum() / 1e9:.1f} s in all): energy over a "
               "window a gap falls in is unknown")
    tq = b.data_quality.setdefault("time", {"clock_steps_back": 0, "clock_stepped_back_s": 0.0, "long_gaps": 0,
                                            "long_gap_s": 0.0, "devices": []})
    if lo.size or long.size:
        tq["clock_steps_back"] += int(lo.size)
        tq["clock_stepped_back_s"] += float((hi - lo).sum() / 1e9)
        tq["long_gaps"] += int(long.size)
        tq["long_gap_s"] += float(d[long].sum() / 1e9)
        tq["devices"].append(f"{host}/{device}")
    return merged, period
