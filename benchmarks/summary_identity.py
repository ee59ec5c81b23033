"""Does a change alter any number? Summaries of fixed runs and of the real-data imports, before/after.

A restructuring must not change what powertrain computes. This script imports every real data set
in ``../shared/data/real`` (as a new user would, with ``powertrain import``), adds any run or sweep
folders you name (e.g. a ``make demo`` results folder), summarizes each run with the code of the
working tree, and either records the summaries or compares them with a recording — metric by
metric, as canonical JSON, so "identical" means byte-identical.

    python benchmarks/summary_identity.py --record /tmp/before.json results/demo-1/
    # ... change the code ...
    python benchmarks/summary_identity.py --check /tmp/before.json results/demo-1/

Exit code 0 when every summary is identical, 1 with the first differences otherwise, 2 when the
real data is absent and no run folders were named.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "real"))
PT = [sys.executable, "-m", "powertrain.cli"]

# (name, importer kind, sources relative to REAL, extra options)
IMPORTS: list[tuple[str, str, list[str], list[str]]] = [
    ("mlperf-lora-1node", "mlperf", ["mlperf-v4.0-smc-h100/llama2-70b-lora_1node_8gpu"], []),
    ("mlperf-lora-8node", "mlperf", ["mlperf-v4.0-smc-h100/llama2-70b-lora_8node_64gpu"], []),
    ("mlperf-gpt3-512", "mlperf", ["mlperf-v4.0-smc-h100/gpt3-175b_64node_512gpu"], []),
    ("wilkins-h100x8", "nvsmi", ["wilkins-nvsmi-h100x8-titanx2/h100x8_gpt8b_ddp/ckpt1000.csv"], ["--tz", "UTC"]),
    ("zeus-samples", "zeus", ["zeus-monitor-samples/A40+resnet18+gpu0,1,2,3.csv"], ["--anchor", "2023-07-07T12:00:00Z"]),
    ("perseus", "zeus", ["perseus-sosp24-pipeline-energy/a40x16_gpt3-6.7b_dp2pp4tp2/0.prof.json"],
     ["--anchor", "2024-01-01T00:00:00Z"]),
    ("kineto", "kineto", ["hta-kineto-traces/a100_rank0_of_2_nccl_meta/nccl_data.json.gz"], []),
]

# Keys that describe when or where a summary was made, not what it says.
VOLATILE = {"generated_at", "computed_at", "summarized_at", "powertrain_version", "path"}


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _canonical(v) for k, v in sorted(obj.items()) if k not in VOLATILE}
    if isinstance(obj, list):
        return [_canonical(v) for v in obj]
    return obj


def _run_dirs(root: Path) -> list[Path]:
    if (root / "run.json").is_file():
        return [root]
    return sorted(p.parent for p in root.glob("*/run.json") if not p.parent.name.startswith("."))


def _import_real(work: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for name, kind, sources, extra in IMPORTS:
        srcs = [REAL / s for s in sources]
        if not all(s.exists() for s in srcs):
            print(f"skip {name}: {', '.join(str(s) for s in srcs)} not found")
            continue
        target = work / name
        proc = subprocess.run([*PT, "import", kind, *map(str, srcs), "--out", str(target), *extra],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"import {name} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
            continue
        out[name] = target
    return out


def collect(folders: list[Path]) -> dict[str, Any]:
    from powertrain.analyze.summary import summarize_run

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pt-identity-") as tmp:
        runs = {f"import:{k}": v for k, v in _import_real(Path(tmp)).items()}
        for folder in folders:
            for run in _run_dirs(folder):
                runs[f"run:{folder.name}/{run.name}" if run != folder else f"run:{run.name}"] = run
        for key, run in sorted(runs.items()):
            result[key] = _canonical(summarize_run(run))
            print(f"summarized {key}")
    return result


def _first_differences(a: Any, b: Any, path: str = "", limit: int = 10) -> list[str]:
    diffs: list[str] = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if len(diffs) >= limit:
                break
            if k not in a or k not in b:
                diffs.append(f"{path}/{k}: only in {'after' if k not in a else 'before'}")
            else:
                diffs += _first_differences(a[k], b[k], f"{path}/{k}", limit - len(diffs))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if len(diffs) >= limit:
                break
            diffs += _first_differences(x, y, f"{path}[{i}]", limit - len(diffs))
    elif json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
        diffs.append(f"{path}: {json.dumps(a)[:80]} → {json.dumps(b)[:80]}")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, help="write the summaries to this file")
    mode.add_argument("--check", type=Path, help="compare with the summaries recorded in this file")
    ap.add_argument("folders", nargs="*", type=Path, help="run or sweep folders to include (e.g. a demo's results)")
    args = ap.parse_args()
    if not REAL.is_dir() and not args.folders:
        print(f"nothing to compare: {REAL} is absent and no run folders were named")
        return 2
    now = collect(args.folders)
    if args.record:
        args.record.write_text(json.dumps(now, sort_keys=True, indent=1))
        print(f"recorded {len(now)} summaries → {args.record}")
        return 0
    before = json.loads(args.check.read_text())
    changed = [k for k in sorted(set(before) | set(now))
               if json.dumps(before.get(k), sort_keys=True) != json.dumps(now.get(k), sort_keys=True)]
    print(f"{len(now)} summaries, {len(changed)} changed")
    for k in changed:
        print(f"  {k}:")
        for line in _first_differences(before.get(k), now.get(k)):
            print(f"    {line}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
