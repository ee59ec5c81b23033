"""How long `powertrain import kineto` takes on real PyTorch profiler traces (target: seconds).

For each trace (default: the three largest under ``$POWERTRAIN_REAL_DATA/hta-kineto-traces``), the
best of ``--repeats`` runs of:

* the baseline, measured in the same run: reading and parsing the same file with the standard
  library (``gzip`` + ``json.load``), which any importer of a Chrome-trace JSON pays;
* ``import_kineto`` (parse, assign every GPU activity to its step, per-step breakdown, events);
* the same plus writing the run directory (Parquet + run.json).

Ratios to the baseline are printed so the figure survives a slower or busier machine.

    python benchmarks/import_kineto_speed.py [TRACE ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from powertrain.importers.kineto import import_kineto

REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real")) / "hta-kineto-traces"


def best(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` wall-clock runs, seconds."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def json_load(path: Path) -> object:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def import_and_write(path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="powertrain-kineto-bench-") as d:
        import_kineto([path]).write(Path(d) / "run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    traces = args.traces or sorted(REAL.glob("*/*.json*"), key=lambda p: p.stat().st_size)[-3:]
    if not traces:
        print(f"no traces given and none under {REAL} (set POWERTRAIN_REAL_DATA): nothing to measure")
        return 0
    import_kineto([traces[0]])  # warm imports (pyarrow, numpy) so the first trace is not charged for them
    print(f"{'trace':52s} {'MB':>6s} {'json.load':>10s} {'import':>8s} {'+write':>8s} {'import/json':>12s}")
    worst = 0.0
    for p in traces:
        base = best(lambda p=p: json_load(p), args.repeats)
        imp = best(lambda p=p: import_kineto([p]), args.repeats)
        full = best(lambda p=p: import_and_write(p), args.repeats)
        worst = max(worst, full)
        label = f"{p.parent.name}/{p.name}"[-52:]
        print(f"{label:52s} {p.stat().st_size / 1e6:6.2f} {base:9.2f}s {imp:7.2f}s {full:7.2f}s {imp / base:11.2f}x")
    print(f"slowest import + write: {worst:.2f} s (target: seconds, not the 25-31 s of issue 13)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
