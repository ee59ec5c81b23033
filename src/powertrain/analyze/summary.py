"""``summary.json`` of one run: every metric of :mod:`powertrain.analyze.metrics`, per run, per
device, per node, per step, per pipeline stage and per expert-parallel rank.

Which devices count: the run's accelerators (every device whose kind is not ``cpu``) when it has
any; otherwise its host devices (``cpu`` rows), which is what a CPU-only run measures. Host rows of a
GPU run are reported under ``per_device`` but do not enter the accelerator metrics.

A run directory whose ``run.json`` has ``kind: "prediction"`` is not re-analysed: its
``summary.json`` (written by the predictor) is returned as is, labelled ``kind: "prediction"``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from powertrain.analyze import profiles, signal, steps, telemetry, work
from powertrain.analyze.metrics import METRIC_NAMES, THROTTLE_REASONS
from powertrain.store.rundir import RunDir, read_json, write_json_atomic
from powertrain.store.tables import read_events

SUMMARY_SCHEMA = "powertrain.summary/1"
# Above this many in-window power samples, per-device spectra are skipped (the run-level oscillation
# still comes from the device-mean signal).
PER_DEVICE_SPECTRUM_MAX_ROWS = 2_000_000

OOM_PATTERN = re.compile(
    r"out of memory|outofmemoryerror|\boom\b|cannot allocate memory|memoryerror|oom-kill|killed by sigkill.*memory",
    re.IGNORECASE,
)


def _clean(v: Any) -> Any:
    """JSON-safe value: numpy scalars to Python, NaN/inf to None (unknown is null)."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def log_tail(run: RunDir, limit: int = 8192) -> str:
    """The last bytes of every log file of a run (for failure classification)."""
    out = []
    if run.logs_dir.is_dir():
        for p in sorted(run.logs_dir.iterdir()):
            if p.is_file():
                try:
                    with open(p, "rb") as f:
                        f.seek(max(0, p.stat().st_size - limit))
                        out.append(f.read().decode(errors="replace"))
                except OSError:
                    continue
    return "\n".join(out)


def classify_status(status: str | None, reason: str | None, logs: str = "") -> str:
    """``oom`` for a failed run whose reason or log tail says it ran out of memory; else the status.

    Only an explicit out-of-memory message counts: other crashes stay ``failed``.
    """
    if status == "failed" and (OOM_PATTERN.search(reason or "") or OOM_PATTERN.search(logs)):
        return "oom"
    return status or "failed"


def _device_kind(info: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d.get("host"), d.get("device")): d for d in info.get("devices", []) or []}


def _fmt_na(reason: str) -> str:
    return reason


