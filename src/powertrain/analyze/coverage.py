"""What each power figure was read from, and what it cannot resolve.

A power reading is only as good as what its sensor averages and how often the driver refreshes it
(docs/metrics.md, *Power sources and coverage*). ``run.json`` says, per device and field, what the field
is (``devices[].properties.sensors[field]``: ``source``, ``nvml``, the probed ``update_period_s``, the
published ``averaging_window_s`` and its ``window_source``, the ``path``) and whether the driver's own
buffer was read (``properties.power_buffer``); the telemetry marks the readings that repeat the driver's
last value (``power_repeat``), which are not samples. From those and the data this module gives:

* :func:`device_power` — per device, its power field and how it was sampled (``data_quality.devices[].power``);
* :func:`power_sources` — per power figure, the field, source, path and effective rate it comes from
  (``sources.power``);
* :func:`coverage` — ``data_quality.coverage``: the steps' power curve seen at only a few phases because
  the step period is locked to the field's update period (*aliasing*), and phases shorter than the
  field's averaging window or update period, each with a note naming the field, the period and the phase;
* :func:`power_source_line`, :func:`power_warnings` — what ``summarize`` and the report print from a summary.

**The aliasing criterion.** Let *U* be the field's update period (the probed one, else the median
interval between its samples) and *W* its averaging window (0 where not published). For every measured
step *k* the device's first sample at or after the step's start lands ``ψ_k`` after it; taken modulo *U*,
``ψ_k`` is where in the update period the step's curve is sampled (every later sample of the step is a
whole number of update periods on). Sorted on the circle of length *U*, the largest gap *G* between
consecutive ``ψ_k`` leaves the *spread* ``U − G``, and the samples' windows see at most
``seen_share = min(1, (U − G + W) / U)`` of every update period of the step. With at least
``MIN_STEPS`` measured steps, a step period *P* ≥ *U*, and ``seen_share < SEEN_SHARE_MIN`` the field is
*aliased*: whatever the number of steps, its samples land at nearly the same phases of every step — a
step period close to a whole number of update periods, with a phase that walks less than the rest of
the update period over the measured steps — so the power figures see the step's curve at only those
phases. The phases are measured, not modelled: a step period's jitter that spreads them counts.

**Short phases.** A phase (a kind of step-phase event — forward, backward, optimizer, … — or a ``phase``
event's name, and the step itself) whose median duration over the measured steps is shorter than the
field's averaging window or its update period cannot be resolved by any power figure from that field.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from powertrain.analyze.families.context import RunContext
from powertrain.analyze.families.power import device_name, device_peak

FIELD = "power_w"
BUFFER_KEY = "power_samples"  # the sensors entry of the driver's buffered samples (telemetry.sensor_facts)
MIN_STEPS = 3  # measured steps before phases can be said to be locked
SEEN_SHARE_MIN = 0.5  # below this share of each update period seen, the field is aliased with the steps
MAX_PHASES = 50  # phase labels checked (the commonest), so a run naming every micro-batch stays short

# The figures each kind of use of power_w makes (sources.power); the peak's and the energy's are their own.
SAMPLE_FIGURES = ("power_p99_w", "power_swing_w", "power_ramp_max_w_per_s", "power_osc_freq_hz", "power_osc_amp_w",
                  "power_above_90pct_limit_share", "cluster_power_peak_w")
# what an aliased field's samples cannot resolve, besides a polled peak (the notes name them)
ALIASED_FIGURES = ("power_p99_w", "power_swing_w", "power_osc_freq_hz", "power_osc_amp_w", "cluster_power_peak_w")
HELD_FIGURES = ("power_mean_w", "cluster_power_mean_w", "energy_integral_j")
PEAK_FIGURES = ("power_peak_w", "power_peak_to_mean")
RULE = ("aliased: at least 3 measured steps, a step period >= the field's update period U, and the samples' "
        "phases within U over all measured steps (the first sample after each step's start, modulo U) leave a "
        "largest gap G such that min(1, (U - G + W) / U) < 0.5, W the field's averaging window (0 where not "
        "published); a short phase: median duration over the measured steps below W or below U. U: the probed "
        "update period (run.json devices[].properties.sensors), else the median interval between samples")


def _pos(v: Any) -> float | None:
    """A positive finite number, else None (unknown)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
        return None
    return float(v)


