"""The analysis in bounded memory: the streamed spectrum is the one-call spectrum for short series and
finds the oscillation of a series too long to hold; the cluster series comes in chunks."""

from __future__ import annotations

import numpy as np
import pytest

from powertrain.analyze.signal import OscillationStream, dominant_oscillation


def _sine(n: int, f_hz: float, rate_hz: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = 1_700_000_000_000_000_000 + (np.arange(n) * (1e9 / rate_hz)).astype(np.int64)
    return t, 500 + 80 * np.sin(2 * np.pi * f_hz * np.arange(n) / rate_hz) + rng.normal(0, 5, n)


def test_short_series_is_exactly_the_one_call_spectrum():
    t, v = _sine(5000, 0.7, 20.0)
    s = OscillationStream(max_points=1 << 13)
    for a in range(0, t.size, 999):
        s.add(t[a:a + 999], v[a:a + 999])
    assert s.result() == dominant_oscillation(t, v)


def test_long_series_streams_welch_segments_and_finds_the_oscillation():
    t, v = _sine(60_000, 0.7, 20.0)
    s = OscillationStream(max_points=1 << 11)  # 2048-point segments, 0.0098 Hz bins
    for a in range(0, t.size, 4000):
        s.add(t[a:a + 4000], v[a:a + 4000])
        assert sum(x.size for x in s._t) <= 4000 + (1 << 11)  # only what the next segment needs is kept
    freq, amp = s.result()
    assert freq == pytest.approx(0.7, abs=20.0 / (1 << 11))
    assert amp == pytest.approx(80, rel=0.1)


def test_flat_long_series_has_no_oscillation():
    t = 1_700_000_000_000_000_000 + np.arange(10_000, dtype=np.int64) * 50_000_000
    s = OscillationStream(max_points=1 << 10)
    s.add(t, np.full(t.size, 300.0))
    assert s.result() is None
