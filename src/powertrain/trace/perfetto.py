"""Export a run as a Chrome / Perfetto trace (JSON Trace Event Format), on one time base.

Open the file in https://ui.perfetto.dev (or ``chrome://tracing``). Layout:

* one **process per host** (``telemetry <host>``) holding one **counter track per device and measured
  field** (``"ph": "C"``, name ``<device> <field>``, e.g. ``gpu3 power_w``); cumulative counters
  (energy, link and PCIe bytes, cgroup CPU time) are shown as rates (``<field>/s``) because their raw
  value only ever grows; fields that are null on a device get no track at all (nothing invented);
* one process ``ranks`` with **one thread (slice track) per rank** (``"ph": "X"``): its steps, and
  inside them its forward / backward / optimizer / … phases; communication intervals, which may
  overlap compute, go on a second thread per rank (``rank <r> comm``) so slices nest properly; a
  pipeline rank's ``pipeline`` phase holds one slice per micro-batch forward and backward of each of
  its stages (``stage<s>.mb<k>``, args ``microbatch`` and ``attrs.stage``), so the 1F1B pattern and the
  bubble (the gaps between them) read directly off the track;
* every timestamp is microseconds since the run's first telemetry sample or event (``t0_ns`` in
  ``metadata``), from the one host clock both the sampler and the ranks stamp with.

The ranks' events are read where they lie (:class:`powertrain.analyze.events.RunEvents`), one rank at
a time in chunks of start time, and written as they are read: a day of steps on 8 ranks (1.38M
events) needs the memory of an hour's.

Long runs are bucketed to at most ``max_points`` samples per counter track (bucket means, computed by
DuckDB from the Parquet files), so a trace of a long, wide run stays loadable.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from powertrain.analyze import telemetry as tel
from powertrain.analyze.events import RunEvents
from powertrain.schema import COUNTER_FIELDS, EVENTS_SCHEMA, FLAG_FIELDS, TELEMETRY_FIELDS
from powertrain.store.leftovers import remove_stale
from powertrain.store.rundir import RunDir, file_mode
from powertrain.store.targets import check_output_file
from powertrain.store.validate import check_run

RANKS_PID = 1_000_000  # pid of the "ranks" process; hosts get 1, 2, …
COMM_TID_OFFSET = 100_000


def _meta(pid: int, name: str, tid: int | None = None, thread: str | None = None, sort: int | None = None
          ) -> list[dict[str, Any]]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}]
    if sort is not None:
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}})
    if tid is not None and thread is not None:
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})
    return out


def trace_events(run_dir: str | Path, max_points: int = 20_000) -> Iterator[dict[str, Any]]:
    """The trace's events, in order: metadata, counters per host/device/field, slices per rank."""
    run = RunDir(run_dir)
    info = run.read()
    with RunEvents.open(run.path) as events:
        con = duckdb.connect()
        try:
            n = tel.open_telemetry(con, run.path)
            sp = tel.span(con) if n else None
            first_event = events.one("SELECT min(t_start_ns) FROM ev")[0] if events.num_rows else None
            starts = [v for v in (sp[0] if sp else None, first_event) if v is not None]
            t0 = min(starts) if starts else int(info.get("start_ns") or 0)
            yield {"ph": "M", "name": "powertrain", "pid": 0, "tid": 0,
                   "args": {"run": info.get("name") or run.path.name, "t0_ns": t0, "status": info.get("status")}}
            if sp is not None:
                yield from _counters(con, t0, sp, max_points)
        finally:
            tel.release(con)
            con.close()
        if events.num_rows:
            yield from _slices(events, t0)


def _counters(con: duckdb.DuckDBPyConnection, t0: int, sp: tuple[int, int], max_points: int
              ) -> Iterator[dict[str, Any]]:
    fields = [f for f in TELEMETRY_FIELDS if f not in FLAG_FIELDS]  # a flag is no counter track
    counts = con.execute("SELECT " + ", ".join(f"count({f})" for f in fields) + " FROM tel").fetchall()[0]
    present = [f for f, c in zip(fields, counts, strict=True) if c]
    keys = con.execute("SELECT DISTINCT host, device FROM tel ORDER BY host, device").fetchall()
    hosts = sorted({h for h, _ in keys})
    for i, h in enumerate(hosts):
        yield from _meta(i + 1, f"telemetry {h}", sort=i + 1)
    if not present:
        return
    rows_per_dev = con.execute("SELECT max(c) FROM (SELECT count(*) AS c FROM tel GROUP BY host, device)"
                               ).fetchall()[0][0] or 0
    bucket = max(1, int(np.ceil((sp[1] - sp[0] + 1) / max_points))) if rows_per_dev > max_points else 1
    if bucket > 1:
        agg = ", ".join(f"avg({f}) AS {f}" if f not in COUNTER_FIELDS and f != "throttle"
                        else (f"bit_or({f}) AS {f}" if f == "throttle" else f"max({f}) AS {f}") for f in present)
        sql = (f"SELECT host, device, min(t_ns) AS t_ns, {agg} FROM tel "
               f"GROUP BY host, device, (t_ns - {sp[0]}) // {bucket} ORDER BY host, device, t_ns")
    else:
        sql = f"SELECT host, device, t_ns, {', '.join(present)} FROM tel ORDER BY host, device, t_ns"
    table = con.sql(sql).to_arrow_table()
    host_col = table["host"].to_numpy(zero_copy_only=False)
    dev_col = table["device"].to_numpy(zero_copy_only=False)
    ts = (table["t_ns"].to_numpy() - t0) / 1e3
    for h, d in keys:
        sel = np.flatnonzero((host_col == h) & (dev_col == d))
        if not len(sel):
            continue
        pid = hosts.index(h) + 1
        t = ts[sel]
        for f in present:
            col = table[f].to_numpy(zero_copy_only=False)[sel]
            vals = np.array([np.nan if v is None else v for v in col], dtype=float) if col.dtype == object \
                else col.astype(float)
            ok = ~np.isnan(vals)
            if not ok.any():
                continue  # a field this device does not have: no track
            tt, vv = t[ok], vals[ok]
            name = f"{d} {f}"
            if f in COUNTER_FIELDS:
                if len(tt) < 2:
                    continue
                dt = np.diff(tt) / 1e6
                good = dt > 0
                rate = np.where(good, np.diff(vv) / np.where(good, dt, 1), np.nan)
                tt, vv, name = tt[1:][good], rate[good], f"{d} {f}/s"
            for a, v in zip(tt.tolist(), vv.tolist(), strict=True):
                yield {"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": round(a, 3), "args": {f: v}}


