"""Energy from a power time series: the integral of power over time, on one documented rule.

The rule (used for every imported energy figure): power is taken as **linear between samples**
(trapezoid rule), and the integral over a window ``[a, b]`` is ``F(b) - F(a)`` where ``F`` is the
running integral of that piecewise-linear power. A window edge that falls between two samples is
interpolated, so back-to-back windows add up exactly to the window that spans them. The part of a
window outside the sampled range is **not** extrapolated: it counts as zero energy and the
``covered_s`` returned with it says how much of the window the samples actually covered.

``powertrain.analyze`` owns energy metrics of runs; this helper exists so an importer can check its
output against a figure stated in the source (e.g. an MLPerf submitter's total) at import time.
"""

from __future__ import annotations

import numpy as np


def cumulative_energy_j(t_ns: np.ndarray, power_w: np.ndarray) -> np.ndarray:
    """Running trapezoid integral (J) of ``power_w`` at each sample time (0 at the first sample).

    ``t_ns`` must be sorted; NaN power samples are dropped first (unknown is not zero).
    """
    t = np.asarray(t_ns, dtype=np.int64)
    p = np.asarray(power_w, dtype=np.float64)
    dt_s = np.diff(t) / 1e9
    return np.concatenate([[0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * dt_s)])


def energy_between_j(
    t_ns: np.ndarray, power_w: np.ndarray, a_ns: np.ndarray | int, b_ns: np.ndarray | int
) -> tuple[np.ndarray, np.ndarray]:
    """Energy (J) in each window ``[a, b]`` and the seconds of it the samples cover (vectorised).

    Args:
        t_ns: sample times (ns, any order; sorted here).
        power_w: power at those times (W); NaN samples are ignored.
        a_ns, b_ns: window starts and ends (ns), scalars or arrays of equal length.
    """
    t = np.asarray(t_ns, dtype=np.int64)
    p = np.asarray(power_w, dtype=np.float64)
    keep = ~np.isnan(p)
    t, p = t[keep], p[keep]
    order = np.argsort(t, kind="stable")
    t, p = t[order], p[order]
    a = np.atleast_1d(np.asarray(a_ns, dtype=np.int64))
    b = np.atleast_1d(np.asarray(b_ns, dtype=np.int64))
    if t.size < 2:
        return np.full(a.shape, np.nan), np.zeros(a.shape)
    cum = cumulative_energy_j(t, p)
    lo, hi = t[0], t[-1]
    ac = np.clip(a, lo, hi)
    bc = np.clip(b, lo, hi)
    energy = _running(t, p, cum, bc) - _running(t, p, cum, ac)
    covered = np.maximum(bc - ac, 0) / 1e9
    return energy, covered


def _running(t: np.ndarray, p: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """F(x): the running integral evaluated between samples (x already clipped to [t0, tN])."""
    i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, t.size - 2)
    h = (t[i + 1] - t[i]) / 1e9
    d = (x - t[i]) / 1e9
    slope = np.divide(p[i + 1] - p[i], h, out=np.zeros_like(h, dtype=np.float64), where=h > 0)
    return cum[i] + p[i] * d + 0.5 * slope * d * d


def total_energy_j(t_ns: np.ndarray, power_w: np.ndarray, a_ns: int, b_ns: int) -> tuple[float, float]:
    """Energy (J) of one series in one window, and the seconds covered (see module doc)."""
    e, c = energy_between_j(t_ns, power_w, a_ns, b_ns)
    return float(e[0]), float(c[0])
