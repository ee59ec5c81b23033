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


def test_summarize_reads_telemetry_in_bounded_chunks(tmp_path, monkeypatch):
    """Every query result the analysis holds is about a chunk, not the run: the device pass and the
    cluster series come in chunks of the configured size, and the figures do not change."""
    import json

    from powertrain.analyze import device_pass
    from powertrain.analyze import telemetry as tel
    from powertrain.analyze.summary import summarize_run
    from powertrain.analyze.synthetic import write_run

    run = write_run(tmp_path / "run", hosts=1, devices_per_host=4, steps=120, step_s=1.0, rate_hz=20.0)
    canon = lambda s: json.dumps({k: v for k, v in s.items() if k != "path"}, sort_keys=True)  # noqa: E731
    whole = canon(summarize_run(run, probe_cpu_peak=False))
    seen: dict[str, list[int]] = {"pass": [], "series": []}
    by_device = device_pass._by_device

    def spy_by_device(t, fields):
        seen["pass"].append(t.num_rows)
        return by_device(t, fields)

    chunks = tel.device_mean_chunks

    def spy_chunks(*a, **k):
        for t in chunks(*a, **k):
            seen["series"].append(t.num_rows)
            yield t

    monkeypatch.setattr(device_pass, "PASS_CHUNK_ROWS", 1000)
    monkeypatch.setattr(tel, "SERIES_CHUNK_ROWS", 1000)
    monkeypatch.setattr(device_pass, "_by_device", spy_by_device)
    monkeypatch.setattr(tel, "device_mean_chunks", spy_chunks)
    small = canon(summarize_run(run, probe_cpu_peak=False))
    total = 4 * 20 * 122
    assert len(seen["pass"]) >= total // 1000 and max(seen["pass"]) <= 1000 + 4 * 20  # whole seconds
    assert len(seen["series"]) >= 2 and sum(seen["series"]) * 4 <= total + 8 and max(seen["series"]) <= 1000
    assert small == whole
