"""The run-level metric names of ``summary.json``: one definition each, with its unit.

This table is the single source for the metric names shared by measured runs and predictions
(``summary.json["metrics"]``), the sweep table's columns, ``powertrain compare`` and the report.
``docs/metrics.md`` explains each one at length; the one-line text here is what tables show.

Conventions that hold for every metric:

* computed over the run's **window** (``summary.json`` ``window``): the one ``run.json`` declares
  (an import's run_start → run_stop, a user's ``--window``), else the measured steps' extent (first
  measured step start → last measured step end), else the whole telemetry span (said in ``notes``);
  energies come from :mod:`powertrain.core.energy` (edges held up to 5 s, null beyond, naming the device);
* a metric with no data is ``None`` and ``why_null[name]`` says why — never 0;
* "per device" values are averaged over devices unless the description says max.
"""

from __future__ import annotations

from dataclasses import dataclass

from powertrain.schema import Throttle


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    text: str
    better: str = ""  # "higher" | "lower" | "" (neither: descriptive)


_M = Metric
METRICS: list[Metric] = [
    # time
    _M("step_time_mean_s", "s", "mean step time over measured steps (a step = its slowest rank)", "lower"),
    _M("step_time_p50_s", "s", "median step time", "lower"),
    _M("step_time_p99_s", "s", "99th percentile step time (linear interpolation)", "lower"),
    _M("step_time_cv", "", "coefficient of variation of step time (population std / mean)", "lower"),
    _M("tokens_per_s", "tok/s", "tokens of the measured steps / their summed step time, whole job", "higher"),
    _M("samples_per_s", "samples/s", "samples of the measured steps / their summed step time", "higher"),
    _M("tokens_per_s_per_device", "tok/s", "tokens_per_s / number of ranks", "higher"),
    # work
    _M("model_flops_per_step", "FLOP", "model FLOPs of one optimizer step (6·N_active·tokens + attention)"),
    _M("tflops_per_device", "TFLOP/s", "model FLOPs per step / step time / ranks / 1e12", "higher"),
    _M("mfu", "", "model FLOP/s per device / peak FLOP/s per device", "higher"),
    _M("hfu", "", "hardware FLOP/s (model + recomputation) per device / peak", "higher"),
    # energy
    _M("energy_j", "J", "energy of all devices over the run's window: per device counter where present, else integral", "lower"),
    _M("energy_counter_j", "J", "energy from the hardware energy counters, all devices", "lower"),
    _M("energy_integral_j", "J", "energy from the trapezoid integral of power_w, all devices", "lower"),
    _M("energy_disagreement_pct", "%", "(integral − counter) / counter × 100, over devices with both"),
    _M("j_per_token", "J/tok", "energy_j / tokens of the measured steps", "lower"),
    _M("tokens_per_j", "tok/J", "tokens of the measured steps / energy_j", "higher"),
    _M("samples_per_s_per_mj_study", "samples/(s·MJ)",
       "the study's metric: samples_per_s / (energy_j / 1e6); divides by time twice — prefer tokens_per_j",
       "higher"),
    # power
    _M("power_mean_w", "W", "per device energy over the window / its seconds, averaged over devices"),
    _M("power_peak_w", "W", "highest power sample of any device: the driver's buffered samples where read, else the polled power_w", "lower"),
    _M("power_p99_w", "W", "99th percentile of all power_w samples of all devices (repeats skipped)", "lower"),
    _M("power_peak_to_mean", "", "highest per-device (peak / mean power)", "lower"),
    _M("power_ramp_max_w_per_s", "W/s", "fastest change of power_w between consecutive samples (repeats skipped), any device", "lower"),
    _M("power_osc_freq_hz", "Hz", "dominant frequency of the device-mean power signal (FFT, DC removed)"),
    _M("power_osc_amp_w", "W", "amplitude (half peak-to-peak of the sine) at that frequency", "lower"),
    _M("power_above_90pct_limit_share", "", "share of samples with power_w ≥ 0.9 × power_limit_w, all devices",
       "lower"),
    _M("power_swing_w", "W", "p99 − p1 of each device's power, averaged over devices", "lower"),
    _M("cluster_power_mean_w", "W", "all devices' energy over the window / its seconds"),
    _M("cluster_power_peak_w", "W", "peak of the sum of all devices' power (per sample period)", "lower"),
    # thermal
    _M("temp_mean_c", "°C", "mean temp_c, averaged over devices", "lower"),
    _M("temp_peak_c", "°C", "highest temp_c of any device", "lower"),
    _M("temp_spread_c", "°C", "largest within-node spread of per-device mean temp_c (max − min)", "lower"),
    _M("temp_spread_pct", "%", "that spread as a share of the node's coolest device mean", "lower"),
    _M("temp_time_to_steady_s", "s", "slowest device's time from the first sample to stay within ±1 °C of its final "
       "temperature (1 s means)", "lower"),
    # clocks
    _M("clock_sm_mean_mhz", "MHz", "mean clock_sm_mhz, averaged over devices", "higher"),
    _M("clock_sm_drop_pct", "%", "(max SM clock − mean) / max × 100; max from device properties or observed",
       "lower"),
    _M("throttle_share", "", "share of samples with any throttle reason other than idle, all devices", "lower"),
    *[_M(f"throttle_share_{t.name.lower()}", "", f"share of samples with throttle reason {t.name.lower()}",
         "lower") for t in Throttle if t.name],
    # balance
    _M("straggler_spread_pct", "%", "per step, (slowest − fastest rank) / median rank step time, mean over steps",
       "lower"),
    _M("straggler_throttle_corr", "", "Pearson correlation over ranks of mean step time vs device throttle share"),
    # interconnect
    _M("link_bytes_per_step", "B", "link_tx_bytes of all devices per measured step (NVLink / xGMI)"),
    _M("link_bw_share", "", "achieved link tx bandwidth per device / its peak link bandwidth"),
    _M("pcie_bytes_per_step", "B", "pcie_tx_bytes of all devices per measured step"),
    # overlap (profiler traces)
    _M("comm_exposed_share", "", "share of a profiled step spent in communication no compute hides (profiles/)",
       "lower"),
    # memory
    _M("mem_per_device_bytes", "B", "peak memory of the fullest device (events' mem_peak_bytes, else mem_used)",
       "lower"),
    # host (what this CPU machine does measure)
    _M("cpu_util_mean_pct", "%", "mean host CPU utilisation over the window"),
    _M("util_mean_pct", "%", "mean device utilisation, averaged over devices", "higher"),
]

METRIC_NAMES: list[str] = [m.name for m in METRICS]
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
THROTTLE_REASONS: list[str] = [t.name.lower() for t in Throttle if t.name]


def unit_of(name: str) -> str:
    m = BY_NAME.get(name)
    return m.unit if m else ""


def format_value(name: str, value: object) -> str:
    """A human string for a metric value (``—`` for null)."""
    if value is None:
        return "—"
    if not isinstance(value, (int, float)):
        return str(value)
    unit = unit_of(name)
    v = float(value)
    if unit == "" and ("share" in name or name in ("mfu", "hfu")):
        return f"{100 * v:.3g} %"
    if unit == "B":
        for scale, suffix in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(v) >= scale:
                return f"{v / scale:.2f} {suffix}"
        return f"{v:.0f} B"
    if abs(v) >= 1e6 or (abs(v) < 1e-3 and v != 0):
        text = f"{v:.3e}"
    elif abs(v) >= 100:
        text = f"{v:,.1f}"
    else:
        text = f"{v:.4g}"
    return f"{text} {unit}".strip()