def summarize_run(path: str | Path, *, probe_cpu_peak: bool = True) -> dict[str, Any]:
    """Compute the summary of the run directory ``path`` (does not write it; see :func:`write_summary`)."""
    run = RunDir(path)
    info = run.read()
    if info.get("kind") == "prediction":
        if not run.summary_json.is_file():
            raise FileNotFoundError(f"{run.path} is a prediction without summary.json; re-run `powertrain predict`")
        summ = read_json(run.summary_json)
        summ["kind"] = "prediction"
        summ.setdefault("run", info.get("name") or run.path.name)
        summ.setdefault("status", info.get("status") or "ok")
        summ.setdefault("reason", info.get("reason"))
        summ.setdefault("config", info.get("config"))
        return summ

    status = run.effective_status()
    status = classify_status(status, info.get("reason"), log_tail(run) if status == "failed" else "")
    config = info.get("config")
    rank_map = info.get("rank_map") or []
    metrics: dict[str, Any] = dict.fromkeys(METRIC_NAMES)
    why: dict[str, str] = {}
    notes: list[str] = []

    # --- steps --------------------------------------------------------------------------------
    events = read_events(run.path)
    sd = steps.measured_steps(events, rank_map, info.get("warmup_steps"))
    if sd is not None and sd.window_rule:
        notes.append(sd.window_rule)
    m, w = steps.step_stats(sd)
    metrics.update(m)
    why.update(w)

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    n_rows = telemetry.open_telemetry(con, run.path)
    tspan = telemetry.span(con)
    if sd is not None:
        w0, w1 = sd.window
        window_source = "measured steps"
    elif tspan is not None:
        w0, w1 = tspan
        window_source = "whole telemetry span (no measured step events)"
        notes.append("no measured step events: telemetry metrics cover the whole run")
    else:
        w0 = w1 = 0
        window_source = "none"
    window_s = (w1 - w0) / 1e9

    dev_stats = telemetry.device_stats(con, w0, w1) if n_rows and w1 > w0 else []
    kinds = _device_kind(info)

    def kind_of(s: dict[str, Any]) -> str:
        d = kinds.get((s["host"], s["device"]))
        if d and d.get("kind"):
            return str(d["kind"])
        return "cpu" if s["device"].startswith("cpu") else "accelerator"

    accel = [s for s in dev_stats if kind_of(s) != "cpu"]
    counted = accel or dev_stats
    n_dev = len(counted)
    no_tel = "no telemetry in the measured window" if not dev_stats else None

    def have(field: str) -> list[dict[str, Any]]:
        return [s for s in counted if s.get(f"{field}_n")]

    # --- power ---------------------------------------------------------------------------------
    for s in dev_stats:  # time-weighted mean (integral / time covered): unbiased by uneven sampling
        if s.get("power_w_integral") is not None and s.get("power_w_integral_s"):
            s["power_w_mean"] = s["power_w_integral"] / s["power_w_integral_s"]
    pw = have("power_w")
    if pw:
        metrics["power_mean_w"] = float(np.mean([s["power_w_mean"] for s in pw]))
        metrics["power_peak_w"] = float(max(s["power_w_max"] for s in pw))
        metrics["power_peak_to_mean"] = max(
            (s["power_w_max"] / s["power_w_mean"] for s in pw if s["power_w_mean"]), default=None)
        metrics["power_swing_w"] = float(np.mean([s["power_w_p99"] - s["power_w_p01"] for s in pw]))
        ramps = [s.get("power_w_ramp_max") for s in pw if s.get("power_w_ramp_max") is not None]
        metrics["power_ramp_max_w_per_s"] = float(max(ramps)) if ramps else None
        keys = [(s["host"], s["device"]) for s in pw]
        metrics["power_p99_w"] = _p99_over(con, keys, w0, w1)
    else:
        reason = no_tel or "no power field on these devices"
        for k in ("power_mean_w", "power_peak_w", "power_p99_w", "power_peak_to_mean", "power_ramp_max_w_per_s",
                  "power_osc_freq_hz", "power_osc_amp_w", "power_swing_w", "cluster_power_mean_w",
                  "cluster_power_peak_w", "energy_integral_j"):
            why[k] = reason
    if metrics["power_ramp_max_w_per_s"] is None and pw:
        why["power_ramp_max_w_per_s"] = "fewer than two power samples inside the window"

    lim = [s for s in pw if s.get("power_above_limit_n")]
    if lim:
        metrics["power_above_90pct_limit_share"] = (
            sum(s["power_above_limit"] * s["power_above_limit_n"] for s in lim) / sum(s["power_above_limit_n"] for s in lim))
    else:
        why["power_above_90pct_limit_share"] = why.get("power_mean_w") or "no power_limit_w field on these devices"
    per_step_power: dict[int, float] = {}
    per_step_energy: dict[int, float] = {}
    series = None
    if pw:
        period = float(np.median([s["period_s"] for s in pw if s["period_s"]] or [0.1]))
        bucket_ns = max(int(period * 1e9), 1)
        series = telemetry.device_mean_series(con, w0, w1, bucket_ns)
        n_full = len(pw)
        tot = [t for t, n in zip(series["total"].to_pylist(), series["n"].to_pylist(), strict=True) if n == n_full]
        if tot:
            metrics["cluster_power_mean_w"] = float(np.mean(tot))
            metrics["cluster_power_peak_w"] = float(np.max(tot))
        else:
            why["cluster_power_mean_w"] = why["cluster_power_peak_w"] = "no sample period where every device reported"
        t_ns = series["t_ns"].to_numpy()
        osc = signal.dominant_oscillation(t_ns, series["mean"].to_numpy(), period)
        if osc:
            metrics["power_osc_freq_hz"], metrics["power_osc_amp_w"] = osc
        else:
            why["power_osc_freq_hz"] = why["power_osc_amp_w"] = "too few samples or a flat power signal"
        if sd is not None:
            mean = series["mean"].to_numpy()
            # cluster power (sum over devices) where every device reported, integrated per step window;
            # one bucket beyond the window on each side so the first and last steps are covered too
            wide = telemetry.device_mean_series(con, w0 - bucket_ns, w1 + bucket_ns, bucket_ns)
            full = wide["n"].to_numpy() == n_full
            t_full, total_full = wide["t_ns"].to_numpy()[full], wide["total"].to_numpy()[full].astype(float)
            for s, a, b in zip(sd.steps.tolist(), sd.t_start_ns.tolist(), sd.t_end_ns.tolist(), strict=True):
                sel = (t_ns >= a) & (t_ns <= b)
                if sel.any():
                    per_step_power[s] = float(np.mean(mean[sel]))
                energy = signal.trapezoid_j(*signal.clip_interp(t_full, total_full, a, b))
                if energy is not None:
                    per_step_energy[s] = energy

    # --- energy ---------------------------------------------------------------------------------
    integ = [s for s in pw if s.get("power_w_integral") is not None]
    ctr = [s for s in counted if s.get("energy_j_delta") is not None and s.get("energy_j_n", 1) is not None]
    ctr = [s for s in ctr if s.get("energy_j_delta_s")]
    if integ:
        metrics["energy_integral_j"] = float(sum(s["power_w_integral"] for s in integ))
    if ctr:
        metrics["energy_counter_j"] = float(sum(s["energy_j_delta"] for s in ctr))
    else:
        why["energy_counter_j"] = no_tel or "no hardware energy counter on these devices"
    both = [s for s in counted if s.get("power_w_integral") is not None and s.get("energy_j_delta")]
    if both:
        c = sum(s["energy_j_delta"] for s in both)
        i = sum(s["power_w_integral"] for s in both)
        metrics["energy_disagreement_pct"] = (i - c) / c * 100 if c else None
    else:
        why["energy_disagreement_pct"] = "needs both an energy counter and power samples on the same devices"
    if ctr and len(ctr) == n_dev:
        metrics["energy_j"] = metrics["energy_counter_j"]
        energy_source = "counter"
    elif integ and len(integ) == n_dev:
        metrics["energy_j"] = metrics["energy_integral_j"]
        energy_source = "integral"
    else:
        energy_source = None
        why["energy_j"] = no_tel or "no energy counter or power samples on every device"
    if energy_source and window_s > 0:
        cover_key = "energy_j_delta_s" if energy_source == "counter" else "power_w_integral_s"
        cover = min((s.get(cover_key) or 0.0) for s in counted) / window_s
        if cover < 0.95:
            notes.append(f"energy covers only {100 * cover:.0f}% of the measured window on some device")

    tokens = float(np.sum(sd.tokens)) if sd is not None and not np.isnan(sd.tokens).any() else None
    if metrics["energy_j"] and tokens:
        metrics["j_per_token"] = metrics["energy_j"] / tokens
        metrics["tokens_per_j"] = tokens / metrics["energy_j"]
    else:
        r = why.get("energy_j") or why.get("tokens_per_s") or "no tokens or no energy"
        why["j_per_token"] = why["tokens_per_j"] = r
    if metrics["energy_j"] and metrics["samples_per_s"]:
        metrics["samples_per_s_per_mj_study"] = metrics["samples_per_s"] / (metrics["energy_j"] / 1e6)
    else:
        why["samples_per_s_per_mj_study"] = why.get("energy_j") or why.get("samples_per_s") or "no samples"

    # --- thermal ---------------------------------------------------------------------------------
    tc = have("temp_c")
    if tc:
        metrics["temp_mean_c"] = float(np.mean([s["temp_c_mean"] for s in tc]))
        metrics["temp_peak_c"] = float(max(s["temp_c_max"] for s in tc))
    else:
        for k in ("temp_mean_c", "temp_peak_c", "temp_spread_c", "temp_spread_pct", "temp_time_to_steady_s"):
            why[k] = no_tel or "no temperature field on these devices"
    steady = {(s["host"], s["device"]): s.get("temp_c_steady_s") for s in tc}
    if tc and len(steady) == len(tc) and all(v is not None for v in steady.values()):
        metrics["temp_time_to_steady_s"] = max(steady.values())  # type: ignore[type-var]
    elif tc:
        why["temp_time_to_steady_s"] = "some device's temperature did not settle within ±1 °C before the run ended"
    per_node = _per_node(counted, kind_of)
    spreads = [n for n in per_node if n.get("temp_spread_c") is not None]
    if spreads:
        worst = max(spreads, key=lambda n: n["temp_spread_c"])
        metrics["temp_spread_c"] = worst["temp_spread_c"]
        metrics["temp_spread_pct"] = worst["temp_spread_pct"]
    elif tc:
        why["temp_spread_c"] = why["temp_spread_pct"] = "needs at least two devices with temperature on one node"

    # --- clocks and throttling -------------------------------------------------------------------
    ck = have("clock_sm_mhz")
    if ck:
        metrics["clock_sm_mean_mhz"] = float(np.mean([s["clock_sm_mhz_mean"] for s in ck]))
        drops = []
        observed_max = max(s["clock_sm_mhz_max"] for s in ck)
        for s in ck:
            props = (kinds.get((s["host"], s["device"])) or {}).get("properties") or {}
            ref = props.get("clock_sm_max_mhz") or props.get("max_clock_sm_mhz") or observed_max
            s["clock_sm_ref_mhz"] = ref
            drops.append((ref - s["clock_sm_mhz_mean"]) / ref * 100 if ref else np.nan)
        metrics["clock_sm_drop_pct"] = float(np.nanmean(drops))
    else:
        why["clock_sm_mean_mhz"] = why["clock_sm_drop_pct"] = no_tel or "no SM clock field on these devices"
    th = have("throttle")
    if th:
        total = sum(s["throttle_n"] for s in th)
        metrics["throttle_share"] = sum(s["throttle_any"] * s["throttle_n"] for s in th) / total
        for r in THROTTLE_REASONS:
            metrics[f"throttle_share_{r}"] = sum(s[f"throttle_{r}"] * s["throttle_n"] for s in th) / total
    else:
        reason = no_tel or "no throttle-reason field on these devices"
        why["throttle_share"] = reason
        for r in THROTTLE_REASONS:
            why[f"throttle_share_{r}"] = reason

    # --- balance ---------------------------------------------------------------------------------
    rank_dev = {int(e["rank"]): (e.get("host"), e.get("device")) for e in rank_map if "rank" in e}
    by_dev = {(s["host"], s["device"]): s for s in dev_stats}
    if sd is not None and len(sd.ranks) >= 3 and th:
        xs, ys = [], []
        for i, r in enumerate(sd.ranks):
            s = by_dev.get(rank_dev.get(r, (None, None)))
            if s is not None and s.get("throttle_n"):
                xs.append(float(np.nanmean(sd.rank_step_s[i])))
                ys.append(s["throttle_any"])
        metrics["straggler_throttle_corr"] = signal.pearson(np.array(xs), np.array(ys))
        if metrics["straggler_throttle_corr"] is None:
            why["straggler_throttle_corr"] = "no variation in step time or throttle share across ranks"
    else:
        why["straggler_throttle_corr"] = (
            "needs step events from at least three ranks mapped to devices with a throttle field")

    # --- interconnect and memory ---------------------------------------------------------------
    n_steps = sd.n if sd is not None else None
    for field, metric in (("link_tx_bytes", "link_bytes_per_step"), ("pcie_tx_bytes", "pcie_bytes_per_step")):
        have_ctr = [s for s in counted if s.get(f"{field}_delta") is not None]
        if have_ctr and n_steps:
            metrics[metric] = float(sum(s[f"{field}_delta"] for s in have_ctr) / n_steps)
        else:
            why[metric] = (no_tel or f"no {field} counter on these devices") if not have_ctr else \
                "no measured steps to divide by"
    link_ctr = [s for s in counted if s.get("link_tx_bytes_delta") is not None]
    shares = []
    catalog_link = work.peak_link_bw(((config or {}).get("hardware") or {}).get("device")
                                     if isinstance(config, dict) else None)
    for s in link_ctr:
        props = (kinds.get((s["host"], s["device"])) or {}).get("properties") or {}
        peak = props.get("link_bw_bytes_per_s") or catalog_link
        if peak and s.get("link_tx_bytes_delta_s"):
            shares.append(s["link_tx_bytes_delta"] / s["link_tx_bytes_delta_s"] / peak)
    if shares:
        metrics["link_bw_share"] = float(np.mean(shares))
    else:
        why["link_bw_share"] = ("no link byte counters on these devices" if not link_ctr
                                else "peak link bandwidth unknown (no device property link_bw_bytes_per_s, not in the catalog)")
    mem_ev = [v for v in events["mem_peak_bytes"].to_pylist() if v is not None] if events.num_rows else []
    mem_tel = [s["mem_used_bytes_max"] for s in counted if s.get("mem_used_bytes_max") is not None]
    if mem_ev:
        metrics["mem_per_device_bytes"] = int(max(mem_ev))
    elif mem_tel:
        metrics["mem_per_device_bytes"] = int(max(mem_tel))
    else:
        why["mem_per_device_bytes"] = "no mem_peak_bytes in events and no mem_used_bytes telemetry"
    ut = have("util_pct")
    if ut:
        metrics["util_mean_pct"] = float(np.mean([s["util_pct_mean"] for s in ut]))
    else:
        why["util_mean_pct"] = no_tel or "no utilisation field on these devices"
    cu = [s for s in dev_stats if s.get("cpu_util_pct_n")]
    if cu:
        metrics["cpu_util_mean_pct"] = float(np.mean([s["cpu_util_pct_mean"] for s in cu]))
    else:
        why["cpu_util_mean_pct"] = no_tel or "no host CPU utilisation field"

    # --- work ------------------------------------------------------------------------------------
    flops_source = peak_source = None
    n_ranks = len(sd.ranks) if sd is not None else None
    world = (config or {}).get("hardware", {}) if isinstance(config, dict) else {}
    if config and isinstance(config, dict) and config.get("model") and tokens and sd is not None:
        try:
            fpt, flops_source = work.model_flops_per_token(config["model"])
            recompute = (config.get("knobs") or {}).get("recompute", "none")
            metrics["model_flops_per_step"] = fpt * tokens / sd.n
            ranks = n_ranks or 1
            step_s = float(np.sum(sd.step_time_s)) / sd.n
            metrics["tflops_per_device"] = metrics["model_flops_per_step"] / step_s / ranks / 1e12
            device = (world or {}).get("device")
            precision = (config.get("knobs") or {}).get("precision", "fp32")
            per_host = max(1, int((world or {}).get("devices_per_node") or ranks))
            # a CPU run's own recorded host probe, so MFU does not change on re-analysis
            probe = info.get("host_probe") if isinstance(info.get("host_probe"), dict) else None
            peak, peak_source = work.peak_flops_per_device(device, precision, per_host, probe) if (
                probe_cpu_peak or probe or (device or "").lower() != "cpu") else (None, "CPU probe disabled")
            if peak:
                metrics["mfu"] = metrics["tflops_per_device"] * 1e12 / peak
                hpt = work.hardware_flops_per_token(config["model"], recompute)
                metrics["hfu"] = metrics["mfu"] * hpt / fpt
            else:
                why["mfu"] = why["hfu"] = peak_source or "unknown peak FLOP/s"
        except (KeyError, ValueError, TypeError) as exc:
            for k in ("model_flops_per_step", "tflops_per_device", "mfu", "hfu"):
                why[k] = f"model in run.json config not understood: {exc}"
    else:
        reason = "run.json has no model configuration" if not (config and isinstance(config, dict)
                                                               and config.get("model")) else \
            (why.get("tokens_per_s") or "no token counts")
        for k in ("model_flops_per_step", "tflops_per_device", "mfu", "hfu"):
            why[k] = reason
    # Per device = per device of the job: an import states the job's count (run.json job_device_count,
    # null when its sources do not say), since the ranks that logged may be one rank of a 512-GPU job.
    n_devices = info.get("job_device_count", n_ranks)
    if metrics["tokens_per_s"] is not None and n_devices:
        metrics["tokens_per_s_per_device"] = metrics["tokens_per_s"] / n_devices
    elif metrics["tokens_per_s"] is not None:
        why["tokens_per_s_per_device"] = (
            f"the job's device count is unknown ({info.get('job_device_count_source') or 'run.json job_device_count'})")
    else:
        why["tokens_per_s_per_device"] = why.get("tokens_per_s", "no token counts")

    # --- profiler traces ---------------------------------------------------------------------------
    profs = profiles.run_profiles(run.path)
    shares = [p["comm_exposed_s"] / p["span_s"] for p in profs if p["span_s"] > 0]
    if shares:
        metrics["comm_exposed_share"] = float(np.mean(shares))
    else:
        why["comm_exposed_share"] = "no profiler traces (profiles/rank-<r>-step-<i>.json) in this run"

    # --- per-device and other views ---------------------------------------------------------------
    dev_rank: dict[tuple[str, str], list[int]] = {}
    for r, key in rank_dev.items():
        dev_rank.setdefault(key, []).append(r)
    coords = {int(e["rank"]): (e.get("coords") or {}) for e in rank_map if "rank" in e}
    spectra = _per_device_spectra(con, pw, w0, w1) if pw else {}
    per_device = []
    for s in dev_stats:
        key = (s["host"], s["device"])
        ranks = sorted(dev_rank.get(key, []))
        row = {
            "host": s["host"], "device": s["device"], "kind": kind_of(s), "ranks": ranks,
            "slot": _slot(s["device"]),
            "pp": _coord(coords, ranks, "pp"), "ep": _coord(coords, ranks, "ep"),
            "tp": _coord(coords, ranks, "tp"), "dp": _coord(coords, ranks, "dp"),
            "samples": s["rows"], "rate_hz": s["rate_hz"], "gaps": s.get("gaps"), "gap_s": s.get("gap_s"),
            "max_interval_s": s.get("max_interval_s"),
            "power_mean_w": s.get("power_w_mean"), "power_peak_w": s.get("power_w_max"),
            "power_p99_w": s.get("power_w_p99"), "power_ramp_max_w_per_s": s.get("power_w_ramp_max"),
            "energy_counter_j": s.get("energy_j_delta"), "energy_integral_j": s.get("power_w_integral"),
            "temp_mean_c": s.get("temp_c_mean"), "temp_peak_c": s.get("temp_c_max"),
            "temp_time_to_steady_s": s.get("temp_c_steady_s"),
            "temp_mem_peak_c": s.get("temp_mem_c_max"),
            "clock_sm_mean_mhz": s.get("clock_sm_mhz_mean"), "clock_sm_min_mhz": s.get("clock_sm_mhz_min"),
            "util_mean_pct": s.get("util_pct_mean"), "cpu_util_mean_pct": s.get("cpu_util_pct_mean"),
            "mem_used_max_bytes": s.get("mem_used_bytes_max"),
            "throttle_share": s.get("throttle_any"),
            **{f"throttle_share_{r}": s.get(f"throttle_{r}") for r in THROTTLE_REASONS},
            "link_tx_bytes": s.get("link_tx_bytes_delta"), "link_rx_bytes": s.get("link_rx_bytes_delta"),
            "pcie_tx_bytes": s.get("pcie_tx_bytes_delta"),
            "power_osc_freq_hz": (spectra.get(key) or (None, None))[0],
            "power_osc_amp_w": (spectra.get(key) or (None, None))[1],
        }
        if sd is not None and ranks:
            idx = [sd.ranks.index(r) for r in ranks if r in sd.ranks]
            row["step_time_mean_s"] = float(np.nanmean(sd.rank_step_s[idx])) if idx else None
        per_device.append(row)

    per_step = []
    if sd is not None:
        for j, s in enumerate(sd.steps.tolist()):
            per_step.append({
                "step": s, "t_start_ns": int(sd.t_start_ns[j]), "t_end_ns": int(sd.t_end_ns[j]),
                "step_time_s": float(sd.step_time_s[j]), "tokens": sd.tokens[j], "samples": sd.samples[j],
                "straggler_spread_pct": sd.spread_pct[j], "power_mean_w": per_step_power.get(s),
                "energy_j": per_step_energy.get(s),
            })

    summary = {
        "schema": SUMMARY_SCHEMA,
        "kind": "measured",
        "run": info.get("name") or run.path.name,
        "path": str(run.path),
        "status": status,
        "reason": info.get("reason"),
        "config": config,
        "metrics": metrics,
        "why_null": {k: v for k, v in why.items() if metrics.get(k) is None},
        "window": {"t_start_ns": w0, "t_end_ns": w1, "seconds": window_s, "source": window_source,
                   "measured_steps": sd.n if sd is not None else 0},
        "sources": {"model_flops": flops_source, "peak_flops": peak_source, "energy": energy_source,
                    "devices_counted": "accelerators" if accel else "host"},
        "per_device": per_device,
        "per_node": per_node,
        "per_step": per_step,
        "per_rank": _per_rank(sd, coords),
        "per_stage": _with_rank_times(_group_view(per_device, "pp"), _per_rank(sd, coords), "pp"),
        "per_expert_rank": _with_rank_times(_group_view(per_device, "ep"), _per_rank(sd, coords), "ep"),
        "phases": sd.phases if sd is not None else [],
        "profiles": profs,
        "data_quality": _data_quality(info, dev_stats, window_s),
        "notes": notes,
    }
    for k in METRIC_NAMES:  # every null metric says why
        if summary["metrics"][k] is None and k not in summary["why_null"]:
            summary["why_null"][k] = no_tel or "not measured in this run"
    telemetry.release(con)
    con.close()
    return _clean(summary)


