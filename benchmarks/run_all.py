"""Run every benchmark in this folder, one after another, and say which passed, failed or skipped.

`make bench` calls this. Each benchmark prints its own figures; this runner adds one line per
benchmark at the end. A benchmark whose input data is not in this checkout (the published runs
under ../shared/data, present on the development machine but not in a fresh clone) is skipped with
one line naming the missing file, instead of failing. A benchmark may also skip itself by exiting
with 77 (the automake convention) after printing why.

    python benchmarks/run_all.py                      # all of them
    python benchmarks/run_all.py predict_speed monitor_overhead
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SKIP = 77

# Arguments a benchmark needs to run unattended (a required option otherwise exits 2 in argparse).
ARGS: dict[str, list[str]] = {
    "predict_cpu_check": ["--dir", str(ROOT / "results" / "bench" / "predict-cpu-check")],
}


def missing_input(path: Path) -> Path | None:
    """The default input file a benchmark module names (``DEFAULT_FILE``) when it is absent.

    Read from the module itself so the check follows the benchmark wherever its data moves."""
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    if spec is None or spec.loader is None:
        return None
    if "DEFAULT_FILE" not in path.read_text():  # do not import (and run top-level code of) the rest
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    default = getattr(module, "DEFAULT_FILE", None)
    return Path(default) if default is not None and not Path(default).is_file() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="benchmark names (file stems); default: all")
    args = ap.parse_args()
    files = sorted(p for p in HERE.glob("*.py") if p.name != Path(__file__).name)
    if args.names:
        unknown = sorted(set(args.names) - {p.stem for p in files})
        if unknown:
            print(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(p.stem for p in files)}",
                  file=sys.stderr)
            return 2
        files = [p for p in files if p.stem in args.names]
    results: list[tuple[str, str, float]] = []
    for path in files:
        print(f"== {path.relative_to(ROOT)}", flush=True)
        absent = missing_input(path)
        if absent is not None:
            line = f"skipped: its input {absent} is not here (a fresh clone has no ../shared/data)"
            print(line, flush=True)
            results.append((path.stem, line, 0.0))
            continue
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, str(path), *ARGS.get(path.stem, [])], cwd=ROOT, check=False).returncode
        dt = time.monotonic() - t0
        verdict = "ok" if rc == 0 else "skipped (exit 77)" if rc == SKIP else f"FAILED (exit {rc})"
        results.append((path.stem, verdict, dt))
    print("\n== benchmarks")
    for name, verdict, dt in results:
        print(f"  {name:<22} {verdict}" + (f"  ({dt:.0f} s)" if dt else ""))
    return 1 if any(v.startswith("FAILED") for _, v, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
