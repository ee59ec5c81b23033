"""Power and energy: levels, peaks, ramps and oscillation of the devices' power; the cluster's power;
per-step power and energy; the run's energy (counter or integral) and energy per token and sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from powertrain.analyze import signal, steps, telemetry
from powertrain.analyze.families.context import Family, RunContext

# Every metric that needs power samples: null with one reason when no counted device has any.
POWER_METRICS = ("power_mean_w", "power_peak_w", "power_p99_w", "power_peak_to_mean", "power_ramp_max_w_per_s",
                 "power_osc_freq_hz", "power_osc_amp_w", "power_swing_w", "cluster_power_mean_w",
                 "cluster_power_peak_w", "energy_integral_j")
# Energy must cover at least this share of the measured window on every device, else a note says so.
ENERGY_COVER_NOTE_BELOW = 0.95


@dataclass
class PowerFamily(Family):
    """The power metrics, and per measured step its mean device power and its cluster energy."""

    per_step_power_w: dict[int, float] = field(default_factory=dict)
    per_step_energy_j: dict[int, float] = field(default_factory=dict)


@dataclass
class EnergyFamily(Family):
    """The energy metrics, and where ``energy_j`` came from (``counter``, ``integral`` or None)."""

    source: str | None = None


def power_family(ctx: RunContext) -> PowerFamily:
    fam = PowerFamily()
    pw = ctx.have("power_w")
    if pw:
        _power_levels(ctx, pw, fam)
    else:
        reason = ctx.no_tel or "no power field on these devices"
        for k in POWER_METRICS:
            fam.why_null[k] = reason
    if fam.metrics.get("power_ramp_max_w_per_s") is None and pw:
        fam.why_null["power_ramp_max_w_per_s"] = "fewer than two power samples inside the window"
    lim = [s for s in pw if s.get("power_above_limit_n")]
    if lim:
        fam.metrics["power_above_90pct_limit_share"] = (
            sum(s["power_above_limit"] * s["power_above_limit_n"] for s in lim) / sum(s["power_above_limit_n"] for s in lim))
    else:
        fam.why_null["power_above_90pct_limit_share"] = (
            fam.why_null.get("power_mean_w") or "no power_limit_w field on these devices")
    if pw:
        _cluster_power(ctx, pw, fam)
    return fam


def _power_levels(ctx: RunContext, pw: list[dict[str, Any]], fam: Family) -> None:
    """Mean, peak, p99, peak-to-mean, swing and steepest ramp of the devices' power."""
    m = fam.metrics
    m["power_mean_w"] = float(np.mean([s["power_w_mean"] for s in pw]))
    m["power_peak_w"] = float(max(s["power_w_max"] for s in pw))
    m["power_peak_to_mean"] = max(
        (s["power_w_max"] / s["power_w_mean"] for s in pw if s["power_w_mean"]), default=None)
    m["power_swing_w"] = float(np.mean([s["power_w_p99"] - s["power_w_p01"] for s in pw]))
    ramps = [s["power_w_ramp_max"] for s in pw if s.get("power_w_ramp_max") is not None]
    m["power_ramp_max_w_per_s"] = float(max(ramps)) if ramps else None
    keys = [(s["host"], s["device"]) for s in pw]
    m["power_p99_w"] = _p99_over(ctx.con, keys, ctx.w0, ctx.w1)


def _p99_over(con: duckdb.DuckDBPyConnection, keys: list[tuple[str, str]], w0: int, w1: int) -> float | None:
    hosts = sorted({k[0] for k in keys})
    devices = sorted({k[1] for k in keys})
    row = con.execute(
        "SELECT quantile_cont(power_w, 0.99) FROM tel WHERE t_ns BETWEEN ? AND ? "
        "AND list_contains(?, host) AND list_contains(?, device)", [w0, w1, hosts, devices]).fetchall()[0]
    return None if row is None or row[0] is None else float(row[0])


def _cluster_power(ctx: RunContext, pw: list[dict[str, Any]], fam: PowerFamily) -> None:
    """The cluster's power (sum over devices, in sample periods where every device reported), the
    dominant oscillation of the device-mean power, and per measured step its power and energy."""
    period = float(np.median([s["period_s"] for s in pw if s["period_s"]] or [0.1]))
    bucket_ns = max(int(period * 1e9), 1)
    series = telemetry.device_mean_series(ctx.con, ctx.w0, ctx.w1, bucket_ns)
    n_full = len(pw)
    tot = [t for t, n in zip(series["total"].to_pylist(), series["n"].to_pylist(), strict=True) if n == n_full]
    if tot:
        fam.metrics["cluster_power_mean_w"] = float(np.mean(tot))
        fam.metrics["cluster_power_peak_w"] = float(np.max(tot))
    else:
        fam.why_null["cluster_power_mean_w"] = fam.why_null["cluster_power_peak_w"] = (
            "no sample period where every device reported")
    osc = signal.dominant_oscillation(series["t_ns"].to_numpy(), series["mean"].to_numpy(), period)
    if osc:
        fam.metrics["power_osc_freq_hz"], fam.metrics["power_osc_amp_w"] = osc
    else:
        fam.why_null["power_osc_freq_hz"] = fam.why_null["power_osc_amp_w"] = "too few samples or a flat power signal"
    if ctx.sd is not None:
        _per_step(ctx, ctx.sd, series, bucket_ns, n_full, fam)


