"""Zeus outputs → run directories.

* **energy windows** (``ZeusMonitor`` / power-limit optimizer CSV)
  ``start_time,window_name,elapsed_time,gpu<i>_energy[,...]`` → one ``step`` event per window on
  rank 0, named after the window, with ``attrs.energy_j = {"gpu<i>": J}`` and the sum. A window is
  the unit Zeus measured (it spans an unrecorded number of iterations), so each window is one step
  of the import and its "step time" is the window's duration — ``run.json`` says so under
  ``step_unit``; the window CSV's GPUs are the job's devices. Zeus
  stamps windows with ``time.monotonic()`` in the files we know: a start time before 2001 needs
  ``anchor_ns`` (``--anchor``), which places the first window; the others keep their spacing.
* **power samples** ``Time,Power`` (Power in **milliwatts**, ``Time`` local wall-clock) →
  telemetry ``power_w`` of ``node0/gpu0``.
* **Perseus** profiles (``<plan>.prof.json``: per-rank ``iter_time`` s and ``iter_energy`` J lists)
  → ``step`` events per rank, back to back from ``anchor_ns`` (the source holds durations, not
  times; refused without an anchor), with ``attrs.energy_j`` = that rank's GPU energy for the
  iteration. Every iteration is measured except the first ``warmup_steps``; the profile's ranks are
  the job's devices (``run.json`` ``job_device_count``). Several plans follow one another, their
  iterations numbered on. The per-microbatch ``time_breakdown`` has no positions in time and is
  dropped (listed).
* **Perseus folders** (as the SOSP'24 artifact ships them: ``<plan>.prof.json``, ``<plan>.sched.json``,
  ``perseus.json``, ``models_<gpu>.csv``): every profile, in numeric plan order; ``perseus.json`` and
  the models CSV are recorded in ``run.json["perseus"]``; the ``.sched.json`` per-instruction clock
  plans have no positions in time and are listed as dropped. A folder of Zeus CSVs imports each CSV.

**The run's window and its energy.** Zeus and Perseus measure *energy per window* (per iteration),
not power readings. So that ``summarize`` reports that very figure on the one energy rule
(:mod:`powertrain.core.energy`), each device's windows are written as telemetry ``energy_j``: a
cumulative counter per device with one row at every window start and end (start of the first = 0 J,
each end = the sum of that device's windows so far). The counter path integrates such a counter
exactly, so the energy of the run's window equals the sum of its windows' energies. ``run.json
["window"]`` is the first window (iteration) start → the last window (iteration) end. Zeus windows
may leave gaps between them (the power-limit optimizer's own time): nothing was measured there, the
counter stays flat across a gap, and ``run.json["zeus"]["unmeasured_s"]`` (with a warning) says how
many seconds of the window that is — the figure is the windows' energy, not an estimate of the gaps.
A device with an implausible window energy (negative, non-finite) gets no counter at all (its
``data_quality`` entry says why): a counter with a hole would under-count silently.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from powertrain.importers.common import (
    ANCHOR_HELP,
    RunBuilder,
    SourceFormatError,
    events_table,
    iso,
    mark_window,
    open_text,
    read_text,
    resolve_zone,
    set_job_devices,
    telemetry_table,
)
from powertrain.importers.sanity import screen

EPOCH_2001_S = 978_307_200


def sniff(path: Path) -> str | None:
    """``"window"``, ``"power"``, ``"perseus"`` or ``None`` from a file's first line."""
    try:
        with open_text(path) as f:
            head = f.readline().strip()
    except OSError:
        return None
    low = head.lower().replace(" ", "")
    if low.startswith("start_time,window_name,elapsed_time"):
        return "window"
    if low == "time,power":
        return "power"
    if path.name.endswith(".prof.json") or (head.startswith("[") and "iter_energy" in read_text(path)[:4000]):
        return "perseus"
    return None


