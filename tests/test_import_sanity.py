"""Implausible readings: screened to NaN, counted per field and kind with the first file:line, one warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from powertrain.importers.common import ImportWarning_, RunBuilder
from powertrain.importers.sanity import (
    ABSOLUTE_MAX_POWER_W,
    default_limits,
    device_tdp_w,
    screen,
    screen_counter,
)


def test_power_screen_counts_kinds_and_first_line():
    b = RunBuilder(format="test")
    v = np.array([100.0, -500.0, 1e308, np.inf, np.nan, 250.0, -1.0])
    where = [f"a.csv:{i + 2}" for i in range(v.size)]
    with pytest.warns(ImportWarning_, match=r"power_w: 4 implausible.*first at a.csv:3"):
        out = screen(b, "power_w", v, where=where)
    assert out[0] == 100.0 and out[5] == 250.0
    assert np.isnan(out[[1, 2, 3, 4, 6]]).all()
    assert v[1] == -500.0  # a copy, the input is untouched
    imp = b.info["data_quality"]["implausible"]["power_w"]
    assert imp["count"] == 4  # the NaN was a null the source wrote, not implausible
    assert imp["kinds"] == {"negative": 2, "too_high": 1, "non_finite": 1}
    assert imp["first"] == "a.csv:3"
    assert imp["first_of_kind"] == {"negative": "a.csv:3", "too_high": "a.csv:4", "non_finite": "a.csv:5"}
    assert len(b.warnings) == 1


def test_second_screen_adds_without_a_second_warning():
    b = RunBuilder(format="test")
    with pytest.warns(ImportWarning_):
        screen(b, "temp_c", np.array([-273.0, 40.0]), where=["x:2", "x:3"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = screen(b, "temp_c", np.array([151.0, 149.0]), where=["y:2", "y:3"])
    assert np.isnan(out[0]) and out[1] == 149.0
    imp = b.info["data_quality"]["implausible"]["temp_c"]
    assert imp["count"] == 2 and imp["kinds"] == {"too_low": 1, "too_high": 1}
    assert imp["first"] == "x:2" and imp["first_of_kind"]["too_high"] == "y:2"
    assert len(b.warnings) == 1


def test_clean_values_leave_no_trace():
    b = RunBuilder(format="test")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = screen(b, "power_w", np.array([0.0, 699.0, np.nan]), where=None)
    assert "data_quality" not in b.info
    assert out[1] == 699.0


def test_tdp_from_the_catalog_and_absolute_bound():
    assert device_tdp_w("NVIDIA H100 80GB HBM3") == 700.0
    assert device_tdp_w("A100-SXM4-40GB") == 400.0
    assert device_tdp_w("Some Unknown Accelerator") is None
    (lo, hi), why = default_limits("power_w", "NVIDIA A100-SXM4-40GB")
    assert (lo, hi) == (0.0, 1200.0) and "TDP" in why
    (lo, hi), why = default_limits("power_w", None)
    assert hi == ABSOLUTE_MAX_POWER_W and "absolute" in why
    b = RunBuilder(format="test")
    with pytest.warns(ImportWarning_, match="3 x TDP"):
        out = screen(b, "power_w", np.array([1300.0, 1100.0]), where=None, device_name="A100-SXM4-40GB")
    assert np.isnan(out[0]) and out[1] == 1100.0
    assert b.info["data_quality"]["implausible"]["power_w"]["first"] is None


def test_explicit_limits_override():
    b = RunBuilder(format="test")
    with pytest.warns(ImportWarning_):
        out = screen(b, "power_w", np.array([5000.0, 9000.0]), where=["n:1", "n:2"], limits=(0.0, 8000.0))
    assert out[0] == 5000.0 and np.isnan(out[1])


def test_counter_backwards_without_modulus():
    b = RunBuilder(format="test")
    with pytest.warns(ImportWarning_, match="energy_j"):
        out = screen_counter(b, "energy_j", np.array([10.0, 20.0, 15.0, 30.0]), where=["c:1", "c:2", "c:3", "c:4"])
    assert np.isnan(out[2]) and out[3] == 30.0
    assert b.info["data_quality"]["implausible"]["energy_j"]["kinds"] == {"backwards": 1}
    b2 = RunBuilder(format="test")
    out2 = screen_counter(b2, "energy_j", np.array([10.0, 20.0, 15.0]), where=None, modulus=2.0**32)
    assert not np.isnan(out2).any() and "data_quality" not in b2.info


def test_where_length_checked():
    with pytest.raises(ValueError, match="locations"):
        screen(RunBuilder(format="t"), "power_w", np.array([1.0, 2.0]), where=["a:1"])
