"""The per-device, per-node, per-step, per-rank, per-stage and per-expert-rank views of a run's
``summary.json``, and its data-quality panel.

Host rows of a GPU run are listed under ``per_device`` but do not enter the accelerator metrics.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from powertrain.analyze import steps
from powertrain.analyze.families.context import DeviceKey, RunContext
from powertrain.analyze.families.power import PowerFamily, device_energy, device_peak
from powertrain.analyze.metrics import THROTTLE_REASONS
from powertrain.core.energy import WindowEnergy


def per_device(ctx: RunContext) -> list[dict[str, Any]]:
    """One row per device with telemetry in the window: its ranks and coordinates, sampling, and its
    own power, energy, temperature, clock, utilisation, memory, throttle and link statistics."""
    sd = ctx.sd
    dev_rank: dict[DeviceKey, list[int]] = {}
    for r, key in ctx.rank_dev.items():
        dev_rank.setdefault(key, []).append(r)
    coords = ctx.coords
    # per-device oscillation: followed by the device pass for the counted devices with power
    # (families.context.PER_DEVICE_SPECTRUM_MAX_ROWS); null for the others
    spectra = {(s["host"], s["device"]): s["power_osc"] for s in ctx.have("power_w") if s.get("power_osc")}
    rows = []
    for s in ctx.dev_stats:
        key = (s["host"], s["device"])
        ranks = sorted(dev_rank.get(key, []))
        osc_freq, osc_amp = spectra.get(key) or (None, None)
        peak, peak_from = device_peak(s)
        row = {
            "host": s["host"], "device": s["device"], "kind": ctx.kind_of(s), "ranks": ranks,
            "slot": _slot(s["device"]),
            "pp": _coord(coords, ranks, "pp"), "ep": _coord(coords, ranks, "ep"),
            "tp": _coord(coords, ranks, "tp"), "dp": _coord(coords, ranks, "dp"),
            "samples": s["rows"], "rate_hz": s["rate_hz"], "gaps": s.get("gaps"), "gap_s": s.get("gap_s"),
            "max_interval_s": s.get("max_interval_s"),
            "power_mean_w": s.get("power_w_mean"), "power_peak_w": peak,
            # the peak's samples: the driver's buffer where read, else the polled samples (polled peak kept)
            "power_peak_from": peak_from if peak is not None else None, "power_peak_polled_w": s.get("power_w_max"),
            "power_rate_hz": s.get("power_rate_hz"),  # power samples per second (repeats not counted)
            "power_p99_w": s.get("power_w_p99"), "power_ramp_max_w_per_s": s.get("power_w_ramp_max"),
            "energy_j": _joules(device_energy(s)),
            "energy_counter_j": _joules(s.get("energy_counter")), "energy_integral_j": _joules(s.get("energy_integral")),
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
            "power_osc_freq_hz": osc_freq,
            "power_osc_amp_w": osc_amp,
        }
        if sd is not None and ranks:
            idx = [sd.ranks.index(r) for r in ranks if r in sd.ranks]
            row["step_time_mean_s"] = float(np.nanmean(sd.rank_step_s[idx])) if idx else None
        rows.append(row)
    return rows


def _joules(e: WindowEnergy | None) -> float | None:
    return None if e is None else e.energy_j


def _slot(device: str) -> int | None:
    m = re.search(r"(\d+)$", device)
    return int(m.group(1)) if m else None


def _coord(coords: dict[int, dict[str, Any]], ranks: list[int], axis: str) -> int | None:
    vals = {coords.get(r, {}).get(axis) for r in ranks} - {None}
    return vals.pop() if len(vals) == 1 else None


def per_node(counted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host: mean and summed power, energy, mean and peak temperature, and the temperature spread
    between its devices."""
    out = []
    for host in sorted({s["host"] for s in counted}):
        devs = [s for s in counted if s["host"] == host]
        temps = [s["temp_c_mean"] for s in devs if s.get("temp_c_n")]
        with_power = [s for s in devs if s.get("power_w_n")]
        powers = [float(s["power_w_mean"]) for s in with_power if s.get("power_w_mean") is not None]
        all_known = len(powers) == len(with_power)  # mean power is null on a device whose energy is
        energy = [_joules(device_energy(s)) for s in devs]
        known = [e for e in energy if e is not None]
        row: dict[str, Any] = {
            "host": host, "devices": len(devs),
            "power_mean_w": float(np.mean(powers)) if powers and all_known else None,
            "power_sum_mean_w": float(np.sum(powers)) if powers and len(powers) == len(devs) else None,
            "energy_j": float(sum(known)) if energy and len(known) == len(energy) else None,
            "temp_mean_c": float(np.mean(temps)) if temps else None,
            "temp_peak_c": max((s["temp_c_max"] for s in devs if s.get("temp_c_n")), default=None),
            "temp_spread_c": None, "temp_spread_pct": None,
        }
        if len(temps) >= 2:
            row["temp_spread_c"] = float(max(temps) - min(temps))
            row["temp_spread_pct"] = float((max(temps) - min(temps)) / min(temps) * 100) if min(temps) > 0 else None
        out.append(row)
    return out


