"""Power and energy: levels, peaks, ramps and oscillation of the devices' power; the cluster's power;
per-step power and energy; the run's energy (counter or integral) and energy per token and sample.

Every energy here is :mod:`powertrain.core.energy`'s, computed per device over the run's window by
:func:`powertrain.analyze.telemetry.device_stats`: a device's energy is its hardware counter's where
it has one, else its power integral; the run's energy is their sum, and null — naming the device —
when any counted device's is null (an edge gap beyond the hold limit, a gap inside beyond the gap
limit, a step back of the clock, no readings), never an under-count. The run's energy, the cluster's
power and energy per token and sample are null too when the data lacks a device or node the job had
(``RunContext.missing_why``: a rank's device without telemetry, an MLPerf node without a power log):
the measured devices' sum would be a part taken for the whole; per-device figures (mean power, each
device's energy) cover what was measured. Mean power over the window is energy / window seconds. Sums
over devices run in the devices' sorted order, so the same run gives the same figures to the last digit.

Levels, peaks, quantiles, ramps and spectra count power *samples*: readings the sampler marked as repeats
of the driver's last value are not samples (``analyze.telemetry.FRESH``). A device's peak is the highest
of the driver's buffered samples where the sampler read them, else of its polled samples
(:func:`device_peak`); the cluster's peak stays on the polled samples (a sum needs every device's reading
in one period). ∫power is kept beside the counter as a cross-check; beyond ``DISAGREEMENT_NOTE_PCT`` a
note names both (``analyze.coverage`` says what each figure was read from)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from powertrain.analyze import device_pass, signal, steps, telemetry
from powertrain.analyze.families.context import Family, RunContext
from powertrain.core.energy import WindowEnergy

# Every metric that needs power samples: null with one reason when no counted device has any.
POWER_METRICS = ("power_mean_w", "power_peak_w", "power_p99_w", "power_peak_to_mean", "power_ramp_max_w_per_s",
                 "power_osc_freq_hz", "power_osc_amp_w", "power_swing_w", "cluster_power_mean_w",
                 "cluster_power_peak_w", "energy_integral_j")


@dataclass
class PowerFamily(Family):
    """The power metrics, and per measured step its mean device power and its cluster energy."""

    # keyed by the step's position in StepData (a step number can repeat: steps.measured_steps)
    per_step_power_w: dict[int, float] = field(default_factory=dict)
    per_step_energy_j: dict[int, float] = field(default_factory=dict)
    per_step_why: str | None = None  # why a step has no energy, when one has none


# |energy_disagreement_pct| beyond which the summary says so in a note (and summarize and the report print it)
DISAGREEMENT_NOTE_PCT = 1.0


@dataclass
class EnergyFamily(Family):
    """The energy metrics, where ``energy_j`` came from (``counter``, ``integral`` or None), and the
    counter against the integral (``check``: ``data_quality.energy_check``; None without both)."""

    source: str | None = None
    check: dict[str, Any] | None = None


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
            (ctx.no_tel or "no power field on these devices") if not pw else "no power_limit_w field on these devices")
    if pw:
        _cluster_power(ctx, pw, fam)
    return fam


def device_name(s: dict[str, Any]) -> str:
    return f"{s['host']}/{s['device']}"


def device_peak(s: dict[str, Any]) -> tuple[float | None, str]:
    """The device's highest power over the window and where it was read: from the driver's buffered
    samples (``buffer``) where the sampler read them and they hold samples in the window — the driver's
    own samples, not the phase of our polling —, else the highest polled sample (``polled``)."""
    buf = s.get("buffer")
    if buf and buf.get("samples"):
        return float(buf["peak_w"]), "buffer"
    peak = s.get("power_w_max")
    return (None if peak is None else float(peak)), "polled"


def sample_period_s(s: dict[str, Any]) -> float | None:
    """One power sample period of the device: the mean interval of its power samples where its readings
    are marked fresh or repeated (the field's effective period), else the mean interval of its rows."""
    if s.get("power_w_marked") and s.get("power_rate_hz"):
        return 1.0 / float(s["power_rate_hz"])
    return s.get("period_s")


def device_energy(s: dict[str, Any]) -> WindowEnergy | None:
    """The device's energy over the window: its counter's where it has counter readings, else its
    power integral (None: neither)."""
    got = s.get("energy_counter") or s.get("energy_integral")
    return got if isinstance(got, WindowEnergy) else None


def _total(devs: list[dict[str, Any]], pick: Callable[[dict[str, Any]], WindowEnergy | None], what: str
           ) -> tuple[float | None, str | None]:
    """Sum of the devices' energies (in their order), or None with the first device that has none."""
    if not devs:
        return None, "no counted device with telemetry in the window"
    total = 0.0
    for s in devs:
        e = pick(s)
        if e is None:
            return None, f"{device_name(s)}: no {what}"
        if e.energy_j is None:
            return None, f"{device_name(s)}: {e.why_null}"
        total += e.energy_j
    return total, None


def _power_levels(ctx: RunContext, pw: list[dict[str, Any]], fam: Family) -> None:
    """Mean (energy / window seconds), peak, p99, peak-to-mean, swing and steepest ramp of the devices' power."""
    m = fam.metrics
    _, why_mean = _total(pw, lambda s: s.get("energy_integral"), "power readings")
    if why_mean is None:
        m["power_mean_w"] = float(np.mean([s["power_w_mean"] for s in pw]))
    else:
        fam.why_null["power_mean_w"] = f"mean power over the window is energy / seconds, and {why_mean}"
    peaks = {device_name(s): p for s in pw if (p := device_peak(s)[0]) is not None}
    m["power_peak_w"] = float(max(peaks.values())) if peaks else None
    m["power_peak_to_mean"] = max(
        (peaks[device_name(s)] / s["power_w_mean"] for s in pw if s.get("power_w_mean") and device_name(s) in peaks),
        default=None)
    m["power_swing_w"] = float(np.mean([s["power_w_p99"] - s["power_w_p01"] for s in pw]))
    ramps = [s["power_w_ramp_max"] for s in pw if s.get("power_w_ramp_max") is not None]
    m["power_ramp_max_w_per_s"] = float(max(ramps)) if ramps else None
    keys = [(s["host"], s["device"]) for s in pw]
    m["power_p99_w"] = _p99_over(ctx.con, keys, ctx.w0, ctx.w1)


def _p99_over(con: duckdb.DuckDBPyConnection, keys: list[tuple[str, str]], w0: int, w1: int) -> float | None:
    """The exact p99 of these devices' power samples in the window (order statistics at position
    (n − 1)·0.99, linearly interpolated). DuckDB's ``max(x, k)`` keeps only the top 1 % (a bounded
    heap), so memory stays small however long the run (``quantile_cont`` or an ORDER BY … OFFSET
    would hold every sample)."""
    # samples only: a reading marked as a repeat of the driver's last value is not one (telemetry.FRESH)
    where = f"t_ns BETWEEN ? AND ? AND power_w IS NOT NULL AND {telemetry.FRESH} AND list_contains(?, [host, device])"
    args = [w0, w1, [list(k) for k in sorted(keys)]]
    n = int(con.execute(f"SELECT count(*) FROM tel WHERE {where}", args).fetchall()[0][0])
    if not n:
        return None
    lo, hi, d = device_pass.quantile_positions(n, 0.99)
    # descending, 1-based: order statistic k is item n − k; the top n − lo items reach the lower one
    top = con.execute(f"SELECT list_slice(max(power_w, {n - lo}), {n - hi}, {n - lo}) FROM tel WHERE {where}",
                      args).fetchall()[0][0]
    b, a = float(top[0]), float(top[-1])
    return device_pass.lerp(a, b, d)


def _cluster_power(ctx: RunContext, pw: list[dict[str, Any]], fam: PowerFamily) -> None:
    """The cluster's power: its mean (all counted devices' energy / window seconds) and its peak (sum
    over devices, in sample periods where every device reported); the dominant oscillation of the
    device-mean power; per measured step its energy and mean device power."""
    period = float(np.median([p for s in pw if (p := sample_period_s(s))] or [0.1]))
    bucket_ns = max(int(period * 1e9), 1)
    n_full = len(pw)
    energy, why = _total(ctx.counted, lambda s: s.get("energy_integral"), "power readings")
    why = why or ctx.missing_why
    if energy is not None and ctx.window_s > 0 and why is None:
        fam.metrics["cluster_power_mean_w"] = energy / ctx.window_s
    else:
        fam.why_null["cluster_power_mean_w"] = f"the cluster's energy over the window is unknown: {why}"
    # The series has one row per sample period of the whole window: it is read in chunks, its peak
    # kept as it goes and its spectrum streamed (one FFT up to 2^17 periods, Welch segments beyond).
    peak: float | None = None
    osc_stream = signal.OscillationStream(period)
    # the counted devices' series only: an idle GPU or a host row is not the cluster's power
    for series in telemetry.device_mean_chunks(ctx.con, ctx.w0, ctx.w1, bucket_ns,
                                               devices=[(s["host"], s["device"]) for s in pw]):
        tot = series["total"].to_numpy(zero_copy_only=False)[series["n"].to_numpy(zero_copy_only=False) == n_full]
        if tot.size:
            peak = float(np.max(tot)) if peak is None else max(peak, float(np.max(tot)))
        osc_stream.add(series["t_ns"].to_numpy(), series["mean"].to_numpy())
    if peak is not None and ctx.missing_why is None:
        fam.metrics["cluster_power_peak_w"] = peak
    else:
        fam.why_null["cluster_power_peak_w"] = (f"the cluster lacks devices the job had: {ctx.missing_why}"
                                                if ctx.missing_why else "no sample period where every device reported")
    osc = osc_stream.result()
    if osc:
        fam.metrics["power_osc_freq_hz"], fam.metrics["power_osc_amp_w"] = osc
    else:
        fam.why_null["power_osc_freq_hz"] = fam.why_null["power_osc_amp_w"] = "too few samples or a flat power signal"
    if ctx.sd is not None:
        _per_step(ctx, ctx.sd, fam)


def _per_step(ctx: RunContext, sd: steps.StepData, fam: PowerFamily) -> None:
    """Per measured step inside the run's window: the counted devices' energy (core.energy's
    ``windows_energy`` with the run's window as the span, so the steps add up to the run) and their
    mean power (that energy / the step's seconds / devices). Null for every step when any counted
    device's energy is unknown (``per_step_why``)."""
    per_dev = []
    whys = []
    for s in ctx.counted:
        e = s.get("step_energy_j")
        if e is None:
            fam.per_step_why = f"{device_name(s)}: no power readings"
            return
        if s.get("step_energy_why"):  # all its steps (an edge refused) or some (a gap, a step back)
            whys.append(f"{device_name(s)}: {s['step_energy_why']}")
        per_dev.append(np.asarray(e, dtype=np.float64))
    if not per_dev:
        return
    if ctx.missing_why:
        fam.per_step_why = f"the steps' energy lacks devices the job had: {ctx.missing_why}"
        return
    if whys:
        fam.per_step_why = "; ".join(whys)
    total = np.zeros(sd.n)
    for e in per_dev:  # in the devices' sorted order: the same sum on every analysis
        total += e
    inside = (sd.t_start_ns >= ctx.w0) & (sd.t_end_ns <= ctx.w1)
    for j in range(sd.n):
        if not inside[j] or not np.isfinite(total[j]):  # NaN: a device's energy in the step is unknown
            continue
        fam.per_step_energy_j[j] = float(total[j])
        dur_s = (int(sd.t_end_ns[j]) - int(sd.t_start_ns[j])) / 1e9
        if dur_s > 0:
            fam.per_step_power_w[j] = float(total[j]) / dur_s / len(per_dev)
    if not inside.all():
        outside = "steps outside the run's window have no energy here (the run's window is its own)"
        fam.per_step_why = f"{fam.per_step_why}; {outside}" if fam.per_step_why else outside


def energy_family(ctx: RunContext, step: Family) -> EnergyFamily:
    """The run's energy from hardware counters and from integrated power (both core.energy's, over the
    run's window), how far they disagree (a note beyond ``DISAGREEMENT_NOTE_PCT``), the run's energy ``energy_j`` (per device its counter where it
    has one, else its integral; null naming the device when any is unknown), and energy per token and
    per sample (``step``: the step family, for throughput and its null reasons)."""
    fam = EnergyFamily()
    m, why = fam.metrics, fam.why_null
    counted = ctx.counted
    with_ctr = [s for s in counted if s.get("energy_counter") is not None]
    m["energy_integral_j"], w_int = _total(counted, lambda s: s.get("energy_integral"), "power readings")
    if w_int:
        why["energy_integral_j"] = ctx.no_tel or w_int
    if with_ctr and len(with_ctr) == len(counted):
        m["energy_counter_j"], w_ctr = _total(counted, lambda s: s.get("energy_counter"), "energy counter")
        if w_ctr:
            why["energy_counter_j"] = w_ctr
    else:
        why["energy_counter_j"] = ctx.no_tel or (
            f"{device_name(next(s for s in counted if s.get('energy_counter') is None))}: no hardware energy counter"
            if with_ctr else "no hardware energy counter on these devices")
    _disagreement(counted, fam)
    m["energy_j"], w_e = _total(counted, device_energy, "energy counter or power readings")
    if ctx.missing_why and m["energy_j"] is not None:
        w_e = (f"the data lacks devices the job had ({ctx.missing_why}): the run's energy is unknown; the "
               f"{len(counted)} measured device(s) add up to {m['energy_j']:.6g} J (per_device, per_node)")
        m["energy_j"] = None
        for k in ("energy_integral_j", "energy_counter_j"):
            if m.get(k) is not None:
                m[k] = None
                why[k] = w_e
    if w_e or not counted:
        why["energy_j"] = ctx.no_tel or w_e or "no counted device"
    else:
        fam.source = ("counter" if len(with_ctr) == len(counted) else "integral" if not with_ctr
                      else "counter where the device has one, else integral")
    held = [(device_name(s), e.edge_held_s) for s in counted if (e := device_energy(s)) is not None
            and e.energy_j is not None and e.edge_held_s > 0]
    if held:
        name, most = max(held, key=lambda x: x[1])
        fam.notes.append(f"energy holds the nearest reading at the window's edges on {len(held)} device(s), "
                         f"at most {most:.2f} s ({name}); data_quality.devices[].edge_held_s per device")
    _per_work(ctx.tokens, step, fam)
    return fam


def _disagreement(counted: list[dict[str, Any]], fam: EnergyFamily) -> None:
    """(integral − counter) / counter × 100 over the devices where both are known; beyond
    ``DISAGREEMENT_NOTE_PCT`` a note names both figures (``check``: what the summary's data quality says)."""
    both = [(s["energy_integral"].energy_j, s["energy_counter"].energy_j) for s in counted
            if s.get("energy_integral") is not None and s.get("energy_counter") is not None
            and s["energy_integral"].energy_j is not None and s["energy_counter"].energy_j is not None]
    if both:
        i = sum(x for x, _ in both)
        c = sum(y for _, y in both)
        fam.check = {"integral_j": i, "counter_j": c, "devices": len(both), "threshold_pct": DISAGREEMENT_NOTE_PCT,
                     "disagreement_pct": (i - c) / c * 100 if c else None, "note": None}
        if c:
            pct = fam.metrics["energy_disagreement_pct"] = (i - c) / c * 100
            if abs(pct) > DISAGREEMENT_NOTE_PCT:
                fam.check["note"] = (
                    f"energy: the integral of the power readings ({i:.6g} J) is {pct:+.2f} % off the energy counter "
                    f"({c:.6g} J) over the {len(both)} device(s) that have both; energy_j is the counter's, ∫power is "
                    "kept as a cross-check (energy_integral_j, energy_disagreement_pct)")
                fam.notes.append(fam.check["note"])
        else:
            fam.why_null["energy_disagreement_pct"] = "the energy counters read 0 J over the window"
    else:
        fam.why_null["energy_disagreement_pct"] = "needs both an energy counter and power samples on the same devices"


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
