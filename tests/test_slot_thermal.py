"""Per-slot node thermal model: coefficients traced to the real 8×H100 logs, spread, throttling per slot."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from powertrain.hardware import get_device
from powertrain.predict.slot_thermal import (
    SLOT_FILE,
    slot_coefficients,
    slot_offset_c,
    slot_power_limit_w,
    slot_ratios,
    slot_temperature_c,
    throttle_margin_c,
)
from powertrain.predict.thermal import node_heat

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("POWERTRAIN_SHARED", ROOT.parent / "shared"))
LOGS = SHARED / "data/real/wilkins-nvsmi-h100x8-titanx2/h100x8_gpt8b_ddp"


def _fit_script():
    spec = importlib.util.spec_from_file_location("fit_slot_thermal", ROOT / "benchmarks" / "fit_slot_thermal.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fit_slot_thermal"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_shipped_coefficients_have_a_spread_and_say_where_they_come_from() -> None:
    co = slot_coefficients()
    assert len(co.power_ratio) == co.devices_per_node == 8
    assert sum(co.power_ratio) / 8 == pytest.approx(1.0, abs=1e-3)
    assert max(co.power_ratio) - min(co.power_ratio) > 0.01  # the measured spread: about 2 %
    assert "wilkins" in co.source and "no licence" in co.source and len(co.runs) >= 5


def test_shipped_coefficients_are_what_the_fit_script_gets_from_the_logs() -> None:
    if not LOGS.is_dir():
        pytest.skip(f"real logs not found at {LOGS} (set POWERTRAIN_SHARED)")
    got = _fit_script().fit(LOGS)
    assert got["power_ratio"] == pytest.approx(list(slot_coefficients().power_ratio), abs=1e-4)


def test_the_fit_reads_implicit_gpu_order_and_keeps_only_steady_training(tmp_path) -> None:
    mod = _fit_script()
    rows = ["timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"]
    want = [1.02, 0.98, 1.0, 1.0, 1.01, 0.99, 1.0, 1.0]
    for i in range(60):
        busy = i >= 10  # ten idle samples first: never part of the fit
        for slot in range(8):
            watts = 500 * want[slot] if busy else 70.0 + slot
            rows.append(f"2025/07/27 00:00:{i:02d}.000, {watts:.2f} W, {100 if busy else 0} %, 100 MiB")
    f = tmp_path / "ckpt7.csv"
    f.write_text("\n".join(rows) + "\n")
    run = mod.fit_run(f)
    assert run["steady_samples"] == 50
    assert run["power_ratio"] == pytest.approx(want, abs=1e-4)


def _slot_powers(dev, n: int, device_w: float) -> list[float]:
    return [device_w * r for r in slot_ratios(dev, n)]


def test_every_slot_has_its_own_temperature_and_the_hottest_is_a_rear_slot_with_the_most_power() -> None:
    dev = get_device("h200")
    temps = [h.steady_c for h in node_heat(dev, 8, _slot_powers(dev, 8, 600.0), run_s=3600.0)]
    assert len({round(t, 6) for t in temps}) == 8  # non-zero spread, slot by slot
    ratios = slot_ratios(dev, 8)
    rear = list(dev.thermal.rear_slots_of_8)
    hottest = max(range(8), key=lambda i: temps[i])
    assert hottest == max(rear, key=lambda i: ratios[i])
    # inside a row the spread is the fitted power spread through R
    front = [i for i in range(8) if i not in rear]
    spread = max(temps[i] for i in front) - min(temps[i] for i in front)
    want = dev.thermal.r_c_per_w * 600.0 * (max(ratios[i] for i in front) - min(ratios[i] for i in front))
    assert spread == pytest.approx(want)


def test_a_short_run_has_not_reached_steady_temperature() -> None:
    """First order from idle: after a run much shorter than τ a slot sits near its idle temperature, after many τ at
    its steady one."""
    dev = get_device("h100-sxm")
    short = node_heat(dev, 8, _slot_powers(dev, 8, 600.0), run_s=2.0)
    long = node_heat(dev, 8, _slot_powers(dev, 8, 600.0), run_s=20 * dev.thermal.tau_s)
    for a, b in zip(short, long, strict=True):
        assert a.idle_c < a.end_c < a.steady_c
        assert b.end_c == pytest.approx(b.steady_c, abs=1e-3)
        assert a.end_c - a.idle_c == pytest.approx((a.steady_c - a.idle_c) * (1 - math.exp(-2.0 / dev.thermal.tau_s)))


def test_placement_api_agrees_with_the_node_model() -> None:
    dev = get_device("h100-sxm")
    heat = node_heat(dev, 8, _slot_powers(dev, 8, 550.0), run_s=1e6)
    for slot in range(8):
        t = slot_temperature_c(dev, 8, slot, 550.0)
        assert t == pytest.approx(heat[slot].steady_c)
        assert throttle_margin_c(dev, 8, slot, 550.0) == pytest.approx(dev.slowdown_c - t)
        limit = slot_power_limit_w(dev, 8, slot)
        assert slot_temperature_c(dev, 8, slot, limit) == pytest.approx(dev.slowdown_c)
    # a heavier stage on a slot heats that slot; the node's mean sets the rear row's pre-heat
    assert slot_temperature_c(dev, 8, 5, 650.0, node_power_w=550.0) == pytest.approx(
        slot_temperature_c(dev, 8, 5, 550.0) + dev.thermal.r_c_per_w * slot_ratios(dev, 8)[5] * 100.0)
    assert min(slot_offset_c(dev, 8, s, 550.0) for s in range(8)) == 0.0
    assert max(slot_offset_c(dev, 8, s, 550.0) for s in range(8)) > 5.0  # the rear row


def test_no_fitted_spread_where_the_fit_does_not_apply() -> None:
    gb = get_device("gb200")  # liquid cooled, 4 per tray: no data, no invented spread
    assert slot_ratios(gb, 4) == (1.0,) * 4
    temps = {round(h.steady_c, 6) for h in node_heat(gb, 4, [900.0] * 4, run_s=60.0)}
    assert len(temps) == 1
    assert slot_ratios(replace(get_device("h100-sxm"), cooling="liquid"), 8) == (1.0,) * 8


def test_the_shipped_file_is_the_one_the_module_reads() -> None:
    assert SLOT_FILE.is_file() and "powertrain" in SLOT_FILE.parts
    assert SLOT_FILE.read_text().startswith("# Per-slot coefficients")