def _p99_over(con: duckdb.DuckDBPyConnection, keys: list[tuple[str, str]], w0: int, w1: int) -> float | None:
    hosts = sorted({k[0] for k in keys})
    devices = sorted({k[1] for k in keys})
    row = con.execute(
        "SELECT quantile_cont(power_w, 0.99) FROM tel WHERE t_ns BETWEEN ? AND ? "
        "AND list_contains(?, host) AND list_contains(?, device)", [w0, w1, hosts, devices]).fetchall()[0]
    return None if row is None or row[0] is None else float(row[0])


def _per_device_spectra(con: duckdb.DuckDBPyConnection, pw: list[dict[str, Any]], w0: int, w1: int
                        ) -> dict[tuple[str, str], tuple[float, float]]:
    if sum(s["power_w_n"] for s in pw) > PER_DEVICE_SPECTRUM_MAX_ROWS:
        return {}
    t = con.sql(f"SELECT host, device, t_ns, power_w FROM tel WHERE t_ns BETWEEN {int(w0)} AND {int(w1)} "
                "AND power_w IS NOT NULL ORDER BY host, device, t_ns").to_arrow_table()
    hosts = t["host"].to_numpy(zero_copy_only=False)
    devs = t["device"].to_numpy(zero_copy_only=False)
    ts = t["t_ns"].to_numpy()
    ps = t["power_w"].to_numpy(zero_copy_only=False)
    out = {}
    for s in pw:
        sel = (hosts == s["host"]) & (devs == s["device"])
        osc = signal.dominant_oscillation(ts[sel], ps[sel])
        if osc:
            out[(s["host"], s["device"])] = osc
    return out


