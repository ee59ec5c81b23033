"""Zeus outputs → run directories.

* **energy windows** (``ZeusMonitor`` / power-limit optimizer CSV)
  ``start_time,window_name,elapsed_time,gpu<i>_energy[,...]`` → one ``phase`` event per window on
  rank 0, named after the window, with ``attrs.energy_j = {"gpu<i>": J}`` and the sum. Zeus stamps
  windows with ``time.monotonic()`` in the files we know, so a start time before 2001 is kept as-is
  and flagged in ``run.json`` (``time_origin``: not the epoch).
* **power samples** ``Time,Power`` (Power in **milliwatts**, ``Time`` local wall-clock) →
  telemetry ``power_w`` of ``node0/gpu0``.
* **Perseus** profiles (``<plan>.prof.json``: per-rank ``iter_time`` s and ``iter_energy`` J lists)
  → ``step`` events per rank, back to back from t = 0 (the source holds durations, not times;
  ``run.json`` says so), with ``attrs.energy_j`` = that rank's GPU energy for the iteration.
  The per-microbatch ``time_breakdown`` has no positions in time and is dropped (listed).
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
    RunBuilder,
    SourceFormatError,
    events_table,
    open_text,
    resolve_zone,
    telemetry_table,
)

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
    if path.name.endswith(".prof.json") or (head.startswith("[") and "iter_energy" in path.read_text()[:4000]):
        return "perseus"
    return None


def read_windows(path: Path, b: RunBuilder) -> list[dict[str, Any]]:
    events = []
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
            events.append({"rank": 0, "kind": "phase", "name": row[1], "t_start_ns": t0,
                           "t_end_ns": t0 + round(elapsed * 1e9),
                           "attrs": {"energy_j": energy, "energy_total_j": sum(energy.values()),
                                     "elapsed_s": elapsed, "source": path.name}})
    b.mapped["start_time,elapsed_time,window_name"] = "events phase (rank 0) per window"
    b.mapped["<gpu>_energy (J)"] = "event attrs.energy_j[<gpu>]"
    if relative:
        b.info["time_origin"] = "zeus window start_time is time.monotonic() (not the epoch): times are relative"
        b.warn(f"{path}: window start times are monotonic-clock seconds, not epoch time; kept as relative times")
    return events


def read_power(path: Path, b: RunBuilder, tz: dt.tzinfo) -> None:
    t: list[int] = []
    w: list[float] = []
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
            except ValueError:
                raise SourceFormatError(path, lineno, f"expected 'YYYY-MM-DD HH:MM:SS.fff,<mW>', found {row!r}") from None
    if not t:
        raise SourceFormatError(path, None, "no samples after the header")
    b.add_telemetry(telemetry_table(t, "node0", "gpu0", {"power_w": np.asarray(w)}))
    b.add_device("node0", "gpu0", kind="gpu", vendor="nvidia")
    b.mapped["Power (mW)"] = "telemetry.power_w (÷1000) of node0/gpu0"


def read_perseus(path: Path, b: RunBuilder, offset_ns: int = 0) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SourceFormatError(path, exc.lineno, f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) and "iter_time" in r for r in data):
        raise SourceFormatError(path, 1, "expected a list of per-rank objects with iter_time and iter_energy")
    plan = path.name.split(".")[0]
    events = []
    for r in data:
        rank = int(r["rank"])
        times, energies = r.get("iter_time") or [], r.get("iter_energy") or []
        if len(energies) not in (0, len(times)):
            raise SourceFormatError(path, None, f"rank {rank}: {len(times)} iter_time but {len(energies)} iter_energy")
        t = offset_ns
        for i, it in enumerate(times):
            dur = round(float(it) * 1e9)
            events.append({"rank": rank, "kind": "step", "name": "iteration", "step": i, "t_start_ns": t,
                           "t_end_ns": t + dur,
                           "attrs": {"energy_j": float(energies[i]) if energies else None,
                                     "frequency_plan": plan, "source": path.name}})
            t += dur
    b.mapped["iter_time (s)"] = "events step per rank, back to back from t=0"
    b.mapped["iter_energy (J)"] = "step attrs.energy_j (that rank's GPU)"
    b.drop("time_breakdown / energy_breakdown: per-instruction durations without positions in time")
    b.info["time_origin"] = "perseus profiles hold durations only: steps start at t = 0 (1970-01-01)"
    return events


def import_zeus(paths: Sequence[str | Path], tz: str | None = None, name: str | None = None) -> RunBuilder:
    """Import Zeus window CSVs, Zeus power-sample CSVs and Perseus profiles (sniffed per file)."""
    tzinfo, tzname = resolve_zone(tz)
    b = RunBuilder(format="zeus", name=name)
    events: list[dict[str, Any]] = []
    for p in map(Path, paths):
        kind = sniff(p)
        if kind is None:
            raise SourceFormatError(p, 1, "not a Zeus window CSV (start_time,window_name,elapsed_time,...), "
                                          "power CSV (Time,Power) or Perseus .prof.json")
        b.add_source(p, role=f"zeus {kind}")
        if kind == "window":
            events += read_windows(p, b)
        elif kind == "power":
            read_power(p, b, tzinfo)
            b.info["import_timezone"] = {"zone": tzname, "note": "Zeus power CSV times are local wall-clock"}
        else:
            # several plans in one import run one after another, in the order given
            events += read_perseus(p, b, offset_ns=max((e["t_end_ns"] for e in events), default=0))
    b.add_events(events_table(events))
    return b
