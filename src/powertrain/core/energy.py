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
4. Time that is not one time line is never integrated. A **gap** — two consecutive readings further
   apart than the gap limit, ``max(GAP_PERIODS × the series' sampling period, hold_limit_s)`` (15 periods,
   and never less than the 5 s an edge may be held; the caller states the period, ``period_s``:
   :func:`median_period_s` of the readings for an importer, the median interval of each device for the
   analysis; a caller that states none gets no gap limit) — is not bridged:
   the energy of a window a gap overlaps is **null with the reason** (the gap's length, where it starts,
   how many there are), as an edge gap beyond the hold limit is. Counting the gap as zero would be an
   under-count and a line across an hour of missing readings a guess; both would be wrong numbers that
   look measured. A gap up to the limit is bridged by the straight line between its readings, as before,
   and those longer than ``NOTED_GAP_PERIODS`` (5) periods are counted (``bridged_gaps``, ``bridged_gap_s``,
   ``bridged_gap_max_s``) so the figure can say how much of it was bridged.
5. A **step back of the clock** — a reading stamped earlier than the one before it, in the order the
   readings were written — makes the readings after it live a stretch of clock time a second time (the
   *re-lived* interval: from the stamp it stepped back to, up to the latest stamp before the step). Sorted
   by time, the two stretches interleave, and no power curve or counter difference through them means
   anything (a 3 s step back read a counter as 24 × the energy). The energy of a window a re-lived
   interval overlaps is null with the reason. :func:`relived_intervals` finds them in the order given;
   a caller that sorted the readings (an import, or the analysis, which reads them by time) passes the
   intervals it found in file order (``relived``).

Sub-windows (steps) follow the same rules one by one: a step that a gap or a re-lived interval overlaps
has no energy (NaN), the others keep theirs. Every :class:`WindowEnergy` counts the gaps and steps back
it saw in its window (``long_gaps``, ``long_gap_s``, ``clock_steps_back``, ``clock_stepped_back_s``), null
or not, so ``data_quality`` can name them. An energy counter is the exception to rule 4: the hardware
kept counting through a gap, so its difference across one stands (rule 5 still applies to it).

Readings that repeat the same timestamp and value (some loggers write each line twice) are dropped
and counted; readings at the same time with different values are averaged and counted; non-finite
readings are dropped and counted. None of them weigh twice.

Energy counters (NVML total energy, RAPL) are integrated by :func:`counter_window_energy` on the
same window and edge rule, so the counter figure and the power integral can be compared.

A long series need not be held at once: :class:`PowerStream` and :class:`CounterStream` take the
readings in time-ordered chunks (no timestamp split between two chunks) and carry the edge state
from chunk to chunk. They *are* the rule — :func:`window_energy`, :func:`windows_energy` and
:func:`counter_window_energy` are one chunk fed to them — and the running sum is added in the same
order whatever the chunks, so a streamed figure equals the one-call figure to the last bit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

DEFAULT_HOLD_LIMIT_S = 5.0
# A gap longer than this many sampling periods (and than the hold limit) is not bridged. The real
# 1-node MLPerf LoRA log (2 s readings) has eleven gaps of 8-10 periods (up to 19.6 s), which MLCommons'
# own rule bridges; a logger that stopped for minutes (an 80 s hole at 2 s, an hour at 1 s) is not.
GAP_PERIODS = 15.0
# Gaps longer than this many periods that are still bridged are counted, so a summary can say so.
NOTED_GAP_PERIODS = 5.0

Intervals = tuple[np.ndarray, np.ndarray]  # (starts, ends) in ns, int64
_NO_INTERVALS: Intervals = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


def _period(period_s: float | None) -> float | None:
    """A usable sampling period (finite, positive), else None."""
    return float(period_s) if period_s is not None and np.isfinite(period_s) and period_s > 0 else None


def gap_limit_s(period_s: float | None, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S) -> float | None:
    """The longest interval between two readings the integral bridges: ``GAP_PERIODS`` sampling periods,
    never less than the hold limit. None for a series whose period the caller does not state: nothing
    says how far apart its readings should be (the analysis and the importers state it)."""
    period = _period(period_s)
    return None if period is None else max(GAP_PERIODS * period, float(hold_limit_s))