def _slot(device: str) -> int | None:
    m = re.search(r"(\d+)$", device)
    return int(m.group(1)) if m else None


def _coord(coords: dict[int, dict[str, Any]], ranks: list[int], axis: str) -> int | None:
    vals = {coords.get(r, {}).get(axis) for r in ranks} - {None}
    return vals.pop() if len(vals) == 1 else None


def _per_node(counted: list[dict[str, Any]], kind_of: Any) -> list[dict[str, Any]]:
    out = []
    for host in sorted({s["host"] for s in counted}):
        devs = [s for s in counted if s["host"] == host]
        temps = [s["temp_c_mean"] for s in devs if s.get("temp_c_n")]
        powers = [s["power_w_mean"] for s in devs if s.get("power_w_n")]
        energy = [s.get("energy_j_delta") if s.get("energy_j_delta") is not None else s.get("power_w_integral")
                  for s in devs]
        row: dict[str, Any] = {
            "host": host, "devices": len(devs),
            "power_mean_w": float(np.mean(powers)) if powers else None,
            "power_sum_mean_w": float(np.sum(powers)) if powers and len(powers) == len(devs) else None,
            "energy_j": float(sum(energy)) if energy and all(e is not None for e in energy) else None,
            "temp_mean_c": float(np.mean(temps)) if temps else None,
            "temp_peak_c": max((s["temp_c_max"] for s in devs if s.get("temp_c_n")), default=None),
            "temp_spread_c": None, "temp_spread_pct": None,
        }
        if len(temps) >= 2:
            row["temp_spread_c"] = float(max(temps) - min(temps))
            row["temp_spread_pct"] = float((max(temps) - min(temps)) / min(temps) * 100) if min(temps) > 0 else None
        out.append(row)
    return out