def read_windows(path: Path, b: RunBuilder, anchor_ns: int | None = None,
                 first_step: int = 0) -> tuple[list[dict[str, Any]], bool]:
    """Window events, and whether ``anchor_ns`` placed them (monotonic-clock start times)."""
    events: list[dict[str, Any]] = []
    with open_text(path) as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        gpus = [h for h in header[3:] if h.endswith("_energy")]
        if len(gpus) != len(header) - 3:
            raise SourceFormatError(path, 1, "columns after elapsed_time must be <device>_energy")
        relative = False
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) != len(header):
                raise SourceFormatError(path, lineno, f"expected {len(header)} values, found {len(row)}")
            try:
                start, elapsed = float(row[0]), float(row[2])
                energy = {g.removesuffix("_energy"): float(v) for g, v in zip(gpus, row[3:], strict=True)}
            except ValueError:
                raise SourceFormatError(path, lineno, f"not a number in {row!r}") from None
            relative |= start < EPOCH_2001_S
            t0 = round(start * 1e9)
            events.append({"rank": 0, "kind": "step", "step": first_step + len(events), "name": row[1], "t_start_ns": t0,
                           "t_end_ns": t0 + round(elapsed * 1e9),
                           "attrs": {"energy_j": energy, "energy_total_j": sum(energy.values()),
                                     "elapsed_s": elapsed, "source": path.name, "where": f"{path.name}:{lineno}"}})
    b.mapped["start_time,elapsed_time,window_name"] = "events step (rank 0), one per window"
    b.info["step_unit"] = ("one Zeus measurement window (its iteration count is not recorded): step time is "
                           "the window's duration, step energy the window's energy")
    set_job_devices(b, len(gpus), f"{path.name}: one <gpu>_energy column per device")
    b.mapped["<gpu>_energy (J)"] = "event attrs.energy_j[<gpu>]"
    if relative and events:
        if anchor_ns is None:
            raise SourceFormatError(path, None, "window start times are time.monotonic() seconds, not wall-clock: "
                                                f"{ANCHOR_HELP} for the first window's start")
        shift = anchor_ns - min(e["t_start_ns"] for e in events)  # monotonic zero (boot) is unknown
        for e in events:
            e["t_start_ns"] += shift
            e["t_end_ns"] += shift
            e["attrs"]["monotonic_start_s"] = (e["t_start_ns"] - shift) / 1e9
        b.info["time_origin"] = (f"{path.name}: zeus window start_time is time.monotonic(), not the epoch; the "
                                 f"first window is placed at --anchor {iso(anchor_ns)}, the others keep their spacing")
    return events, relative


def read_power(path: Path, b: RunBuilder, tz: dt.tzinfo) -> None:
    t: list[int] = []
    w: list[float] = []
    lines: list[int] = []
    with open_text(path) as f:
        reader = csv.reader(f)
        next(reader)
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) != 2:
                raise SourceFormatError(path, lineno, f"expected 'Time,Power', found {len(row)} values")
            try:
                ts = row[0].strip()
                head, _, frac = ts.partition(".")
                sec = dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=tz).timestamp()
                t.append(int(sec) * 1_000_000_000 + (int((frac + "000000000")[:9]) if frac else 0))
                w.append(float(row[1]) / 1000.0)
                lines.append(lineno)
            except ValueError:
                raise SourceFormatError(path, lineno, f"expected 'YYYY-MM-DD HH:MM:SS.fff,<mW>', found {row!r}") from None
    if not t:
        raise SourceFormatError(path, None, "no samples after the header")
    where = [f"{path.name}:{n}" for n in lines]
    b.add_telemetry(telemetry_table(t, "node0", "gpu0", {"power_w": screen(b, "power_w", np.asarray(w), where=where)}))
    b.add_device("node0", "gpu0", kind="gpu", vendor="nvidia")
    b.mapped["Power (mW)"] = "telemetry.power_w (÷1000) of node0/gpu0"


