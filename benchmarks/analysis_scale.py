"""How long summarizing sweep-scale telemetry takes, and how much memory it needs.

Builds a synthetic run in a temporary folder — by default 512 devices (64 hosts × 8) sampled at
10 Hz for one hour, ≈ 18.4 M telemetry rows in 64 Parquet files, plus step events of 512 ranks —
then, each in a fresh child process so their peak memory is their own:

1. **baseline**: a DuckDB scan that reads every telemetry column once (sum of each) — the I/O floor;
2. **summarize**: :func:`powertrain.analyze.summarize_run` (every metric of summary.json).

Prints wall time, peak RSS (``resource.getrusage``, the child's own ``ru_maxrss``) and the ratio of
summarize to the baseline scan. Target on the 2-core development machine: summarize < 60 s and peak
RSS < 4 GiB.

    python benchmarks/analysis_scale.py                   # 512 devices × 1 h × 10 Hz
    python benchmarks/analysis_scale.py --devices 64 --hours 0.1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from powertrain.schema import EVENTS_SCHEMA, TELEMETRY_FIELDS, TELEMETRY_SCHEMA, Throttle
from powertrain.store.rundir import RunDir

T0 = 1_700_000_000_000_000_000
PER_HOST = 8


def build(root: Path, devices: int, hours: float, rate_hz: float, step_s: float) -> tuple[Path, int]:
    run = RunDir(root / "run").create()
    hosts = max(1, devices // PER_HOST)
    n = int(hours * 3600 * rate_hz)
    t_s = np.arange(n) / rate_hz
    t_ns = T0 + (t_s * 1e9).astype(np.int64)
    rng = np.random.default_rng(0)
    rows = 0
    devs, rank_map = [], []
    for h in range(hosts):
        host = f"node{h:03d}"
        cols: dict[str, list[pa.Array]] = {k: [] for k in TELEMETRY_SCHEMA.names}
        for d in range(PER_HOST):
            g = h * PER_HOST + d
            # bursty step-periodic power, rear slots hotter, occasional power-cap throttling
            phase = (t_s % step_s) / step_s
            p = 350 + 300 * (phase < 0.7) + rng.normal(0, 10, n)
            e = np.cumsum(p) / rate_hz
            temp = 45 + 2.5 * d + 10 * (1 - np.exp(-t_s / 300))
            thr = np.where(p > 655, int(Throttle.POWER_CAP), 0)
            values = {
                "power_w": p, "energy_j": e, "temp_c": temp, "clock_sm_mhz": np.where(thr > 0, 1600.0, 1980.0),
                "throttle": thr.astype(np.int64), "util_pct": 100 * (phase < 0.7),
                "link_tx_bytes": np.cumsum(rng.integers(0, 2_000_000, n)), "mem_used_bytes": np.full(n, 60 << 30),
            }
            cols["t_ns"].append(pa.array(t_ns))
            cols["host"].append(pa.array([host] * n, pa.string()).dictionary_encode().cast(pa.string()))
            cols["device"].append(pa.array([f"gpu{d}"] * n, pa.string()))
            for f, typ in TELEMETRY_FIELDS.items():
                cols[f].append(pa.array(values[f], typ) if f in values else pa.nulls(n, typ))
            devs.append({"host": host, "device": f"gpu{d}", "kind": "gpu", "vendor": "synthetic",
                         "supported": list(values), "properties": {}})
            rank_map.append({"rank": g, "host": host, "local_rank": d, "device": f"gpu{d}",
                             "coords": {"dp": g // 8, "tp": g % 8, "pp": 0, "cp": 0, "ep": 0}})
        table = pa.table({k: pa.concat_arrays(v) for k, v in cols.items()}, schema=TELEMETRY_SCHEMA)
        pq.write_table(table, run.telemetry_file(host), compression="zstd")
        rows += table.num_rows
        del table, cols
    n_steps = int(hours * 3600 / step_s) - 1
    starts = T0 + ((np.arange(n_steps) * step_s + 0.5) * 1e9).astype(np.int64)
    for r in range(hosts * PER_HOST):
        jitter = (rng.normal(0, 0.005, n_steps) * 1e9).astype(np.int64)
        ends = starts + int(step_s * 0.98 * 1e9) + np.abs(jitter)
        pq.write_table(pa.table({
            "rank": pa.array(np.full(n_steps, r), pa.int32()), "kind": pa.array(["step"] * n_steps),
            "name": pa.nulls(n_steps, pa.string()), "step": pa.array(np.arange(n_steps)),
            "t_start_ns": pa.array(starts), "t_end_ns": pa.array(ends),
            "window": pa.array(["warmup"] * 2 + ["measured"] * (n_steps - 2)),
            "microbatch": pa.nulls(n_steps, pa.int32()), "tokens": pa.array(np.full(n_steps, 4096)),
            "samples": pa.array(np.full(n_steps, 2)), "loss": pa.nulls(n_steps, pa.float64()),
            "mem_peak_bytes": pa.nulls(n_steps, pa.int64()), "attrs": pa.nulls(n_steps, pa.string()),
        }, schema=EVENTS_SCHEMA), run.events_file(r))
    run.write({"name": "analysis-scale", "status": "ok", "synthetic": True, "kind": "train",
               "hosts": [f"node{h:03d}" for h in range(hosts)], "devices": devs, "rank_map": rank_map,
               "fields_supported": ["power_w", "energy_j", "temp_c", "clock_sm_mhz", "throttle", "util_pct",
                                    "link_tx_bytes", "mem_used_bytes"],
               "config": {"model": "llama3-70b", "layout": {"tp": 8, "pp": 1, "dp": hosts},
                          "knobs": {"precision": "bf16", "recompute": "none"},
                          "hardware": {"nodes": hosts, "devices_per_node": PER_HOST, "device": "h100"}}})
    return run.path, rows


CHILD = r"""
import json, resource, sys, time
kind, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if kind == "baseline":
    import duckdb
    from powertrain.schema import TELEMETRY_FIELDS
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    con.execute("SET enable_progress_bar = false")
    cols = ", ".join(f"sum({f})" for f in TELEMETRY_FIELDS)
    con.execute(f"SELECT count(*), {cols} FROM read_parquet('{path}/telemetry/*.parquet')").fetchall()
    out = {}