def median_period_s(t_ns: Any) -> float | None:
    """The median interval (s) between the distinct reading times of a series (None: fewer than two)."""
    t = np.unique(np.asarray(t_ns, dtype=np.int64))
    return float(np.median(np.diff(t))) / 1e9 if t.size >= 2 else None


def relived_intervals(t_ns: Any) -> Intervals:
    """Where the clock stepped back, in the order the times are given (the order they were written):
    for every time earlier than the one before it, the clock interval [that time, the latest time before
    it] that the readings after the step live through a second time. Not merged (one per step back)."""
    t = np.asarray(t_ns, dtype=np.int64).ravel()
    if t.size < 2:
        return _NO_INTERVALS
    back = np.flatnonzero(t[1:] < t[:-1]) + 1
    if back.size == 0:
        return _NO_INTERVALS
    return t[back], np.maximum.accumulate(t)[back - 1]


def merge_intervals(lo: Any, hi: Any) -> Intervals:
    """Sorted, disjoint intervals covering the given ones (touching ones joined)."""
    a = np.asarray(lo, dtype=np.int64).ravel()
    b = np.asarray(hi, dtype=np.int64).ravel()
    if a.size == 0:
        return _NO_INTERVALS
    order = np.argsort(a, kind="stable")
    a, b = a[order], np.maximum.accumulate(b[order])
    new = np.concatenate([[True], a[1:] > b[:-1]])  # b is a running max: an interval joins the one before
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], a.size] - 1
    return a[starts], b[ends]


def overlapping(lo: np.ndarray, hi: np.ndarray, a: Any, b: Any) -> np.ndarray:
    """For each window [a_i, b_i], whether any of the merged intervals (lo, hi) overlaps it in time
    (more than a point)."""
    a = np.atleast_1d(np.asarray(a, dtype=np.int64))
    b = np.atleast_1d(np.asarray(b, dtype=np.int64))
    if lo.size == 0:
        return np.zeros(a.shape, dtype=bool)
    i = np.searchsorted(hi, a, side="right")  # the first interval that ends after the window starts
    j = np.minimum(i, lo.size - 1)
    return (i < lo.size) & (lo[j] < b)


def _clipped_s(lo: np.ndarray, hi: np.ndarray, t0: int, t1: int) -> np.ndarray:
    """Seconds of each interval inside [t0, t1]."""
    return np.maximum(0, np.minimum(hi, t1) - np.maximum(lo, t0)) / 1e9


@dataclass(frozen=True)
class Readings:
    """A cleaned, time-sorted power series and what cleaning removed (for ``data_quality``), with the
    intervals the clock re-lived where the readings, as given, stepped back in time."""

    t_ns: np.ndarray
    value: np.ndarray
    duplicates_dropped: int = 0
    same_time_merged: int = 0
    non_finite_dropped: int = 0
    relived: Intervals = _NO_INTERVALS

    @property
    def steps_back(self) -> int:
        return int(self.relived[0].size)

    @property
    def quality(self) -> dict[str, int]:
        return {
            "duplicate_readings_dropped": self.duplicates_dropped,
            "same_time_readings_merged": self.same_time_merged,
            "non_finite_readings_dropped": self.non_finite_dropped,
            "clock_steps_back": self.steps_back,
        }


def clean_readings(t_ns: Any, value: Any) -> Readings:
    """Sort by time; drop non-finite values and exact repeats; average different same-time values.
    Steps back of the clock are found in the order given, before sorting (:func:`relived_intervals`)."""
    t = np.asarray(t_ns, dtype=np.int64).ravel()
    v = np.asarray(value, dtype=np.float64).ravel()
    if t.shape != v.shape:
        raise ValueError(f"times and values differ in length ({t.size} vs {v.size})")
    finite = np.isfinite(v)
    non_finite = int((~finite).sum())
    t, v = t[finite], v[finite]
    relived = relived_intervals(t)
    order = np.lexsort((v, t))
    t, v = t[order], v[order]
    if t.size < 2:
        return Readings(t, v, 0, 0, non_finite, relived)
    repeat = np.concatenate([[False], (t[1:] == t[:-1]) & (v[1:] == v[:-1])])
    duplicates = int(repeat.sum())
    t, v = t[~repeat], v[~repeat]
    merged = 0
    if t.size > 1 and np.any(t[1:] == t[:-1]):
        uniq, start, counts = np.unique(t, return_index=True, return_counts=True)
        merged = int((counts - 1).sum())
        v = np.add.reduceat(v, start) / counts
        t = uniq
    return Readings(t, v, duplicates, merged, non_finite, relived)


