"""The hostile-input table of ``tests/test_hostile_inputs.py``, run case by case, and its counts.

Each case is a bad spec file, monitor option, damaged run directory or bad import source; it passes
when the command exits non-zero (where the input is invalid), writes exactly one line on stderr
naming the file or field, shows no traceback and leaves every file that was there before
byte-identical (sha256 before/after). Content cases (damaged content that still reads: a clock that
steps back, a hole in the readings, NaN power, a rank without events, names that are paths, FIFOs)
pass when the command refuses in one line or says what it found (the note). This prints the number
of cases by area, how many pass, the broken promises by kind — **silent-wrong** (exit 0 on an invalid
input, or no note), **hang**, **data lost** (a file that was there changed, or one written outside
its target), **code ran** — and each failing case; then it runs the other hostile-input test files
(Slurm values, sweep folders, names and files, time and gaps, streamed events, exporter, leftovers)
and prints their counts. These are the figures docs/reliability.md quotes.

    python benchmarks/hostile_inputs.py            # counts, failures listed
    python benchmarks/hostile_inputs.py --only content/ --verbose
    python benchmarks/hostile_inputs.py --no-suites  # the table only

Exit code 0 when every case passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "test_hostile_inputs.py"
# the other files whose every test is a hostile input or a fault (run through pytest, counted by file)
SUITES = ("test_slurm_injection.py", "test_sweep_folder_safety.py", "test_values_at_the_door.py",
          "test_names_and_files.py", "test_time_gaps_missing.py", "test_streamed_events.py",
          "test_exporter_limits.py", "test_exporter_slowloris.py", "test_leftovers.py", "test_sweep_state_log.py",
          "test_damaged_runs.py", "test_faults.py", "test_spec_hostile.py")
KINDS = ("silent-wrong", "hang", "data lost", "code ran", "message")


def load_table() -> ModuleType:
    """The test module, loaded by path (tests/ is no package; its helper modules are imported by name)."""
    if str(TABLE.parent) not in sys.path:
        sys.path.insert(0, str(TABLE.parent))
    spec = importlib.util.spec_from_file_location("hostile_inputs_table", TABLE)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {TABLE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def run_table(only: str, verbose: bool) -> int:
    """The table's cases, one by one: counts by area and by kind of broken promise. Returns failures."""
    table = load_table()
    cases = [c for c in table.CASES if c.id.startswith(only)]
    total, passed, kinds = Counter(), Counter(), Counter()
    failures: list[tuple[str, str, str]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        for i, case in enumerate(cases):
            outcome = table.run_case(case, Path(tmp) / f"case-{i}")
            total[case.area] += 1
            if outcome.ok:
                passed[case.area] += 1
            else:
                failures.append((case.id, "; ".join(outcome.problems), case.fixed_by))
                kinds.update({table.kind_of_problem(p) for p in outcome.problems})
            if verbose:
                print(f"{'ok  ' if outcome.ok else 'FAIL'} {case.id}: exit {outcome.exit_code}: "
                      f"{outcome.stderr.strip()[:300]!r}")
    elapsed = time.monotonic() - t0
    print(f"hostile inputs: {sum(total.values())} cases, {sum(passed.values())} pass, "
          f"{sum(total.values()) - sum(passed.values())} fail ({elapsed:.0f} s)")
    print("broken promises (cases): " + ", ".join(f"{kinds[k]} {k}" for k in KINDS))
    print(f"{'area':<10} {'cases':>6} {'pass':>6}")
    for area in ("spec", "monitor", "rundir", "import", "content"):
        if total[area]:
            print(f"{area:<10} {total[area]:>6} {passed[area]:>6}")
    subprocess_cases = sum(1 for c in cases if c.subprocess)
    print(f"({subprocess_cases} of them through the console script as subprocesses, the rest in-process)")
    for case_id, problems, fixed_by in failures:
        print(f"FAIL {case_id}: {problems}" + (f"  [awaits: {fixed_by}]" if fixed_by else ""))
    return len(failures)


def run_suites() -> int:
    """The other hostile-input test files through pytest (one process each): passed / failed per file."""
    failed_total = 0
    print(f"\n{'test file':<34} {'passed':>7} {'failed':>7}")
    for name in SUITES:
        path = ROOT / "tests" / name
        if not path.exists():
            print(f"{name:<34} {'(absent)':>15}")
            continue
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                              str(path)], capture_output=True, text=True, cwd=ROOT)
        tail = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr.strip()[-200:]
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error)", tail)}
        failed = counts.get("failed", 0) + counts.get("error", 0)
        failed_total += failed
        print(f"{name:<34} {counts.get('passed', 0):>7} {failed:>7}")
    return failed_total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run only cases whose id starts with this")
    ap.add_argument("--verbose", action="store_true", help="print every case's stderr")
    ap.add_argument("--no-suites", action="store_true", help="the table only, not the other hostile test files")
    args = ap.parse_args()
    failures = run_table(args.only, args.verbose)
    if not args.no_suites and not args.only:
        failures += run_suites()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
