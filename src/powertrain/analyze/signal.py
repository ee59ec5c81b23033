"""Signal arithmetic on one device's time series (numpy): integrals, counter increases, oscillation,
settling time, correlation.

Times are int64 nanoseconds (``t_ns``); values are floats. :class:`OscillationStream` finds the
dominant oscillation of a series too long to hold (Welch segments) in bounded memory. Every function returns ``None`` when
it has too little data, never 0. :mod:`powertrain.analyze.telemetry` computes integrals, counter
increases and ramps at scale (its ramp is the largest ``|Δp| / Δt`` between consecutive in-window
samples); these are the reference definitions and what the per-step energy and the spectra use.
"""

from __future__ import annotations

import numpy as np

from powertrain.core.series import clean_series as _clean
from powertrain.core.series import clip_interp as clip_interp  # re-exported: the reference definitions
from powertrain.core.series import trapezoid_j as trapezoid_j


def counter_delta(t_ns: np.ndarray, counter: np.ndarray) -> float | None:
    """Increase of a cumulative counter over the series (negative steps — resets — are dropped)."""
    t, c = _clean(t_ns, counter)
    if len(t) < 2:
        return None
    d = np.diff(c)
    return float(np.sum(d[d >= 0]))


def resample_uniform(t_ns: np.ndarray, v: np.ndarray, period_s: float | None = None) -> tuple[np.ndarray, float]:
    """The series linearly resampled on a uniform grid (default: its median sample period)."""
    t, x = _clean(t_ns, v)
    if len(t) < 2:
        return np.empty(0), 0.0
    if period_s is None:
        period_s = float(np.median(np.diff(t))) / 1e9
    if period_s <= 0:
        return np.empty(0), 0.0
    grid = np.arange(t[0], t[-1] + 1, round(period_s * 1e9), dtype=np.int64)
    return np.interp(grid, t, x), period_s


def dominant_oscillation(t_ns: np.ndarray, v: np.ndarray, period_s: float | None = None) -> tuple[float, float] | None:
    """(frequency in Hz, amplitude) of the strongest non-DC component of the series.

    The series is resampled uniformly, its mean removed, a Hann window applied, and the largest bin
    of the real FFT taken; the amplitude is corrected for the window's coherent gain, so a pure sine
    ``A·sin(2πft)`` gives ``(f, A)`` (within one frequency bin). ``None`` below 8 samples or for a
    flat signal.
    """
    x, dt = resample_uniform(t_ns, v, period_s)
    n = len(x)
    if n < 8:
        return None
    x = x - x.mean()
    if np.allclose(x, 0):
        return None
    w = np.hanning(n)
    return _spectral_peak(np.abs(np.fft.rfft(x * w)), n, dt, float(w.sum()))


def _spectral_peak(spec: np.ndarray, n: int, dt: float, w_sum: float) -> tuple[float, float] | None:
    """The largest non-DC bin of a magnitude spectrum of ``n`` points ``dt`` apart (Hann sum ``w_sum``),
    refined by parabolic interpolation between bins: (frequency in Hz, amplitude)."""
    spec = spec.copy()
    spec[0] = 0.0
    k = int(np.argmax(spec))
    if k == 0:
        return None
    freqs = np.fft.rfftfreq(n, d=dt)
    # Parabolic interpolation of the peak refines frequency and amplitude between bins.
    if 0 < k < len(spec) - 1:
        a, b, c = spec[k - 1], spec[k], spec[k + 1]
        denom = a - 2 * b + c
        delta = 0.5 * (a - c) / denom if denom != 0 else 0.0
        peak = b - 0.25 * (a - c) * delta
    else:
        delta, peak = 0.0, spec[k]
    freq = (k + delta) / (n * dt)
    amp = 2.0 * peak / w_sum
    return float(min(max(freq, freqs[1]), freqs[-1])), float(amp)


