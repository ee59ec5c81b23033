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
    """Cleans chunk after chunk (:func:`clean_readings`) and keeps the counts and the first/last time."""

    def __init__(self) -> None:
        self.quality = {"duplicate_readings_dropped": 0, "same_time_readings_merged": 0,
                        "non_finite_readings_dropped": 0}
        self.n = 0
        self.first: int | None = None
        self.last: int | None = None

    def clean(self, t_ns: Any, value: Any) -> Readings:
        r = clean_readings(t_ns, value)
        for k, v in r.quality.items():
            self.quality[k] += v
        if r.t_ns.size:
            if self.last is not None and int(r.t_ns[0]) <= self.last:
                raise ValueError("readings fed out of time order (each chunk must start after the last one)")
            self.first = int(r.t_ns[0]) if self.first is None else self.first
            self.last = int(r.t_ns[-1])
            self.n += int(r.t_ns.size)
        return r


class PowerStream:
    """The power integral over ``[t0_ns, t1_ns]`` and, optionally, over sub-windows ``[a_i, b_i]``
    (checked on ``span`` as :func:`windows_energy` does), from readings added in time-ordered chunks
    (a timestamp never split between two chunks). :meth:`energy` equals :func:`window_energy` of all
    the readings at once, and :meth:`sub_energy` :func:`windows_energy`, to the last bit."""

    def __init__(self, t0_ns: int, t1_ns: int, *, sub: tuple[Any, Any] | None = None,
                 span: tuple[int, int] | None = None, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S) -> None:
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
        self._clean = _Cleaned()
        self._f = RunningIntegral(np.concatenate([[self.t0, self.t1], a, b]))

    def add(self, t_ns: Any, power_w: Any) -> None:
        r = self._clean.clean(t_ns, power_w)
        self._f.feed(r.t_ns, r.value)

    def energy(self) -> WindowEnergy:
        c = self._clean
        window_s = (self.t1 - self.t0) / 1e9
        held_start, held_end, why = _refuse(c.first, c.last, self.t0, self.t1, self.hold_limit_s)
        if why is not None:
            return WindowEnergy(None, window_s, held_start, held_end, c.n, why, dict(c.quality))
        f = self._f.finish()
        return WindowEnergy(float(f[1] - f[0]), window_s, held_start, held_end, c.n, None, dict(c.quality))

    def sub_energy(self) -> tuple[np.ndarray, str | None]:
        if self.a.size == 0 or self.span is None:
            return np.empty(0), None
        _, _, why = _refuse(self._clean.first, self._clean.last, self.span[0], self.span[1], self.hold_limit_s)
        if why is not None:
            return np.full(self.a.shape, np.nan), why
        f = self._f.finish()
        k = self.a.size
        return f[2 + k:] - f[2:2 + k], None


def window_energy(
    t_ns: Any, power_w: Any, t0_ns: int, t1_ns: int, *, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S
) -> WindowEnergy:
    """Energy (J) of a power series over ``[t0_ns, t1_ns]`` on the module's rule."""
    s = PowerStream(t0_ns, t1_ns, hold_limit_s=hold_limit_s)
    s.add(t_ns, power_w)
    return s.energy()


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
    a = np.atleast_1d(np.asarray(a_ns, dtype=np.int64))
    if a.size == 0:
        return np.empty(0), None
    lo, hi = span if span is not None else (int(a.min()), int(np.max(b_ns)))
    s = PowerStream(lo, max(lo, hi), sub=(a, b_ns), span=(lo, hi), hold_limit_s=hold_limit_s)
    s.add(t_ns, power_w)
    return s.sub_energy()


class CounterStream:
    """:func:`counter_window_energy` from readings of an un-wrapped counter added in time-ordered
    chunks (a timestamp never split between two chunks); :meth:`energy` equals the one-call figure."""

    def __init__(self, t0_ns: int, t1_ns: int, *, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S) -> None:
        self.t0, self.t1 = int(t0_ns), int(t1_ns)
        self.hold_limit_s = hold_limit_s
        self._clean = _Cleaned()
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
        if why is None and cl.n < 2:
            why = "fewer than two energy-counter readings"
        if why is None and self._backwards:
            why = "energy counter goes backwards (un-wrap it first)"
        if why is not None:
            return WindowEnergy(None, window_s, held_start, held_end, cl.n, why, dict(cl.quality))
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
                            dict(cl.quality))


def counter_window_energy(
    t_ns: Any, energy_counter_j: Any, t0_ns: int, t1_ns: int, *,
    hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
) -> WindowEnergy:
    """Energy (J) over ``[t0, t1]`` from a cumulative, already un-wrapped energy counter.

    The counter is linear between readings (constant power in each interval); a held edge takes the
    mean power of the interval next to it — the same edge rule as the power integral.
    """
    s = CounterStream(t0_ns, t1_ns, hold_limit_s=hold_limit_s)
    s.add(t_ns, energy_counter_j)
    return s.energy()
