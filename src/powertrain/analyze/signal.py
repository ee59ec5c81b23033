"""Signal arithmetic on one device's time series (numpy): integrals, counter increases, oscillation,
settling time, correlation.

Times are int64 nanoseconds (``t_ns``); values are floats. Every function returns ``None`` when
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
    spec = np.abs(np.fft.rfft(x * w))
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
    amp = 2.0 * peak / w.sum()
    return float(min(max(freq, freqs[1]), freqs[-1])), float(amp)


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