def _per_step(ctx: RunContext, sd: steps.StepData, series: pa.Table, bucket_ns: int, n_full: int,
              fam: PowerFamily) -> None:
    """Per measured step: the mean of the device-mean power, and the cluster power (sum over devices,
    where every device reported) integrated over the step window — one bucket beyond the window on
    each side so the first and last steps are covered too."""
    t_ns = series["t_ns"].to_numpy()
    mean = series["mean"].to_numpy()
    wide = telemetry.device_mean_series(ctx.con, ctx.w0 - bucket_ns, ctx.w1 + bucket_ns, bucket_ns)
    full = wide["n"].to_numpy() == n_full
    t_full, total_full = wide["t_ns"].to_numpy()[full], wide["total"].to_numpy()[full].astype(float)
    for s, a, b in zip(sd.steps.tolist(), sd.t_start_ns.tolist(), sd.t_end_ns.tolist(), strict=True):
        sel = (t_ns >= a) & (t_ns <= b)
        if sel.any():
            fam.per_step_power_w[s] = float(np.mean(mean[sel]))
        energy = signal.trapezoid_j(*signal.clip_interp(t_full, total_full, a, b))
        if energy is not None:
            fam.per_step_energy_j[s] = energy


def energy_family(ctx: RunContext, step: Family) -> EnergyFamily:
    """The run's energy from hardware counters and from integrated power, how far they disagree, which
    one ``energy_j`` is (the counter when every counted device has one), and energy per token and per
    sample (``step``: the step family, for throughput and its null reasons)."""
    fam = EnergyFamily()
    m, why = fam.metrics, fam.why_null
    integ = [s for s in ctx.have("power_w") if s.get("power_w_integral") is not None]
    ctr = [s for s in ctx.counted if s.get("energy_j_delta") is not None and s.get("energy_j_n", 1) is not None]
    ctr = [s for s in ctr if s.get("energy_j_delta_s")]
    if integ:
        m["energy_integral_j"] = float(sum(s["power_w_integral"] for s in integ))
    if ctr:
        m["energy_counter_j"] = float(sum(s["energy_j_delta"] for s in ctr))
    else:
        why["energy_counter_j"] = ctx.no_tel or "no hardware energy counter on these devices"
    both = [s for s in ctx.counted if s.get("power_w_integral") is not None and s.get("energy_j_delta")]
    if both:
        c = sum(s["energy_j_delta"] for s in both)
        i = sum(s["power_w_integral"] for s in both)
        m["energy_disagreement_pct"] = (i - c) / c * 100 if c else None
    else:
        why["energy_disagreement_pct"] = "needs both an energy counter and power samples on the same devices"
    if ctr and len(ctr) == ctx.n_dev:
        m["energy_j"] = m["energy_counter_j"]
        fam.source = "counter"
    elif integ and len(integ) == ctx.n_dev:
        m["energy_j"] = m["energy_integral_j"]
        fam.source = "integral"
    else:
        why["energy_j"] = ctx.no_tel or "no energy counter or power samples on every device"
    if fam.source and ctx.window_s > 0:
        cover_key = "energy_j_delta_s" if fam.source == "counter" else "power_w_integral_s"
        cover = min((s.get(cover_key) or 0.0) for s in ctx.counted) / ctx.window_s
        if cover < ENERGY_COVER_NOTE_BELOW:
            fam.notes.append(f"energy covers only {100 * cover:.0f}% of the measured window on some device")
    _per_work(ctx.tokens, step, fam)
    return fam


def _per_work(tokens: float | None, step: Family, fam: EnergyFamily) -> None:
    """Joules per token, tokens per joule and the study's samples/s per MJ."""
    m, why = fam.metrics, fam.why_null
    energy = m.get("energy_j")
    if energy and tokens:
        m["j_per_token"] = energy / tokens
        m["tokens_per_j"] = tokens / energy
    else:
        r = why.get("energy_j") or step.why_null.get("tokens_per_s") or "no tokens or no energy"
        why["j_per_token"] = why["tokens_per_j"] = r
    samples_per_s = step.metrics.get("samples_per_s")
    if energy and samples_per_s:
        m["samples_per_s_per_mj_study"] = samples_per_s / (energy / 1e6)
    else:
        why["samples_per_s_per_mj_study"] = why.get("energy_j") or step.why_null.get("samples_per_s") or "no samples"
