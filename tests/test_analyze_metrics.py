"""Metrics on synthetic runs whose answers are known by construction (see powertrain.analyze.synthetic)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from powertrain.analyze import METRIC_NAMES, load_summary, summarize_run, synthetic
from powertrain.analyze import signal as sig
from powertrain.analyze.summary import classify_status
from powertrain.schema import Throttle
from powertrain.store.rundir import RunDir

BASE, AMP, FREQ = 500.0, 100.0, 0.5
SHARES = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "r1"
    synthetic.write_run(path, hosts=2, devices_per_host=4, base_w=BASE, amp_w=AMP, freq_hz=FREQ,
                        throttle_share=SHARES, link_bps=1e9, steps=6, step_s=1.0, temp_step_c=2.0,
                        power_limit_w=(BASE + 0.9 * AMP) / 0.9,
                        device_properties={"clock_sm_max_mhz": 2000.0})
    return path, summarize_run(path)


def test_time_and_throughput(gpu_run):
    _, s = gpu_run
    m = s["metrics"]
    assert m["step_time_mean_s"] == pytest.approx(1.0)
    assert m["step_time_cv"] == pytest.approx(0.0, abs=1e-9)
    # 8 ranks, each its own data-parallel replica, 1024 tokens per step each
    assert m["tokens_per_s"] == pytest.approx(8 * 1024)
    assert m["samples_per_s"] == pytest.approx(64)
    assert m["tokens_per_s_per_device"] == pytest.approx(1024)
    assert s["window"]["measured_steps"] == 6


def test_energy_counter_and_integral_agree_with_construction(gpu_run):
    _, s = gpu_run
    m = s["metrics"]
    # window = 6 whole seconds = 3 periods of the 0.5 Hz sine: the sine integrates to zero
    expected = 8 * BASE * 6.0
    assert m["energy_counter_j"] == pytest.approx(expected, rel=1e-9)
    assert m["energy_integral_j"] == pytest.approx(expected, rel=1e-3)
    assert abs(m["energy_disagreement_pct"]) < 0.1
    assert m["energy_j"] == m["energy_counter_j"] and s["sources"]["energy"] == "counter"
    tokens = 8 * 1024 * 6
    assert m["j_per_token"] == pytest.approx(expected / tokens, rel=1e-6)
    assert m["tokens_per_j"] == pytest.approx(tokens / expected, rel=1e-6)
    # the study's samples/(s·MJ): samples/s divided by energy in MJ
    assert m["samples_per_s_per_mj_study"] == pytest.approx(64 / (expected / 1e6), rel=1e-6)


def test_power_peaks_oscillation_and_cluster(gpu_run):
    _, s = gpu_run
    m = s["metrics"]
    assert m["power_mean_w"] == pytest.approx(BASE, abs=1.0)
    assert m["power_peak_w"] == pytest.approx(BASE + AMP)  # sampled exactly at the crest (t = k + 0.5)
    assert m["power_peak_to_mean"] == pytest.approx((BASE + AMP) / BASE, rel=1e-2)
    assert m["power_osc_freq_hz"] == pytest.approx(FREQ, rel=0.03)
    assert m["power_osc_amp_w"] == pytest.approx(AMP, rel=0.05)
    assert m["cluster_power_mean_w"] == pytest.approx(8 * BASE, rel=0.01)
    assert m["cluster_power_peak_w"] == pytest.approx(8 * (BASE + AMP), rel=0.01)
    # steepest chord of a 0.5 Hz sine sampled at 10 Hz: amp·sin(π·0.1)/0.1 (through a zero crossing)
    assert m["power_ramp_max_w_per_s"] == pytest.approx(AMP * math.sin(math.pi * 0.1) / 0.1, rel=1e-6)
    # 0.9 × limit = BASE + 0.9·AMP: sin(πt) ≥ 0.9 holds for the 3 samples around each crest
    # (t = k+0.4, k+0.5, k+0.6; sin(0.4π) = 0.951), 3 crests in the 6 s window, 61 samples
    assert m["power_above_90pct_limit_share"] == pytest.approx(9 / 61, rel=1e-6)
    dev = s["per_device"][0]
    assert dev["power_osc_freq_hz"] == pytest.approx(FREQ, rel=0.03)


def test_thermal_clock_throttle(gpu_run):
    _, s = gpu_run
    m = s["metrics"]
    assert m["temp_mean_c"] == pytest.approx(53.0)  # slots 0..3 at 50, 52, 54, 56 on each node
    assert m["temp_peak_c"] == pytest.approx(56.0)
    assert m["temp_spread_c"] == pytest.approx(6.0)
    assert m["temp_spread_pct"] == pytest.approx(12.0)
    # every second, device g is power-capped for its first SHARES[g] of it
    assert m["throttle_share"] == pytest.approx(np.mean(SHARES), abs=0.02)
    assert m["throttle_share_power_cap"] == pytest.approx(m["throttle_share"])
    assert m["throttle_share_thermal_hw"] == 0.0
    # throttled samples run 300 MHz lower; the reference maximum is the device property (2000)
    expected_mean = 1980 - 300 * m["throttle_share"]
    assert m["clock_sm_mean_mhz"] == pytest.approx(expected_mean, abs=0.5)
    assert m["clock_sm_drop_pct"] == pytest.approx((2000 - expected_mean) / 2000 * 100, abs=0.05)
    per_dev = {(d["host"], d["device"]): d for d in s["per_device"]}
    assert per_dev[("node1", "gpu3")]["throttle_share"] == pytest.approx(0.7, abs=0.03)


def test_link_bytes_and_memory(gpu_run):
    _, s = gpu_run
    m = s["metrics"]
    assert m["link_bytes_per_step"] == pytest.approx(8 * 1e9 * 1.0, rel=1e-6)
    assert m["mem_per_device_bytes"] == 40 << 30
    assert m["pcie_bytes_per_step"] is None and "pcie" in s["why_null"]["pcie_bytes_per_step"]


def test_per_node_stage_views(gpu_run):
    _, s = gpu_run
    assert [n["host"] for n in s["per_node"]] == ["node0", "node1"]
    assert s["per_node"][0]["energy_j"] == pytest.approx(4 * BASE * 6.0, rel=1e-6)
    assert s["per_step"][0]["power_mean_w"] is not None
    assert {p["kind"] for p in s["phases"]} == {"forward", "backward", "optimizer"}


def test_flops_and_mfu_use_catalog_peak(gpu_run):
    _, s = gpu_run
    m = s["metrics"]
    from powertrain.spec.model import get_model

    g = get_model("gpt3-tiny")
    # 6·(L·(4h² + 2h·ffn) + h·V) + 12·L·h·s  (GPT: MHA, GELU MLP)
    per_tok = 6 * (g.layers * (4 * g.hidden**2 + 2 * g.hidden * g.ffn) + g.hidden * g.vocab) \
        + 12 * g.layers * g.hidden * g.seq_len
    if s["sources"]["model_flops"].startswith("powertrain.analyze"):
        assert m["model_flops_per_step"] == pytest.approx(per_tok * 8 * 1024)
    assert m["tflops_per_device"] == pytest.approx(m["model_flops_per_step"] / 1.0 / 8 / 1e12)
    if m["mfu"] is not None:
        assert 0 < m["mfu"] < 1 and m["hfu"] == pytest.approx(m["mfu"])  # no recomputation
        assert "catalog" in s["sources"]["peak_flops"]
    else:
        assert s["why_null"]["mfu"]


def test_per_stage_and_expert_views(tmp_path):
    # pp=2 over 4 ranks: ranks 0,1 are stage 0 (cooler slots), ranks 2,3 stage 1; ep=2 splits dp
    path = synthetic.write_run(tmp_path / "pp", hosts=1, devices_per_host=4, layout={"pp": 2, "ep": 2}, steps=2,
                               temp_step_c=4.0, power_step_w=10.0)
    s = summarize_run(path, probe_cpu_peak=False)
    stages = {v["pp"]: v for v in s["per_stage"]}
    assert set(stages) == {0, 1} and stages[0]["devices"] == 2
    assert stages[0]["temp_mean_c"] == pytest.approx(52.0) and stages[1]["temp_mean_c"] == pytest.approx(60.0)
    assert stages[1]["power_mean_w"] - stages[0]["power_mean_w"] == pytest.approx(20.0, abs=0.5)
    assert {v["ep"] for v in s["per_expert_rank"]} == {0, 1}
    # 2 data-parallel replicas of 1024 tokens per step
    assert s["metrics"]["tokens_per_s"] == pytest.approx(2048)


def test_stragglers_correlate_with_throttling(tmp_path):
    # rank r is slower by 0.05·r s and its device throttles more: correlation is +1 by construction
    path = synthetic.write_run(tmp_path / "s", hosts=1, devices_per_host=4, straggle_s=0.05,
                               throttle_share=[0.0, 0.2, 0.4, 0.6], steps=3)
    m = summarize_run(path, probe_cpu_peak=False)["metrics"]
    # slowest 1.15 s, fastest 1.0 s, median 1.075 s
    assert m["straggler_spread_pct"] == pytest.approx(0.15 / 1.075 * 100, rel=1e-6)
    assert m["step_time_mean_s"] == pytest.approx(1.15)
    assert m["straggler_throttle_corr"] == pytest.approx(1.0, abs=0.02)


def test_null_fields_give_null_metrics_not_zeros(tmp_path):
    # a CPU run that measures only utilisation: no power, temperature, clocks, counters
    path = synthetic.write_run(tmp_path / "cpu", hosts=1, devices_per_host=1, kind="cpu", device_type="cpu",
                               fields=["util_pct"], steps=3)
    s = summarize_run(path, probe_cpu_peak=False)
    m, why = s["metrics"], s["why_null"]
    for name in ("power_mean_w", "power_peak_w", "power_p99_w", "power_ramp_max_w_per_s", "power_osc_freq_hz",
                 "energy_j", "energy_counter_j", "energy_integral_j", "j_per_token", "tokens_per_j",
                 "samples_per_s_per_mj_study", "temp_mean_c", "temp_spread_c", "clock_sm_mean_mhz",
                 "clock_sm_drop_pct", "throttle_share", "throttle_share_power_cap", "link_bytes_per_step"):
        assert m[name] is None, name
        assert why[name], name
    assert "no power field" in why["power_mean_w"]
    assert "temperature" in why["temp_mean_c"]
    assert m["step_time_mean_s"] == pytest.approx(1.0)
    assert m["util_mean_pct"] == pytest.approx(95.0)
    assert set(m) == set(METRIC_NAMES)
    assert all(m[k] is not None or k in why for k in METRIC_NAMES)  # every null says why


def test_no_events_no_telemetry(tmp_path):
    run = RunDir(tmp_path / "empty").create()
    run.write({"status": "ok", "name": "empty"})
    s = summarize_run(run.path)
    assert all(v is None for v in s["metrics"].values())
    assert "no measured step" in s["why_null"]["step_time_mean_s"]
    assert "no telemetry" in s["why_null"]["power_mean_w"]


def test_window_edges_between_samples_are_interpolated(tmp_path):
    # constant 200 W at 1 Hz, a window that starts and ends between samples: energy = 200 W × window
    path = synthetic.write_run(tmp_path / "edges", hosts=1, devices_per_host=1, rate_hz=1.0, amp_w=0.0,
                               base_w=200.0, energy_counter=False, steps=4, step_s=1.3, start_pad_s=0.25)
    s = summarize_run(path, probe_cpu_peak=False)
    assert s["window"]["seconds"] == pytest.approx(5.2)
    assert s["metrics"]["energy_integral_j"] == pytest.approx(200.0 * 5.2, rel=1e-9)
    assert s["metrics"]["energy_j"] == s["metrics"]["energy_integral_j"]
    assert s["sources"]["energy"] == "integral"
    assert "energy_counter_j" in s["why_null"]


def test_power_step_ramp_and_gap_counted(tmp_path):
    path = synthetic.write_run(tmp_path / "step", hosts=1, devices_per_host=1, amp_w=0.0, steps=4)
    f = RunDir(path).telemetry_file("node0")
    t = pq.read_table(f)
    tn = t["t_ns"].to_numpy()
    p = np.where(tn >= tn[30], 700.0, 300.0)  # one jump of 400 W within one 0.1 s period
    keep = np.ones(len(tn), bool)
    keep[20:25] = False  # a 0.6 s hole in the samples
    t = t.set_column(t.schema.get_field_index("power_w"), "power_w", pa.array(p))
    pq.write_table(t.filter(pa.array(keep)), f)
    s = summarize_run(path, probe_cpu_peak=False)
    assert s["metrics"]["power_ramp_max_w_per_s"] == pytest.approx(4000.0)
    assert s["metrics"]["power_peak_w"] == 700.0
    dq = s["data_quality"]["devices"][0]
    assert dq["gaps"] == 1 and dq["max_interval_s"] == pytest.approx(0.6)


def test_time_to_steady_state(tmp_path):
    # first-order warm-up 40 → 70 °C with a 20 s time constant: within 1 °C of 70 after 20·ln(30) s
    path = synthetic.write_run(tmp_path / "warm", hosts=1, devices_per_host=1, steps=200, step_s=1.0, amp_w=0.0)
    f = RunDir(path).telemetry_file("node0")
    t = pq.read_table(f)
    ts = (t["t_ns"].to_numpy() - t["t_ns"].to_numpy()[0]) / 1e9
    temp = 70.0 - 30.0 * np.exp(-ts / 20.0)
    pq.write_table(t.set_column(t.schema.get_field_index("temp_c"), "temp_c", pa.array(temp)), f)
    s = summarize_run(path, probe_cpu_peak=False)
    # the final level is the mean of the last 10 % (≈ 70 − tiny): 1 s buckets round up to the next second
    assert s["metrics"]["temp_time_to_steady_s"] == pytest.approx(20 * math.log(30), abs=1.5)
    assert sig.time_to_steady(np.arange(20.0), np.r_[np.zeros(19), 5.0]) is None  # never settles


def test_signal_functions_known_answers():
    t = (np.arange(0, 1000) * 1e7).astype(np.int64)  # 100 Hz for 10 s
    x = 3.0 + 2.0 * np.sin(2 * np.pi * 5.0 * t / 1e9)
    f, a = sig.dominant_oscillation(t, x)
    assert f == pytest.approx(5.0, rel=0.01) and a == pytest.approx(2.0, rel=0.02)
    assert sig.dominant_oscillation(t, np.full(len(t), 7.0)) is None
    assert sig.trapezoid_j(t, np.full(len(t), 10.0)) == pytest.approx(10.0 * 9.99)
    assert sig.trapezoid_j(t[:1], x[:1]) is None
    assert sig.counter_delta(t[:3], np.array([5.0, 7.0, 1.0])) == 2.0  # a reset contributes nothing
    assert sig.pearson(np.array([1.0, 2.0]), np.array([1.0, 2.0])) is None


def test_status_oom_only_when_memory_is_named():
    assert classify_status("failed", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB") == "oom"
    assert classify_status("failed", "command exited with code 1", "torch.OutOfMemoryError: ...") == "oom"
    assert classify_status("failed", "command killed by SIGSEGV") == "failed"
    assert classify_status("failed", "NCCL timeout after 600 s") == "failed"
    assert classify_status("ok", "out of memory") == "ok"


def test_summary_written_and_reused(tmp_path):
    path = synthetic.write_run(tmp_path / "w", hosts=1, devices_per_host=2, steps=2)
    s = load_summary(path)
    on_disk = json.loads((path / "summary.json").read_text())
    assert on_disk["kind"] == "measured" and on_disk["metrics"]["step_time_mean_s"] == s["metrics"]["step_time_mean_s"]
    assert json.dumps(on_disk)  # JSON-clean (no NaN)
    assert "NaN" not in (path / "summary.json").read_text()


def test_prediction_summary_passed_through(tmp_path):
    run = RunDir(tmp_path / "pred").create()
    run.write({"kind": "prediction", "name": "pred", "status": "ok"})
    (run.path / "summary.json").write_text(json.dumps(
        {"kind": "prediction", "run": "pred", "status": "ok", "metrics": {"step_time_mean_s": 2.0}}))
    s = load_summary(run.path)
    assert s["kind"] == "prediction" and s["metrics"]["step_time_mean_s"] == 2.0


def test_throttle_names_cover_schema():
    assert all(f"throttle_share_{t.name.lower()}" in METRIC_NAMES for t in Throttle if t.name)


def test_energy_per_step_is_the_cluster_power_integrated_over_each_step(tmp_path):
    path = synthetic.write_run(tmp_path / "flat", hosts=2, devices_per_host=4, base_w=BASE, amp_w=0.0,
                               steps=4, step_s=1.0)
    per_step = summarize_run(path)["per_step"]
    assert len(per_step) == 4
    for row in per_step:  # 8 devices × 500 W × 1 s
        assert row["energy_j"] == pytest.approx(8 * BASE * 1.0, rel=0.02)