class OscillationStream:
    """:func:`dominant_oscillation` of a series added in time-ordered chunks, in bounded memory.

    Up to ``max_points`` samples it is exactly :func:`dominant_oscillation` of the whole series. A
    longer series is resampled on a uniform grid (``period_s``, else the median interval of its
    first ``max_points`` samples) and cut into Hann segments of ``max_points`` grid points that
    overlap by half (Welch's method); the peak is taken from their mean magnitude spectrum, so the
    frequency bin is 1 / (``max_points`` · period) — 1/6554 Hz at 20 Hz — and memory is a few
    segments, however long the series."""

    def __init__(self, period_s: float | None = None, max_points: int = 1 << 17) -> None:
        self.period_s = period_s
        self.L = max_points
        self._t: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self._n = 0
        self._grid0: int | None = None  # the uniform grid's first time (Welch mode)
        self._step = 0  # grid period, ns
        self._seg = 0  # next segment's index
        self._sum: np.ndarray | None = None
        self._segments = 0
        self._flat = True

    def add(self, t_ns: np.ndarray, v: np.ndarray) -> None:
        t, x = _clean(t_ns, v)
        if t.size == 0:
            return
        self._t.append(t)
        self._v.append(x)
        self._n += t.size
        if self._grid0 is None and self._n > self.L:
            self._start_welch()
        if self._grid0 is not None:
            self._segments_ready()

    def _start_welch(self) -> None:
        t = np.concatenate(self._t)
        if self.period_s is None:
            self.period_s = float(np.median(np.diff(t[: self.L]))) / 1e9
        self._step = max(round(self.period_s * 1e9), 1)
        self._grid0 = int(t[0])

    def _segments_ready(self) -> None:
        """Transform every segment whose grid the buffered samples reach past; drop what no later one needs."""
        assert self._grid0 is not None
        t, x = np.concatenate(self._t), np.concatenate(self._v)
        half = self.L // 2
        while True:
            g0 = self._grid0 + self._seg * half * self._step
            grid = g0 + np.arange(self.L, dtype=np.int64) * self._step
            if t[-1] < grid[-1]:
                break
            self._transform(np.interp(grid, t, x))
            self._seg += 1
        keep = max(int(np.searchsorted(t, self._grid0 + self._seg * half * self._step, side="right")) - 1, 0)
        self._t, self._v = [t[keep:]], [x[keep:]]

    def _transform(self, x: np.ndarray) -> None:
        x = x - x.mean()
        self._flat &= bool(np.allclose(x, 0))
        spec = np.abs(np.fft.rfft(x * np.hanning(self.L)))
        self._sum = spec if self._sum is None else self._sum + spec
        self._segments += 1

    def result(self) -> tuple[float, float] | None:
        if self._grid0 is None:
            if not self._t:
                return None
            return dominant_oscillation(np.concatenate(self._t), np.concatenate(self._v), self.period_s)
        if self._sum is None or self._flat:
            return None
        return _spectral_peak(self._sum / self._segments, self.L, self._step / 1e9, float(np.hanning(self.L).sum()))


def time_to_steady(t_s: np.ndarray, v: np.ndarray, band: float = 1.0, tail: float = 0.1) -> float | None:
    """Seconds from the first sample until the series enters, and stays within, ``±band`` of its final
    level (the mean of the last ``tail`` share of the samples). ``None`` below 10 samples or when the
    series does not settle (its last sample is outside the band)."""
    t = np.asarray(t_s, dtype=np.float64)
    x = np.asarray(v, dtype=np.float64)
    ok = ~np.isnan(x)
    t, x = t[ok], x[ok]
    if len(t) < 10:
        return None
    final = float(np.mean(x[-max(1, int(len(x) * tail)):]))
    out = np.abs(x - final) > band
    if out[-1]:
        return None
    if not out.any():
        return 0.0
    last_out = int(np.flatnonzero(out)[-1])
    return float(t[last_out + 1] - t[0])


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson correlation of two equally long samples; ``None`` below 3 points or without variance."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    ok = ~(np.isnan(a) | np.isnan(b))
    a, b = a[ok], b[ok]
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])
