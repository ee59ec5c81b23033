"""Synthetic run directories whose metrics are known by construction.

Used by the analysis tests, the report's browser test and ``benchmarks/analysis_scale.py``. Nothing
here pretends to be measured: every ``run.json`` written says ``"synthetic": true`` and names the
generator, and its devices are named ``vendor: "synthetic"``.

Signals, per device ``d`` (global index ``g``) at time ``t`` (seconds since the start):

* ``power_w = base_w + d_offset + amp_w · sin(2π·freq_hz·t)``, ``d_offset = power_step_w · g``;
* ``energy_j`` = the exact integral of that power (so counter and integral agree up to the trapezoid
  error), unless ``energy_counter=False``;
* ``temp_c = temp_base_c + temp_step_c · slot`` (rear slots hotter, as in an air-cooled chassis);
* ``clock_sm_mhz = clock_mhz`` except while throttled, where it is ``clock_mhz − 300``; a device is
  throttled (``POWER_CAP``) in the first ``throttle_share[g]`` of every second;
* ``link_tx_bytes`` grows at ``link_bps`` bytes per second; ``power_limit_w`` is constant if given.

A sensor that is not a true meter (issue 30): with ``refresh_hz`` the driver refreshes ``power_w`` only
at ``k / refresh_hz`` and every reading in between repeats the last value; with ``window_s`` the value
is the mean of the true power over the ``window_s`` before the refresh (a sensor that averages 25 ms of
every 100 ms). ``repeats`` says what the ``power_repeat`` column holds: ``"marked"`` True on a reading
that repeats the last refresh and False on a fresh one, ``"unknown"`` null, ``"absent"`` no column at
all (a file written before it existed). ``counter_scale`` multiplies the energy counter (a counter
that disagrees with ∫power). ``buffer_hz`` (:func:`write_run`) writes the driver's buffered samples of
the true power at that rate (:func:`power_samples_table`) to ``telemetry/power-samples/<host>.parquet``.

Step events: ``warmup`` then ``steps`` measured steps per rank, back to back, each ``step_s``
long (rank ``r`` adds ``straggle_s · r``), ``tokens_per_rank`` tokens each. :func:`step_events` lays
out the same rows with numpy, a chunk of steps at a time, for long runs (``benchmarks/memory_scaling.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from powertrain.schema import EVENTS_SCHEMA, TELEMETRY_FIELDS, TELEMETRY_SCHEMA, Throttle
from powertrain.store.rundir import RunDir

T0_NS = 1_700_000_000_000_000_000
REPEAT = "power_repeat"
POWER_SAMPLE_KEYS = ("base_w", "amp_w", "freq_hz", "power_step_w")  # the signal the buffer samples


def _null_col(n: int, typ: pa.DataType) -> pa.Array:
    return pa.nulls(n, type=typ)


def telemetry_table(
    host: str,
    devices: Sequence[str],
    *,
    t0_ns: int = T0_NS,
    duration_s: float = 10.0,
    rate_hz: float = 10.0,
    base_w: float = 500.0,
    amp_w: float = 100.0,
    freq_hz: float = 1.0,
    power_step_w: float = 0.0,
    first_index: int = 0,
    temp_base_c: float = 50.0,
    temp_step_c: float = 2.0,
    clock_mhz: float = 1980.0,
    throttle_share: Sequence[float] | float = 0.0,
    link_bps: float | None = None,
    energy_counter: bool = True,
    power_limit_w: float | None = None,
    fields: Sequence[str] | None = None,
    refresh_hz: float | None = None,
    window_s: float | None = None,
    repeats: str = "unknown",
    counter_scale: float = 1.0,
) -> pa.Table:
    """Telemetry rows of one host (see module doc); ``fields`` limits which fields are non-null."""
    if repeats not in ("marked", "unknown", "absent"):
        raise ValueError(f"repeats must be marked, unknown or absent, got {repeats!r}")
    n = round(duration_s * rate_hz) + 1
    t_s = np.arange(n) / rate_hz
    t_ns = t0_ns + np.round(t_s * 1e9).astype(np.int64)
    shares = throttle_share if isinstance(throttle_share, Sequence) else [throttle_share] * (first_index + len(devices))
    cols: dict[str, list[pa.Array]] = {k: [] for k in [*TELEMETRY_SCHEMA.names, REPEAT]}
    w = 2 * math.pi * freq_hz
    # the refresh each reading shows (its index and time): every reading is one where the driver refreshes at once
    refresh = np.floor(t_s * refresh_hz + 1e-9) if refresh_hz else np.arange(n, dtype=np.float64)
    t_seen = refresh / refresh_hz if refresh_hz else t_s
    fresh = np.r_[True, refresh[1:] != refresh[:-1]]
    for i, dev in enumerate(devices):
        g = first_index + i
        base = base_w + power_step_w * g
        p = _sensed(base, amp_w, freq_hz, t_seen, window_s)
        e = (base * t_s + (amp_w / w) * (1 - np.cos(w * t_s)) if freq_hz > 0 else base * t_s) * counter_scale
        frac = t_s - np.floor(t_s)
        throttled = frac < shares[g] - 1e-12
        values: dict[str, np.ndarray] = {
            "power_w": p,
            "energy_j": e,
            "temp_c": np.full(n, temp_base_c + temp_step_c * i),
            "clock_sm_mhz": np.where(throttled, clock_mhz - 300.0, clock_mhz),
            "throttle": np.where(throttled, int(Throttle.POWER_CAP), 0).astype(np.int64),
            "util_pct": np.full(n, 95.0),
            "mem_used_bytes": np.full(n, 40 << 30, dtype=np.int64),
        }
        if power_limit_w is not None:
            values["power_limit_w"] = np.full(n, power_limit_w)
        if link_bps is not None:
            values["link_tx_bytes"] = np.round(link_bps * t_s).astype(np.int64)
        if not energy_counter:
            values.pop("energy_j")
        if fields is not None:
            values = {k: v for k, v in values.items() if k in fields}
        cols["t_ns"].append(pa.array(t_ns, pa.int64()))
        cols["host"].append(pa.array([host] * n, pa.string()))
        cols["device"].append(pa.array([dev] * n, pa.string()))
        for f, typ in TELEMETRY_FIELDS.items():
            if f != REPEAT:
                cols[f].append(pa.array(values[f], typ) if f in values else _null_col(n, typ))
        marks = ~fresh if repeats == "marked" and "power_w" in values else None
        cols[REPEAT].append(pa.array(marks, pa.bool_()) if marks is not None else _null_col(n, pa.bool_()))
    table = pa.table({k: pa.concat_arrays(v) for k, v in cols.items() if k in TELEMETRY_SCHEMA.names},
                     schema=TELEMETRY_SCHEMA)
    if REPEAT in TELEMETRY_SCHEMA.names:
        table = table.set_column(TELEMETRY_SCHEMA.get_field_index(REPEAT), REPEAT, pa.concat_arrays(cols[REPEAT]))
    elif repeats != "absent":
        table = table.append_column(pa.field(REPEAT, pa.bool_()), pa.concat_arrays(cols[REPEAT]))
    return table.drop_columns([REPEAT]) if repeats == "absent" and REPEAT in table.column_names else table


def _sensed(base: float, amp_w: float, freq_hz: float, t_s: np.ndarray, window_s: float | None) -> np.ndarray:
    """``base + amp_w · sin(2π·freq_hz·t)`` at ``t_s``, or its mean over the ``window_s`` before each time."""
    w = 2 * math.pi * freq_hz
    if not window_s or freq_hz <= 0:
        return base + amp_w * np.sin(w * t_s)
    mean: np.ndarray = base + amp_w * (np.cos(w * (t_s - window_s)) - np.cos(w * t_s)) / (w * window_s)
    return mean


def power_samples_table(host: str, devices: Sequence[str], *, t0_ns: int = T0_NS, duration_s: float = 10.0,
                        rate_hz: float = 100.0, base_w: float = 500.0, amp_w: float = 100.0, freq_hz: float = 1.0,
                        power_step_w: float = 0.0, first_index: int = 0) -> pa.Table:
    """The driver's buffered samples of one host (``t_ns, host, device, power_w``): the true power of
    every device (module doc) at ``rate_hz``."""
    n = round(duration_s * rate_hz) + 1
    t_s = np.arange(n) / rate_hz
    t_ns = t0_ns + np.round(t_s * 1e9).astype(np.int64)
    parts = [pa.table({"t_ns": pa.array(t_ns, pa.int64()), "host": pa.array([host] * n, pa.string()),
                       "device": pa.array([dev] * n, pa.string()),
                       "power_w": pa.array(_sensed(base_w + power_step_w * (first_index + i), amp_w, freq_hz, t_s,
                                                   None), pa.float64())})
             for i, dev in enumerate(devices)]
    return pa.concat_tables(parts)


PHASE_SPLITS = (("forward", 0.0, 0.3), ("backward", 0.3, 0.8), ("optimizer", 0.8, 1.0))


def events_table(
    rank: int,
    *,
    t0_ns: int = T0_NS,
    warmup: int = 1,
    steps: int = 5,
    step_s: float = 1.0,
    straggle_s: float = 0.0,
    tokens: int | None = 1024,
    samples: int | None = 8,
    phases: bool = True,
    start_offset_s: float = 0.0,
    period_s: float | None = None,
    phase_splits: Sequence[tuple[str, float, float]] | None = None,
) -> pa.Table:
    """Step (and forward/backward/optimizer) events of one rank; all ranks' steps start together.
    ``phase_splits``: (kind, start, end) of each phase as shares of the step (:data:`PHASE_SPLITS`)."""
    rows: list[dict[str, Any]] = []
    dur = step_s + straggle_s * rank
    period = period_s if period_s is not None else dur
    for s in range(warmup + steps):
        # every step starts at the same instant on every rank; the slowest rank sets the pace
        a = t0_ns + round((start_offset_s + s * period) * 1e9)
        b = a + round(dur * 1e9)
        win = "warmup" if s < warmup else "measured"
        rows.append({"rank": rank, "kind": "step", "name": f"step{s}", "step": s, "t_start_ns": a, "t_end_ns": b,
                     "window": win, "tokens": tokens, "samples": samples, "loss": 1.0 / (s + 1),
                     "mem_peak_bytes": None, "microbatch": None, "attrs": None})
        if phases:
            for kind, lo, hi in phase_splits or PHASE_SPLITS:
                x, y = a + int((b - a) * lo), a + int((b - a) * hi) if hi < 1.0 else b
                rows.append({"rank": rank, "kind": kind, "name": kind, "step": s, "t_start_ns": x, "t_end_ns": y,
                             "window": win, "tokens": None, "samples": None, "loss": None, "mem_peak_bytes": None,
                             "microbatch": None, "attrs": None})
    return pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)


def step_events(rank: int, first: int, count: int, *, t0_ns: int = T0_NS, period_s: float = 2.0,
                step_s: float | None = None, warmup: int = 0, tokens: int | None = 8192,
                samples: int | None = 4, phases: bool = True) -> pa.Table:
    """Steps ``first`` … ``first + count − 1`` of one rank, as :func:`events_table` lays them out (a step
    event, then its forward / backward / optimizer phases when ``phases``), built with numpy so that a
    long run's events (a day of 2 s steps: 43 200 per rank) can be written a chunk at a time.

    Step ``s`` starts at ``t0_ns + s · period_s`` and lasts ``step_s`` (``period_s`` when not given);
    the steps below ``warmup`` are marked ``warmup``, the others ``measured``."""
    s = np.arange(first, first + count, dtype=np.int64)
    a = t0_ns + np.round(s * period_s * 1e9).astype(np.int64)
    dur = round((period_s if step_s is None else step_s) * 1e9)
    b = a + dur
    win = np.where(s < warmup, "warmup", "measured").astype(object)
    parts = [("step", a, b)]
    if phases:
        parts += [(kind, a + int(dur * lo), a + int(dur * hi) if hi < 1.0 else b) for kind, lo, hi in PHASE_SPLITS]
    k = len(parts)
    n = count * k

    def inter(values: list[np.ndarray]) -> np.ndarray:  # row j·k + i is part i of step j
        return np.stack(values, axis=1).reshape(n)

    is_step = np.tile(np.arange(k) == 0, count)
    cols: dict[str, Any] = {
        "rank": np.full(n, rank, dtype=np.int32),
        "kind": inter([np.full(count, kind, dtype=object) for kind, _, _ in parts]),
        "name": inter([np.char.add("step", s.astype(str)).astype(object)]
                      + [np.full(count, kind, dtype=object) for kind, _, _ in parts[1:]]),
        "step": np.repeat(s, k),
        "t_start_ns": inter([x for _, x, _ in parts]),
        "t_end_ns": inter([y for _, _, y in parts]),
        "window": np.repeat(win, k),
    }
    table = {name: pa.array(v, EVENTS_SCHEMA.field(name).type) for name, v in cols.items()}
    for name, value in (("tokens", tokens), ("samples", samples)):
        table[name] = pa.array(np.where(is_step, value if value is not None else 0, 0),
                               pa.int64(), mask=~is_step if value is not None else np.ones(n, dtype=bool))
    table["loss"] = pa.array(np.where(is_step, 1.0 / (np.repeat(s, k) + 1), 0.0), pa.float64(), mask=~is_step)
    for name in ("microbatch", "mem_peak_bytes", "attrs"):
        table[name] = pa.nulls(n, EVENTS_SCHEMA.field(name).type)
    return pa.table({f.name: table[f.name] for f in EVENTS_SCHEMA}, schema=EVENTS_SCHEMA)


def write_run(
    path: str | Path,
    *,
    hosts: int = 1,
    devices_per_host: int = 4,
    kind: str = "gpu",
    status: str = "ok",
    reason: str | None = None,
    model: str | dict[str, Any] = "gpt3-tiny",
    layout: dict[str, Any] | None = None,
    knobs: dict[str, Any] | None = None,
    device_type: str = "h100",
    warmup: int = 1,
    steps: int = 5,
    step_s: float = 1.0,
    straggle_s: float = 0.0,
    tokens_per_rank: int | None = 1024,
    samples_per_rank: int | None = 8,
    rate_hz: float = 10.0,
    name: str | None = None,
    device_properties: dict[str, Any] | None = None,
    buffer_hz: float | None = None,
    phase_splits: Sequence[tuple[str, float, float]] | None = None,
    **signal: Any,
) -> Path:
    """A complete synthetic run directory (run.json, telemetry/<host>.parquet, events/rank-<r>.parquet;
    with ``buffer_hz``, telemetry/power-samples/<host>.parquet). ``device_properties`` go to every
    device's ``run.json`` properties (``sensors``, ``power_buffer``: what the sampler records)."""
    run = RunDir(path).create()
    world = hosts * devices_per_host
    duration = (warmup + steps) * (step_s + straggle_s * world) + 1.0
    signal.setdefault("start_pad_s", 0.5)
    pad = signal.pop("start_pad_s")
    devices, rank_map = [], []
    layout = layout or {}
    tp, pp = int(layout.get("tp", 1)), int(layout.get("pp", 1))
    ep = int(layout.get("ep", 1))
    for h in range(hosts):
        host = f"node{h}"
        names = [f"{'gpu' if kind == 'gpu' else 'cpu'}{i}" for i in range(devices_per_host)]
        fields = _write_host(run, host, names, duration + pad, rate_hz, h * devices_per_host, buffer_hz, signal)
        for i, dev in enumerate(names):
            devices.append({"host": host, "device": dev, "kind": kind, "vendor": "synthetic", "name": "synthetic",
                            "uuid": f"synthetic-{h}-{i}", "supported": fields,
                            "properties": dict(device_properties or {})})
    for r in range(world):
        h, local = divmod(r, devices_per_host)
        # Megatron's order: tensor parallel innermost, then data parallel, pipeline outermost
        dp = world // (tp * pp)
        tp_c = r % tp
        dp_c = (r // tp) % dp
        pp_c = r // (tp * dp)
        rank_map.append({"rank": r, "host": f"node{h}", "local_rank": local,
                         "device": f"{'gpu' if kind == 'gpu' else 'cpu'}{local}",
                         "coords": {"dp": dp_c, "tp": tp_c, "pp": pp_c, "cp": 0, "ep": dp_c % ep}})
        ev = events_table(r, warmup=warmup, steps=steps, step_s=step_s, straggle_s=straggle_s,
                          tokens=tokens_per_rank, samples=samples_per_rank, start_offset_s=pad,
                          period_s=step_s + straggle_s * (world - 1), phase_splits=phase_splits)
        pq.write_table(ev, run.events_file(r))
    knobs_d = {"micro_batch": 1, "global_batch": 8, "recompute": "none", "precision": "bf16", **(knobs or {})}
    config = {
        "name": name or run.path.name,
        "model": model,
        "layout": {"dp": world // (tp * pp), "tp": tp, "pp": pp, "cp": 1, "ep": ep, **layout},
        "knobs": knobs_d,
        "hardware": {"nodes": hosts, "devices_per_node": devices_per_host, "device": device_type},
    }
    run.write({
        "schema": "powertrain.run/1", "kind": "train", "name": name or run.path.name, "status": status,
        "reason": reason, "synthetic": True, "generator": "powertrain.analyze.synthetic",
        "start_ns": T0_NS, "end_ns": T0_NS + int((duration + pad) * 1e9),
        "hosts": [f"node{h}" for h in range(hosts)], "devices": devices,
        "fields_supported": sorted({f for d in devices for f in d["supported"]}),
        "not_measured": [], "config": config, "rank_map": rank_map,
        "sampler": {"rate_hz": rate_hz},
    })
    return run.path


def _write_host(run: RunDir, host: str, names: list[str], duration_s: float, rate_hz: float, first_index: int,
                buffer_hz: float | None, signal: dict[str, Any]) -> list[str]:
    """One host's telemetry file (and, with ``buffer_hz``, its buffered power samples); the fields it holds."""
    tel = telemetry_table(host, names, duration_s=duration_s, rate_hz=rate_hz, first_index=first_index, **signal)
    pq.write_table(tel, run.telemetry_file(host))
    if buffer_hz:
        buf = power_samples_table(host, names, duration_s=duration_s, rate_hz=buffer_hz, first_index=first_index,
                                  **{k: v for k, v in signal.items() if k in POWER_SAMPLE_KEYS})
        (run.path / "telemetry" / "power-samples").mkdir(exist_ok=True)
        pq.write_table(buf, run.path / "telemetry" / "power-samples" / f"{host}.parquet")
    return [f for f in TELEMETRY_FIELDS if f != REPEAT and f in tel.column_names and tel[f].null_count < tel.num_rows]


def write_sweep(root: str | Path) -> Path:
    """A small synthetic sweep folder: two ok runs, an OOM (said so in its log), a segfault, and
    ``sweep.json`` entries for a rejected and a not-run configuration."""
    import json

    root = Path(root)
    root.mkdir(parents=True)
    write_run(root / "tp1pp1", hosts=1, devices_per_host=2, steps=2, base_w=400.0)
    write_run(root / "tp2pp1", hosts=1, devices_per_host=2, steps=2, base_w=450.0, layout={"tp": 2})
    write_run(root / "oom", hosts=1, devices_per_host=2, steps=2, status="failed",
              reason="command exited with code 1")
    (RunDir(root / "oom").logs_dir / "rank-0.stderr").write_text(
        "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB\n")
    write_run(root / "crash", hosts=1, devices_per_host=2, steps=2, status="failed",
              reason="command killed by SIGSEGV")
    (root / "sweep.json").write_text(json.dumps({"name": "demo", "synthetic": True, "runs": [
        {"id": "tp1pp1", "status": "ok", "variant": "base", "axes": {"tp": 1}},
        {"id": "tp2pp1", "status": "ok", "variant": "base", "axes": {"tp": 2}},
        {"id": "oom", "status": "failed", "variant": "base", "axes": {"tp": 4}},
        {"id": "crash", "status": "failed", "variant": "base", "axes": {"tp": 8}},
        {"id": "bad-heads", "status": "rejected", "reason": "heads (8) % tp (3) != 0",
         "config": {"model": "gpt3-tiny", "layout": {"tp": 3}}, "axes": {"tp": 3}},
        {"id": "later", "status": "not-run", "config": {"model": "gpt3-tiny"}, "axes": {"tp": 16}},
    ]}))
    return root