def device_power(ctx: RunContext, s: dict[str, Any]) -> dict[str, Any] | None:
    """How one device's power was read: the field, what run.json says it is, its update period (probed,
    else the median interval of its samples) and averaging window, its readings, samples and repeats
    (null where the sampler did not mark them), the samples' rate and the rows' (polled) rate, its
    peak and where the peak came from, and its buffered samples. None without power readings."""
    if not s.get("power_w_readings"):
        return None
    sens = ctx.sensor(s, FIELD)
    marked = bool(s.get("power_w_marked"))
    update, update_from = _update_period(sens, _pos(s.get("power_w_sample_period_s")), marked)
    peak, peak_from = device_peak(s)
    buf = s.get("buffer")
    buf_sens = ctx.sensor(s, BUFFER_KEY)
    return {
        "field": FIELD, "source": sens.get("source"), "nvml": sens.get("nvml"), "path": sens.get("path"),
        "update_period_s": update, "update_period_from": update_from,
        "averaging_window_s": _pos(sens.get("averaging_window_s")), "window_source": sens.get("window_source"),
        "readings": s.get("power_w_readings"), "samples": s.get("power_w_n"),
        "repeats": s.get("power_w_repeats") if marked else None,
        "repeats_marked": "all readings" if marked and s["power_w_marked"] == s["power_w_readings"] else
                          "some readings" if marked else "no",
        "rate_hz": s.get("power_rate_hz"), "polled_rate_hz": s.get("rate_hz"),
        "peak_w": peak, "peak_from": peak_from, "peak_polled_w": s.get("power_w_max"),
        "buffer": None if not buf else {**{k: buf[k] for k in ("samples", "rate_hz", "peak_w")},
                                        "source": buf_sens.get("source"), "nvml": buf_sens.get("nvml"),
                                        "update_period_s": _pos(buf_sens.get("update_period_s")),
                                        "averaging_window_s": _pos(buf_sens.get("averaging_window_s"))},
        "buffer_recorded": ctx.power_buffer(s) or None,
    }


def _update_period(sens: dict[str, Any], median_s: float | None, marked: bool) -> tuple[float | None, str | None]:
    """The field's update period and where it comes from: probed at the start of the run (``probed``; ``probed,
    at most`` where the value changed at every poll of the probe), else the median interval of its fresh
    samples (where the sampler marked repeats), else the published period, else the median interval of
    its readings (repeats not marked: the polling's, at least as fine as the field's)."""
    probed = _pos(sens.get("update_period_s"))
    if probed is not None:
        return probed, "probed, at most" if sens.get("period_from") == "probe_limit" else "probed"
    if median_s is not None and marked:
        return median_s, "fresh samples"
    published = _pos(sens.get("published_update_period_s"))
    if published is not None:
        return published, "published"
    return median_s, None if median_s is None else "readings; repeats not marked"


def _common(values: list[Any]) -> Any:
    """The one value every device has (None when they differ or none has one)."""
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 and len(values) == sum(v is not None for v in values) else None


def _describe(devs: list[dict[str, Any]], readings: str) -> dict[str, Any]:
    """One figure's source over the devices it covers (their descriptions from :func:`device_power`): what
    they share — where they differ, a text is null and a period or window the longest (the coarsest;
    ``devices_differ`` names the keys) —, and the slowest device's rates."""
    out: dict[str, Any] = {"field": FIELD, "readings": readings}
    differ = []
    for k in ("source", "nvml", "path", "update_period_s", "update_period_from", "averaging_window_s",
              "window_source"):
        vals = [d.get(k) for d in devs]
        out[k] = _common(vals)
        if out[k] is None and any(v is not None for v in vals):
            differ.append(k)
            if k.endswith("_s"):
                out[k] = max(v for v in vals if v is not None)
    rates = [d["rate_hz"] for d in devs if d.get("rate_hz")]
    polled = [d["polled_rate_hz"] for d in devs if d.get("polled_rate_hz")]
    out["rate_hz"] = min(rates) if rates else None  # the slowest device's: no figure is finer than it
    out["polled_rate_hz"] = min(polled) if polled else None
    marked = {d["repeats_marked"] for d in devs}
    out["repeats"] = ("excluded" if marked == {"all readings"} else "not marked" if marked == {"no"}
                      else "excluded where marked")
    if differ:
        out["devices_differ"] = differ
    return out


