"""Issue 30, the analysis half: repeats are not samples, peaks come from the driver's buffer where it
was read, every power figure names its field and effective rate, energy comes from the counter with
∫power as a cross-check, and a run whose steps are locked to the update period (or whose phase is
shorter than the window) says what the power figures cannot resolve — in summary.json, in
``powertrain summarize`` and in the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from powertrain.analyze import synthetic
from powertrain.analyze.summary import summarize_run
from powertrain.cli import app
from powertrain.report import build_report

# What the sampler records for an H100's instantaneous field (telemetry.sensor_facts): probed update
# period 100 ms, the published 25 ms window (Yang et al., SC'24), and the energy counter.
SENSORS = {"sensors": {
    "power_w": {"source": "instant", "nvml": "NVML_FI_DEV_POWER_INSTANT", "update_period_s": 0.1,
                "period_from": "probe", "averaging_window_s": 0.025, "published_update_period_s": 0.1,
                "window_source": "yang-sc24", "path": "polled"},
    "energy_j": {"source": "energy_counter", "nvml": "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "path": "polled"}},
    "power_buffer": {"used": False, "depth": None, "why_not": "not offered"}}


def _summary(run: Path) -> dict[str, Any]:
    return summarize_run(run, probe_cpu_peak=False)


def _fresh(run: Path, summ: dict[str, Any], device: str = "gpu0") -> tuple[np.ndarray, np.ndarray]:
    """One device's in-window power samples (readings not marked as repeats): times and values."""
    t = pq.read_table(run / "telemetry" / "node0.parquet").to_pandas()
    w = summ["window"]
    t = t[(t.device == device) & (t.t_ns >= w["t0_ns"]) & (t.t_ns <= w["t1_ns"])]
    if "power_repeat" in t:
        t = t[t.power_repeat.ne(True)]
    return t.t_ns.to_numpy(), t.power_w.to_numpy()


def _summarize_cli(run: Path) -> str:
    res = CliRunner().invoke(app, ["summarize", str(run), "--refresh"])
    assert res.exit_code == 0, res.output
    return res.output


def test_repeats_are_not_samples(tmp_path):
    """20 Hz polling of a field the driver refreshes at 10 Hz: half the readings repeat the last value.
    Marked, they leave the rate (10 Hz), the peak, p99, swing, ramp and spectrum to the fresh samples;
    energy and mean power (the readings as held) do not move."""
    kw = dict(devices_per_host=1, rate_hz=20.0, refresh_hz=10.0, freq_hz=0.7, steps=10, step_s=1.037,
              device_properties=SENSORS)
    marked = synthetic.write_run(tmp_path / "marked", repeats="marked", **kw)
    unknown = synthetic.write_run(tmp_path / "unknown", repeats="unknown", **kw)
    s, u = _summary(marked), _summary(unknown)
    t, p = _fresh(marked, s)
    dev = s["data_quality"]["devices"][0]
    assert dev["rate_hz"] == pytest.approx(20.0)  # the rows: the sampler polled at 20 Hz
    assert dev["power"]["rate_hz"] == pytest.approx(10.0, rel=1e-3)  # the samples: the driver's 10 Hz
    assert dev["power"]["samples"] == p.size and dev["power"]["repeats"] == dev["power"]["readings"] - p.size
    assert s["per_device"][0]["power_rate_hz"] == pytest.approx(10.0, rel=1e-3)
    m = s["metrics"]
    assert m["power_peak_w"] == p.max()
    assert m["power_p99_w"] == pytest.approx(np.quantile(p, 0.99), rel=1e-12)
    assert m["power_swing_w"] == pytest.approx(np.quantile(p, 0.99) - np.quantile(p, 0.01), rel=1e-12)
    # between fresh samples 100 ms apart, not a held value's 50 ms jump
    assert m["power_ramp_max_w_per_s"] == pytest.approx(np.max(np.abs(np.diff(p)) / (np.diff(t) / 1e9)), rel=1e-12)
    assert m["power_ramp_max_w_per_s"] == pytest.approx(u["metrics"]["power_ramp_max_w_per_s"] / 2, rel=1e-9)
    assert m["power_osc_freq_hz"] == pytest.approx(0.7, abs=0.05)
    # unmarked, the same readings give today's figures: every reading a sample
    assert u["data_quality"]["devices"][0]["power"]["rate_hz"] == pytest.approx(20.0)
    assert u["data_quality"]["devices"][0]["power"]["repeats"] is None
    for k in ("energy_j", "energy_integral_j", "energy_counter_j", "power_mean_w", "cluster_power_mean_w"):
        assert m[k] == u["metrics"][k], k  # a held value is the sensor's output: energy does not move
    src = s["sources"]["power"]["power_p99_w"]
    assert (src["field"], src["source"], src["nvml"], src["path"], src["repeats"]) == (
        "power_w", "instant", "NVML_FI_DEV_POWER_INSTANT", "polled", "excluded")
    assert src["rate_hz"] == pytest.approx(10.0, rel=1e-3) and src["polled_rate_hz"] == pytest.approx(20.0)
    assert (src["averaging_window_s"], src["update_period_s"], src["update_period_from"]) == (0.025, 0.1, "probed")
    assert u["sources"]["power"]["power_p99_w"]["repeats"] == "not marked"
    out = _summarize_cli(marked)
    assert ("power: power_w (instant field, NVML_FI_DEV_POWER_INSTANT), 10 Hz fresh of 20 Hz polled, 25 ms window, "
            "updated every 100 ms (probed); peak from the polled samples at 10 Hz") in out
    assert "20 Hz polled (repeats not marked)" in _summarize_cli(unknown)