@dataclass(frozen=True)
class WindowEnergy:
    """Energy of one series over one window, with the evidence a reader needs to trust it.

    ``long_gaps`` / ``long_gap_s``: gaps longer than ``gap_limit_s`` that overlap the window, and their
    seconds inside it; ``clock_steps_back`` / ``clock_stepped_back_s``: steps back of the clock whose
    re-lived interval overlaps the window, and how far they stepped back (module doc, rules 4 and 5)."""

    energy_j: float | None
    window_s: float
    held_start_s: float = 0.0
    held_end_s: float = 0.0
    readings: int = 0
    why_null: str | None = None
    quality: dict[str, int] = field(default_factory=dict)
    long_gaps: int = 0
    long_gap_s: float = 0.0
    gap_limit_s: float | None = None
    clock_steps_back: int = 0
    clock_stepped_back_s: float = 0.0
    bridged_gaps: int = 0  # gaps over NOTED_GAP_PERIODS periods, up to the limit: bridged, counted
    bridged_gap_s: float = 0.0
    bridged_gap_max_s: float = 0.0

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


def _edge_gaps(first: int, last: int, t0: int, t1: int) -> tuple[float, float]:
    """Seconds of [t0, t1] before the first and after the last reading (0 where covered)."""
    start = max(0, min(first, t1) - t0) / 1e9
    end = max(0, t1 - max(last, t0)) / 1e9
    return start, end


def _refuse(first: int | None, last: int | None, t0: int, t1: int, hold_limit_s: float
            ) -> tuple[float, float, str | None]:
    """Held seconds at each edge, and the reason to refuse the window (None when it is fine);
    ``first``/``last``: the times of the first and last cleaned reading (None: there is none)."""
    if first is None or last is None:
        return 0.0, 0.0, "no power readings"
    start, end = _edge_gaps(first, last, t0, t1)
    if start > hold_limit_s:
        return start, end, (f"power readings start {start:.1f} s after the window start "
                            f"(more than the {hold_limit_s:g} s an edge may be held)")
    if end > hold_limit_s:
        return start, end, (f"power readings stop {end:.1f} s before the window end "
                            f"(more than the {hold_limit_s:g} s an edge may be held)")
    return start, end, None