def power_sources(ctx: RunContext, energy_source: str | None) -> dict[str, Any]:
    """``sources.power``: per power figure of the run, the field and source it comes from, the path
    (polled, or the driver's buffer), its effective rate (samples per second, repeats not counted) and the
    field's averaging window and update period; the energy figures name theirs."""
    devs = {device_name(s): d for s in ctx.have(FIELD) if (d := device_power(ctx, s)) is not None}
    out: dict[str, Any] = {}
    if devs:
        samples = _describe(list(devs.values()), "samples: readings not marked as repeats of the driver's last value")
        held = _describe(list(devs.values()), "every reading, held until the next (a time integral)")
        out |= {k: {**samples, "path": "polled"} for k in SAMPLE_FIGURES}
        out |= {k: dict(held) for k in HELD_FIGURES}
        name, top = max(devs.items(), key=lambda kv: (kv[1]["peak_w"] is not None, kv[1]["peak_w"] or 0.0))
        peak = {**_describe([top], "the highest sample of the device that holds the peak"), "device": name,
                "path": top["peak_from"]}
        if top["peak_from"] == "buffer":
            b = top["buffer"]
            peak |= {"field": BUFFER_KEY, "readings": "the driver's buffered samples", "source": b["source"] or "driver_buffer",
                     "nvml": b["nvml"] or "nvmlDeviceGetSamples", "rate_hz": b["rate_hz"],
                     "update_period_s": b["update_period_s"], "averaging_window_s": b["averaging_window_s"],
                     "update_period_from": "probed" if b["update_period_s"] else None, "window_source": None,
                     "repeats": None, "polled_rate_hz": None}
        out |= {k: dict(peak) for k in PEAK_FIGURES}
        out["peaks_from"] = {n: d["peak_from"] for n, d in devs.items()}
    ctr = [s for s in ctx.counted if s.get("energy_counter") is not None]
    if ctr:
        nvml = _common([ctx.sensor(s, "energy_j").get("nvml") for s in ctr])
        out["energy_counter_j"] = {"field": "energy_j", "source": "energy_counter", "nvml": nvml}
    if energy_source is not None:
        out["energy_j"] = {"counter": {"field": "energy_j", "source": "energy_counter"},
                           "integral": {"field": FIELD, "source": "integral of the power readings"}}.get(
            energy_source, {"field": "energy_j where the device has a counter, else power_w", "source": energy_source})
    return out


def step_period_s(ctx: RunContext) -> float | None:
    """The measured steps' period: the median interval between consecutive starts inside the window."""
    sd = ctx.sd
    if sd is None:
        return None
    starts = np.sort(sd.t_start_ns[(sd.t_start_ns >= ctx.w0) & (sd.t_end_ns <= ctx.w1)].astype(np.int64))
    if starts.size < 2:
        return None
    return float(np.median(np.diff(starts))) / 1e9


def phase_durations(ctx: RunContext) -> list[dict[str, Any]]:
    """The step itself and each phase label of the measured steps (the event's kind, a ``phase`` event's
    name), with its median duration and how many events, the commonest ``MAX_PHASES`` labels."""
    sd = ctx.sd
    if sd is None or not sd.n:
        return []
    out = [{"phase": "step", "median_s": float(np.median(sd.step_time_s)), "events": int(sd.n)}]
    ctx.events.register_steps("_coverage_steps", np.unique(sd.steps))
    rows = ctx.events.rows(
        "SELECT CASE WHEN kind = 'phase' THEN coalesce(name, 'phase') ELSE kind END AS label, "
        "median(t_end_ns - t_start_ns) AS d, count(*) AS n FROM ev WHERE kind <> 'step' "
        "AND step IN (SELECT step FROM _coverage_steps) AND t_start_ns >= ? AND t_end_ns <= ? "
        f"AND t_end_ns > t_start_ns GROUP BY label ORDER BY n DESC, label LIMIT {MAX_PHASES}",
        [int(sd.window[0]), int(sd.window[1])])
    out += [{"phase": str(label), "median_s": float(d) / 1e9, "events": int(n)} for label, d, n in sorted(rows)]
    return out


