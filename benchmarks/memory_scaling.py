"""Is peak memory flat in run length? Compaction, summarize, report and trace of 1 h vs 24 h of a run.

Writes, in a temporary folder, the run directory a ``powertrain monitor`` run of 8 GPUs sampled at
20 Hz leaves when its sampler was killed before compacting: ``telemetry/<host>.parts/seg-*.parquet``,
one 15 s segment each (the sampler's segment length), plus ``run.json`` and the host's meta. The
signals are synthetic (bursty step-periodic power with its energy counter, a warming temperature,
power-cap throttling, clocks, utilization, memory, link bytes; seeded, so both lengths carry the same
kind of data). Its 8 ranks mark 2 s steps with forward / backward / optimizer phases (the first 5
steps warm-up, the rest measured; rank ``r``'s step lasts 1.98 + 0.002·r s, tokens and samples on
every step), written as the recorder leaves them, ``events/rank-<r>.parquet`` (57.6k events for
1 h, 1.38M for 24 h; ``--no-events``: a monitored command without markers, the telemetry path alone).

Then, each in a fresh child process (its peak RSS is ``resource.getrusage(RUSAGE_SELF).ru_maxrss``,
the child's own high-water mark, start-up included):

1. **compaction**: :func:`powertrain.store.tables.finalize_run_streams` (segments → ``<host>.parquet``);
2. **summarize**: :func:`powertrain.analyze.summarize_run` (every metric of summary.json);
3. **report**: :func:`powertrain.report.build.build_report` with PNG figures, its summary included
   (``--no-report`` skips it);
4. **trace**: :func:`powertrain.trace.perfetto.export_trace`, the Perfetto JSON (``--no-trace`` skips it).

It prints each figure for the short and the long run, and the ratio long / short. Target: the 24 h
figure within 1.2× of the 1 h one for every step.

    python benchmarks/memory_scaling.py                       # 1 h vs 24 h (a few minutes on 2 cores)
    python benchmarks/memory_scaling.py --hours 0.25 --long-hours 2   # a quicker check
    python benchmarks/memory_scaling.py --workdir /tmp/ms    # keep the runs (reused by the next call)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from powertrain.analyze.synthetic import step_events
from powertrain.schema import EVENTS_SCHEMA, TELEMETRY_FIELDS, TELEMETRY_SCHEMA, Throttle
from powertrain.store.rundir import RunDir, write_json_atomic
from powertrain.store.tables import COMPACT_ROW_GROUP_ROWS

T0 = 1_700_000_000_000_000_000
HOST = "node000"
DEVICES = 8
SEGMENT_S = 15.0
FIELDS = ("power_w", "energy_j", "temp_c", "clock_sm_mhz", "throttle", "util_pct", "mem_used_bytes",
          "power_limit_w", "link_tx_bytes")
RANKS = DEVICES  # one rank per GPU
STEP_S = 2.0
WARMUP_STEPS = 5
STEPS_PER_CHUNK = 4096  # steps of one rank generated and written at a time


def _segment(i: int, rate_hz: float, step_s: float, rng: np.random.Generator, energy0: np.ndarray,
             link0: np.ndarray) -> pa.Table:
    """Segment ``i``: rows in time order, the devices of one sample next to each other (as the sampler
    writes them). ``energy0``/``link0`` carry each device's counters from segment to segment."""
    n = int(SEGMENT_S * rate_hz)
    t_s = i * SEGMENT_S + np.arange(n) / rate_hz
    t_ns = np.repeat(T0 + (t_s * 1e9).astype(np.int64), DEVICES) + np.tile(np.arange(DEVICES) * 20_000, n)
    phase = np.repeat((t_s % step_s) / step_s, DEVICES)
    slot = np.tile(np.arange(DEVICES), n)
    p = 350 + 300 * (phase < 0.7) + 5 * slot + rng.normal(0, 10, n * DEVICES)
    e = energy0[slot] + np.cumsum(p.reshape(n, DEVICES), axis=0).ravel() / rate_hz
    energy0[:] = e[-DEVICES:]
    link = link0[slot] + np.cumsum(rng.integers(0, 2_000_000, (n, DEVICES)), axis=0).ravel()
    link0[:] = link[-DEVICES:]
    thr = np.where(p > 660, int(Throttle.POWER_CAP), 0)
    values = {
        "power_w": p, "energy_j": e, "temp_c": 45 + 2.5 * slot + 10 * (1 - np.exp(-np.repeat(t_s, DEVICES) / 300)),
        "clock_sm_mhz": np.where(thr > 0, 1600.0, 1980.0), "throttle": thr, "util_pct": 100.0 * (phase < 0.7),
        "mem_used_bytes": np.full(n * DEVICES, 60 << 30), "power_limit_w": np.full(n * DEVICES, 700.0),
        "link_tx_bytes": link,
    }
    cols: dict[str, pa.Array] = {
        "t_ns": pa.array(t_ns, pa.int64()),
        "host": pa.array(np.full(n * DEVICES, HOST, dtype=object), pa.string()),
        "device": pa.array(np.array([f"gpu{d}" for d in range(DEVICES)], dtype=object)[slot], pa.string()),
    }
    for f, typ in TELEMETRY_FIELDS.items():
        cols[f] = pa.array(values[f], typ) if f in values else pa.nulls(n * DEVICES, typ)
    return pa.table(cols, schema=TELEMETRY_SCHEMA)


