"""core.energy streamed in chunks (what the analysis does for long runs) equals the one-call integral
to the last bit, and the one-call integral is still the whole-series trapezoid formula."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from powertrain.core.energy import (
    CounterStream,
    PowerStream,
    clean_readings,
    counter_window_energy,
    window_energy,
    windows_energy,
)


def _whole_series_f(t: np.ndarray, p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The running integral as one cumulative sum over the whole cleaned series (the formula before
    streaming; kept here as the reference)."""
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * (np.diff(t) / 1e9))])
    xc = np.clip(x, t[0], t[-1])
    i = np.clip(np.searchsorted(t, xc, side="right") - 1, 0, max(t.size - 2, 0))
    h = (t[i + 1] - t[i]) / 1e9
    d = (xc - t[i]) / 1e9
    slope = np.divide(p[i + 1] - p[i], h, out=np.zeros_like(h, dtype=np.float64), where=h > 0)
    inside = cum[i] + p[i] * d + 0.5 * slope * d * d
    out = np.where(x < t[0], -(t[0] - x) / 1e9 * p[0], inside)
    return np.where(x > t[-1], cum[-1] + (x - t[-1]) / 1e9 * p[-1], out)


def _series(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    t = np.sort(rng.integers(0, 10**11, n)).astype(np.int64)
    t = np.repeat(t[: n // 2 + 1], 2)[:n]  # same-time readings, merged by the cleaning
    p = rng.normal(300, 100, t.size)
    p[rng.integers(0, t.size, 3)] = np.inf  # dropped and counted
    return t, p


def _chunks(t: np.ndarray, rng: np.random.Generator, k: int) -> list[np.ndarray]:
    """Masks cutting the series at ``k - 1`` reading times (a timestamp never split)."""
    u = np.unique(t)
    cuts = np.unique(np.r_[0, rng.choice(u, min(k - 1, u.size), replace=False), 10**12])
    return [(t >= lo) & (t < hi) for lo, hi in itertools.pairwise(cuts)]


@pytest.mark.parametrize("seed", range(12))
def test_streamed_energy_equals_one_call_to_the_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t, p = _series(rng, int(rng.integers(2, 4000)))
    t0 = int(t[t.size // 3]) if seed % 3 == 0 else int(rng.integers(-10**10, 5 * 10**10))
    t1 = int(t[-1]) if seed % 4 == 0 else t0 + int(rng.integers(1, 10**11))
    hold = 1e9 if seed % 2 else 5.0
    edges = np.sort(rng.integers(t0, t1 + 1, 30))
    a, b = edges[:-1], edges[1:]
    ok = np.isfinite(p)
    tc, c = t[ok], np.cumsum(np.abs(p[ok]))
    one = window_energy(t, p, t0, t1, hold_limit_s=hold)
    one_steps, one_why = windows_energy(t, p, a, b, span=(t0, t1), hold_limit_s=hold)
    one_counter = counter_window_energy(tc, c, t0, t1, hold_limit_s=hold)
    for k in (2, 7, 60):
        ps = PowerStream(t0, t1, sub=(a, b), span=(t0, t1), hold_limit_s=hold)
        cs = CounterStream(t0, t1, hold_limit_s=hold)
        for m in _chunks(t, rng, k):
            ps.add(t[m], p[m])
            mc = (tc >= t[m].min()) & (tc <= t[m].max()) if m.any() else np.zeros(tc.size, dtype=bool)
            cs.add(tc[mc], c[mc])
        assert ps.energy() == one
        steps, why = ps.sub_energy()
        assert why == one_why
        assert np.array_equal(steps, one_steps, equal_nan=True)
        assert cs.energy() == one_counter


@pytest.mark.parametrize("seed", range(6))
def test_one_call_is_the_whole_series_trapezoid(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    t, p = _series(rng, int(rng.integers(2, 4000)))
    r = clean_readings(t, p)
    x = np.sort(np.r_[rng.integers(-10**10, 2 * 10**11, 40), r.t_ns[[0, r.t_ns.size // 2, -1]]]).astype(np.int64)
    ref = _whole_series_f(r.t_ns, r.value, x)
    for i in range(0, x.size - 1, 2):
        got = window_energy(t, p, int(x[i]), int(x[i + 1]), hold_limit_s=1e12)
        assert got.energy_j == float(ref[i + 1] - ref[i])


def test_chunks_out_of_time_order_are_refused() -> None:
    ps = PowerStream(0, 10)
    ps.add([5, 6], [1.0, 2.0])
    with pytest.raises(ValueError, match="time order"):
        ps.add([6, 7], [1.0, 2.0])
