"""The one energy integral of powertrain: power readings → joules over an explicit window.

Every energy figure the project prints (imports, summaries, reports, per-step energy, the
predictor's output) comes from :func:`window_energy` or :func:`windows_energy`, on one rule:

1. Power is linear between readings (trapezoid rule). A window edge that falls between two readings
   takes the linearly interpolated power there, so adjacent windows add up exactly to the window
   that spans them.
2. Where the readings stop short of a window edge (a logger that starts late or stops early), the
   nearest reading is *held* (constant power) up to ``hold_limit_s`` (default 5 s). The held seconds
   are reported (``held_start_s`` / ``held_end_s``) so a reader sees how much of the figure is held.
3. A gap at an edge longer than the limit makes the energy **null with a reason**: an under-count
   (counting the gap as zero) or a long extrapolation would both be wrong numbers.

Readings that repeat the same timestamp and value (some loggers write each line twice) are dropped
and counted; readings at the same time with different values are averaged and counted; non-finite
readings are dropped and counted. None of them weigh twice.

Energy counters (NVML total energy, RAPL) are integrated by :func:`counter_window_energy` on the
same window and edge rule, so the counter figure and the power integral can be compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

DEFAULT_HOLD_LIMIT_S = 5.0


@dataclass(frozen=True)
class Readings:
    """A cleaned, time-sorted power series and what cleaning removed (for ``data_quality``)."""

    t_ns: np.ndarray
    value: np.ndarray
    duplicates_dropped: int = 0
    same_time_merged: int = 0
    non_finite_dropped: int = 0

    @property
    def quality(self) -> dict[str, int]:
        return {
            "duplicate_readings_dropped": self.duplicates_dropped,
            "same_time_readings_merged": self.same_time_merged,
            "non_finite_readings_dropped": self.non_finite_dropped,
        }


def clean_readings(t_ns: Any, value: Any) -> Readings:
    """Sort by time; drop non-finite values and exact repeats; average different same-time values."""
    t = np.asarray(t_ns, dtype=np.int64).ravel()
    v = np.asarray(value, dtype=np.float64).ravel()
    if t.shape != v.shape:
        raise ValueError(f"times and values differ in length ({t.size} vs {v.size})")
    finite = np.isfinite(v)
    non_finite = int((~finite).sum())
    t, v = t[finite], v[finite]
    order = np.lexsort((v, t))
    t, v = t[order], v[order]
    if t.size < 2:
        return Readings(t, v, 0, 0, non_finite)
    repeat = np.concatenate([[False], (t[1:] == t[:-1]) & (v[1:] == v[:-1])])
    duplicates = int(repeat.sum())
    t, v = t[~repeat], v[~repeat]
    merged = 0
    if t.size > 1 and np.any(t[1:] == t[:-1]):
        uniq, start, counts = np.unique(t, return_index=True, return_counts=True)
        merged = int((counts - 1).sum())
        v = np.add.reduceat(v, start) / counts
        t = uniq
    return Readings(t, v, duplicates, merged, non_finite)


@dataclass(frozen=True)
class WindowEnergy:
    """Energy of one series over one window, with the evidence a reader needs to trust it."""

    energy_j: float | None
    window_s: float
    held_start_s: float = 0.0
    held_end_s: float = 0.0
    readings: int = 0
    why_null: str | None = None
    quality: dict[str, int] = field(default_factory=dict)

    @property
    def edge_held_s(self) -> float:
        return self.held_start_s + self.held_end_s

    @property
    def mean_power_w(self) -> float | None:
        if self.energy_j is None or self.window_s <= 0:
            return None
        return self.energy_j / self.window_s

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["edge_held_s"] = self.edge_held_s
        return d


def _edge_gaps(t: np.ndarray, t0: int, t1: int) -> tuple[float, float]:
    """Seconds of [t0, t1] before the first and after the last reading (0 where covered)."""
    start = max(0, min(int(t[0]), t1) - t0) / 1e9
    end = max(0, t1 - max(int(t[-1]), t0)) / 1e9
    return start, end


def _refuse(t: np.ndarray, t0: int, t1: int, hold_limit_s: float) -> tuple[float, float, str | None]:
    """Held seconds at each edge, and the reason to refuse the window (None when it is fine)."""
    if t.size == 0:
        return 0.0, 0.0, "no power readings"
    start, end = _edge_gaps(t, t0, t1)
    if start > hold_limit_s:
        return start, end, (f"power readings start {start:.1f} s after the window start "
                            f"(more than the {hold_limit_s:g} s an edge may be held)")
    if end > hold_limit_s:
        return start, end, (f"power readings stop {end:.1f} s before the window end "
                            f"(more than the {hold_limit_s:g} s an edge may be held)")
    return start, end, None


def _running_integral(t: np.ndarray, p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """F(x) = ∫ power from t[0] to x over the piecewise-linear series, held flat beyond its ends."""
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * (np.diff(t) / 1e9))])
    x = np.asarray(x, dtype=np.int64)
    before = x < t[0]
    after = x > t[-1]
    xc = np.clip(x, t[0], t[-1])
    i = np.clip(np.searchsorted(t, xc, side="right") - 1, 0, max(t.size - 2, 0))
    if t.size == 1:
        inside = np.zeros(x.shape)
    else:
        h = (t[i + 1] - t[i]) / 1e9
        d = (xc - t[i]) / 1e9
        slope = np.divide(p[i + 1] - p[i], h, out=np.zeros_like(h, dtype=np.float64), where=h > 0)
        inside = cum[i] + p[i] * d + 0.5 * slope * d * d
    total = cum[-1]
    out = np.where(before, -(t[0] - x) / 1e9 * p[0], inside)
    return np.where(after, total + (x - t[-1]) / 1e9 * p[-1], out)


def window_energy(
    t_ns: Any, power_w: Any, t0_ns: int, t1_ns: int, *, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S
) -> WindowEnergy:
    """Energy (J) of a power series over ``[t0_ns, t1_ns]`` on the module's rule."""
    r = clean_readings(t_ns, power_w)
    t0, t1 = int(t0_ns), int(t1_ns)
    if t1 < t0:
        raise ValueError(f"window ends before it starts ({t0} > {t1})")
    window_s = (t1 - t0) / 1e9
    held_start, held_end, why = _refuse(r.t_ns, t0, t1, hold_limit_s)
    if why is not None:
        return WindowEnergy(None, window_s, held_start, held_end, int(r.t_ns.size), why, r.quality)
    f = _running_integral(r.t_ns, r.value, np.array([t0, t1], dtype=np.int64))
    return WindowEnergy(float(f[1] - f[0]), window_s, held_start, held_end, int(r.t_ns.size), None,
                        r.quality)


