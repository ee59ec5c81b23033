"""Power phases, chassis slots, throttling stragglers, and thermal fitting from timelines."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from powertrain.hardware import get_device
from powertrain.predict import Case, fit_thermal, predict
from powertrain.predict.thermal import ThermalParams, simulate


def _case(**kw: object) -> Case:
    base = dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq_len=8192, tp=1,
                pp=1, dp=8, micro_batch=1, global_batch=64, device=get_device("h100-sxm"),
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


# --- power on the same footing as step time (issue 15, point 6) ---------------------------------------------

def test_the_clock_exponent_is_held_to_its_physical_range() -> None:
    from powertrain.predict import load_calibration
    from powertrain.predict.power import CLOCK_EXPONENT_RANGE, clock_exponent, clock_factor

    c = load_calibration("default").coefficients
    dev = replace(get_device("h100-sxm-96gb"))  # 500 W limit under a 700 W compute draw
    lo, hi = CLOCK_EXPONENT_RANGE
    assert 1.5 <= lo < hi <= 3.5
    assert clock_exponent(replace(c, power_clock_exponent=1.0)) == lo
    assert clock_exponent(replace(c, power_clock_exponent=9.0)) == hi
    # an unphysical α = 1 would cut clocks as deep as the power; the held one cuts them less
    assert clock_factor(dev, replace(c, power_clock_exponent=1.0), None) == pytest.approx(
        clock_factor(dev, replace(c, power_clock_exponent=lo), None))
    assert clock_factor(dev, replace(c, power_clock_exponent=lo), None) > (500 - 70) / (
        70 + c.power_compute * 630 - 70)


def test_exposed_communication_draws_more_than_waiting() -> None:
    from powertrain.predict import load_calibration
    from powertrain.predict.power import device_power, phase_powers

    c = load_calibration("default").coefficients
    dev = get_device("h100-sxm")
    idle = device_power(dev, c, 1.0, 0.5, 0.2, 0.3)
    comm = device_power(dev, c, 1.0, 0.5, 0.2, 0.3, comm_s=0.3)
    p_c, p_m, p_w = phase_powers(dev, c)
    assert idle.mean_w == pytest.approx(0.5 * p_c + 0.2 * p_m + 0.3 * p_w)
    assert comm.mean_w == pytest.approx(0.5 * p_c + 0.5 * p_m)


def _sweep_powers():
    from collections import defaultdict

    from powertrain.plan.sweep_spec import expand, load_sweep_spec
    from powertrain.predict import case_from_run_config, load_calibration
    from powertrain.predict.power import clock_factor, step_power
    from powertrain.predict.steptime import step_time

    c = load_calibration("default").coefficients
    out = defaultdict(list)
    root = Path(__file__).resolve().parents[1]
    for e in expand(load_sweep_spec(root / "examples" / "study-h200-microbatch.yaml")):
        if e.config is None:
            continue
        case = case_from_run_config(e.config)
        if case.micro_batch * case.dp > case.global_batch:
            continue  # the one invalid point (micro-batch × dp > global batch), as in the study: predict refuses it
        clock = clock_factor(case.device, c, case.power_limit_w)
        pw = step_power(case.device, c, step_time(case, c, clock), clock)
        out[(e.config.model.name, e.config.layout.label())].append((case.micro_batch, pw))
    return out


def test_peak_power_strictly_rises_with_micro_batch_for_every_layout_of_the_sweep() -> None:
    sweeps = _sweep_powers()
    assert len(sweeps) == 15
    for layout, pts in sweeps.items():
        pts.sort(key=lambda t: t[0])
        peaks = [pw.peak_w for _, pw in pts]
        shares = [pw.gemm_share for _, pw in pts]
        assert all(b > a for a, b in itertools.pairwise(peaks)), (layout, peaks)
        assert all(b > a for a, b in itertools.pairwise(shares)), (layout, shares)
        assert all(pw.mean_w <= pw.peak_w <= pw.compute_w for _, pw in pts)


def test_mlperf_node_power_within_ten_percent() -> None:
    """The MLPerf v4.0 GPT-3 512×H100 run: predicted wall power per node (8 GPUs + host, through the power
    supplies) vs the measured AC mean, and the DC load vs the measured DC mean."""
    from powertrain.predict import load_calibration
    from powertrain.predict.power import clock_factor, node_dc_w, node_power_w, step_power
    from powertrain.predict.published import load_published
    from powertrain.predict.steptime import step_time

    run = next(r for r in load_published() if r.id == "mlperf40_smc_gpt3_512gpu_power")
    c = load_calibration("default").coefficients
    clock = clock_factor(run.case.device, c, run.case.power_limit_w)
    pw = step_power(run.case.device, c, step_time(run.case, c, clock), clock)
    node = node_power_w(8 * pw.mean_w, 1, c)
    measured = float(run.raw["measured"]["node_power_ac_w"])  # the same figure the benchmark reads from MLLOG
    assert abs(node_dc_w(8 * pw.mean_w, 1, c) / float(run.raw["measured"]["node_power_dc_w"]) - 1) <= 0.10
    assert abs(node / measured - 1) <= 0.10, (node, measured)


def test_node_power_is_the_dc_load_through_the_power_supplies_one_formula_for_predict_and_advise(tmp_path: Path) -> None:
    """predict's node energy and the advisor's idle-node check use the same wall-power formula; a profile's
    power-supply efficiency changes both, and one outside (0.5, 1] is refused naming the fix."""
    import yaml

    from powertrain.predict import load_calibration
    from powertrain.predict.calibration import calibration_from_dict
    from powertrain.predict.power import node_power_w

    cal = load_calibration("default")
    c = cal.coefficients
    case = Case(layers=8, hidden=1024, ffn=4096, heads=8, kv_heads=8, vocab=32000, seq_len=2048, dp=8, micro_batch=1,
                global_batch=8, device=get_device("h100-sxm"), devices_per_node=8)
    p = predict(case, cal)
    t, devices_j = p.metrics["step_time_mean_s"], p.metrics["energy_per_step_j"]
    assert p.breakdown["node_energy_per_step_j"] == pytest.approx(node_power_w(devices_j / t, 1, c) * t)
    better = cal.with_coefficients(psu_efficiency=0.98)
    assert predict(case, better).breakdown["node_energy_per_step_j"] < p.breakdown["node_energy_per_step_j"]
    raw = yaml.safe_load(yaml.safe_dump(cal.to_dict()))
    raw["coefficients"]["psu_efficiency"] = 96
    with pytest.raises(ValueError, match=r"psu_efficiency = 96 is outside 0\.5-1: it is the power supplies"):
        calibration_from_dict(raw, "my-site.yaml")
