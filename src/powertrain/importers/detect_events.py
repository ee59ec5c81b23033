"""Events found in a power timeline: training start and end, and the dips in between.

Training on many GPUs draws a steady high power; what interrupts it shows up as a drop of the
*summed* power of a host: a checkpoint save (the other ranks wait), a stalled or stopped process
(the others spin in a collective), the end of training or a killed job (power falls to idle and
stays there). This module finds those intervals in imported telemetry when the source has no step
log, so the report's timeline can show them.

Rule (per host, on the sum of its devices' power, averaged into bins of the sampling period and
smoothed with a 1 s running median):

* ``idle`` = 5th percentile, ``busy`` = median of the samples above the midpoint of idle and max;
  no events when ``busy < 1.5 × idle`` (the run never got busy);
* *active* = above ``idle + 0.5 × (busy - idle)``;
* ``activity_start`` / ``activity_end`` = the first rise / the last fall (the fall is reported only
  when at least ``min_tail_s`` of samples follow it: otherwise the log just stopped);
* a *dip* = an inactive stretch of at least ``min_dip_s`` between two active ones. Dips that recur
  at a regular interval (three or more, spacing within 25 % of its median) are labelled
  ``checkpoint``; the others stay ``phase``/``power_dip`` (a stall, a slow checkpoint, an eval …).
  A dip during which one device is nearly idle while the others stay busy (utilisation) names that
  device in ``attrs.waiting_on``: the others were waiting for its process.

Detected events are written as event rows on the pseudo-rank :data:`DETECTED_RANK` (-1: no training
rank logged them) and listed in ``run.json["detected_events"]``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DETECTED_RANK = -1


def _runs(mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """``(start, end_exclusive, value)`` of the runs of equal values in a boolean array."""
    if mask.size == 0:
        return []
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [mask.size]])
    return [(int(s), int(e), bool(mask[s])) for s, e in zip(starts, ends, strict=True)]


def _running_median(x: np.ndarray, width: int) -> np.ndarray:
    if width <= 1 or x.size < width:
        return x
    pad = width // 2
    xp = np.pad(x, pad, mode="edge")
    win = np.lib.stride_tricks.sliding_window_view(xp, width)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-gap window stays NaN, on purpose
        return np.nanmedian(win, axis=1)[: x.size]


def host_series(tel: pa.Table, host: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], float] | None:
    """Binned summed power of one host: ``(t_ns bin starts, total_w, util per device, period_s)``."""
    sub = tel.filter(pc.and_(pc.equal(tel.column("host"), host), pc.is_valid(tel.column("power_w"))))
    if sub.num_rows < 10:
        return None
    t = sub.column("t_ns").to_numpy()
    p = sub.column("power_w").to_numpy()
    dev = np.asarray(sub.column("device").to_pylist())
    names = sorted(set(dev.tolist()))
    first_dev = t[dev == names[0]]
    period = float(np.median(np.diff(np.sort(first_dev)))) if first_dev.size > 1 else 1e8
    period = max(period, 1e6)
    t0 = int(t.min())
    b = ((t - t0) // period).astype(np.int64)
    nb = int(b.max()) + 1
    total = np.zeros(nb)
    have = np.zeros(nb, dtype=bool)
    util_cols: dict[str, np.ndarray] = {}
    u_all = sub.column("util_pct").to_numpy(zero_copy_only=False).astype(np.float64)
    for name in names:
        m = dev == name
        s = np.bincount(b[m], weights=p[m], minlength=nb)
        c = np.bincount(b[m], minlength=nb)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = s / c
        # a device missing from a bin takes its previous value (nvidia-smi rows drift across bins)
        idx = np.where(c > 0, np.arange(nb), 0)
        np.maximum.accumulate(idx, out=idx)
        filled = mean[idx]
        filled[: np.argmax(c > 0)] = np.nan
        total += np.nan_to_num(filled)
        have |= c > 0
        um = ~np.isnan(u_all[m])
        if um.any():
            su = np.bincount(b[m][um], weights=u_all[m][um], minlength=nb)
            cu = np.bincount(b[m][um], minlength=nb)
            with np.errstate(invalid="ignore", divide="ignore"):
                util_cols[name] = su / cu
    total[~have] = np.nan
    return t0 + np.arange(nb, dtype=np.int64) * int(period), total, util_cols, period / 1e9


def detect_power_events(
    tel: pa.Table, min_dip_s: float = 2.0, min_tail_s: float = 5.0
) -> list[dict[str, Any]]:
    """Detected events of every host (see module doc), as dicts ready for ``events_table``."""
    out: list[dict[str, Any]] = []
    for host in sorted(set(tel.column("host").to_pylist())):
        s = host_series(tel, host)
        if s is None:
            continue
        tb, total, util, period_s = s
        ok = ~np.isnan(total)
        if ok.sum() < 10:
            continue
        smooth = _running_median(np.where(ok, total, np.nan), max(1, round(1.0 / period_s)))
        idle = float(np.nanpercentile(smooth, 5))
        peak = float(np.nanmax(smooth))
        hi = smooth[smooth > 0.5 * (idle + peak)]
        busy = float(np.nanmedian(hi)) if hi.size else peak
        if busy < 1.5 * idle or busy <= 0:
            continue
        thr = idle + 0.5 * (busy - idle)
        # a logging gap (no sample) is not a dip: carry the last value across it
        idx = np.where(np.isnan(smooth), 0, np.arange(smooth.size))
        np.maximum.accumulate(idx, out=idx)
        active = np.nan_to_num(smooth[idx], nan=0.0) > thr
        runs = _runs(active)
        act = [r for r in runs if r[2]]
        if not act:
            continue
        n_dev = len(util) or None

        ev = functools.partial(_event, tb, total, host, busy, idle)

        first, last = act[0], act[-1]
        out.append(ev("phase", "activity_start", max(first[0] - 1, 0), first[0] + 1))
        tail = tb.size - last[1]
        if tail * period_s >= min_tail_s:
            out.append(ev("phase", "activity_end", last[1] - 1, min(last[1] + 1, tb.size - 1),
                          after_power_w=float(np.nanmedian(total[last[1]:])),
                          note="power fell to idle and stayed there: training ended or the job was killed"))
        dips = [r for r in runs if not r[2] and r[0] > first[0] and r[1] < last[1]
                and (r[1] - r[0]) * period_s >= min_dip_s]
        labels = _periodic([tb[r[0]] for r in dips], [r[1] - r[0] for r in dips])
        for (i0, i1, _), periodic in zip(dips, labels, strict=True):
            attrs: dict[str, Any] = {"duration_s": (i1 - i0) * period_s}
            if n_dev and n_dev > 1:
                means = {d: float(np.nanmean(u[i0:i1])) for d, u in util.items() if np.isfinite(u[i0:i1]).any()}
                if means:
                    low = min(means, key=lambda d: means[d])
                    others = [v for d, v in means.items() if d != low]
                    if others and means[low] < 20 and min(others) > 60:
                        attrs["waiting_on"] = low
            if periodic:
                out.append(ev("checkpoint", "checkpoint_dip", i0, i1, **attrs,
                              note="recurring power dip at a regular interval: periodic checkpoint save (likely)"))
            else:
                out.append(ev("phase", "power_dip", i0, i1, **attrs,
                              note="summed power fell to idle and recovered: stall, checkpoint or eval"))
    return out


def _event(tb: np.ndarray, total: np.ndarray, host: str, busy: float, idle: float,
           kind: str, name: str, i0: int, i1: int, **attrs: Any) -> dict[str, Any]:
    seg = total[i0:i1]
    mean = float(np.nanmean(seg)) if np.isfinite(seg).any() else None
    return {"rank": DETECTED_RANK, "kind": kind, "name": name, "t_start_ns": int(tb[i0]),
            "t_end_ns": int(tb[min(i1, tb.size - 1)]),
            "attrs": {"host": host, "detector": "power_dip/1", "mean_power_w": mean,
                      "busy_power_w": busy, "idle_power_w": idle, **attrs}}


def _periodic(starts: list[int], lengths: list[int]) -> list[bool]:
    """Which dips recur: a regular series of starts, or ≥3 dips of the same length (within 25 %).

    Checkpoints every N *steps* are regular in time only while the step time is steady; their
    length (the save) is the steadier signature, so either rule marks a dip as recurring.
    """
    if len(starts) < 3:
        return [False] * len(starts)
    s = np.asarray(starts, dtype=np.float64)
    gaps = np.diff(s)
    med = float(np.median(gaps))
    near = np.abs(gaps - med) <= 0.25 * med
    out = [False] * len(starts)
    for i, good in enumerate(near):
        if good:
            out[i] = out[i + 1] = True
    if sum(out) < 3:
        out = [False] * len(starts)
    ln = np.asarray(lengths, dtype=np.float64)
    for i, x in enumerate(ln):
        if np.sum(np.abs(ln - x) <= 0.25 * x) >= 3:
            out[i] = True
    return out


def summarize(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``run.json["detected_events"]`` list: one flat entry per event (times in ns and s)."""
    if not events:
        return []
    t0 = min(e["t_start_ns"] for e in events)
    return [{"kind": e["kind"], "name": e["name"], "t_start_ns": e["t_start_ns"], "t_end_ns": e["t_end_ns"],
             "t_start_rel_s": (e["t_start_ns"] - t0) / 1e9, "duration_s": (e["t_end_ns"] - e["t_start_ns"]) / 1e9,
             **e["attrs"]} for e in events]
