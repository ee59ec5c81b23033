"""The one energy integral: property test against an independent numeric reference, and its edge rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powertrain.core.energy import (
    clean_readings,
    counter_window_energy,
    window_energy,
    windows_energy,
)

S = 1_000_000_000


def reference_energy(t_s: np.ndarray, p: np.ndarray, a_s: float, b_s: float) -> float:
    """Independent reference: the held-at-ends piecewise-linear power, integrated exactly piece by
    piece with math.fsum on the union of the reading times and the window edges."""
    import math

    def power(x: float) -> float:
        if x <= t_s[0]:
            return float(p[0])
        if x >= t_s[-1]:
            return float(p[-1])
        return float(np.interp(x, t_s, p))

    knots = sorted({a_s, b_s, *[float(x) for x in t_s if a_s < x < b_s]})
    return math.fsum((knots[i + 1] - knots[i]) * (power(knots[i]) + power(knots[i + 1])) / 2
                     for i in range(len(knots) - 1))


series = st.integers(min_value=2, max_value=40).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(min_value=1, max_value=3 * S), min_size=n, max_size=n, unique=True),
        st.lists(st.floats(min_value=0, max_value=1500, allow_nan=False), min_size=n, max_size=n),
    )
)


@settings(max_examples=300, deadline=None)
@given(data=series, a_off=st.integers(-3 * S, 60 * S), length=st.integers(0, 60 * S))
def test_integral_matches_reference_including_held_edges_and_windows_between_readings(data, a_off, length):
    gaps, powers = data
    t = np.cumsum(np.asarray(gaps, dtype=np.int64)) + 10 * S
    p = np.asarray(powers)
    a = int(t[0]) + a_off
    b = a + length
    got = window_energy(t, p, a, b, hold_limit_s=1e9)
    ref = reference_energy(t / 1e9, p, a / 1e9, b / 1e9)
    assert got.energy_j is not None
    assert got.energy_j == pytest.approx(ref, rel=1e-9, abs=1e-6)
    # Held seconds are exactly the uncovered parts of the window.
    assert got.held_start_s == pytest.approx(max(0, min(t[0], b) - a) / 1e9)
    assert got.held_end_s == pytest.approx(max(0, b - max(t[-1], a)) / 1e9)


def test_adjacent_windows_add_up_to_the_window_that_spans_them():
    rng = np.random.default_rng(3)
    t = np.sort(rng.choice(np.arange(0, 100 * S, S // 7), 300, replace=False))
    p = rng.uniform(100, 700, t.size)
    edges = np.sort(rng.integers(t[0] - 2 * S, t[-1] + 2 * S, 50))
    parts, why = windows_energy(t, p, edges[:-1], edges[1:], span=(int(edges[0]), int(edges[-1])))
    assert why is None
    whole = window_energy(t, p, int(edges[0]), int(edges[-1]))
    assert parts.sum() == pytest.approx(whole.energy_j, rel=1e-12)


def test_an_edge_gap_beyond_the_limit_is_null_with_a_reason_not_an_undercount():
    t = np.array([10, 11, 12], dtype=np.int64) * S
    p = np.array([500.0, 500.0, 500.0])
    late_start = window_energy(t, p, 0, 12 * S, hold_limit_s=5)
    assert late_start.energy_j is None and "start 10.0 s after" in (late_start.why_null or "")
    early_stop = window_energy(t, p, 10 * S, 30 * S, hold_limit_s=5)
    assert early_stop.energy_j is None and "stop 18.0 s before" in (early_stop.why_null or "")
    held = window_energy(t, p, 8 * S, 13 * S, hold_limit_s=5)
    assert held.energy_j == pytest.approx(2500.0)
    assert (held.held_start_s, held.held_end_s, held.edge_held_s) == (2.0, 1.0, 3.0)
    assert window_energy([], [], 0, S).why_null == "no power readings"


def test_repeated_readings_do_not_weigh_twice_and_are_counted():
    t = np.array([0, 1, 1, 2, 3, 3], dtype=np.int64) * S
    p = np.array([100.0, 200.0, 200.0, 300.0, 400.0, 200.0, np.nan])[:6]
    r = clean_readings(t, p)
    assert r.duplicates_dropped == 1 and r.same_time_merged == 1
    assert list(r.value) == [100.0, 200.0, 300.0, 300.0]
    with_nan = clean_readings(np.append(t, 4 * S), np.append(p, np.inf))
    assert with_nan.non_finite_dropped == 1


def test_counter_energy_agrees_with_the_power_integral_on_constant_power():
    t = np.arange(0, 21) * S
    counter = 1e6 + 400.0 * np.arange(21)
    power = np.full(21, 400.0)
    c = counter_window_energy(t, counter, -2 * S, 22 * S)
    w = window_energy(t, power, -2 * S, 22 * S)
    assert c.energy_j == pytest.approx(w.energy_j) == pytest.approx(400.0 * 24)
    assert counter_window_energy(t, counter[::-1], 0, 5 * S).why_null.startswith("energy counter goes backwards")