else:
    from powertrain.analyze import summarize_run
    s = summarize_run(path)
    out = {k: s["metrics"][k] for k in ("step_time_mean_s", "power_mean_w", "energy_j", "temp_spread_c",
                                        "throttle_share", "mfu")}
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT " + json.dumps({"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_bytes": ru.ru_maxrss * 1024,
                              **out}))
"""


def child(kind: str, path: Path) -> dict[str, float]:
    r = subprocess.run([sys.executable, "-c", CHILD, kind, str(path)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{r.stderr[-3000:]}")
    return json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=512)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=10.0, help="samples per second per device")
    ap.add_argument("--step-s", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pt-analysis-scale-") as tmp:
        t = time.perf_counter()
        path, rows = build(Path(tmp), args.devices, args.hours, args.rate, args.step_s)
        size = sum(p.stat().st_size for p in (path / "telemetry").glob("*.parquet"))
        print(f"built {rows:,} telemetry rows ({args.devices} devices × {args.hours} h × {args.rate} Hz), "
              f"{size / 2**20:.0f} MiB Parquet, in {time.perf_counter() - t:.1f} s")
        base = child("baseline", path)
        summ = child("summarize", path)
        for label, r in (("baseline scan (every column once)", base), ("summarize_run (all metrics)      ", summ)):
            print(f"{label}: {r['wall_s']:6.1f} s wall, {r['cpu_s']:6.1f} s CPU (process, incl. start-up), "
                  f"peak RSS {r['rss_bytes'] / 2**30:.2f} GiB")
        print(f"ratio summarize / scan: {summ['wall_s'] / base['wall_s']:.1f}×;  rows/s: {rows / summ['wall_s']:,.0f}")
        print(f"target: < 60 s and < 4 GiB → {'met' if summ['wall_s'] < 60 and summ['rss_bytes'] < 4 * 2**30 else 'NOT met'}")
        print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work slows the wall time)")
        print("metrics:", json.dumps({k: v for k, v in summ.items() if k not in ("wall_s", "cpu_s", "rss_bytes")}))


if __name__ == "__main__":
    main()
