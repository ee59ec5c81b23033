"""The hostile-input table of ``tests/test_hostile_inputs.py``, run case by case, and its counts.

Each case is a bad spec file, monitor option, damaged run directory or bad import source; it passes
when the command exits non-zero (where the input is invalid), writes exactly one line on stderr
naming the file or field, shows no traceback and leaves every file that was there before
byte-identical (sha256 before/after). This prints the number of cases by area, how many pass, and
each failing case with what it broke — the figures docs/reliability.md quotes.

    python benchmarks/hostile_inputs.py            # counts, failures listed
    python benchmarks/hostile_inputs.py --only monitor/ --verbose

Exit code 0 when every case passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "test_hostile_inputs.py"


def load_table() -> ModuleType:
    """The test module, loaded by path (tests/ is no package)."""
    spec = importlib.util.spec_from_file_location("hostile_inputs_table", TABLE)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {TABLE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run only cases whose id starts with this")
    ap.add_argument("--verbose", action="store_true", help="print every case's stderr")
    args = ap.parse_args()
    table = load_table()
    cases = [c for c in table.CASES if c.id.startswith(args.only)]
    total, passed = Counter(), Counter()
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
            if args.verbose:
                print(f"{'ok  ' if outcome.ok else 'FAIL'} {case.id}: exit {outcome.exit_code}: "
                      f"{outcome.stderr.strip()[:300]!r}")
    elapsed = time.monotonic() - t0
    print(f"hostile inputs: {sum(total.values())} cases, {sum(passed.values())} pass, "
          f"{sum(total.values()) - sum(passed.values())} fail ({elapsed:.0f} s)")
    print(f"{'area':<10} {'cases':>6} {'pass':>6}")
    for area in ("spec", "monitor", "rundir", "import"):
        if total[area]:
            print(f"{area:<10} {total[area]:>6} {passed[area]:>6}")
    subprocess_cases = sum(1 for c in cases if c.subprocess)
    print(f"({subprocess_cases} of them through the console script as subprocesses, the rest in-process)")
    for case_id, problems, fixed_by in failures:
        print(f"FAIL {case_id}: {problems}" + (f"  [awaits: {fixed_by}]" if fixed_by else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