def _inside(t: np.ndarray, p: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """F at points ``x`` within [t[0], t[-1]] of a piecewise-linear stretch whose running integral at
    each reading is ``cum`` (the last segment serves x == t[-1], as in one whole-series call)."""
    xc = np.clip(x, t[0], t[-1])
    i = np.clip(np.searchsorted(t, xc, side="right") - 1, 0, max(t.size - 2, 0))
    if t.size == 1:
        return np.zeros(x.shape)
    h = (t[i + 1] - t[i]) / 1e9
    d = (xc - t[i]) / 1e9
    slope = np.divide(p[i + 1] - p[i], h, out=np.zeros_like(h, dtype=np.float64), where=h > 0)
    out: np.ndarray = cum[i] + p[i] * d + 0.5 * slope * d * d
    return out


class RunningIntegral:
    """F(x) = ∫ power from the first reading to x over the piecewise-linear series, held flat beyond
    its ends, at fixed points ``x``, from cleaned readings fed in time order in any number of chunks.

    The running sum is one left-to-right accumulation carried from chunk to chunk (``np.cumsum`` is
    sequential), so every F(x) is the same to the last bit however the series is cut."""

    def __init__(self, x: Any) -> None:
        self.x = np.atleast_1d(np.asarray(x, dtype=np.int64))
        self.out = np.full(self.x.shape, np.nan)
        self._open = np.ones(self.x.shape, dtype=bool)
        self._t = np.empty(0, dtype=np.int64)  # the last (up to) two readings, their power and F
        self._p = np.empty(0)
        self._cum = np.empty(0)
        self.first: tuple[int, float] | None = None

    def feed(self, t: np.ndarray, p: np.ndarray) -> None:
        """Cleaned readings (:func:`clean_readings`), all later than every reading fed before."""
        if t.size == 0:
            return
        if self.first is None:
            self.first = (int(t[0]), float(p[0]))
            te, pe = t, p
            cum = np.concatenate([[0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * (np.diff(t) / 1e9))])
        else:
            te, pe = np.concatenate([self._t[-1:], t]), np.concatenate([self._p[-1:], p])
            trap = 0.5 * (pe[1:] + pe[:-1]) * (np.diff(te) / 1e9)
            cum = np.cumsum(np.concatenate([self._cum[-1:], trap]))
        # points before this stretch's last reading are settled here (x == the last one is left for
        # the next chunk, whose first segment starts there, or for finish(): a whole call does so)
        sel = self._open & (self.x >= te[0]) & (self.x < te[-1])
        if sel.any():
            self.out[sel] = _inside(te, pe, cum, self.x[sel])
            self._open &= ~sel
        self._t, self._p, self._cum = te[-2:], pe[-2:], cum[-2:]

    def finish(self) -> np.ndarray:
        """F at every point (NaN everywhere when no reading was fed)."""
        if self.first is None:
            return self.out
        t0, p0 = self.first
        x = self.x[self._open]
        before = x < t0
        after = x > self._t[-1]
        inside = _inside(self._t, self._p, self._cum, x)  # a single reading: 0 at it, held flat around it
        out = np.where(before, -(t0 - x) / 1e9 * p0, inside)
        self.out[self._open] = np.where(after, self._cum[-1] + (x - self._t[-1]) / 1e9 * self._p[-1], out)
        self._open[:] = False
        return self.out


def _running_integral(t: np.ndarray, p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """F(x) = ∫ power from t[0] to x over the piecewise-linear series, held flat beyond its ends."""
    f = RunningIntegral(x)
    f.feed(t, p)
    return f.finish()


class _Cleaned:
    """Cleans chunk after chunk (:func:`clean_readings`) and keeps the counts, the first/last time, the
    re-lived intervals (given, and found in each chunk's order) and the gaps longer than the gap limit."""

    def __init__(self, relived: Intervals | None = None, gap_limit_s: float | None = None,
                 noted_gap_s: float | None = None) -> None:
        self.quality = {"duplicate_readings_dropped": 0, "same_time_readings_merged": 0,
                        "non_finite_readings_dropped": 0, "clock_steps_back": 0}
        self.n = 0
        self.first: int | None = None
        self.last: int | None = None
        self.gap_limit_s = gap_limit_s
        self.noted_gap_s = noted_gap_s
        given = relived if relived is not None else _NO_INTERVALS
        self._back: list[Intervals] = [(np.asarray(given[0], dtype=np.int64), np.asarray(given[1], dtype=np.int64))]
        self._gaps: list[Intervals] = []
        self._bridged: list[Intervals] = []

    def clean(self, t_ns: Any, value: Any) -> Readings:
        r = clean_readings(t_ns, value)
        for k, v in r.quality.items():
            self.quality[k] += v
        if r.steps_back:
            self._back.append(r.relived)
        if r.t_ns.size:
            if self.last is not None and int(r.t_ns[0]) <= self.last:
                raise ValueError("readings fed out of time order (each chunk must start after the last one)")
            if self.gap_limit_s is not None:
                t = r.t_ns if self.last is None else np.concatenate([[self.last], r.t_ns])
                d = np.diff(t)
                g = np.flatnonzero(d > self.gap_limit_s * 1e9)
                if g.size:
                    self._gaps.append((t[g], t[g + 1]))
                if self.noted_gap_s is not None:
                    n = np.flatnonzero((d > self.noted_gap_s * 1e9) & (d <= self.gap_limit_s * 1e9))
                    if n.size:
                        self._bridged.append((t[n], t[n + 1]))
            self.first = int(r.t_ns[0]) if self.first is None else self.first
            self.last = int(r.t_ns[-1])
            self.n += int(r.t_ns.size)
        return r

    def back(self) -> Intervals:
        """Every re-lived interval, merged."""
        return merge_intervals(np.concatenate([a for a, _ in self._back]), np.concatenate([b for _, b in self._back]))

    def gaps(self) -> Intervals:
        """Every gap longer than the limit (disjoint, in time order: they are consecutive readings)."""
        if not self._gaps:
            return _NO_INTERVALS
        return np.concatenate([a for a, _ in self._gaps]), np.concatenate([b for _, b in self._gaps])

    def faults(self, t0: int, t1: int) -> tuple[dict[str, Any], str | None]:
        """The window's gaps and steps back (``WindowEnergy`` fields) and the reason they make its
        energy unknown (None: there are none in it)."""
        steps = [(a, b) for a, b in self._back if a.size]
        sa = np.concatenate([a for a, _ in steps]) if steps else _NO_INTERVALS[0]
        sb = np.concatenate([b for _, b in steps]) if steps else _NO_INTERVALS[1]
        hit = (sa < t1) & (sb > t0)
        ga, gb = self.gaps()
        in_win = (ga < t1) & (gb > t0)
        gap_s = _clipped_s(ga[in_win], gb[in_win], t0, t1)
        out: dict[str, Any] = {"long_gaps": int(in_win.sum()), "long_gap_s": float(gap_s.sum()),
                               "gap_limit_s": self.gap_limit_s, "clock_steps_back": int(hit.sum()),
                               "clock_stepped_back_s": float(((sb - sa)[hit]).sum() / 1e9)}
        if self._bridged:
            ba = np.concatenate([a for a, _ in self._bridged])
            bb = np.concatenate([b for _, b in self._bridged])
            inb = (ba < t1) & (bb > t0)
            out.update(bridged_gaps=int(inb.sum()), bridged_gap_s=float(_clipped_s(ba[inb], bb[inb], t0, t1).sum()),
                       bridged_gap_max_s=float(((bb - ba)[inb]).max() / 1e9) if inb.any() else 0.0)
        if hit.any():
            k = int(np.flatnonzero(hit)[0])
            return out, (f"the clock went backwards by {(sb[k] - sa[k]) / 1e9:.1f} s at {(sb[k] - t0) / 1e9:.1f} s "
                         f"into the window ({out['clock_steps_back']} step(s) back in it, "
                         f"{out['clock_stepped_back_s']:.1f} s in all): the readings on either side of a step "
                         "back are not on one time line, so the energy over the window is unknown")
        if in_win.any():
            k = int(np.flatnonzero(in_win)[0])
            return out, (f"no power readings for {(gb[k] - ga[k]) / 1e9:.1f} s from {(ga[k] - t0) / 1e9:.1f} s "
                         f"into the window ({out['long_gaps']} gap(s) longer than the {self.gap_limit_s:.3g} s a "
                         f"gap may be bridged, {out['long_gap_s']:.1f} s of the window in all): the energy over "
                         "the window is unknown")
        return out, None

    def bad_windows(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Which sub-windows a re-lived interval or a long gap overlaps."""
        ga, gb = self.gaps()
        return overlapping(*self.back(), a, b) | overlapping(ga, gb, a, b)


class PowerStream:
    """The power integral over ``[t0_ns, t1_ns]`` and, optionally, over sub-windows ``[a_i, b_i]``
    (checked on ``span`` as :func:`windows_energy` does), from readings added in time-ordered chunks
    (a timestamp never split between two chunks). :meth:`energy` equals :func:`window_energy` of all
    the readings at once, and :meth:`sub_energy` :func:`windows_energy`, to the last bit.

    ``period_s``: the series' sampling period, for the gap limit (:func:`gap_limit_s`; None: the hold
    limit); ``relived``: clock intervals re-lived after steps back the caller found in file order."""

    def __init__(self, t0_ns: int, t1_ns: int, *, sub: tuple[Any, Any] | None = None,
                 span: tuple[int, int] | None = None, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
                 period_s: float | None = None, relived: Intervals | None = None) -> None:
        self.t0, self.t1 = int(t0_ns), int(t1_ns)
        if self.t1 < self.t0:
            raise ValueError(f"window ends before it starts ({self.t0} > {self.t1})")
        self.hold_limit_s = hold_limit_s
        a = b = np.empty(0, dtype=np.int64)
        if sub is not None:
            a = np.atleast_1d(np.asarray(sub[0], dtype=np.int64))
            b = np.atleast_1d(np.asarray(sub[1], dtype=np.int64))
        self.a, self.b = a, b
        self.span = span if span is not None else ((int(a.min()), int(b.max())) if a.size else None)
        period = _period(period_s)
        self._clean = _Cleaned(relived, gap_limit_s(period, hold_limit_s),
                               None if period is None else NOTED_GAP_PERIODS * period)
        self._f = RunningIntegral(np.concatenate([[self.t0, self.t1], a, b]))

    def add(self, t_ns: Any, power_w: Any) -> None:
        r = self._clean.clean(t_ns, power_w)
        self._f.feed(r.t_ns, r.value)

    def energy(self) -> WindowEnergy:
        c = self._clean
        window_s = (self.t1 - self.t0) / 1e9
        held_start, held_end, why = _refuse(c.first, c.last, self.t0, self.t1, self.hold_limit_s)
        faults, why_faults = c.faults(self.t0, self.t1)
        why = why or why_faults
        if why is not None:
            return WindowEnergy(None, window_s, held_start, held_end, c.n, why, dict(c.quality), **faults)
        f = self._f.finish()
        return WindowEnergy(float(f[1] - f[0]), window_s, held_start, held_end, c.n, None, dict(c.quality),
                            **faults)

    def sub_energy(self) -> tuple[np.ndarray, str | None]:
        """Each sub-window's energy (NaN where unknown) and why some or all are unknown (None: none is)."""
        if self.a.size == 0 or self.span is None:
            return np.empty(0), None
        _, _, why = _refuse(self._clean.first, self._clean.last, self.span[0], self.span[1], self.hold_limit_s)
        if why is not None:
            return np.full(self.a.shape, np.nan), why
        f = self._f.finish()
        k = self.a.size
        out = f[2 + k:] - f[2:2 + k]
        bad = self._clean.bad_windows(self.a, self.b)
        if bad.any():
            out[bad] = np.nan
            return out, (f"{int(bad.sum())} of {k} sub-window(s) overlap a gap in the power readings longer "
                         f"than {self._clean.gap_limit_s:.3g} s or a step back of the clock: their energy is unknown")
        return out, None


def window_energy(
    t_ns: Any, power_w: Any, t0_ns: int, t1_ns: int, *, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
    period_s: float | None = None, relived: Intervals | None = None,
) -> WindowEnergy:
    """Energy (J) of a power series over ``[t0_ns, t1_ns]`` on the module's rule (``period_s`` and
    ``relived`` as :class:`PowerStream` takes them; steps back in the order given are found too)."""
    s = PowerStream(t0_ns, t1_ns, hold_limit_s=hold_limit_s, period_s=period_s, relived=relived)
    s.add(t_ns, power_w)
    return s.energy()


def windows_energy(
    t_ns: Any, power_w: Any, a_ns: Any, b_ns: Any, *, span: tuple[int, int] | None = None,
    hold_limit_s: float = DEFAULT_HOLD_LIMIT_S, period_s: float | None = None, relived: Intervals | None = None,
) -> tuple[np.ndarray, str | None]:
    """Energy (J) of each sub-window ``[a_i, b_i]`` (e.g. every step) on the same rule, vectorised.

    ``span`` is the enclosing window (the run's); the hold limit is checked on it once, so steps at
    the run's edges are held exactly as the run's own total is, and the steps add up to the run.
    Without ``span`` the sub-windows' overall extent is used. Returns NaN for every sub-window, and
    the reason, when the span is refused; NaN for the sub-windows a long gap or a re-lived interval
    overlaps, and how many, otherwise.
    """
    a = np.atleast_1d(np.asarray(a_ns, dtype=np.int64))
    if a.size == 0:
        return np.empty(0), None
    lo, hi = span if span is not None else (int(a.min()), int(np.max(b_ns)))
    s = PowerStream(lo, max(lo, hi), sub=(a, b_ns), span=(lo, hi), hold_limit_s=hold_limit_s,
                    period_s=period_s, relived=relived)
    s.add(t_ns, power_w)
    return s.sub_energy()


class CounterStream:
    """:func:`counter_window_energy` from readings of an un-wrapped counter added in time-ordered
    chunks (a timestamp never split between two chunks); :meth:`energy` equals the one-call figure.
    ``relived`` as :class:`PowerStream` takes it (a counter's difference across a gap stands)."""

    def __init__(self, t0_ns: int, t1_ns: int, *, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
                 relived: Intervals | None = None) -> None:
        self.t0, self.t1 = int(t0_ns), int(t1_ns)
        self.hold_limit_s = hold_limit_s
        self._clean = _Cleaned(relived)
        self._head: list[tuple[int, float]] = []  # the first two readings
        self._tail: list[tuple[int, float]] = []  # the last two
        self._backwards = False
        self._at: dict[int, float] = {}  # counter value at t0 / t1 where they fall inside the readings

    def add(self, t_ns: Any, counter_j: Any) -> None:
        r = self._clean.clean(t_ns, counter_j)
        if r.t_ns.size == 0:
            return
        t, c = r.t_ns, r.value
        if self._tail:
            t = np.concatenate([[self._tail[-1][0]], t])
            c = np.concatenate([[self._tail[-1][1]], c])
        self._backwards |= bool(np.any(np.diff(c) < 0))
        first = self._head[0][0] if self._head else int(t[0])
        for x in (self.t0, self.t1):
            if x not in self._at and t[0] <= x < t[-1]:
                self._at[x] = float(np.interp((x - first) / 1e9, (t - first) / 1e9, c))
        pts = list(zip(r.t_ns[:2].tolist(), r.value[:2].tolist(), strict=True))
        self._head = (self._head + pts)[:2]
        self._tail = (self._tail + list(zip(r.t_ns[-2:].tolist(), r.value[-2:].tolist(), strict=True)))[-2:]

    def energy(self) -> WindowEnergy:
        cl = self._clean
        window_s = (self.t1 - self.t0) / 1e9
        held_start, held_end, why = _refuse(cl.first, cl.last, self.t0, self.t1, self.hold_limit_s)
        faults, why_faults = cl.faults(self.t0, self.t1)
        why = why or why_faults
        if why is None and cl.n < 2:
            why = "fewer than two energy-counter readings"
        if why is None and self._backwards:
            why = "energy counter goes backwards (un-wrap it first)"
        if why is not None:
            return WindowEnergy(None, window_s, held_start, held_end, cl.n, why, dict(cl.quality), **faults)
        (ta, ca), (tb, cb) = self._head
        (ty, cy), (tz, cz) = self._tail
        first_w = (cb - ca) / max((tb - ta) / 1e9 - 0.0, 1e-12)  # as (t - t[0]) / 1e9 of a whole call
        last_w = (cz - cy) / max((tz - ta) / 1e9 - (ty - ta) / 1e9, 1e-12)

        def at(x: int) -> float:
            if x <= ta:
                return float(ca - (ta - x) / 1e9 * first_w)
            if x >= tz:
                return float(cz + (x - tz) / 1e9 * last_w)
            return self._at[x]

        return WindowEnergy(at(self.t1) - at(self.t0), window_s, held_start, held_end, cl.n, None,
                            dict(cl.quality), **faults)


def counter_window_energy(
    t_ns: Any, energy_counter_j: Any, t0_ns: int, t1_ns: int, *,
    hold_limit_s: float = DEFAULT_HOLD_LIMIT_S, relived: Intervals | None = None,
) -> WindowEnergy:
    """Energy (J) over ``[t0, t1]`` from a cumulative, already un-wrapped energy counter.

    The counter is linear between readings (constant power in each interval); a held edge takes the
    mean power of the interval next to it — the same edge rule as the power integral.
    """
    s = CounterStream(t0_ns, t1_ns, hold_limit_s=hold_limit_s, relived=relived)
    s.add(t_ns, energy_counter_j)
    return s.energy()