def write_events(run: RunDir, seconds: float) -> int:
    """Every rank's step events over ``seconds`` (see the module doc); returns how many were written."""
    n_steps = int(seconds // STEP_S)
    rows = 0
    for r in range(RANKS):
        with pq.ParquetWriter(run.events_file(r), EVENTS_SCHEMA, compression="zstd") as w:
            for first in range(0, n_steps, STEPS_PER_CHUNK):
                t = step_events(r, first, min(STEPS_PER_CHUNK, n_steps - first), t0_ns=T0, period_s=STEP_S,
                                step_s=STEP_S * 0.99 + 0.002 * r, warmup=WARMUP_STEPS)
                w.write_table(t, row_group_size=COMPACT_ROW_GROUP_ROWS)
                rows += t.num_rows
    return rows


def build(root: Path, hours: float, rate_hz: float, step_s: float = STEP_S, events: bool = True
          ) -> tuple[Path, int, int, int]:
    """A run directory with ``hours`` of segments (and step events); returns (path, telemetry rows,
    segments, events)."""
    run = RunDir(root).create()
    parts = run.telemetry_dir / f"{HOST}.parts"
    parts.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    energy0, link0 = np.zeros(DEVICES), np.zeros(DEVICES, dtype=np.int64)
    segments = round(hours * 3600 / SEGMENT_S)
    rows = 0
    for i in range(segments):
        t = _segment(i, rate_hz, step_s, rng, energy0, link0)
        pq.write_table(t, parts / f"seg-{i:06d}.parquet", compression="zstd")
        rows += t.num_rows
    t_end = T0 + int(segments * SEGMENT_S * 1e9)
    devices = [{"host": HOST, "device": f"gpu{d}", "kind": "gpu", "vendor": "synthetic", "supported": list(FIELDS),
                "properties": {"power_limit_default_w": 700.0}} for d in range(DEVICES)]
    write_json_atomic(run.telemetry_meta(HOST), {
        "host": HOST, "devices": devices, "notes": [], "incidents": [], "rate_hz_requested": rate_hz,
        "rate_hz_achieved": rate_hz, "samples": rows // DEVICES, "missed_ticks": 0, "t_first_ns": T0,
        "t_last_ns": t_end, "finished": False, "stop_reason": "killed (synthetic: left in segments)"})
    run.write({"name": "memory-scaling", "kind": "monitor", "status": "ok", "synthetic": True,
               "generator": "benchmarks/memory_scaling.py", "command": ["train.sh"], "exit_code": 0,
               "start_ns": T0, "end_ns": t_end, "hosts": [HOST], "devices": devices,
               "fields_supported": list(FIELDS), "not_measured": [], "telemetry_notes": [], "incidents": []})
    n_events = write_events(run, segments * SEGMENT_S) if events else 0
    return run.path, rows, segments, n_events


CHILD = r"""
import json, resource, sys, time
kind, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
out = {}
if kind == "compact":
    from powertrain.store.tables import finalize_run_streams
    finalize_run_streams(path)
elif kind == "summarize":
    from powertrain.analyze import summarize_run
    s = summarize_run(path)
    out = {k: s["metrics"].get(k) for k in ("energy_j", "power_mean_w", "cluster_power_peak_w", "temp_spread_c",
                                            "step_time_mean_s", "tokens_per_s")}
elif kind == "report":
    import os
    from powertrain.report.build import build_report
    if os.path.exists(path + "/summary.json"):  # the summary is part of what a report costs
        os.unlink(path + "/summary.json")
    build_report(path, path + "/report", formats=("png",), force=True)
else:
    from powertrain.trace.perfetto import export_trace
    out = export_trace(path, path + "/trace.json", force=True)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT " + json.dumps({"wall_s": wall, "rss_bytes": ru.ru_maxrss * 1024, **out}))
"""


def child(kind: str, path: Path) -> dict[str, float]:
    r = subprocess.run([sys.executable, "-c", CHILD, kind, str(path)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{kind} of {path} failed:\n{r.stderr[-3000:]}")
    return json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])


def measure(root: Path, hours: float, rate_hz: float, steps: list[str], events: bool
            ) -> dict[str, dict[str, float]]:
    t = time.perf_counter()
    path = root / f"run-{hours:g}h{'' if events else '-no-events'}"
    if (path / "run.json").is_file():  # a kept run (--workdir): its files are what this length writes
        print(f"{hours:g} h: reusing {path} (compacted already if a compaction was measured on it)", flush=True)
    else:
        path, rows, segments, n_events = build(path, hours, rate_hz, events=events)
        size = sum(p.stat().st_size for p in (path / "telemetry").rglob("*.parquet"))
        print(f"{hours:g} h: {rows:,} telemetry rows ({DEVICES} devices × {rate_hz:g} Hz) in {segments} segments, "
              f"{size / 2**20:.0f} MiB; {n_events:,} events of {RANKS} ranks; written in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    res = {}
    for kind in steps:
        res[kind] = child(kind, path)
        print(f"  {kind:9s}: peak RSS {res[kind]['rss_bytes'] / 2**20:7.1f} MiB, {res[kind]['wall_s']:6.1f} s",
              flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=1.0, help="the short run's length (default 1)")
    ap.add_argument("--long-hours", type=float, default=24.0, help="the long run's length (default 24)")
    ap.add_argument("--rate", type=float, default=20.0, help="samples per second per device (default 20)")
    ap.add_argument("--steps", default="compact,summarize,report,trace",
                    help="what to measure, comma-separated (default: compact,summarize,report,trace)")
    ap.add_argument("--no-report", action="store_true", help="skip the report")
    ap.add_argument("--no-trace", action="store_true", help="skip the trace")
    ap.add_argument("--no-events", action="store_true", help="no step events (telemetry alone)")
    ap.add_argument("--workdir", type=Path, help="build the runs here and keep them (reused when present)")
    ap.add_argument("--target", type=float, default=1.2, help="largest accepted ratio long / short")
    args = ap.parse_args()
    skip = {"report"} if args.no_report else set()
    skip |= {"trace"} if args.no_trace else set()
    steps = [s for s in args.steps.split(",") if s and s not in skip]
    if set(steps) - {"compact", "summarize", "report", "trace"}:
        ap.error(f"--steps: unknown {sorted(set(steps) - {'compact', 'summarize', 'report', 'trace'})}")
    with tempfile.TemporaryDirectory(prefix="pt-memory-scaling-") as tmp:
        root = args.workdir or Path(tmp)
        short = measure(root, args.hours, args.rate, steps, not args.no_events)
        long = measure(root, args.long_hours, args.rate, steps, not args.no_events)
    ok = True
    print(f"peak RSS, {args.long_hours:g} h / {args.hours:g} h (target ≤ {args.target:g}×):")
    for kind in steps:
        ratio = long[kind]["rss_bytes"] / short[kind]["rss_bytes"]
        ok &= ratio <= args.target
        print(f"  {kind:9s}: {short[kind]['rss_bytes'] / 2**20:7.1f} MiB → {long[kind]['rss_bytes'] / 2**20:7.1f} MiB"
              f"  = {ratio:.2f}×  {'met' if ratio <= args.target else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