_COLUMNS = EVENTS_SCHEMA.names
_SELECT = ", ".join(f'"{c}"' for c in _COLUMNS)


def _slices(events: RunEvents, t0: int) -> Iterator[dict[str, Any]]:
    ranks = events.ranks()
    yield from _meta(RANKS_PID, "ranks", sort=0)
    has_comm = set(events.ranks("kind = 'comm'"))
    for r in ranks:
        yield {"ph": "M", "name": "thread_name", "pid": RANKS_PID, "tid": r, "args": {"name": f"rank {r}"}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": RANKS_PID, "tid": r, "args": {"sort_index": 2 * r}}
        if r in has_comm:
            yield {"ph": "M", "name": "thread_name", "pid": RANKS_PID, "tid": COMM_TID_OFFSET + r,
                   "args": {"name": f"rank {r} comm"}}
            yield {"ph": "M", "name": "thread_sort_index", "pid": RANKS_PID, "tid": COMM_TID_OFFSET + r,
                   "args": {"sort_index": 2 * r + 1}}
    # By rank, then start time; enclosing slices first at equal start times, so viewers nest phases
    # inside steps. One rank's chunk of start time at a time, written as it is read.
    for r in ranks:
        for rows in events.rank_chunks(r, "TRUE", _SELECT, "t_end_ns DESC"):
            for row in rows:
                yield _slice(dict(zip(_COLUMNS, row, strict=True)), t0)


def _slice(e: dict[str, Any], t0: int) -> dict[str, Any]:
    """One event as a complete slice (``"ph": "X"``) on its rank's thread (communication: the rank's second)."""
    name = f"step {e['step']}" if e["kind"] == "step" else (e["name"] or e["kind"])
    args = {k: e[k] for k in ("step", "window", "microbatch", "tokens", "samples", "loss", "mem_peak_bytes")
            if e.get(k) is not None}
    if e.get("attrs"):
        try:
            args["attrs"] = json.loads(e["attrs"])
        except ValueError:
            args["attrs"] = e["attrs"]
    tid = COMM_TID_OFFSET + e["rank"] if e["kind"] == "comm" else e["rank"]
    return {"ph": "X", "name": name, "cat": e["kind"], "pid": RANKS_PID, "tid": tid,
            "ts": round((e["t_start_ns"] - t0) / 1e3, 3), "dur": round((e["t_end_ns"] - e["t_start_ns"]) / 1e3, 3),
            "args": args}


_HEADER = '{"displayTimeUnit": "ms", "otherData": {"generator": "powertrain trace"}, "traceEvents": [\n'


def is_trace_file(path: Path) -> bool:
    """A file :func:`export_trace` wrote (it starts with its header)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(len(_HEADER)) == _HEADER
    except (OSError, UnicodeDecodeError):
        return False


def export_trace(run_dir: str | Path, out: str | Path, max_points: int = 20_000, *, force: bool = False
                 ) -> dict[str, int]:
    """Write the trace of ``run_dir`` to ``out`` (JSON object format); returns counts by phase type.

    ``out`` must be new, or (``force``) a trace written before; never a run's own file
    (:func:`powertrain.store.targets.check_output_file`). The run is checked first
    (:func:`powertrain.store.validate.check_run`); the temporary file is removed on every error path.
    """
    out = Path(out)
    check_output_file(out, "trace", force=force, same_kind=is_trace_file)
    check_run(run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    remove_stale(out.parent, [f".{out.name}.*.tmp"])  # what a killed trace left
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w") as f:
            f.write(_HEADER)
            first = True
            for ev in trace_events(run_dir, max_points=max_points):
                counts[ev["ph"]] = counts.get(ev["ph"], 0) + 1
                f.write(("" if first else ",\n") + json.dumps(ev, allow_nan=False, separators=(",", ":")))
                first = False
            f.write("\n]}\n")
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return counts