def test_peak_comes_from_the_drivers_buffer(tmp_path):
    """Buffered samples at 100 Hz see the sine's crest; the 10 Hz polled samples miss it. The peak is
    the buffer's and says so; the polled one is kept beside it."""
    props = {**SENSORS, "power_buffer": {"used": True, "depth": 100, "why_not": None}}
    run = synthetic.write_run(tmp_path / "r", devices_per_host=2, rate_hz=10.0, freq_hz=1.0, step_s=1.037,
                              buffer_hz=100.0, device_properties=props, repeats="marked")
    s = _summary(run)
    assert s["metrics"]["power_peak_w"] == pytest.approx(600.0, rel=1e-9)  # base 500 + amplitude 100
    row = s["per_device"][0]
    assert row["power_peak_from"] == "buffer" and row["power_peak_w"] == pytest.approx(600.0, rel=1e-9)
    assert row["power_peak_polled_w"] < 599.0  # the polled samples land beside the crest
    assert s["metrics"]["power_peak_to_mean"] == pytest.approx(600.0 / s["per_device"][0]["power_mean_w"], rel=1e-9)
    peak = s["sources"]["power"]["power_peak_w"]
    assert (peak["path"], peak["field"], peak["source"]) == ("buffer", "power_samples", "driver_buffer")
    assert peak["rate_hz"] == pytest.approx(100.0)
    buf = s["data_quality"]["devices"][0]["power"]["buffer"]
    assert buf["samples"] > 400 and buf["peak_w"] == pytest.approx(600.0, rel=1e-9)
    assert s["data_quality"]["devices"][0]["power"]["buffer_recorded"]["used"] is True
    # the cluster peak stays on the polled samples: a sum needs every device's reading at one moment
    assert s["sources"]["power"]["cluster_power_peak_w"]["path"] == "polled"
    assert "peak from the driver's buffer at 100 Hz (node0/gpu0)" in _summarize_cli(run)
    html = build_report(run, tmp_path / "rep", ("png",)).read_text()
    assert "peak from the driver&#x27;s buffer at 100 Hz" in html and "power_samples (driver_buffer), buffer" in html