def per_step(sd: steps.StepData | None, power: PowerFamily) -> list[dict[str, Any]]:
    """One row per measured step: its window, time, tokens, samples, straggler spread, mean device
    power and cluster energy (core.energy over the step, the run's window as the span: the steps of a
    window they tile add up to its energy)."""
    if sd is None:
        return []
    return [{
        "step": s, "t_start_ns": int(sd.t_start_ns[j]), "t_end_ns": int(sd.t_end_ns[j]),
        "step_time_s": float(sd.step_time_s[j]), "tokens": sd.tokens[j], "samples": sd.samples[j],
        "straggler_spread_pct": sd.spread_pct[j], "power_mean_w": power.per_step_power_w.get(j),
        "energy_j": power.per_step_energy_j.get(j),
    } for j, s in enumerate(sd.steps.tolist())]


def per_rank(sd: steps.StepData | None, coords: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    if sd is None:
        return []
    out = []
    for i, r in enumerate(sd.ranks):
        d = sd.rank_step_s[i]
        out.append({"rank": r, "coords": coords.get(r) or {}, "step_time_mean_s": float(np.nanmean(d)),
                    "step_time_max_s": float(np.nanmax(d)), "steps": int(np.sum(~np.isnan(d)))})
    return out


def group_view(per_device: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
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


def with_rank_times(view: list[dict[str, Any]], per_rank: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
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


def _device_quality(s: dict[str, Any]) -> dict[str, Any]:
    """One device's sampling, and how its energy over the window was made: seconds held at each edge
    (``edge_held_s``), why it is null, readings dropped or merged by core.energy's cleaning."""
    e = device_energy(s)
    row: dict[str, Any] = {"host": s["host"], "device": s["device"], "samples": s["rows"], "rate_hz": s["rate_hz"],
                           "gaps": s.get("gaps"), "gap_s": s.get("gap_s"), "max_interval_s": s.get("max_interval_s"),
                           "energy_from": None, "edge_held_s": None, "held_start_s": None, "held_end_s": None,
                           "energy_why_null": "no energy counter or power readings"}
    if e is not None:
        row.update({"energy_from": "counter" if s.get("energy_counter") is not None else "integral",
                    "edge_held_s": e.edge_held_s, "held_start_s": e.held_start_s, "held_end_s": e.held_end_s,
                    "energy_why_null": e.why_null, **e.quality})
    row.update(_time_quality(s))
    row["implausible"] = s.get("implausible") or {}
    return row


def _time_quality(s: dict[str, Any]) -> dict[str, Any]:
    """One device's time as written (steps back of its clock over all its readings, its median
    interval) and the gaps in the window its energy integral does not bridge."""
    w = s.get("written")
    integral = s.get("energy_integral")
    first = w.first_step if w is not None else None
    return {
        "clock_steps_back": w.steps_back if w is not None else 0,
        "clock_stepped_back_s": w.stepped_back_s if w is not None else 0.0,
        "first_step_back": {"from_ns": first[0], "to_ns": first[1]} if first else None,
        "median_interval_s": w.median_period_s if w is not None else None,
        "long_gaps": integral.long_gaps if isinstance(integral, WindowEnergy) else None,
        "long_gap_s": integral.long_gap_s if isinstance(integral, WindowEnergy) else None,
        "gap_limit_s": integral.gap_limit_s if isinstance(integral, WindowEnergy) else None,
        "bridged_gaps": integral.bridged_gaps if isinstance(integral, WindowEnergy) else None,
        "bridged_gap_s": integral.bridged_gap_s if isinstance(integral, WindowEnergy) else None,
        "bridged_gap_max_s": integral.bridged_gap_max_s if isinstance(integral, WindowEnergy) else None,
    }


def time_summary(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """``data_quality.time``: the steps back of the clocks and the gaps energy does not bridge, over all
    devices, naming them (each device's own figures are in ``data_quality.devices``)."""
    back = [d for d in devices if d.get("clock_steps_back")]
    gaps = [d for d in devices if d.get("long_gaps")]
    return {
        "clock_steps_back": sum(d["clock_steps_back"] for d in back),
        "clock_stepped_back_s": sum(d["clock_stepped_back_s"] for d in back),
        "devices_stepped_back": [f"{d['host']}/{d['device']}" for d in back],
        "long_gaps": sum(d["long_gaps"] for d in gaps),
        "long_gap_s": sum(d["long_gap_s"] for d in gaps),
        "devices_with_long_gaps": [f"{d['host']}/{d['device']}" for d in gaps],
        "bridged_gaps": sum(d.get("bridged_gaps") or 0 for d in devices),
        "bridged_gap_s": sum(d.get("bridged_gap_s") or 0.0 for d in devices),
        "rule": ("a step back is a reading stamped earlier than the one written before it; a long gap is an "
                 "interval between readings beyond max(15 x the device's median interval, the 5 s hold limit), "
                 "and energy over a window either falls in is null (core.energy rules 4 and 5); gaps over 5 "
                 "median intervals up to that limit are bridged and counted (bridged_gaps)"),
    }


def implausible_summary(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """``data_quality.implausible``: per field, the readings in the window the analysis kept out, by kind,
    and the devices they came from."""
    out: dict[str, Any] = {}
    for d in devices:
        for f, kinds in (d.get("implausible") or {}).items():
            e = out.setdefault(f, {"count": 0, "kinds": {}, "devices": []})
            e["count"] += sum(kinds.values())
            for k, n in kinds.items():
                e["kinds"][k] = e["kinds"].get(k, 0) + n
            e["devices"].append(f"{d['host']}/{d['device']}")
    return out


def data_quality(info: dict[str, Any], dev_stats: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """Fields supported, achieved sample rate, gaps, edge holds and clock skew, as the report's
    data-quality panel."""
    hosts = info.get("sampler_hosts") or {}
    skew = info.get("clock_skew_ns") or (info.get("clock") or {}).get("skew_ns")
    n_hosts = len(info.get("hosts") or hosts or {s["host"] for s in dev_stats})
    devices = [_device_quality(s) for s in dev_stats]
    return {
        "fields_supported": info.get("fields_supported") or [],
        "not_measured": info.get("not_measured") or [],
        "telemetry_notes": info.get("telemetry_notes") or [],
        "rate_hz_requested": {h: v.get("rate_hz_requested") for h, v in hosts.items()} or
                             (info.get("sampler") or {}).get("rate_hz"),
        "devices": devices,
        "time": time_summary(devices),
        "implausible": implausible_summary(devices),
        # devices or nodes the job had that the data lacks (an importer's finding, e.g. an MLPerf node log)
        "missing_devices": (info.get("data_quality") or {}).get("missing_devices"),
        "clock_skew_ns": skew,
        "clock_skew_note": ("single host: all rows stamped by one clock" if n_hosts <= 1 and skew is None
                            else ("measured" if skew is not None else "not measured across hosts")),
        "window_s": window_s,
        "from_import": info.get("data_quality") or {},  # what the importer found (implausible readings, …)
    }