def windows_energy(
    t_ns: Any, power_w: Any, a_ns: Any, b_ns: Any, *, span: tuple[int, int] | None = None,
    hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
) -> tuple[np.ndarray, str | None]:
    """Energy (J) of each sub-window ``[a_i, b_i]`` (e.g. every step) on the same rule, vectorised.

    ``span`` is the enclosing window (the run's); the hold limit is checked on it once, so steps at
    the run's edges are held exactly as the run's own total is, and the steps add up to the run.
    Without ``span`` the sub-windows' overall extent is used. Returns NaN for every sub-window, and
    the reason, when the span is refused.
    """
    r = clean_readings(t_ns, power_w)
    a = np.atleast_1d(np.asarray(a_ns, dtype=np.int64))
    b = np.atleast_1d(np.asarray(b_ns, dtype=np.int64))
    if a.size == 0:
        return np.empty(0), None
    lo, hi = span if span is not None else (int(a.min()), int(b.max()))
    _, _, why = _refuse(r.t_ns, lo, hi, hold_limit_s)
    if why is not None:
        return np.full(a.shape, np.nan), why
    return _running_integral(r.t_ns, r.value, b) - _running_integral(r.t_ns, r.value, a), None


def counter_window_energy(
    t_ns: Any, energy_counter_j: Any, t0_ns: int, t1_ns: int, *,
    hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
) -> WindowEnergy:
    """Energy (J) over ``[t0, t1]`` from a cumulative, already un-wrapped energy counter.

    The counter is linear between readings (constant power in each interval); a held edge takes the
    mean power of the interval next to it — the same edge rule as the power integral.
    """
    r = clean_readings(t_ns, energy_counter_j)
    t0, t1 = int(t0_ns), int(t1_ns)
    window_s = (t1 - t0) / 1e9
    held_start, held_end, why = _refuse(r.t_ns, t0, t1, hold_limit_s)
    if why is None and r.t_ns.size < 2:
        why = "fewer than two energy-counter readings"
    if why is None and np.any(np.diff(r.value) < 0):
        why = "energy counter goes backwards (un-wrap it first)"
    if why is not None:
        return WindowEnergy(None, window_s, held_start, held_end, int(r.t_ns.size), why, r.quality)
    t, c = r.t_ns, r.value
    t_s = (t - t[0]) / 1e9
    first_w = (c[1] - c[0]) / max(t_s[1] - t_s[0], 1e-12)
    last_w = (c[-1] - c[-2]) / max(t_s[-1] - t_s[-2], 1e-12)

    def at(x: int) -> float:
        if x <= t[0]:
            return float(c[0] - (t[0] - x) / 1e9 * first_w)
        if x >= t[-1]:
            return float(c[-1] + (x - t[-1]) / 1e9 * last_w)
        return float(np.interp((x - t[0]) / 1e9, t_s, c))

    return WindowEnergy(at(t1) - at(t0), window_s, held_start, held_end, int(t.size), None, r.quality)