def test_phase_locked_steps_are_said_to_alias(tmp_path):
    """1.0 s steps, a field refreshed every 100 ms on the same clock: every step is sampled at the same
    ten phases, and its 25 ms window sees a quarter of the step. The summary, summarize and the
    report say so; steps of 1.037 s walk across the update period and draw no warning."""
    run = synthetic.write_run(tmp_path / "locked", devices_per_host=2, rate_hz=20.0, refresh_hz=10.0,
                              repeats="marked", step_s=1.0, steps=6, device_properties=SENSORS)
    s = _summary(run)
    cov = s["data_quality"]["coverage"]
    assert cov["step_period_s"] == pytest.approx(1.0) and cov["measured_steps"] == 6
    dev = cov["devices"][0]
    assert dev["aliased"] is True and dev["phase_spread_s"] == 0.0 and dev["seen_share"] == pytest.approx(0.25)
    assert dev["steps_per_update"] == pytest.approx(10.0) and dev["update_period_from"] == "probed"
    [warning] = cov["warnings"]
    assert warning.startswith("power_w (instant, NVML_FI_DEV_POWER_INSTANT) cannot resolve the steps' power curve "
                              "on node0/gpu0, node0/gpu1: the step period 1 s is 10 × its update period 100 ms")
    assert "see 25 % of it" in warning and "power_peak_w, power_p99_w" in warning
    assert warning in s["notes"]
    assert f"warning: {warning}" in _summarize_cli(run)
    html = build_report(run, tmp_path / "rep", ("png",)).read_text()
    assert "cannot resolve the steps" in html
    walking = synthetic.write_run(tmp_path / "walking", devices_per_host=1, rate_hz=20.0, refresh_hz=10.0,
                                  repeats="marked", step_s=1.037, steps=6, device_properties=SENSORS)
    w = _summary(walking)["data_quality"]["coverage"]
    assert w["devices"][0]["aliased"] is False and w["devices"][0]["seen_share"] > 0.9 and w["warnings"] == []


def test_a_phase_shorter_than_the_window_is_named(tmp_path):
    """An optimizer phase of about 10 ms under a 25 ms window refreshed every 100 ms: no power figure
    from that field resolves it."""
    splits = (("forward", 0.0, 0.49), ("backward", 0.49, 0.99), ("optimizer", 0.99, 1.0))
    run = synthetic.write_run(tmp_path / "r", devices_per_host=1, rate_hz=10.0, repeats="marked", step_s=1.037,
                              steps=6, phase_splits=splits, device_properties=SENSORS)
    s = _summary(run)
    cov = s["data_quality"]["coverage"]
    opt = next(p for p in cov["phases"] if p["phase"] == "optimizer")
    assert opt["median_s"] == pytest.approx(0.01037, rel=1e-3) and opt["events"] == 6
    assert cov["devices"][0]["short_phases"] == ["optimizer"] and cov["devices"][0]["aliased"] is False
    [warning] = cov["warnings"]
    assert warning == ("power_w (instant, NVML_FI_DEV_POWER_INSTANT) cannot resolve phase optimizer on node0/gpu0: "
                       "it lasts 10.4 ms (median of 6 events), shorter than the field's 25 ms averaging window and "
                       "100 ms update period (probed); no power figure from this field resolves it "
                       "(data_quality.coverage)")
    assert f"warning: {warning}" in _summarize_cli(run)