def _phase_spread(phases_ns: np.ndarray, update_s: float) -> float:
    """How much of the update period the step phases ``ψ_k mod U`` spread over: U − the largest gap
    between consecutive ones on the circle of length U (seconds)."""
    u = max(round(update_s * 1e9), 1)
    psi = np.sort(np.mod(phases_ns.astype(np.int64), u))
    gaps = np.diff(np.concatenate([psi, [psi[0] + u]]))
    return float(u - gaps.max()) / 1e9


def _device_coverage(dev: dict[str, Any], s: dict[str, Any], period: float | None,
                     phases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One device's entry of ``data_quality.coverage.devices`` (None without an update period)."""
    u, w = dev["update_period_s"], dev["averaging_window_s"]
    if u is None:
        return None
    psi = s.get("power_w_step_phase_ns")
    row: dict[str, Any] = {"device": device_name(s), "field": FIELD, "source": dev["source"], "nvml": dev["nvml"],
                           "update_period_s": u, "update_period_from": dev["update_period_from"],
                           "averaging_window_s": w, "steps_per_update": period / u if period else None,
                           "steps_seen": 0 if psi is None else int(psi.size), "phase_spread_s": None,
                           "seen_share": None, "aliased": None}
    if psi is not None and psi.size >= MIN_STEPS and period is not None and period >= u:
        spread = _phase_spread(psi, u)
        seen = min(1.0, (spread + (w or 0.0)) / u)
        row.update(phase_spread_s=spread, seen_share=seen, aliased=seen < SEEN_SHARE_MIN)
    row["short_phases"] = [p["phase"] for p in phases if p["median_s"] < u or (w is not None and p["median_s"] < w)]
    return row


def coverage(ctx: RunContext) -> dict[str, Any]:
    """``data_quality.coverage``: the step period, the phases' durations, per counted device with power
    its phases within the update period (``aliased``) and the phases shorter than its window or update
    period, and ``warnings``: one note per aliased field and per short phase, naming field, period, phase."""
    period = step_period_s(ctx)
    phases = phase_durations(ctx)
    rows: list[dict[str, Any]] = []
    by_dev: dict[str, dict[str, Any]] = {}
    for s in ctx.have(FIELD):
        dev = device_power(ctx, s)
        row = _device_coverage(dev, s, period, phases) if dev is not None else None
        if dev is not None and row is not None:
            rows.append(row)
            by_dev[row["device"]] = dev
    return {"rule": RULE, "step_period_s": period, "measured_steps": ctx.sd.n if ctx.sd is not None else 0,
            "phases": phases, "devices": rows, "warnings": _warnings(rows, phases, period, by_dev)}


def _field_text(row: dict[str, Any]) -> str:
    what = ", ".join(str(x) for x in (row.get("source"), row.get("nvml")) if x)
    return f"{FIELD} ({what or 'source not recorded'})"


def _from_text(row: dict[str, Any]) -> str:
    how = str(row.get("update_period_from"))
    return how if how.startswith(("probed", "published")) else f"median interval of the {how}"


def _ms(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


def _devices_text(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _warnings(rows: list[dict[str, Any]], phases: list[dict[str, Any]], period: float | None,
              devs: dict[str, dict[str, Any]]) -> list[str]:
    """The coverage notes, one per (field description, update period, window) of aliased devices and
    one per short phase and field description (devices named)."""
    out = []
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r["aliased"]:
            groups.setdefault(("alias", _field_text(r), r["update_period_s"], r["averaging_window_s"]), []).append(r)
        for p in r["short_phases"]:
            groups.setdefault(("short", _field_text(r), r["update_period_s"], r["averaging_window_s"], p), []).append(r)
    for key, rs in groups.items():
        names = [r["device"] for r in rs]
        field, u, w = key[1], key[2], key[3]
        sees = (f"with its {_ms(w)} averaging window they see" if w else
                "they sample (no averaging window published)")
        if key[0] == "alias":
            peak_polled = any(devs[n]["peak_from"] == "polled" for n in names)  # a buffered peak is the driver's
            figures = ", ".join([*(["power_peak_w"] if peak_polled else []), *ALIASED_FIGURES])
            out.append(
                f"{field} cannot resolve the steps' power curve on {_devices_text(names)}: the step period "
                f"{period:.4g} s is {period / u:.3g} × its update period {_ms(u)} ({_from_text(rs[0])}) and "
                f"over {rs[0]['steps_seen']} measured steps its samples land within "
                f"{_ms(max(r['phase_spread_s'] for r in rs))} of the same phases of that period, so {sees} "
                f"{100 * max(r['seen_share'] for r in rs):.0f} % of it: {figures}, per-step power and "
                "∫power see the step at only those phases (data_quality.coverage)")
        else:
            ph = next(p for p in phases if p["phase"] == key[4])
            limits = [x for x in ((f"{_ms(w)} averaging window" if w is not None and ph["median_s"] < w else None),
                                  (f"{_ms(u)} update period" if ph["median_s"] < u else None)) if x]
            out.append(
                f"{field} cannot resolve phase {ph['phase']} on {_devices_text(names)}: it lasts {_ms(ph['median_s'])} "
                f"(median of {ph['events']} events), shorter than the field's {' and '.join(limits)} "
                f"({_from_text(rs[0])}); no power figure "
                "from this field resolves it (data_quality.coverage)")
    return out


def _hz(v: Any) -> str:
    return "—" if not isinstance(v, (int, float)) else f"{v:.3g} Hz"


def power_source_line(summ: dict[str, Any]) -> str | None:
    """The line ``summarize`` and the report print about the power figures: the field, its source, the
    effective (fresh) and polled rates, window and update period, where the peak and the energy come
    from. None for a summary without power figures, or written before they were recorded."""
    src = (summ.get("sources") or {}).get("power") or {}
    base = src.get("power_p99_w")
    if not base:
        return f"power: no power readings; {_energy_text(src['energy_j'])}" if src.get("energy_j") else None
    what = ", ".join(str(x) for x in (base.get("source") and f"{base['source']} field", base.get("nvml")) if x)
    rate = (f"{_hz(base.get('rate_hz'))} fresh of {_hz(base.get('polled_rate_hz'))} polled"
            if base.get("repeats") != "not marked" else f"{_hz(base.get('rate_hz'))} polled (repeats not marked)")
    w, u = base.get("averaging_window_s"), base.get("update_period_s")
    differ = base.get("devices_differ") or []
    parts = [f"power: {FIELD} ({what or 'source not recorded'}), {rate}",
             (f"{_ms(w)} window" + (" (the longest of the devices')" if "averaging_window_s" in differ else ""))
             if w else "averaging window not recorded",
             (f"updated every {_ms(u)} (" + ("the slowest device; " if "update_period_s" in differ else "")
              + f"{_from_text(base)})") if u else "update period unknown"]
    peak = src.get("power_peak_w") or {}
    where = "the driver's buffer" if peak.get("path") == "buffer" else "the polled samples"
    text = ", ".join(parts) + f"; peak from {where} at {_hz(peak.get('rate_hz'))} ({peak.get('device')})"
    energy = src.get("energy_j")
    return text + (f"; {_energy_text(energy)}" if energy else "")


def _energy_text(energy: dict[str, Any]) -> str:
    return ("energy from the counter (energy_j)" if energy.get("source") == "energy_counter" else
            "energy from ∫power_w (no counter)" if energy.get("field") == FIELD else
            "energy from the counter where the device has one, else ∫power_w")


def power_warnings(summ: dict[str, Any]) -> list[str]:
    """The coverage warnings and the counter-against-integral note of a summary (none from one written
    before they were recorded)."""
    dq = summ.get("data_quality") or {}
    out = list((dq.get("coverage") or {}).get("warnings") or [])
    note = (dq.get("energy_check") or {}).get("note")
    return [*out, note] if note else out
