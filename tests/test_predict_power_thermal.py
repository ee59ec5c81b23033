"""Power phases, chassis slots, throttling stragglers, and thermal fitting from timelines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from powertrain.hardware import get_device
from powertrain.predict import Case, fit_thermal, predict
from powertrain.predict.thermal import ThermalParams, simulate


def _case(**kw: object) -> Case:
    base = dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq_len=8192, tp=1,
                pp=1, dp=8, micro_batch=1, global_batch=64, device=get_device("h100-sxm"), nodes=1,
                devices_per_node=8, distributed_optimizer=True)
    base.update(kw)
    return Case(**base)  # type: ignore[arg-type]


def test_power_between_idle_and_limit() -> None:
    m = predict(_case()).metrics
    dev = get_device("h100-sxm")
    assert dev.idle_w < m["power_mean_w"] <= m["power_peak_w"] <= dev.tdp_w
    assert m["power_swing_w"] > 0
    assert m["j_per_token"] == pytest.approx(1 / m["tokens_per_j"])
    assert m["energy_per_step_j"] == pytest.approx(m["power_mean_w"] * 8 * m["step_time_mean_s"])


def test_rear_slots_run_hotter() -> None:
    p = predict(_case())
    slots = {s["slot"]: s for s in p.breakdown["slots"]}
    assert slots["gpu4"]["steady_c"] > slots["gpu0"]["steady_c"]
    assert p.metrics["hottest_slot"] in {"gpu4", "gpu5", "gpu6", "gpu7"}


def test_a_hot_slot_throttles_and_slows_the_whole_job() -> None:
    cool = predict(_case())
    hot_dev = replace(get_device("h100-sxm"), slowdown_c=cool.metrics["temp_mean_c"])  # rear slots exceed it
    hot = predict(_case(device=hot_dev))
    assert 0 < hot.metrics["throttle_share"] < 1
    assert hot.metrics["step_time_mean_s"] > cool.metrics["step_time_mean_s"]
    assert hot.metrics["temp_peak_c"] <= hot_dev.slowdown_c + 1e-9
    assert hot.breakdown["clock_factor_thermal"] < 1


def test_liquid_cooled_parts_have_no_rear_preheat() -> None:
    gb = predict(_case(device=get_device("gb200"), devices_per_node=4, dp=4, tp=1))
    temps = {round(s["steady_c"], 6) for s in gb.breakdown["slots"]}
    assert len(temps) == 1


def test_measured_cpu_has_no_invented_power() -> None:
    p = predict(_case(device=get_device("cpu"), layers=2, hidden=256, ffn=512, heads=4, kv_heads=4, vocab=512,
                      seq_len=128, dp=1, global_batch=4, devices_per_node=1))
    assert p.metrics["power_mean_w"] is None and "power_mean_w" in p.why_null
    assert p.metrics["step_time_mean_s"] > 0


@pytest.mark.parametrize(("r", "tau", "inlet"), [(0.07, 40.0, 28.0), (0.03, 12.0, 35.0)])
def test_fit_thermal_recovers_known_parameters(r: float, tau: float, inlet: float) -> None:
    rng = np.random.default_rng(1)
    t = np.arange(0, 600, 0.5)
    # idle, a training burst, a step down, another burst: load changes make R, τ and T_in separable
    power = np.select([t < 60, t < 300, t < 380], [80.0, 650.0, 300.0], 600.0) + rng.normal(0, 15, len(t))
    true = ThermalParams(r_c_per_w=r, tau_s=tau, inlet_c=inlet)
    temp = simulate(true, t, power) + rng.normal(0, 0.1, len(t))
    fit = fit_thermal(t, power, temp)
    assert fit.r_c_per_w == pytest.approx(r, rel=0.05)
    assert fit.tau_s == pytest.approx(tau, rel=0.05)
    assert fit.inlet_c == pytest.approx(inlet, rel=0.05)
    assert fit.rmse_c is not None and fit.rmse_c < 1.0


def test_fit_thermal_refuses_flat_data() -> None:
    with pytest.raises(ValueError, match="at least 10 samples"):
        fit_thermal(np.arange(5.0), np.ones(5), np.ones(5))
