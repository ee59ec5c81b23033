"""MLPerf Training logs (``:::MLLOG`` JSON lines): node power readings and the run's step timing.

Inputs (any mix, files or folders; ``.gz`` is read transparently):

* power logs ``node_<N>.txt`` — ``power_reading`` (W, node-level, AC or DC side) every ~2 s between
  ``power_measurement_start`` / ``_stop``, stamped in epoch milliseconds. Each node becomes host
  ``node_<N>`` with one device ``node`` whose readings go to ``power_w``.
* the result log ``result_*.txt`` — the job's stdout, lines optionally prefixed by the Slurm rank
  (``  0: :::MLLOG {...}``). ``run_start`` / ``run_stop`` become a ``phase`` event named ``run``,
  ``eval_start`` / ``eval_stop`` become ``eval`` events (with ``eval_accuracy`` in attrs),
  ``tracked_stats`` ``{"train_step_timing in s": x}`` become ``step`` events (``t_end`` = the log
  time, ``t_start = t_end - x``), ``{"throughput": x}`` (Llama-2 LoRA) become ``phase`` events
  ``train_block`` spanning the previous tracked point to this one. All events are on rank 0: the log
  describes the whole job, so ``tokens`` / ``samples`` of a step are the global batch's. The
  measured window is the format's own: the steps inside run_start → run_stop (less the first
  ``warmup_steps``, default 0).
* ``system_*.json`` — the system description: ``number_of_nodes × accelerators_per_node`` is the
  job's device count (``run.json`` ``job_device_count``), which per-device throughput divides by.
* ``total_power.txt`` — the submitter's energy (kWh), kept for comparison.

Everything is on the log's own epoch-ms clock, shared by all nodes. Per-step energy (attrs
``energy_j``) is the sum over nodes of the integral of node power over the step window
(:mod:`powertrain.importers.energy`, trapezoid rule).

Quirks tolerated, with a warning (never by dropping readings): a stop marker stamped before the
start marker or before the last reading (seen in a real submission, where the stop line carries the
start's timestamp), ``"value": "null"`` strings, readings outside the start/stop markers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from powertrain.core.series import clip_interp, trapezoid_j
from powertrain.importers.common import (
    RunBuilder,
    SourceFormatError,
    events_table,
    mark_window,
    open_text,
    set_job_devices,
    telemetry_table,
)
from powertrain.importers.energy import energy_between_j

MARK = ":::MLLOG"
_NODE_RE = re.compile(r"^node_(\d+)\.txt(\.gz)?$")
_RESULT_RE = re.compile(r"^result_.*\.txt(\.gz)?$")


def iter_mllog(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line number, prefix, record)`` for every ``:::MLLOG`` line of a file.

    Only lines containing the marker are JSON-decoded (the rest of a job log is skipped with one
    substring test), so a multi-MB log costs one pass.
    """
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            k = line.find(MARK)
            if k < 0:
                continue
            try:
                rec = json.loads(line[k + len(MARK):])
            except json.JSONDecodeError as exc:
                raise SourceFormatError(path, lineno, f"text after {MARK} is not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict) or "key" not in rec or "time_ms" not in rec:
                raise SourceFormatError(path, lineno, f"{MARK} record lacks 'key' or 'time_ms'")
            yield lineno, line[:k].strip().rstrip(":").strip(), rec


def classify(paths: Sequence[str | Path], builder: RunBuilder | None = None) -> dict[str, list[Path]]:
    """Sort sources into result logs, node power logs and submitter totals (folders are searched)."""
    out: dict[str, list[Path]] = {"result": [], "power": [], "total": [], "other": []}
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(x for x in p.iterdir() if x.is_file())
            power_dirs = sorted(x for x in p.iterdir() if x.is_dir() and x.name.startswith("power"))
            if power_dirs:
                chosen = next((d for d in power_dirs if d.name == "power_ac"), power_dirs[0])
                for d in power_dirs:
                    if d != chosen and builder:
                        builder.drop(f"{d}: another power measurement of the same run (imported {chosen.name}); "
                                     "pass that folder explicitly to import it instead")
                files += sorted(x for x in chosen.iterdir() if x.is_file())
            for d in sorted(x for x in p.iterdir() if x.is_dir() and x not in power_dirs):
                if builder:
                    builder.drop(f"{d}: sub-folder not searched (another run?); import it separately")
        elif p.is_file():
            files = [p]
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
        for f in files:
            if _NODE_RE.match(f.name):
                out["power"].append(f)
            elif _RESULT_RE.match(f.name):
                out["result"].append(f)
            elif f.name.startswith("total_power"):
                out["total"].append(f)
            else:
                out["other"].append(f)
    return out


def _number(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def read_node_power(path: Path, builder: RunBuilder) -> tuple[str, np.ndarray, np.ndarray]:
    """One node's readings: ``(host, t_ns, power_w)``; markers are checked, never trusted to cut."""
    m = _NODE_RE.match(path.name)
    host = f"node_{m.group(1)}" if m else path.name.split(".")[0]
    t: list[int] = []
    w: list[float] = []
    start = stop = None
    nulls = 0
    for lineno, _, rec in iter_mllog(path):
        key = rec["key"]
        if key == "power_reading":
            v = _number(rec.get("value"))
            if v is None:
                nulls += 1
                continue
            if not isinstance(rec["time_ms"], int | float):
                raise SourceFormatError(path, lineno, f"time_ms is not a number: {rec['time_ms']!r}")
            t.append(int(rec["time_ms"]))
            w.append(v)
        elif key == "power_measurement_start":
            start = int(rec["time_ms"])
        elif key == "power_measurement_stop":
            stop = int(rec["time_ms"])
    if not t:
        raise SourceFormatError(path, None, "no power_reading lines found (is this an MLPerf power log?)")
    if nulls:
        builder.warn(f"{path}: {nulls} power_reading line(s) without a numeric value were skipped")
    t_arr = np.asarray(t, dtype=np.int64)
    if start is not None and stop is not None and stop <= start:
        builder.warn(f"{path}: power_measurement_stop ({stop}) is not after power_measurement_start ({start}); "
                     f"ignoring the markers and keeping all {len(t)} readings")
    elif stop is not None and t_arr.max() > stop:
        builder.warn(f"{path}: {(t_arr > stop).sum()} readings after power_measurement_stop; kept")
    if np.any(np.diff(t_arr) < 0):
        builder.warn(f"{path}: readings are not in time order; sorted")
        order = np.argsort(t_arr, kind="stable")
        return host, t_arr[order] * 1_000_000, np.asarray(w)[order]
    return host, t_arr * 1_000_000, np.asarray(w, dtype=np.float64)


def read_result_log(path: Path, builder: RunBuilder) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Events (rank 0) and run facts from a result log (first rank prefix that logs run_start)."""
    recs = _first_rank_records(path)
    facts: dict[str, Any] = {}
    for _, r in recs:
        if r.get("event_type") == "POINT_IN_TIME" and r["key"] not in ("tracked_stats", "eval_accuracy", "cache_clear"):
            facts.setdefault(r["key"], r.get("value"))
    events, run_start, run_stop, status = _run_phases(path, recs, builder)
    steps = _StepCounter(_number(facts.get("max_sequence_length")), _number(facts.get("global_batch_size")))
    events += _timeline_events(path, recs, run_start, run_stop, steps)
    facts.update(run_start_ms=run_start, run_stop_ms=run_stop, status=status, result_log=str(path),
                 train_steps=steps.n_step)
    facts["facts"] = {k: v for k, v in facts.items() if isinstance(v, int | float | str) and len(str(v)) < 200}
    return events, facts


def _first_rank_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of the first rank prefix that logs ``run_start`` (the other ranks
    repeat rank 0's records)."""
    recs = list(iter_mllog(path))
    if not recs:
        raise SourceFormatError(path, None, f"no {MARK} lines found (is this an MLPerf result log?)")
    starters = [pre for _, pre, r in recs if r["key"] == "run_start"]
    if not starters:
        raise SourceFormatError(path, None, "no run_start record: the log ends before training started")
    prefix = starters[0]
    return [(ln, r) for ln, pre, r in recs if pre == prefix]


def _run_phases(path: Path, recs: list[tuple[int, dict[str, Any]]],
                builder: RunBuilder) -> tuple[list[dict[str, Any]], Any, Any, Any]:
    """The ``run`` phase (run_start → run_stop, or the last record) and the ``init`` phase when logged;
    also returns run_start, run_stop (ms, as logged) and the run's status."""
    events: list[dict[str, Any]] = []
    run_start = next(r["time_ms"] for _, r in recs if r["key"] == "run_start")
    run_stop = next((r["time_ms"] for _, r in recs if r["key"] == "run_stop"), None)
    status = next((r.get("metadata", {}).get("status") for _, r in recs if r["key"] == "run_stop"), None)
    if run_stop is None:
        builder.warn(f"{path}: no run_stop record (the run did not finish); the run window ends at the last record")
        run_stop = recs[-1][1]["time_ms"]
    events.append({"rank": 0, "kind": "phase", "name": "run", "t_start_ns": run_start * _MS,
                   "t_end_ns": run_stop * _MS, "attrs": {"status": status, "source": "run_start/run_stop"}})
    init_start = next((r["time_ms"] for _, r in recs if r["key"] == "init_start"), None)
    init_stop = next((r["time_ms"] for _, r in recs if r["key"] == "init_stop"), None)
    if init_start is not None and init_stop is not None:
        events.append({"rank": 0, "kind": "phase", "name": "init", "t_start_ns": init_start * _MS,
                       "t_end_ns": init_stop * _MS, "attrs": {"source": "init_start/init_stop"}})
    return events, run_start, run_stop, status


_MS = 1_000_000  # ns per ms


@dataclass
class _StepCounter:
    """Step numbers and tokens of ``tracked_stats`` records, whose ``metadata.step`` is cumulative
    (tokens = sequence length × global batch × step, or samples)."""

    seq: float | None
    gbs: float | None
    prev_cum: float | None = None
    n_step: int = 0

    def advance(self, cum: float | None) -> tuple[int, float | None]:
        """``(step, tokens of this step or None)`` of the next timed record."""
        self.n_step += 1
        per_step = cum - self.prev_cum if cum is not None and self.prev_cum is not None else None
        tokens_per_step = self.seq * self.gbs if self.seq and self.gbs else None
        if cum is not None and tokens_per_step is not None and cum % tokens_per_step == 0:
            if per_step is None:
                per_step = tokens_per_step
            step = int(cum // tokens_per_step)
        else:
            step = self.n_step
        self.prev_cum = cum
        return step, per_step


def _timeline_events(path: Path, recs: list[tuple[int, dict[str, Any]]], run_start: Any, run_stop: Any,
                     steps: _StepCounter) -> list[dict[str, Any]]:
    """``eval`` events, ``step`` events of ``train_step_timing`` records and ``train_block`` phases of
    ``throughput`` records, in log order."""
    events: list[dict[str, Any]] = []
    eval_open: tuple[int, dict[str, Any]] | None = None
    last_point = run_start
    last_samples: float | None = None
    seq, gbs = steps.seq, steps.gbs
    for lineno, r in recs:
        key, tms, md = r["key"], r["time_ms"], r.get("metadata") or {}
        md = md if isinstance(md, dict) else {}
        if key == "eval_start":
            eval_open = (tms, {"epoch_num": md.get("epoch_num")})
        elif key == "eval_accuracy" and eval_open is not None:
            eval_open[1]["eval_accuracy"] = _number(r.get("value"))
        elif key == "eval_stop" and eval_open is not None:
            events.append({"rank": 0, "kind": "eval", "name": "eval", "t_start_ns": eval_open[0] * _MS,
                           "t_end_ns": tms * _MS, "attrs": eval_open[1]})
            eval_open = None
        elif key == "tracked_stats":
            value = r.get("value")
            if not isinstance(value, dict):
                raise SourceFormatError(path, lineno, f"tracked_stats value is not an object: {value!r}")
            timing = _number(value.get("train_step_timing in s"))
            cum = _number(md.get("step"))
            if timing is not None:
                step, per_step = steps.advance(cum)
                events.append({
                    "rank": 0, "kind": "step", "name": "train_step", "step": step,
                    "t_start_ns": round((tms - timing * 1000.0) * _MS), "t_end_ns": tms * _MS,
                    "window": None,  # set by mark_window; steps outside run_start → run_stop stay null
                    "tokens": int(per_step) if per_step is not None and seq else None,
                    "samples": int(gbs) if gbs else None,
                    "attrs": {"train_step_timing_s": timing, "mlperf_step": cum, "tokens_scope": "job",
                              "source_line": lineno,
                              **({} if run_start <= tms <= run_stop else {"outside_run_window": True})},
                })
            elif "validation_step_timing in s" in value:
                pass  # inside an eval window; the eval event already covers it
            elif "throughput" in value:
                samples = cum
                events.append({
                    "rank": 0, "kind": "phase", "name": "train_block", "t_start_ns": last_point * _MS,
                    "t_end_ns": tms * _MS,
                    "samples": int(samples - last_samples) if samples is not None and last_samples is not None else None,
                    "attrs": {"throughput": _number(value["throughput"]), "mlperf_step": cum, "source_line": lineno},
                })
                last_samples = samples
            last_point = tms
    return events


def read_total(path: Path) -> float | None:
    """The submitter's energy in kWh from ``total_power.txt`` (``Total Power Usage: 415.22 kWh``)."""
    m = re.search(r"([0-9.]+)\s*kWh", path.read_text(errors="replace"))
    return float(m.group(1)) if m else None


def read_system(path: Path) -> int | None:
    """Accelerators of the job from an MLPerf system description (``system_*.json``):
    ``number_of_nodes × accelerators_per_node``; ``None`` when either is missing or not a number."""
    try:
        data = json.loads(path.read_text(errors="replace"))
    except json.JSONDecodeError as exc:
        raise SourceFormatError(path, exc.lineno, f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise SourceFormatError(path, 1, "an MLPerf system description is a JSON object")
    nodes, per_node = _number(data.get("number_of_nodes")), _number(data.get("accelerators_per_node"))
    return int(nodes * per_node) if nodes and per_node else None


def import_mlperf(paths: Sequence[str | Path], name: str | None = None,
                  warmup_steps: int | None = None) -> RunBuilder:
    """Parse MLPerf power and result logs into a :class:`RunBuilder` (call ``.write(out)``).

    The measured window is the format's own: the steps inside run_start → run_stop, less the first
    ``warmup_steps`` of them (default 0). The job's device count comes from ``system_*.json``.
    """
    b = RunBuilder(format="mlperf", name=name)
    groups = classify(paths, b)
    if not groups["power"] and not groups["result"]:
        raise SourceFormatError(paths[0], None, "no MLPerf node_<N>.txt power log or result_*.txt log found")
    devices: dict[str, int | None] = {}
    for f in groups["other"]:
        if f.name.startswith("sw_"):
            b.drop(f"{f.name}: interconnect switch power estimate (its timestamps are not on the run's clock)")
        elif f.name.startswith("system") and f.suffix == ".json":
            b.add_source(f, role="system description")
            devices[f.name] = read_system(f)
        elif f.suffix not in (".json", ".md"):
            b.drop(f"{f.name}: not an MLPerf power or result log")
    counts = set(devices.values())
    if len(counts) == 1 and None not in counts:
        set_job_devices(b, counts.pop(), f"MLPerf {', '.join(sorted(devices))}: number_of_nodes × accelerators_per_node")
    elif len(counts) > 1:
        b.warn(f"MLPerf system descriptions disagree on the device count ({devices}); per-device throughput unknown")
        set_job_devices(b, None, f"MLPerf system descriptions disagree: {devices}")
    else:
        set_job_devices(b, None, "no MLPerf system_*.json (number_of_nodes × accelerators_per_node) among the "
                                 "sources: pass the submission's run folder or that file to know it")
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for f in groups["power"]:
        b.add_source(f, role="power")
        host, t, w = read_node_power(f, b)
        if host in series:
            raise SourceFormatError(f, None, f"a second power log for {host}; import one run at a time")
        series[host] = (t, w)
        b.add_telemetry(telemetry_table(t, host, "node", {"power_w": w}))
        b.add_device(host, "node", kind="node", vendor=None, name="node power meter")
    if series:
        b.mapped["power_reading (W, node)"] = "telemetry.power_w on device 'node' of host node_<N>"
    reported = None
    for f in groups["total"]:
        b.add_source(f, role="reported_total")
        reported = read_total(f)
    summary: dict[str, Any] = {"nodes": len(series), "reported_energy_kwh": reported,
                               "integration": "trapezoid, linear between samples, per node, summed "
                                              "(powertrain.importers.energy)"}
    events: list[dict[str, Any]] = []
    for f in groups["result"]:
        b.add_source(f, role="result")
        ev, facts = read_result_log(f, b)
        events += ev
        summary.update({k: facts.get(k) for k in ("run_start_ms", "run_stop_ms", "status", "train_steps",
                                                   "global_batch_size", "max_sequence_length",
                                                   "submission_benchmark", "submission_division", "facts")})
    if len(groups["result"]) > 1:
        raise SourceFormatError(groups["result"][1], None, "more than one result log: import one run at a time")
    if groups["result"]:
        b.mapped.update({"run_start/run_stop": "events phase 'run' (rank 0)",
                         "eval_start/eval_stop + eval_accuracy": "events eval (rank 0)",
                         "tracked_stats train_step_timing": "events step (rank 0): t_end = log time, "
                                                            "t_start = t_end - timing; attrs.energy_j"})
        b.drop("init burst of every rank and per-rank duplicates of rank-0 records (only the first rank "
               "that logs run_start is read); configuration records are kept in run.json mlperf.facts")
    if series and events:
        _add_energy(events, series, summary, b)
    mark_window([e for e in events if not e["attrs"].get("outside_run_window")], warmup_steps, b,
                declared="MLPerf run_start → run_stop")
    b.add_events(events_table(events))
    b.info["mlperf"] = summary
    return b


def _run_window_energy(t: np.ndarray, w: np.ndarray, a: int, b: int) -> float:
    """Energy of one node's power over [a, b]: the reference window integral the analysis uses too."""
    return trapezoid_j(*clip_interp(t, w, a, b)) or 0.0


def _add_energy(events: list[dict[str, Any]], series: dict[str, tuple[np.ndarray, np.ndarray]],
                summary: dict[str, Any], b: RunBuilder) -> None:
    """Energy of the run window and of every step: Σ over nodes of ∫ node power dt."""
    steps = [e for e in events if e["kind"] == "step"]
    a = np.array([e["t_start_ns"] for e in steps], dtype=np.int64)
    z = np.array([e["t_end_ns"] for e in steps], dtype=np.int64)
    run = next(e for e in events if e["kind"] == "phase" and e["name"] == "run")
    total = 0.0
    short_nodes = []
    step_e = np.zeros(len(steps))
    for host, (t, w) in series.items():
        _, cov = energy_between_j(t, w, run["t_start_ns"], run["t_end_ns"])
        total += _run_window_energy(t, w, run["t_start_ns"], run["t_end_ns"])
        if cov[0] < (run["t_end_ns"] - run["t_start_ns"]) / 1e9 - 5.0:
            short_nodes.append(host)
        if steps:
            e_node, c = energy_between_j(t, w, a, z)
            step_e += np.where(c > 0, e_node, np.nan)
    summary["integration"] = (
        "run window: powertrain.core.series.trapezoid_j over clip_interp"
        "; steps: powertrain.importers.energy.energy_between_j (same rule, vectorised); summed over nodes")
    if short_nodes:
        b.warn(f"power readings of {len(short_nodes)} node(s) cover less of the run window than the run "
               f"(missing >5 s): {', '.join(short_nodes[:5])}; their energy counts only the covered part")
    run["attrs"]["energy_j"] = total
    summary["energy_run_j"] = total
    summary["energy_run_kwh"] = total / 3.6e6
    if summary.get("reported_energy_kwh"):
        summary["energy_vs_reported_rel"] = summary["energy_run_kwh"] / summary["reported_energy_kwh"] - 1.0
    for e, v in zip(steps, step_e, strict=True):
        e["attrs"]["energy_j"] = None if np.isnan(v) else float(v)
    if steps:
        summary["step_energy_j"] = {"count": len(steps), "mean": float(np.nanmean(step_e)),
                                    "min": float(np.nanmin(step_e)), "max": float(np.nanmax(step_e)),
                                    "sum": float(np.nansum(step_e))}
