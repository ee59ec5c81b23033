"""What every metric family reads, and what each returns.

Which devices count (:func:`select_devices`): the devices the run's ranks ran on, when ``run.json``'s
``rank_map`` says so for every rank — an accelerator rank's GPU (``local_device`` when the launch
placed ranks by ``launch.device_order``, else the index in its device name: ``cuda:1`` → ``gpu1``, or
the second GPU of the ``CUDA_VISIBLE_DEVICES`` the launch inherited, ``run.json`` ``visible_devices``), a
CPU rank's host devices (``cpu`` rows of its host). Other sampled accelerators (idle GPUs of the node,
the GPUs a CPU-spec run hides from its ranks) are listed under ``per_device`` but not counted, and a
note names them. Without such a map (imports, ``powertrain monitor``): the accelerators (every device
whose kind is not ``cpu``) when there are any, otherwise the host devices; and when more accelerators
were sampled than the run has ranks, a note says that idle ones may be counted.

The run's window — every energy, power and time metric of the run is over it — is, in this order:
``run.json["window"]`` (``{"t0_ns", "t1_ns", "source"}``, written by importers: MLPerf run_start →
run_stop, Zeus/Perseus windows, a user's ``import --window``); else the measured steps' extent (our
own runs); else, with a note saying so, the whole telemetry span.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from powertrain.analyze import steps, telemetry
from powertrain.analyze.events import RunEvents
from powertrain.core.energy import DEFAULT_HOLD_LIMIT_S, Intervals
from powertrain.store.rundir import RunDir

DeviceKey = tuple[str | None, str | None]
# How long a window edge may be held at the nearest reading (core.energy's default, stated here once).
HOLD_LIMIT_S = DEFAULT_HOLD_LIMIT_S


@dataclass
class Family:
    """One metric family's result: its metrics, why each null one is null (in the order the reasons
    were found), and notes for the summary."""

    metrics: dict[str, Any] = field(default_factory=dict)
    why_null: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class RunContext:
    """One run opened for analysis: its ``run.json``, events, measured steps, measurement window and
    per-device statistics in the window (``dev_stats``, one dict per device, see
    :func:`powertrain.analyze.telemetry.device_stats`). Holds a DuckDB connection: :meth:`close` it."""

    run: RunDir
    info: dict[str, Any]
    events: RunEvents  # queried where they lie (analyze.events): a long run's events are never one table
    sd: steps.StepData | None
    con: duckdb.DuckDBPyConnection
    w0: int
    w1: int
    window_source: str
    dev_stats: list[dict[str, Any]]
    kinds: dict[DeviceKey, dict[str, Any]]
    counted: list[dict[str, Any]]  # the devices the run-level metrics cover
    accel: bool  # whether those are accelerators (else host devices)
    no_tel: str | None  # the reason for every telemetry metric when there is no telemetry in the window
    notes: list[str]
    selection: dict[str, Any] = field(default_factory=dict)  # how ``counted`` was chosen (select_devices)
    visible: dict[int, list[str]] = field(default_factory=dict)  # node → its ranks' GPUs (visible_by_node)

    @property
    def config(self) -> Any:
        return self.info.get("config")

    @property
    def rank_map(self) -> list[dict[str, Any]]:
        return self.info.get("rank_map") or []

    @property
    def window_s(self) -> float:
        return (self.w1 - self.w0) / 1e9

    @property
    def n_dev(self) -> int:
        return len(self.counted)

    @property
    def tokens(self) -> float | None:
        """Tokens of all measured steps; None when any step's count is unknown (a count below zero is
        unknown already: analyze.steps keeps it out, data_quality.dropped_steps.negative_counts)."""
        sd = self.sd
        if sd is None or np.isnan(sd.tokens).any():
            return None
        return float(np.sum(sd.tokens))

    @property
    def missing_why(self) -> str | None:
        """Why the job-level energy is unknown because the data lacks devices or nodes the job had (a
        rank's device without telemetry, an MLPerf node without a power log); None when none is missing."""
        sel = self.selection.get("missing") or []
        imp = (self.info.get("data_quality") or {}).get("missing_devices") or {}
        parts = []
        if imp.get("names") or imp.get("missing"):
            parts.append(str(imp.get("why") or f"missing: {', '.join(map(str, imp.get('names') or []))}"))
        if sel:
            parts.append(f"{', '.join(sel)}: a rank ran there but it has no telemetry in the window")
        return "; ".join(parts) or None

    @property
    def rank_dev(self) -> dict[int, DeviceKey]:
        """Rank → the (host, device) of its telemetry, from the rank map (:func:`rank_device`)."""
        return {int(e["rank"]): rank_device(e, self.visible.get(_node(e))) or (e.get("host"), e.get("device"))
                for e in self.rank_map if "rank" in e}

    @property
    def coords(self) -> dict[int, dict[str, Any]]:
        """Rank → its parallel coordinates (dp, tp, pp, cp, ep) from the rank map."""
        return {int(e["rank"]): (e.get("coords") or {}) for e in self.rank_map if "rank" in e}

    def kind_of(self, s: dict[str, Any]) -> str:
        """A device's kind as ``run.json`` lists it; else ``cpu`` for ``cpu*`` names, else accelerator."""
        return _kind(self.kinds, s)

    def sensor(self, s: dict[str, Any], field: str = "power_w") -> dict[str, Any]:
        """What ``run.json`` says the device's ``field`` is (``devices[].properties.sensors[field]``: its
        source, driver name, probed update period, published averaging window, path); {} where it says
        nothing (an older run, an import)."""
        props = (self.kinds.get((s["host"], s["device"])) or {}).get("properties")
        sensors = props.get("sensors") if isinstance(props, dict) else None
        got = sensors.get(field) if isinstance(sensors, dict) else None
        return got if isinstance(got, dict) else {}

    def power_buffer(self, s: dict[str, Any]) -> dict[str, Any]:
        """``devices[].properties.power_buffer`` (``used``, ``depth``, ``why_not``); {} where not recorded."""
        props = (self.kinds.get((s["host"], s["device"])) or {}).get("properties")
        got = props.get("power_buffer") if isinstance(props, dict) else None
        return got if isinstance(got, dict) else {}

    def have(self, field: str) -> list[dict[str, Any]]:
        """The counted devices with samples of ``field`` in the window."""
        return [s for s in self.counted if s.get(f"{field}_n")]

    @property
    def window(self) -> dict[str, Any]:
        """The run's window as ``summary.json`` states it."""
        return {"t0_ns": self.w0, "t1_ns": self.w1, "source": self.window_source, "seconds": self.window_s}

    def close(self) -> None:
        telemetry.release(self.con)
        self.con.close()
        self.events.close()


def declared_window(info: dict[str, Any]) -> tuple[int, int, str] | None:
    """``run.json["window"]`` as ``(t0_ns, t1_ns, source)``, or None when the run declares none.

    A window that is present but malformed is an error (naming what to fix), never ignored."""
    w = info.get("window")
    if w is None:
        return None
    try:
        t0, t1 = w["t0_ns"], w["t1_ns"]
    except (TypeError, KeyError) as exc:
        raise ValueError(f"run.json window must be {{t0_ns, t1_ns, source}}, got {w!r}") from exc
    if isinstance(t0, bool) or isinstance(t1, bool) or not isinstance(t0, int) or not isinstance(t1, int):
        raise ValueError(f"run.json window t0_ns / t1_ns must be integers (ns since the epoch), got {w!r}")
    if t1 <= t0:
        raise ValueError(f"run.json window ends before it starts (t0_ns {t0} >= t1_ns {t1})")
    return t0, t1, str(w.get("source") or "run.json window (no source named)")


def _window(info: dict[str, Any], sd: steps.StepData | None, tspan: tuple[int, int] | None,
            notes: list[str]) -> tuple[int, int, str]:
    """The run's window and its source, in the order of the module doc."""
    declared = declared_window(info)
    if declared is not None:
        return declared
    if sd is not None:
        return sd.window[0], sd.window[1], "measured steps"
    if tspan is not None:
        notes.append("no window in run.json and no measured step events: telemetry metrics cover the whole "
                     "telemetry span")
        return tspan[0], tspan[1], "whole telemetry span (no window in run.json, no measured step events)"
    return 0, 0, "none"


# Above this many in-window power samples (all counted devices together), per-device spectra are
# skipped (the run-level oscillation still comes from the device-mean signal): each device's
# spectrum stream holds up to 2^17 samples before it turns to Welch segments.
PER_DEVICE_SPECTRUM_MAX_ROWS = 2_000_000


def _spectrum_devices(stats: list[dict[str, Any]], kinds: dict[DeviceKey, dict[str, Any]],
                      rank_map: list[dict[str, Any]], visible: dict[int, list[str]]) -> set[tuple[str, str]]:
    """The devices whose power spectrum ``per_device`` reports: the counted ones (:func:`select_devices`)
    with power samples, unless they hold more than PER_DEVICE_SPECTRUM_MAX_ROWS together."""
    counted = select_devices(stats, kinds, rank_map, visible=visible)[0]
    pw = [s for s in counted if s.get("power_w_n")]
    if sum(s["power_w_n"] for s in pw) > PER_DEVICE_SPECTRUM_MAX_ROWS:
        return set()
    return {(s["host"], s["device"]) for s in pw}


def _kind(kinds: dict[DeviceKey, dict[str, Any]], s: dict[str, Any]) -> str:
    d = kinds.get((s["host"], s["device"]))
    if d and d.get("kind"):
        return str(d["kind"])
    return "cpu" if s["device"].startswith("cpu") else "accelerator"


def _device_kind(info: dict[str, Any]) -> dict[DeviceKey, dict[str, Any]]:
    return {(d.get("host"), d.get("device")): d for d in info.get("devices", []) or []}


def open_context(run: RunDir, info: dict[str, Any]) -> RunContext:
    """Read a run's events and find its measured steps and window; open its telemetry in DuckDB and
    compute the per-device statistics in the window."""
    events = RunEvents.open(run.path)
    sd = steps.measured_steps(events, info.get("rank_map") or [], info.get("warmup_steps"))
    notes: list[str] = []
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    n_rows = telemetry.open_telemetry(con, run.path)
    tspan = telemetry.span(con)
    w0, w1, window_source = _window(info, sd, tspan, notes)
    sub = (sd.t_start_ns, sd.t_end_ns) if sd is not None else None
    kinds = _device_kind(info)
    visible = visible_by_node(info)
    dev_stats = (telemetry.device_stats(con, w0, w1, sub_windows=sub, hold_limit_s=HOLD_LIMIT_S,
                                        spectra=lambda stats: _spectrum_devices(stats, kinds, info.get("rank_map") or [],
                                                                                visible),
                                        relived=imported_relived(info), step_starts=_step_starts(sd, w0, w1))
                 if n_rows and w1 > w0 else [])
    _add_imported_steps_back(dev_stats, info)
    # the driver's buffered power samples, where the sampler read them: each device's peak comes from them
    buffers, unreadable = telemetry.buffer_stats(con, run.path, w0, w1) if dev_stats else ({}, None)
    for s in dev_stats:
        s["buffer"] = buffers.get((s["host"], s["device"]))
    if unreadable:
        notes.append(unreadable)
    notes += quality_notes(dev_stats)
    missing = (info.get("data_quality") or {}).get("missing_devices") or {}
    if missing.get("why"):
        notes.append(f"{missing['why']}: the run's energy, the cluster's power and energy per token are null; "
                     "per-device figures cover what was measured (data_quality.missing_devices)")
    for s in dev_stats:  # mean power over the window = energy / window seconds (null where energy is)
        e = s.get("energy_integral")
        if e is not None:
            s["power_w_mean"] = e.mean_power_w
    ctx = RunContext(run=run, info=info, events=events, sd=sd, con=con, w0=w0, w1=w1, window_source=window_source,
                     dev_stats=dev_stats, kinds=kinds, counted=[], accel=False,
                     no_tel="no telemetry in the measured window" if not dev_stats else None, notes=notes,
                     visible=visible)
    ranks_seen = 0 if info.get("kind") == "import" else events.ranks_seen()
    ctx.counted, ctx.accel, ctx.selection = select_devices(dev_stats, kinds, ctx.rank_map, ranks_seen, visible)
    if ctx.selection.get("note"):
        notes.append(ctx.selection["note"])
    if dev_stats and not ctx.counted:
        ctx.no_tel = "no telemetry of the devices the run's ranks ran on in the measured window"
    return ctx


def _step_starts(sd: steps.StepData | None, w0: int, w1: int) -> np.ndarray | None:
    """The starts of the measured steps inside the window, sorted (where the power samples land in them)."""
    if sd is None:
        return None
    inside = (sd.t_start_ns >= w0) & (sd.t_end_ns <= w1)
    return np.sort(sd.t_start_ns[inside].astype(np.int64))


def imported_relived(info: dict[str, Any]) -> dict[tuple[str, str], Intervals]:
    """Clock intervals an importer found re-lived after steps back (``run.json`` ``data_quality.devices[]
    .relived_ns``, ``[[start, end], ...]``): an import's rows are sorted, so the analysis cannot see them."""
    out: dict[tuple[str, str], Intervals] = {}
    for d in (info.get("data_quality") or {}).get("devices") or []:
        iv = d.get("relived_ns") if isinstance(d, dict) else None
        if isinstance(iv, list) and iv and all(isinstance(x, list) and len(x) == 2 for x in iv):
            arr = np.asarray(iv, dtype=np.int64)
            out[(str(d.get("host")), str(d.get("device")))] = (arr[:, 0], arr[:, 1])
    return out


def _add_imported_steps_back(dev_stats: list[dict[str, Any]], info: dict[str, Any]) -> None:
    """An import's steps back (its rows are sorted, so the written order the analysis sees has none)
    go into each device's ``written`` record, for ``data_quality`` and the notes."""
    entries = {(d.get("host"), d.get("device")): d for d in (info.get("data_quality") or {}).get("devices") or []
               if isinstance(d, dict) and d.get("clock_steps_back")}
    for s in dev_stats:
        e, w = entries.get((s["host"], s["device"])), s.get("written")
        if e is None or w is None or w.steps_back:
            continue
        w.steps_back = int(e["clock_steps_back"])
        w.stepped_back_s = float(e.get("clock_stepped_back_s") or 0.0)
        iv = e.get("relived_ns") or []
        w.first_step = (int(iv[0][1]), int(iv[0][0])) if iv else None


def _utc(t_ns: int) -> str:
    return _dt.datetime.fromtimestamp(t_ns / 1e9, _dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def quality_notes(dev_stats: list[dict[str, Any]]) -> list[str]:
    """One note each for steps back of a clock, gaps energy does not bridge and implausible readings
    kept out, naming the devices (the counts per device are in ``data_quality``)."""
    notes = []
    back = [s for s in dev_stats if s.get("written") is not None and s["written"].steps_back]
    if back:
        first = back[0]["written"]
        t_from, t_to = first.first_step or (0, 0)
        notes.append(
            f"the clock went backwards on {_names(back)}: {sum(s['written'].steps_back for s in back)} step(s), "
            f"{sum(s['written'].stepped_back_s for s in back):.1f} s in all (first on {back[0]['host']}/"
            f"{back[0]['device']}: from {_utc(t_from)} to {_utc(t_to)}); energy over a window a step back "
            "falls in is null (data_quality.time)")
    gaps = [(s, e) for s in dev_stats if (e := s.get("energy_integral")) is not None and e.long_gaps]
    if gaps:
        notes.append(
            f"power readings have gaps longer than energy bridges on {_names([s for s, _ in gaps])}: "
            f"{sum(e.long_gaps for _, e in gaps)} gap(s), {sum(e.long_gap_s for _, e in gaps):.1f} s of the "
            f"window in all (limit {max(e.gap_limit_s or 0 for _, e in gaps):.3g} s); the energy integral over "
            "the window is null where one falls (data_quality.time)")
    bridged = [(s, e) for s in dev_stats if (e := s.get("energy_integral")) is not None and e.bridged_gaps]
    if bridged:
        notes.append(
            f"energy bridges gaps in the power readings longer than 5 sampling intervals on "
            f"{_names([s for s, _ in bridged])}: {sum(e.bridged_gaps for _, e in bridged)} gap(s), the longest "
            f"{max(e.bridged_gap_max_s for _, e in bridged):.1f} s, "
            + ", ".join(f"{e.bridged_gap_s:.1f} s ({e.bridged_gap_s / e.window_s * 100:.1f} % of the window) on "
                        f"{s['host']}/{s['device']}" for s, e in bridged[:4] if e.window_s > 0)
            + (" …" if len(bridged) > 4 else "") + ": linear power across them (data_quality.time)")
    bad: dict[str, dict[str, int]] = {}
    for s in dev_stats:
        for f, kinds in (s.get("implausible") or {}).items():
            for k, n in kinds.items():
                bad.setdefault(f, {})[k] = bad.setdefault(f, {}).get(k, 0) + n
    for f, kinds in sorted(bad.items()):
        devs = [s for s in dev_stats if f in (s.get("implausible") or {})]
        what = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in sorted(kinds.items()))
        notes.append(f"{f}: {sum(kinds.values())} implausible reading(s) in the window ({what}) on "
                     f"{_names(devs)} kept out of every metric (data_quality.implausible)")
    return notes


# A device name that ends in its index: cuda:1, hip:0, xpu:2 (torch's), gpu3 (the samplers' and importers').
_INDEXED = re.compile(r"[A-Za-z_]+:?(\d+)")


def rank_device(entry: dict[str, Any], visible: list[str] | None = None) -> DeviceKey | None:
    """The (host, telemetry device) of a rank-map entry's accelerator: ``gpu<local_device>`` when the
    launch placed it by ``launch.device_order``; else the i-th of ``visible`` (its node's GPUs as the
    ranks saw them, :func:`visible_by_node`) for ``cuda:i``, or ``gpu<i>`` when nothing narrowed them;
    the samplers name GPUs by their NVML / amdsmi index. None for a CPU rank, a name without an index
    or an index ``visible`` does not reach."""
    dev = entry.get("device")
    if not isinstance(dev, str) or dev.startswith("cpu"):
        return None
    local = entry.get("local_device")
    if isinstance(local, int) and not isinstance(local, bool):
        return entry.get("host"), f"gpu{local}"
    m = _INDEXED.fullmatch(dev)
    if not m:
        return None
    i = int(m.group(1))
    if visible is None:
        return entry.get("host"), f"gpu{i}"
    return (entry.get("host"), visible[i]) if i < len(visible) else None


def _node(entry: dict[str, Any]) -> int:
    n = entry.get("node")
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


# Which recorded variables choose a vendor's GPUs, outermost first (launch.controls applies the same).
_VISIBLE_VARS = {"nvidia": ("CUDA_VISIBLE_DEVICES",), "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}


def visible_by_node(info: dict[str, Any]) -> dict[int, list[str]]:
    """Node → the telemetry names of the GPUs its ranks saw, in their ``cuda:i`` order, from the
    visible-devices variables the launch inherited (``run.json`` ``visible_devices`` for node 0,
    ``nodes.exits[n].visible_devices`` for the others) and the node's GPU vendor. A node where none was
    set is left out (``cuda:i`` is ``gpu<i>``). An entry that is neither an index nor the UUID (or a
    prefix of it) of a sampled GPU of the node names no device: the list then stops before it, as the
    CUDA runtime stops at an entry it cannot use, so the ranks past it are not placed."""
    records: dict[int, Any] = {0: info.get("visible_devices")}
    for n, ex in ((info.get("nodes") or {}).get("exits") or {}).items():
        if isinstance(ex, dict) and str(n).isdigit():
            records[int(n)] = ex.get("visible_devices")
    hosts = {_node(e): e.get("host") for e in info.get("rank_map") or [] if "rank" in e}
    out: dict[int, list[str]] = {}
    for node, rec in records.items():
        if not isinstance(rec, dict):
            continue
        gpus = [d for d in info.get("devices") or [] if d.get("host") == hosts.get(node) and d.get("kind") != "cpu"]
        vendors = {d.get("vendor") for d in gpus}
        vendor = next(iter(vendors)) if len(vendors) == 1 else "nvidia"  # CUDA's variable when the vendor is unknown
        names: list[str] | None = None
        for var in _VISIBLE_VARS.get(str(vendor), ()):
            raw = rec.get(var)
            if not isinstance(raw, str):
                continue
            listed: list[str] = []
            for item in (x.strip() for x in raw.split(",")):
                name: str | None
                if names is not None and item.isdigit():  # an inner variable indexes into what the outer left
                    name = names[int(item)] if int(item) < len(names) else None
                else:
                    name = _gpu_named(item, gpus)
                    if names is not None and name not in names:
                        name = None
                if name is None:
                    break
                listed.append(name)
            names = listed
        if names is not None:
            out[node] = names
    return out


def _gpu_named(item: str, gpus: list[dict[str, Any]]) -> str | None:
    """The telemetry name of one visible-devices entry: ``gpu<index>``, or the sampled GPU whose UUID
    it is or starts (the CUDA runtime accepts a unique prefix); None for anything else (MIG, unknown)."""
    if item.isdigit():
        return f"gpu{int(item)}"
    if not item:
        return None
    hits = [d.get("device") for d in gpus if isinstance(d.get("uuid"), str) and d["uuid"].startswith(item)]
    return str(hits[0]) if len(hits) == 1 else None


def _names(stats: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s['device']} ({s['host']})" for s in stats)


def select_devices(stats: list[dict[str, Any]], kinds: dict[DeviceKey, dict[str, Any]],
                   rank_map: list[dict[str, Any]], ranks_seen: int = 0, visible: dict[int, list[str]] | None = None,
                   ) -> tuple[list[dict[str, Any]], bool, dict[str, Any]]:
    """Of ``stats`` (one dict per sampled device), the devices the run-level metrics count (see the
    module doc), whether they are accelerators, and how they were chosen (``summary.json``
    ``data_quality.device_selection``: ``rule``, ``not_counted``, ``missing`` (devices a rank ran on
    without telemetry in the window), ``note``). ``ranks_seen``: how many ranks recorded events, for a run
    without a rank map (0: unknown, as in an import, whose events stand for the whole job). ``visible``:
    each node's GPUs as its ranks saw them (:func:`visible_by_node`)."""
    visible = visible or {}
    accel = [s for s in stats if _kind(kinds, s) != "cpu"]
    entries = [e for e in rank_map if "rank" in e]
    tel_hosts = {s["host"] for s in stats}
    gpu_keys: list[DeviceKey] = []
    cpu_hosts: set[Any] = set()
    placed = bool(entries)
    for e in entries:
        dev = e.get("device")
        key = rank_device(e, visible.get(_node(e)))
        if e.get("host") is None:
            placed = False  # a node whose host never became known: its telemetry cannot be told
        elif isinstance(dev, str) and dev.startswith("cpu"):
            cpu_hosts.add(e.get("host"))
        elif key is not None:
            gpu_keys.append(key)
        else:
            placed = False  # a rank whose device the map does not name
    if placed and stats and not ({h for h, _ in gpu_keys} | cpu_hosts) & tel_hosts:
        placed = False  # the map's hosts are not the telemetry's: nothing to match them with
    if not placed:
        n_ranks = len(entries) or ranks_seen
        note = None
        if n_ranks and len(accel) > n_ranks:
            note = (f"{len(accel)} accelerators were sampled and the run has {n_ranks} rank(s) but does not record "
                    "which devices they ran on: energy, power and per-token metrics count all of them, idle ones "
                    "included; per_device has each device's own (powertrain run records the rank → device map)")
        return (accel or stats), bool(accel), {"rule": "every sampled accelerator, else the host devices (the run "
                                                "records no usable rank → device map)", "not_counted": [], "missing": [],
                                                "note": note}
    want = set(gpu_keys)
    counted = [s for s in stats if (s["host"], s["device"]) in want
               or (s["host"] in cpu_hosts and _kind(kinds, s) == "cpu")]
    have = {(s["host"], s["device"]) for s in counted}
    missing = sorted(f"{d} ({h})" for h, d in want - have)
    not_counted = [s for s in accel if (s["host"], s["device"]) not in have]
    parts = []
    if not_counted:
        how = ("" if all(isinstance(e.get("local_device"), int) or _node(e) in visible
                         for e in entries if rank_device(e, visible.get(_node(e)))) else
               " (local rank i on GPU i; if CUDA_VISIBLE_DEVICES was set around the launch, give "
               "launch.device_order instead)")
        parts.append(f"{_names(not_counted)} sampled but no rank ran on them{how}: not counted in energy, power or "
                     "per-token metrics (per_device lists them)")
    if missing:
        parts.append(f"{', '.join(missing)}: a rank ran there but it has no telemetry in the window, so the run-level "
                     "energy is unknown and power covers the other devices (per_device has each one's own)")
    return counted, bool(want), {"rule": "the devices of the run's ranks (rank_map)",
                                 "not_counted": [f"{s['device']} ({s['host']})" for s in not_counted],
                                 "missing": missing, "note": "; ".join(parts) or None}
