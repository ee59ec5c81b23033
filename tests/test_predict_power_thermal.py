"""Power phases, chassis slots, throttling stragglers, and thermal fitting from timelines."""

from __future__ import annotations

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
    assert dev.idle_w < m["power_mean_w"] <= dev.tdp_w < m["power_peak_w"] < 1.2 * dev.tdp_w
    assert m["power_swing_w"] > 0
    assert m["j_per_token"] == pytest.approx(1 / m["tokens_per_j"])
    assert m["energy_per_step_j"] == pytest.approx(m["power_mean_w"] * 8 * m["step_time_mean_s"])


def test_rear_slots_run_hotter() -> None:
    p = predict(_case())
    slots = {s["slot"]: s for s in p.breakdown["slots"]}
    assert slots["gpu4"]["steady_c"] > slots["gpu0"]["steady_c"]
    assert p.metrics["hottest_slot"] in {"gpu4", "gpu5", "gpu6", "gpu7"}


def test_a_hot_slot_throttles_and_slows_the_whole_job() -> None:
    """A slot past its slowdown temperature lowers its own clock until it holds there; the synchronous job waits
    for it (a straggler): the step slows, its slot's clock differs from the cool slots', the thermal share counts
    its devices."""
    cool = predict(_case())
    steady = sorted(s["steady_c"] for s in cool.breakdown["slots"])
    hot_dev = replace(get_device("h100-sxm"), slowdown_c=steady[-2] - 3.0)  # the two hottest slots pass it
    hot = predict(_case(device=hot_dev))
    assert 0 < hot.metrics["throttle_share_thermal_sw"] < 1
    assert hot.metrics["step_time_mean_s"] > cool.metrics["step_time_mean_s"]
    assert hot.breakdown["clock_factor_thermal"] < 1
    slots = hot.breakdown["slots"]
    throttled = [s for s in slots if s["throttled"]]
    assert throttled and all(s["steady_c"] <= hot_dev.slowdown_c + 0.5 for s in throttled)
    assert max(s["clock"] for s in slots) > min(s["clock"] for s in throttled) + 0.005  # per-slot clocks differ
    # the cool slots wait for it: they draw less than they did
    cool_w = {s["slot"]: s["power_w"] for s in cool.breakdown["slots"]}
    assert all(s["power_w"] < cool_w[s["slot"]] for s in slots if not s["throttled"])


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


def _smc_node():
    """The SMC MLPerf node (2× Xeon 8462Y+, immersion) from the shipped system_ac.json, as the benchmark reads it."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("predict_power_check", root / "benchmarks" / "predict_power_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["predict_power_check"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.node_from_system(root / "examples/data/mlperf-v4.0-smc-h100-llama2-lora-8node/system_ac.json")


def test_mlperf_node_host_terms_leave_the_gpus_a_physical_share() -> None:
    """The MLPerf v4.0 GPT-3 512×H100 run (SMC, immersion cooled): the node-power model's host terms for the node
    its system JSON describes leave the GPUs a mean between idle and their power limit of the measured DC node
    power, and the predicted node is the GPUs plus exactly those terms through the supplies."""
    from powertrain.predict.node_power import node_power
    from powertrain.predict.published import load_published

    node, cooling, _, dev = _smc_node()
    assert cooling == "immersion" and node.host is not None and node.host.cpu_tdp_w == 300
    run = next(r for r in load_published() if r.id == "mlperf40_smc_gpt3_512gpu_power")
    host = node_power(0.0, node, cooling)
    assert host.fans_w == 0 and host.host_w is not None
    implied = (float(run.raw["measured"]["node_power_dc_w"]) - host.host_w) / 8
    assert dev.idle_w < implied <= 1.02 * dev.tdp_w, implied
    gpu = predict(run.case).metrics["power_mean_w"]
    pred = node_power(8 * gpu, node, cooling)
    assert pred.dc_w == pytest.approx(8 * gpu + host.host_w)
    assert pred.ac_w == pytest.approx(pred.dc_w / pred.psu_efficiency)


def test_mlperf_node_power_within_ten_percent() -> None:
    """Predicted node power (8 GPUs + the SMC node's host terms, through the supplies) within 10 % of the
    measured means, AC and DC."""
    from powertrain.predict.node_power import node_power
    from powertrain.predict.published import load_published

    node, cooling, _, _ = _smc_node()
    run = next(r for r in load_published() if r.id == "mlperf40_smc_gpt3_512gpu_power")
    pred = node_power(8 * predict(run.case).metrics["power_mean_w"], node, cooling)
    assert pred.dc_w is not None and pred.ac_w is not None
    assert abs(pred.dc_w / float(run.raw["measured"]["node_power_dc_w"]) - 1) <= 0.10
    assert abs(pred.ac_w / float(run.raw["measured"]["node_power_ac_w"]) - 1) <= 0.10


def test_node_power_is_one_formula_for_predict_and_advise(tmp_path: Path) -> None:
    """predict's node energy and the advisor's node power use the same formula (power.node_power_w, built from
    the catalog's node description); other power supplies change both; a profile that still sets the retired
    psu_efficiency or host_w_per_node is refused naming what replaced them."""
    import yaml

    from powertrain.hardware import PsuSpec
    from powertrain.predict import load_calibration
    from powertrain.predict.calibration import calibration_from_dict
    from powertrain.predict.power import node_power_w

    cal = load_calibration("default")
    dev = get_device("h100-sxm")
    case = Case(layers=8, hidden=1024, ffn=4096, heads=8, kv_heads=8, vocab=32000, seq_len=2048, dp=8, micro_batch=1,
                global_batch=8, device=dev, devices_per_node=8)
    p = predict(case, cal)
    t, devices_j = p.metrics["step_time_mean_s"], p.metrics["energy_per_step_j"]
    assert p.breakdown["node_energy_per_step_j"] == pytest.approx(node_power_w(devices_j / t, 1, dev) * t)
    assert p.breakdown["node_power"]["gpus_w"] == pytest.approx(devices_j / t)
    assert dev.node.host is not None
    # twice the supplies: each at half the load, nearer the low end of the Titanium curve, so less efficient here
    more = replace(dev, node=replace(dev.node, host=replace(dev.node.host, psu=PsuSpec(12, 3300.0, 8))))
    other = predict(replace(case, device=more), cal).breakdown["node_energy_per_step_j"]
    assert other != pytest.approx(p.breakdown["node_energy_per_step_j"])
    raw = yaml.safe_load(yaml.safe_dump(cal.to_dict()))
    for retired in ("psu_efficiency", "host_w_per_node"):
        with pytest.raises(ValueError, match=f"{retired} no longer change.*node_power.py.*delete the line"):
            calibration_from_dict({**raw, "coefficients": {**raw["coefficients"], retired: 0.96}}, "my-site.yaml")
