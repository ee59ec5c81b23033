"""The per-device pass over a run's telemetry, streamed in time chunks with each device's state carried.

:func:`powertrain.analyze.telemetry.device_stats` needs, per device, figures that follow the samples
in time order: the energy integral (:mod:`powertrain.core.energy`), the energy counter, counter
increases, the steepest ramp, gaps, the time to thermal steady state and the power quantiles. This
module reads the telemetry a time chunk at a time (all devices of about ``PASS_CHUNK_ROWS`` rows,
whole seconds, ordered by device then time as the readers order rows) and keeps per device only
what the next chunk needs: its last row, running sums, the energy streams' edge state, one mean per
second of temperature and the tails of its power distribution, and — for the devices asked — the stream of its
power spectrum (:class:`powertrain.analyze.signal.OscillationStream`). Memory is bounded by one
chunk, not by the run's length (what still grows, by design small, is per device one temperature
mean per second — 16 bytes —, the two 1 % power tails — 16 bytes per 100 samples — and one offset
per measured step, 8 bytes).

Power readings the sampler marked as repeats of the driver's last value (``power_repeat`` True) are
not samples: the quantiles, the spectrum, the steepest ramp and the sample intervals skip them
(:class:`_Samples`); the energy integral takes every reading (a held value is the sensor's output
while it is held). Where the column is absent or null every reading is a sample, as before it existed.

Every sum is added in time order, carried from chunk to chunk (``np.cumsum`` is sequential), so the
figures are those of one whole-series pass to the last bit, whatever the chunk size.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from powertrain.analyze.signal import OscillationStream, time_to_steady
from powertrain.core.energy import CounterStream, Intervals, PowerStream, overlapping

PASS_CHUNK_ROWS = 1 << 17  # rows (all devices) per query of the pass
GAP_FACTOR = 2.5
INTEGRATED = ("power_w",)
REPEAT = "power_repeat"  # True on a power reading that repeats the driver's last value (telemetry.REPEAT)
QUANTILES = (("p99", 0.99), ("p01", 0.01))  # of power_w in the window, per device


def quantile_positions(n: int, q: float) -> tuple[int, int, float]:
    """The order statistics (0-based, ascending) that the ``q`` quantile of ``n`` values interpolates
    between, and the weight of the upper one: the linear method, position (n − 1)·q."""
    rn = (n - 1) * q
    lo = math.floor(rn)
    return lo, math.ceil(rn), rn - lo


def lerp(a: float, b: float, d: float) -> float:
    """Linear interpolation between order statistics ``a`` ≤ ``b`` at weight ``d``, from the nearer end
    (as numpy's quantile does, so ``d`` near 1 stays exact at ``b``)."""
    return float(b - (b - a) * (1 - d)) if d >= 0.5 else float(a + (b - a) * d)


def _seq(carry: float, w: np.ndarray) -> float:
    """``carry`` plus the values of ``w`` added one after the other (as one whole-series sum would)."""
    return carry if w.size == 0 else float(np.cumsum(np.concatenate([[carry], w]))[-1])


@dataclass
class _Tail:
    """The ``keep`` largest (or smallest) values seen so far."""

    keep: int
    largest: bool
    values: np.ndarray = field(default_factory=lambda: np.empty(0))

    def add(self, v: np.ndarray) -> None:
        if self.keep <= 0 or v.size == 0:
            return
        x = np.concatenate([self.values, v])
        if x.size > self.keep:
            x = np.partition(x, x.size - self.keep)[x.size - self.keep:] if self.largest else \
                np.partition(x, self.keep - 1)[:self.keep]
        self.values = x


@dataclass
class _Quantile:
    """An exact quantile of ``n`` values streamed in any order: only the tail it falls in is kept."""

    n: int
    q: float
    tail: _Tail = field(init=False)

    def __post_init__(self) -> None:
        lo, hi, _ = quantile_positions(self.n, self.q) if self.n else (0, 0, 0.0)
        upper = self.q >= 0.5
        self.tail = _Tail(self.n - lo if upper else hi + 1, upper)

    def value(self) -> float | None:
        v = np.sort(self.tail.values)
        if self.n == 0 or v.size != self.tail.keep:
            return None
        lo, hi, d = quantile_positions(self.n, self.q)
        off = self.n - v.size if self.tail.largest else 0  # v[i] is order statistic i + off
        return lerp(float(v[lo - off]), float(v[hi - off]), d)


@dataclass
class Plan:
    """What the pass computes: the window, the fields, each device's nominal period and in-window
    power count (for its quantiles), the sub-windows and the energy hold limit."""

    w0: int
    w1: int
    seg_fields: list[str]
    energy_fields: list[str]
    periods: dict[tuple[str, str], float | None]
    power_n: dict[tuple[str, str], int]
    sub_windows: tuple[np.ndarray, np.ndarray] | None
    hold_limit_s: float
    steady_field: str | None
    spectra: set[tuple[str, str]] = field(default_factory=set)  # devices whose power spectrum is wanted
    # per device: clock intervals re-lived after its clock stepped back (core.energy rule 5), and the
    # median interval of its readings (the period of its gap limit, rule 4)
    relived: dict[tuple[str, str], Intervals] = field(default_factory=dict)
    gap_periods: dict[tuple[str, str], float | None] = field(default_factory=dict)
    # the measured steps' starts, sorted: per device, the offset of its first power sample after each
    # (analyze.coverage: at which phase of the steps the samples land)
    step_starts: np.ndarray | None = None


@dataclass
class _Samples:
    """One device's power samples (its rows not marked as repeats, :data:`REPEAT`), in time order and
    carried from chunk to chunk: the steepest ramp between consecutive ones inside the window, the
    intervals between consecutive in-window samples with a reading (their median: the field's update
    period where the sampler marks repeats), and per measured step the offset of the first sample with
    a reading at or after its start (``Plan.step_starts``; one integer per step)."""

    plan: Plan
    last: tuple[int, float] | None = None  # the previous row of the samples (its power may be unknown)
    last_in: int | None = None  # time of the previous in-window sample with a reading
    intervals_us: Counter[int] = field(default_factory=Counter)  # interval (µs, rounded) -> how often
    next_step: int = 0  # first step whose sample is not found yet
    phases: list[np.ndarray] = field(default_factory=list)

    def add(self, ts: np.ndarray, p: np.ndarray, ramp: float) -> float:
        """The next samples (times after every sample added before); returns the steepest ramp so far."""
        w0, w1 = self.plan.w0, self.plan.w1
        t, v = ts, p
        if self.last is not None:
            t, v = np.concatenate([[self.last[0]], ts]), np.concatenate([[self.last[1]], p])
        if ts.size:
            self.last = (int(ts[-1]), float(p[-1]))
        if t.size >= 2:
            t0, t1, v0, v1 = t[:-1], t[1:], v[:-1], v[1:]
            sel = (t1 > t0) & (t0 >= w0) & (t1 <= w1) & ~np.isnan(v0) & ~np.isnan(v1)
            if sel.any():
                dt = (t1 - t0).astype(np.float64)
                ramp = max(ramp, float((np.abs(v1 - v0) / (np.where(dt > 0, dt, 1.0) / 1e9))[sel].max()))
        read = ts[~np.isnan(p)]
        inside = read[(read >= w0) & (read <= w1)]
        if inside.size:
            d = np.diff(inside if self.last_in is None else np.concatenate([[self.last_in], inside]))
            vals, counts = np.unique(np.rint(d[d > 0] / 1e3).astype(np.int64), return_counts=True)
            self.intervals_us.update(dict(zip(vals.tolist(), counts.tolist(), strict=True)))
            self.last_in = int(inside[-1])
        self._phases(read)
        return ramp

    def _phases(self, read: np.ndarray) -> None:
        starts = self.plan.step_starts
        if starts is None or self.next_step >= starts.size or not read.size:
            return
        todo = starts[self.next_step:]
        idx = np.searchsorted(read, todo, side="left")
        found = int(np.count_nonzero(idx < read.size))  # a prefix: the starts are sorted
        if found:
            self.phases.append(read[idx[:found]] - todo[:found])
            self.next_step += found

    def median_interval_s(self) -> float | None:
        """The median interval between consecutive in-window samples, to the µs (None: fewer than two)."""
        total = sum(self.intervals_us.values())
        seen = 0
        for us in sorted(self.intervals_us):
            seen += self.intervals_us[us]
            if 2 * seen >= total:
                return us / 1e6
        return None

    def step_phases(self) -> np.ndarray | None:
        if self.plan.step_starts is None:
            return None
        return np.concatenate(self.phases) if self.phases else np.zeros(0, dtype=np.int64)


class _Device:
    """One device's running state; :meth:`result` gives its row of ``device_stats``."""

    def __init__(self, key: tuple[str, str], plan: Plan) -> None:
        self.key, self.plan = key, plan
        self.rows = 0
        self.last_t: int | None = None
        self.last_v: dict[str, float] = {}
        self.cov, self.ncov = 0.0, 0
        self.maxint = -np.inf
        self.gaps, self.gap_s, self.ngap = 0, 0.0, 0
        self.ramp: dict[str, float] = {f: -np.inf for f in plan.seg_fields if f in INTEGRATED}
        self.sample = _Samples(plan) if "power_w" in plan.seg_fields else None
        self.delta: dict[str, list[Any]] = {f: [0.0, 0, 0.0, 0] for f in plan.seg_fields if f not in INTEGRATED}
        self.steady: list[tuple[np.ndarray, np.ndarray]] = []
        self.relived = plan.relived.get(key)
        self.power = (PowerStream(plan.w0, plan.w1, sub=plan.sub_windows, span=(plan.w0, plan.w1),
                                  hold_limit_s=plan.hold_limit_s, period_s=plan.gap_periods.get(key),
                                  relived=self.relived) if "power_w" in plan.energy_fields else None)
        self.counter: CounterStream | None = None
        self.unwrap_last: float | None = None
        self.unwrap_offset = 0.0
        n = plan.power_n.get(key, 0)
        self.quantiles = {name: _Quantile(n, q) for name, q in QUANTILES} if "power_w" in plan.seg_fields else {}
        self.osc = OscillationStream() if key in plan.spectra else None

    def add(self, ts: np.ndarray, cols: dict[str, np.ndarray]) -> None:
        """The device's next rows (time order, later than every row added before)."""
        self.rows += ts.size
        self._segments(ts, cols)
        if self.plan.steady_field is not None:
            self._steady(ts, cols[self.plan.steady_field])
        self._energy(ts, cols)
        if self.sample is not None:
            # a reading marked as a repeat of the driver's last value is not a sample: quantiles, the
            # spectrum, the ramp and the intervals see the others (fresh, or not marked either way)
            fresh = cols[REPEAT] != 1.0 if REPEAT in cols else np.ones(ts.size, dtype=bool)
            ts_f, p = ts[fresh], cols["power_w"][fresh]
            self.ramp["power_w"] = self.sample.add(ts_f, p, self.ramp["power_w"])
            sel = (ts_f >= self.plan.w0) & (ts_f <= self.plan.w1) & ~np.isnan(p)
            for qt in self.quantiles.values():
                qt.tail.add(p[sel])
            if self.osc is not None:
                self.osc.add(ts_f[sel], p[sel])
        self.last_t = int(ts[-1])
        self.last_v = {f: float(cols[f][-1]) for f in self.plan.seg_fields}

    def _segments(self, ts: np.ndarray, cols: dict[str, np.ndarray]) -> None:
        """Segments between consecutive samples (the first one from the previous chunk's last row),
        clipped to the window: coverage, gaps, longest interval, counter increases, steepest ramps."""
        p = self.plan
        if self.last_t is not None:
            ts = np.concatenate([[self.last_t], ts])
        if ts.size < 2:
            return
        t0, t1 = ts[:-1], ts[1:]
        dt = (t1 - t0).astype(np.float64)
        valid = (t1 > t0) & (t1 > p.w0) & (t0 < p.w1)
        a, b = np.maximum(t0, p.w0), np.minimum(t1, p.w1)
        clip = np.where(valid, (b - a).astype(np.float64), 0.0)
        inside = valid & (t0 >= p.w0) & (t1 <= p.w1)
        period = p.periods.get(self.key) or np.nan
        with np.errstate(invalid="ignore"):
            gap = inside & (dt > GAP_FACTOR * period)
        self.cov, self.ncov = _seq(self.cov, clip[valid]), self.ncov + int(valid.sum())
        if inside.any():
            self.maxint = max(self.maxint, float(dt[inside].max()))
        self.gaps += int(gap.sum())
        self.gap_s, self.ngap = _seq(self.gap_s, dt[gap]), self.ngap + int(gap.sum())
        safe_dt = np.where(dt > 0, dt, 1.0)
        for f in p.seg_fields:
            v = cols[f] if self.last_t is None else np.concatenate([[self.last_v[f]], cols[f]])
            v0, v1 = v[:-1], v[1:]
            ok = valid & ~np.isnan(v0) & ~np.isnan(v1)
            if f in INTEGRATED:  # its integral is core.energy's, its ramp is between samples (_Samples)
                continue
            d = v1 - v0
            okc = ok & (d >= 0)  # a negative step is a counter reset: it contributes nothing
            acc = self.delta[f]
            acc[0], acc[1] = _seq(acc[0], (d * clip / safe_dt)[okc]), acc[1] + int(okc.sum())
            acc[2], acc[3] = _seq(acc[2], (clip / 1e9)[ok]), acc[3] + int(ok.sum())

    def _steady(self, ts: np.ndarray, v: np.ndarray) -> None:
        """1 s means (chunks hold whole seconds, so no second is split between two of them)."""
        ok = ~np.isnan(v)
        if ok.any():
            sec = ts[ok] // 1_000_000_000
            uniq, inv = np.unique(sec, return_inverse=True)
            self.steady.append((uniq, np.bincount(inv, weights=v[ok]) / np.bincount(inv)))

    def _energy(self, ts: np.ndarray, cols: dict[str, np.ndarray]) -> None:
        if self.power is not None:
            pw = cols["power_w"]
            ok = ~np.isnan(pw)
            self.power.add(ts[ok], pw[ok])
        if "energy_j" in cols:
            c = cols["energy_j"]
            ok = ~np.isnan(c)
            if ok.any():  # a device without counter readings has no counter figure (not a refused one)
                if self.counter is None:
                    self.counter = CounterStream(self.plan.w0, self.plan.w1, hold_limit_s=self.plan.hold_limit_s,
                                                 relived=self.relived)
                self.counter.add(ts[ok], self._unwrap(c[ok]))

    def _unwrap(self, c: np.ndarray) -> np.ndarray:
        """core.counters' rule without a modulus (a drop is a reset: the total continues), carried
        from chunk to chunk: the same offsets, added in the same order, as ``unwrap`` of the whole series."""
        prev = np.concatenate([[np.nan if self.unwrap_last is None else self.unwrap_last], c[:-1]])
        with np.errstate(invalid="ignore"):
            inc = np.where(c < prev, prev, 0.0)
        off = np.cumsum(np.concatenate([[self.unwrap_offset], inc]))[1:]
        self.unwrap_last, self.unwrap_offset = float(c[-1]), float(off[-1])
        out: np.ndarray = c + off
        return out

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.rows >= 2:
            out.update({
                "covered_s": self.cov / 1e9 if self.ncov else None,
                "max_interval_s": self.maxint / 1e9 if np.isfinite(self.maxint) else None,
                "gaps": self.gaps, "gap_s": self.gap_s / 1e9 if self.ngap else None,
            })
            # a ramp between readings a step back of the clock interleaved is between two moments
            # that were not next to each other: not a ramp (the device's energy says why it is null)
            stepped = self.relived is not None and overlapping(*self.relived, [self.plan.w0], [self.plan.w1])[0]
            for f, r in self.ramp.items():
                out[f"{f}_ramp_max"] = r if np.isfinite(r) and not stepped else None
            for f, (s, n, s_s, n_s) in self.delta.items():
                out[f"{f}_delta"] = s if n else None
                out[f"{f}_delta_s"] = s_s if n_s else None
        if self.steady:
            secs = np.concatenate([s for s, _ in self.steady])
            means = np.concatenate([m for _, m in self.steady])
            out[f"{self.plan.steady_field}_steady_s"] = time_to_steady(secs.astype(np.float64), means)
        if self.power is not None:
            out["energy_integral"] = self.power.energy()
            if self.plan.sub_windows is not None:
                out["step_energy_j"], out["step_energy_why"] = self.power.sub_energy()
        if self.counter is not None:
            out["energy_counter"] = self.counter.energy()
        for name, qt in self.quantiles.items():
            out[f"power_w_{name}"] = qt.value()
        if self.sample is not None:
            out["power_w_sample_period_s"] = self.sample.median_interval_s()
            out["power_w_step_phase_ns"] = self.sample.step_phases()
        if self.osc is not None:
            out["power_osc"] = self.osc.result()
        return out


def time_chunks(con: duckdb.DuckDBPyConnection, name: str, t_lo: int | None, t_hi: int | None
                ) -> Iterator[tuple[int, int]]:
    """[lo, hi) ranges of whole seconds covering the view's rows in [t_lo, t_hi] (all rows when not
    given), each about ``PASS_CHUNK_ROWS`` rows at the run's mean row rate."""
    win = f"WHERE t_ns BETWEEN {int(t_lo)} AND {int(t_hi)}" if t_lo is not None and t_hi is not None else ""
    n, first, last = con.execute(f"SELECT count(*), min(t_ns), max(t_ns) FROM {name} {win}").fetchall()[0]
    if not n:
        return
    sec = 1_000_000_000
    start, end = int(first) // sec * sec, int(last) // sec * sec + sec
    per_s = n / max((end - start) / sec, 1.0)
    step = max(1, int(PASS_CHUNK_ROWS / per_s)) * sec
    for lo in range(start, end, step):
        yield lo, min(lo + step, end)


def run_pass(con: duckdb.DuckDBPyConnection, name: str, plan: Plan, t_lo: int | None, t_hi: int | None
             ) -> dict[tuple[str, str], dict[str, Any]]:
    """Every device's row of pass figures over the view's rows in [t_lo, t_hi] (all when not given)."""
    cols = ["t_ns", "host", "device", *dict.fromkeys([*plan.seg_fields, *plan.energy_fields,
                                                     *([plan.steady_field] if plan.steady_field else []),
                                                     *([REPEAT] if "power_w" in plan.seg_fields else [])])]
    win = f" AND t_ns BETWEEN {int(t_lo)} AND {int(t_hi)}" if t_lo is not None and t_hi is not None else ""
    devices: dict[tuple[str, str], _Device] = {}
    for lo, hi in time_chunks(con, name, t_lo, t_hi):
        t = con.sql(f"SELECT {', '.join(cols)} FROM {name}_rows WHERE t_ns >= {lo} AND t_ns < {hi}{win} "
                    "ORDER BY host, device, t_ns, file, file_row").to_arrow_table()
        for key, ts, values in _by_device(t, cols[3:]):
            dev = devices.get(key)
            if dev is None:
                dev = devices[key] = _Device(key, plan)
            dev.add(ts, values)
    return {k: d.result() for k, d in devices.items()}


def _by_device(t: pa.Table, fields: Sequence[str]) -> Iterator[tuple[tuple[str, str], np.ndarray, dict[str, np.ndarray]]]:
    """The chunk's rows per device (already ordered by device, then time): times and float columns."""
    if t.num_rows == 0:
        return
    key = pc.binary_join_element_wise(t["host"], t["device"], "\x00")
    enc = pc.dictionary_encode(key).combine_chunks()
    codes = enc.indices.to_numpy()
    names = enc.dictionary.to_pylist()
    ts = t["t_ns"].to_numpy()
    cols = {f: np.asarray(pc.cast(t[f], pa.float64()).to_numpy(zero_copy_only=False)) for f in fields}
    bounds = np.r_[0, np.flatnonzero(codes[1:] != codes[:-1]) + 1, codes.size]
    for lo, hi in itertools.pairwise(bounds):
        host, device = names[codes[lo]].split("\x00", 1)
        yield (host, device), ts[lo:hi], {f: c[lo:hi] for f, c in cols.items()}
