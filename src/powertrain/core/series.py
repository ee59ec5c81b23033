"""Time-series arithmetic shared by the analysis and the importers: a series cleaned of NaNs and put in
time order, clipped to a window with interpolated end points, and its trapezoid integral.

Times are int64 nanoseconds (``t_ns``); values are floats. A function that has too little data
returns ``None``, never 0. :mod:`powertrain.analyze.signal` builds on these (and re-exports the
window integral as its reference definition); the MLPerf importer integrates a run window's power
with them, so an imported run's energy and an analysed one come from the same rule.
"""

from __future__ import annotations

import numpy as np


def clean_series(t_ns: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The series without NaN values, in time order (stable for equal times)."""
    t = np.asarray(t_ns, dtype=np.int64)
    x = np.asarray(v, dtype=np.float64)
    ok = ~np.isnan(x)
    t, x = t[ok], x[ok]
    order = np.argsort(t, kind="stable")
    return t[order], x[order]


def clip_interp(t_ns: np.ndarray, v: np.ndarray, w0: int, w1: int) -> tuple[np.ndarray, np.ndarray]:
    """The series restricted to [w0, w1], with linearly interpolated end points added when the
    series extends past the window (so integrals cover exactly the window where data allow)."""
    t, x = clean_series(t_ns, v)
    if len(t) == 0:
        return t, x
    inside = (t >= w0) & (t <= w1)
    tt = [t[inside]]
    xx = [x[inside]]
    if t[0] < w0 < t[-1] and (len(tt[0]) == 0 or tt[0][0] != w0):
        tt.insert(0, np.array([w0]))
        xx.insert(0, np.array([np.interp(w0, t, x)]))
    if t[0] < w1 < t[-1] and (len(tt[-1]) == 0 or tt[-1][-1] != w1):
        tt.append(np.array([w1]))
        xx.append(np.array([np.interp(w1, t, x)]))
    return np.concatenate(tt), np.concatenate(xx)


def trapezoid_j(t_ns: np.ndarray, power_w: np.ndarray) -> float | None:
    """Energy in joules: the trapezoid integral of power over time (needs two samples)."""
    t, p = clean_series(t_ns, power_w)
    if len(t) < 2:
        return None
    dt = np.diff(t) / 1e9
    return float(np.sum(dt * (p[1:] + p[:-1]) / 2))