def _per_rank(sd: steps.StepData | None, coords: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    if sd is None:
        return []
    out = []
    for i, r in enumerate(sd.ranks):
        d = sd.rank_step_s[i]
        out.append({"rank": r, "coords": coords.get(r) or {}, "step_time_mean_s": float(np.nanmean(d)),
                    "step_time_max_s": float(np.nanmax(d)), "steps": int(np.sum(~np.isnan(d)))})
    return out


def _group_view(per_device: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """Mean power, temperature, clocks and step time of the devices sharing one coordinate."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for d in per_device:
        if d.get(axis) is not None:
            groups.setdefault(d[axis], []).append(d)
    out = []
    for g, devs in sorted(groups.items()):
        row: dict[str, Any] = {axis: g, "devices": len(devs)}
        for k in ("power_mean_w", "power_peak_w", "temp_mean_c", "temp_peak_c", "clock_sm_mean_mhz",
                  "throttle_share", "step_time_mean_s", "energy_integral_j", "link_tx_bytes"):
            vals = [d[k] for d in devs if d.get(k) is not None]
            row[k] = (max(vals) if k.endswith("_peak_w") or k.endswith("_peak_c") else float(np.mean(vals))) \
                if vals else None
        out.append(row)
    return out


def _with_rank_times(view: list[dict[str, Any]], per_rank: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """Add each group's ranks and their mean step time (from the events), also where ranks share one
    device (a CPU host) and the device view alone cannot tell the groups apart."""
    rows = {v[axis]: v for v in view}
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in per_rank:
        c = (r.get("coords") or {}).get(axis)
        if c is not None:
            groups.setdefault(c, []).append(r)
    if len(groups) < 2 and not rows:
        return []
    for g, rs in groups.items():
        row = rows.setdefault(g, {axis: g, "devices": None})
        row["ranks"] = [r["rank"] for r in rs]
        row["rank_step_time_mean_s"] = float(np.mean([r["step_time_mean_s"] for r in rs]))
    return [rows[k] for k in sorted(rows)]


def _data_quality(info: dict[str, Any], dev_stats: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """Fields supported, achieved sample rate, gaps and clock skew, as the report's data-quality panel."""
    hosts = info.get("sampler_hosts") or {}
    skew = info.get("clock_skew_ns") or (info.get("clock") or {}).get("skew_ns")
    n_hosts = len(info.get("hosts") or hosts or {s["host"] for s in dev_stats})
    return {
        "fields_supported": info.get("fields_supported") or [],
        "not_measured": info.get("not_measured") or [],
        "telemetry_notes": info.get("telemetry_notes") or [],
        "rate_hz_requested": {h: v.get("rate_hz_requested") for h, v in hosts.items()} or
                             (info.get("sampler") or {}).get("rate_hz"),
        "devices": [{"host": s["host"], "device": s["device"], "samples": s["rows"], "rate_hz": s["rate_hz"],
                     "gaps": s.get("gaps"), "gap_s": s.get("gap_s"), "max_interval_s": s.get("max_interval_s")}
                    for s in dev_stats],
        "clock_skew_ns": skew,
        "clock_skew_note": ("single host: all rows stamped by one clock" if n_hosts <= 1 and skew is None
                            else ("measured" if skew is not None else "not measured across hosts")),
        "window_s": window_s,
    }


def write_summary(path: str | Path, summary: dict[str, Any] | None = None) -> Path:
    """Compute (unless given) and write ``summary.json`` atomically; returns its path.

    A prediction's summary is the predictor's; it is never overwritten here.
    """
    run = RunDir(path)
    summary = summary if summary is not None else summarize_run(path)
    if summary.get("kind") == "prediction":
        return run.summary_json
    write_json_atomic(run.summary_json, summary)
    return run.summary_json


def load_summary(path: str | Path, *, refresh: bool = False) -> dict[str, Any]:
    """The summary of a run: computed and written when missing (or when ``refresh``), read otherwise.

    A summary older than the run's ``run.json`` is recomputed.
    """
    run = RunDir(path)
    info = run.read()
    if info.get("kind") == "prediction":
        return summarize_run(path)
    if (not refresh and run.summary_json.is_file()
            and run.summary_json.stat().st_mtime >= run.run_json.stat().st_mtime):
        summ = read_json(run.summary_json)
        if summ.get("schema") == SUMMARY_SCHEMA:
            return summ
    summ = summarize_run(path)
    if summ.get("status") != "running":
        write_summary(path, summ)
    return summ