def read_perseus(path: Path, b: RunBuilder, offset_ns: int, first_step: int = 0) -> list[dict[str, Any]]:
    """Per-rank iterations of one profile from ``offset_ns``, numbered from ``first_step``.

    Iteration ``i`` of every rank starts at the same instant (a synchronous job: each iteration ends
    with the pipeline flush and the optimizer step on all ranks); the iteration lasts as long as its
    slowest rank, and each rank's step event its own ``iter_time``."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise SourceFormatError(path, exc.lineno, f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) and "iter_time" in r for r in data):
        raise SourceFormatError(path, 1, "expected a list of per-rank objects with iter_time and iter_energy")
    plan = path.name.split(".")[0]
    events = []
    n_iter = {len(r.get("iter_time") or []) for r in data}
    if len(n_iter) != 1:
        raise SourceFormatError(path, None, f"the ranks list different numbers of iterations ({sorted(n_iter)})")
    starts = [offset_ns]
    for i in range(n_iter.pop()):
        starts.append(starts[-1] + max(round(float(r["iter_time"][i]) * 1e9) for r in data))
    for r in data:
        rank = int(r["rank"])
        times, energies = r.get("iter_time") or [], r.get("iter_energy") or []
        if len(energies) not in (0, len(times)):
            raise SourceFormatError(path, None, f"rank {rank}: {len(times)} iter_time but {len(energies)} iter_energy")
        for i, it in enumerate(times):
            t = starts[i]
            events.append({"rank": rank, "kind": "step", "name": "iteration", "step": first_step + i,
                           "t_start_ns": t, "t_end_ns": t + round(float(it) * 1e9),
                           "attrs": {"energy_j": float(energies[i]) if energies else None, "iteration": i,
                                     "frequency_plan": plan, "source": path.name,
                                     "where": f"{path.name}: rank {rank} iter_energy[{i}]"}})
    b.mapped["iter_time (s)"] = ("events step per rank; iteration i of every rank starts together, the "
                                 "iterations follow one another from --anchor (each as long as its slowest rank)")
    b.mapped["iter_energy (J)"] = "step attrs.energy_j (that rank's GPU)"
    b.drop("time_breakdown / energy_breakdown: per-instruction durations without positions in time")
    ranks = len(data)
    prev = b.info.get("job_device_count")
    if prev is not None and prev != ranks:
        raise SourceFormatError(path, None, f"{ranks} ranks, but an earlier profile of this import has {prev}: "
                                            "import one job at a time")
    set_job_devices(b, ranks, "Perseus profile: one entry per rank of the job (one rank per GPU)")
    return events


def expand_sources(paths: Sequence[str | Path], b: RunBuilder) -> list[tuple[Path, str]]:
    """``(file, kind)`` of every source: files as given, folders opened (Perseus plans in numeric
    order, then Zeus CSVs by name); a folder's Perseus configuration goes to ``run.json["perseus"]``."""
    out: list[tuple[Path, str]] = []
    for p in map(Path, paths):
        if not p.is_dir():
            kind = sniff(p)
            if kind is None:
                raise SourceFormatError(p, 1, "not a Zeus window CSV (start_time,window_name,elapsed_time,...), "
                                              "power CSV (Time,Power) or Perseus .prof.json")
            out.append((p, kind))
            continue
        found: list[tuple[Path, str]] = []
        for x in sorted(p.iterdir(), key=_plan_order):
            if not x.is_file():
                continue
            kind = sniff(x)
            if kind is not None:
                found.append((x, kind))
            elif x.name.endswith(".sched.json"):
                b.drop(f"{x.name}: Perseus per-instruction SM clock plan, no positions in time")
            elif x.name == "perseus.json" or (x.name.startswith("models_") and x.suffix == ".csv"):
                _perseus_config(x, b)
            elif x.name != "LICENSE":
                b.drop(f"{x.name}: not a Zeus/Perseus data file")
        if not found:
            raise SourceFormatError(p, None, "no Zeus window CSV, Zeus power CSV or Perseus <plan>.prof.json "
                                             "in this folder")
        out += found
    return out


def _plan_order(x: Path) -> tuple[int, float, str]:
    head = x.name.split(".")[0]
    return (0 if x.name.endswith(".prof.json") else 1, float(head) if head.isdigit() else float("inf"), x.name)


def _perseus_config(x: Path, b: RunBuilder) -> None:
    """``perseus.json`` (scheduler settings) and ``models_<gpu>.csv`` (parallel layout per model), as given."""
    b.add_source(x, role="perseus configuration")
    info = b.info.setdefault("perseus", {})
    if x.suffix == ".json":
        try:
            info["config"] = json.loads(read_text(x))
        except json.JSONDecodeError as exc:
            raise SourceFormatError(x, exc.lineno, f"not valid JSON ({exc.msg})") from None
        return
    with open_text(x) as f:
        rows = list(csv.DictReader(f))
    info["models"] = rows
    folder = x.parent.name.lower()
    match = [r for r in rows if r.get("model") and r["model"].lower() in folder]
    if len(match) == 1:
        info["layout"] = match[0]
        info["layout_note"] = f"the row of {x.name} whose model is named in the folder name {x.parent.name!r}"


def write_energy_counters(b: RunBuilder, events: list[dict[str, Any]], span: tuple[int, int]) -> None:
    """Each device's window energies as a cumulative ``energy_j`` counter (see the module doc)."""
    per_dev: dict[str, list[tuple[int, int, float, str]]] = {}
    for e in events:
        if e.get("kind") != "step":
            continue
        a = e["attrs"]
        energy = a.get("energy_j")
        pairs = energy.items() if isinstance(energy, dict) else [(f"gpu{e['rank']}", energy)]
        for dev, j in pairs:
            per_dev.setdefault(dev, []).append((e["t_start_ns"], e["t_end_ns"], np.nan if j is None else float(j),
                                                a.get("where") or a.get("source", "")))
    unmeasured: dict[str, float] = {}
    for dev, wins in sorted(per_dev.items()):
        wins.sort()
        t0 = np.array([w[0] for w in wins], dtype=np.int64)
        t1 = np.array([w[1] for w in wins], dtype=np.int64)
        j = screen(b, "energy_j", np.array([w[2] for w in wins]), where=[w[3] for w in wins])
        why = None
        if np.isnan(j).any():
            why = f"{int(np.isnan(j).sum())} window(s) without a plausible energy: no counter (it would under-count)"
        elif (t0[1:] < t1[:-1]).any():
            why = "windows overlap: their energies cannot be one cumulative counter"
        if why:
            b.device_quality("node0", dev, why_null=why)
            continue
        t, c = _counter_rows(t0, t1, j, span)
        b.add_telemetry(telemetry_table(t, "node0", dev, {"energy_j": c}))
        if not any(d["host"] == "node0" and d["device"] == dev for d in b.devices):
            b.add_device("node0", dev, kind="gpu", vendor="nvidia")
        unmeasured[dev] = float((span[1] - span[0] - np.sum(t1 - t0)) / 1e9)
    b.mapped["window energies"] = "telemetry energy_j: cumulative per device at window starts and ends"
    if unmeasured:
        b.info.setdefault("zeus", {})["unmeasured_s"] = unmeasured
        worst = max(unmeasured.values())
        if worst > 1e-3 * (span[1] - span[0]) / 1e9:
            b.warn(f"energy is the sum of the measured windows: up to {worst:.1f} s of the "
                   f"{(span[1] - span[0]) / 1e9:.1f} s window lie between windows and were not measured "
                   "(run.json zeus.unmeasured_s per device)")