def test_an_old_run_keeps_its_figures(tmp_path):
    """A run written before the sampler marked repeats or described its fields (no power_repeat column,
    no sensors): every figure is what the analysis gave before (recorded with the code of commit 2a41454),
    and the new keys say what little is known."""
    run = synthetic.write_run(tmp_path / "r", devices_per_host=2, rate_hz=20.0, steps=6, amp_w=80.0, freq_hz=1.1,
                              repeats="absent")
    assert "power_repeat" not in pq.read_schema(run / "telemetry" / "node0.parquet").names
    s = _summary(run)
    before = {"power_peak_w": 580.0, "power_p99_w": 579.9605248292585, "power_swing_w": 159.8973723475176,
              "power_ramp_max_w_per_s": 550.1052474015262, "power_osc_freq_hz": 1.1082988415459536,
              "power_osc_amp_w": 77.02305902167518, "cluster_power_peak_w": 1160.0,
              "cluster_power_mean_w": 997.7547615737394, "power_mean_w": 498.8773807868697,
              "energy_j": 5986.392883144892, "energy_integral_j": 5986.5285694424365,
              "energy_counter_j": 5986.392883144892, "energy_disagreement_pct": 0.002266578558959722,
              "power_peak_to_mean": 1.162610337404308}
    assert {k: s["metrics"][k] for k in before} == before
    assert [(d["rate_hz"], d["samples"]) for d in s["data_quality"]["devices"]] == [(20.0, 121), (20.0, 121)]
    assert [d["power_p99_w"] for d in s["per_device"]] == [579.9605248292585] * 2
    src = s["sources"]["power"]["power_p99_w"]
    assert (src["source"], src["repeats"], src["rate_hz"], src["update_period_from"]) == (
        None, "not marked", 20.0, "readings; repeats not marked")
    assert s["per_device"][0]["power_peak_from"] == "polled"
    assert s["data_quality"]["energy_check"]["note"] is None  # 0.002 %: no note
    assert "power: power_w (source not recorded), 20 Hz polled (repeats not marked)" in _summarize_cli(run)


def test_counter_against_integral_disagreement_is_a_note(tmp_path):
    """An energy counter 3 % below ∫power: energy_j is the counter's, both figures are named in a note,
    in summarize's output and in the report; never a silent substitute."""
    run = synthetic.write_run(tmp_path / "r", devices_per_host=2, rate_hz=20.0, step_s=1.037, repeats="marked",
                              counter_scale=1 / 1.03, device_properties=SENSORS)
    s = _summary(run)
    m = s["metrics"]
    assert m["energy_disagreement_pct"] == pytest.approx(3.0, abs=0.01)
    assert m["energy_j"] == m["energy_counter_j"] and s["sources"]["energy"] == "counter"
    assert s["sources"]["power"]["energy_j"] == {"field": "energy_j", "source": "energy_counter"}
    assert s["sources"]["power"]["energy_counter_j"]["nvml"] == "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    check = s["data_quality"]["energy_check"]
    assert check["integral_j"] == m["energy_integral_j"] and check["counter_j"] == m["energy_counter_j"]
    note = check["note"]
    assert note.startswith(f"energy: the integral of the power readings ({m['energy_integral_j']:.6g} J) is +3.00 % "
                           f"off the energy counter ({m['energy_counter_j']:.6g} J)")
    assert note in s["notes"]
    out = _summarize_cli(run)
    assert f"warning: {note}" in out and "energy from the counter (energy_j)" in out
    html = build_report(run, tmp_path / "rep", ("png",)).read_text()
    assert "+3.00 % off the energy counter" in html
    agree = synthetic.write_run(tmp_path / "agree", devices_per_host=1, step_s=1.037, device_properties=SENSORS)
    assert _summary(agree)["data_quality"]["energy_check"]["note"] is None


def test_summary_json_records_the_sources(tmp_path):
    """What summarize writes: sources.power for every power figure, data_quality.devices[].power."""
    run = synthetic.write_run(tmp_path / "r", devices_per_host=1, rate_hz=20.0, refresh_hz=10.0, repeats="marked",
                              step_s=1.037, device_properties=SENSORS)
    _summarize_cli(run)
    summ = json.loads((run / "summary.json").read_text())
    assert summ["schema"] == "powertrain.summary/3"
    power = summ["sources"]["power"]
    for k in ("power_peak_w", "power_mean_w", "power_p99_w", "power_swing_w", "power_ramp_max_w_per_s",
              "power_osc_freq_hz", "power_osc_amp_w", "cluster_power_mean_w", "cluster_power_peak_w",
              "energy_integral_j", "energy_counter_j", "energy_j"):
        assert power[k]["field"] in ("power_w", "energy_j", "power_samples"), k
    assert power["power_mean_w"]["readings"].startswith("every reading, held")
    assert summ["data_quality"]["devices"][0]["power"]["repeats_marked"] == "all readings"