def _counter_rows(t0: np.ndarray, t1: np.ndarray, j: np.ndarray, span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a flat-between-windows cumulative counter that covers ``span`` (0 J at its start)."""
    cum = np.concatenate([[0.0], np.cumsum(j)])
    t = [span[0]]
    c = [0.0]
    for i in range(t0.size):
        if t0[i] > t[-1]:
            t.append(int(t0[i]))
            c.append(cum[i])
        t.append(int(t1[i]))
        c.append(cum[i + 1])
    if span[1] > t[-1]:
        t.append(span[1])
        c.append(cum[-1])
    return np.asarray(t, dtype=np.int64), np.asarray(c)


def import_zeus(paths: Sequence[str | Path], tz: str | None = None, name: str | None = None,
                anchor_ns: int | None = None, warmup_steps: int | None = None) -> RunBuilder:
    """Import Zeus window CSVs, Zeus power-sample CSVs and Perseus profiles (sniffed per file), or
    folders of them.

    Sources without wall-clock times (Perseus profiles, monotonic-clock window CSVs) are placed at
    ``anchor_ns`` (epoch ns, ``--anchor``) and refused without it. Perseus iterations are steps: all
    measured except the first ``warmup_steps`` (default 0).
    """
    tzinfo, tzname = resolve_zone(tz)
    b = RunBuilder(format="zeus", name=name)
    events: list[dict[str, Any]] = []
    anchor_used = False
    perseus: list[str] = []
    for p, kind in expand_sources(paths, b):
        b.add_source(p, role=f"zeus {kind}")
        if kind == "window":
            ev, used = read_windows(p, b, anchor_ns, first_step=1 + max(
                (e["step"] for e in events if e["kind"] == "step"), default=-1))
            events += ev
            anchor_used |= used
            b.times_without_zone(p, "Zeus window start times are time.monotonic() seconds, placed by --anchor"
                                 if used else "Zeus window start times are epoch seconds")
        elif kind == "power":
            read_power(p, b, tzinfo)
            b.read_local_times = True
            b.info["import_timezone"] = {"zone": tzname, "note": "Zeus power CSV times are local wall-clock"}
        else:
            if anchor_ns is None:
                raise SourceFormatError(p, None, "a Perseus profile holds durations, not wall-clock times: "
                                                 f"{ANCHOR_HELP} for the first iteration's start")
            # several plans in one import run one after another, in the order given, steps numbered on
            prior = [e for e in events if e["kind"] == "step"]
            events += read_perseus(p, b, offset_ns=max((e["t_end_ns"] for e in prior), default=anchor_ns),
                                   first_step=max((e["step"] for e in prior), default=-1) + 1)
            anchor_used = True
            perseus.append(p.name)
            b.times_without_zone(p, "a Perseus profile holds durations only, placed by --anchor")
    if anchor_ns is not None and not anchor_used:
        raise ValueError("--anchor is only for sources without wall-clock times (Perseus profiles, monotonic "
                         "Zeus windows), and none was given: drop --anchor")
    if perseus:
        b.info["time_origin"] = (f"Perseus profiles ({', '.join(perseus)}) hold durations only: iterations are "
                                 f"placed one after another from --anchor {iso(anchor_ns)}, every rank's "
                                 "iteration i starting together")
        b.info["rank_map"] = [{"rank": r, "host": "node0", "local_rank": r, "device": f"gpu{r}"}
                              for r in sorted({e["rank"] for e in events})]
    steps = [e for e in events if e["kind"] == "step"]
    if steps:
        span = (min(e["t_start_ns"] for e in steps), max(e["t_end_ns"] for e in steps))
        b.set_window(*span, "Perseus: first iteration start → last iteration end" if perseus
                     else "Zeus: first window start → last window end")
        write_energy_counters(b, events, span)
    mark_window(events, warmup_steps, b)
    b.add_events(events_table(events))
    return b
