"""Fit the per-slot coefficients of the node thermal model from real 8×H100 nvidia-smi logs.

Data: ``../shared/data/real/wilkins-nvsmi-h100x8-titanx2/h100x8_gpt8b_ddp`` — raw
``nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,memory.used -lms 100`` logs of DDP
training of an 8B GPT on one 8×H100 Azure VM (github.com/grantwilkins/training_profile @ 5f999fe2).
The repository has **no licence**, so no log is copied into powertrain: only the fitted numbers
ship (``src/powertrain/predict/data/slot_thermal.yaml``), with this script to refit them.

What is fitted: the logs have power but no temperature. In DDP every GPU does the same work each
step, so a slot's steady-training power over the node mean (its *power ratio*) is the slot's own
excess heat at equal work (silicon and board variation, its air path). Per run: the samples where
every GPU reports ≥ 90 % utilization and the node mean is above 400 W (steady training: no start-up,
checkpoint dips, the injected stop/kill); per slot the mean power ÷ the node mean. The shipped ratio
is the mean over runs; the spread across runs is printed and shipped too. Rows carry no GPU index:
they come in GPU order, 8 per sample (see the data README).

    python benchmarks/fit_slot_thermal.py [--data DIR] [--write]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path

import numpy as np
import yaml

DATA = Path(os.environ.get("POWERTRAIN_SHARED", Path(__file__).resolve().parents[2] / "shared")) / (
    "data/real/wilkins-nvsmi-h100x8-titanx2/h100x8_gpt8b_ddp")
OUT = Path(__file__).resolve().parents[1] / "src/powertrain/predict/data/slot_thermal.yaml"
SLOTS = 8
MIN_UTIL_PCT = 90.0
MIN_NODE_MEAN_W = 400.0


def read_log(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(power W, utilization %) as (samples, 8) arrays of one nvidia-smi CSV (gzip or plain)."""
    opener = gzip.open if path.suffix == ".gz" else open
    power, util = [], []
    with opener(path, "rt") as fh:
        next(fh)  # header
        for line in fh:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) < 3:
                continue
            power.append(float(cells[1].split()[0]))
            util.append(float(cells[2].split()[0]))
    n = len(power) // SLOTS * SLOTS
    return np.asarray(power[:n]).reshape(-1, SLOTS), np.asarray(util[:n]).reshape(-1, SLOTS)


def fit_run(path: Path) -> dict | None:
    """Per-slot power ratio of one run's steady training, or None when it has none (e.g. ckpt1)."""
    p, u = read_log(path)
    steady = (u.min(axis=1) >= MIN_UTIL_PCT) & (p.mean(axis=1) >= MIN_NODE_MEAN_W)
    if steady.sum() < 20:
        return None
    mean = p[steady].mean(axis=0)
    return {"file": path.name, "steady_samples": int(steady.sum()), "node_mean_w": round(float(mean.mean()), 1),
            "slot_mean_w": [round(float(v), 1) for v in mean],
            "power_ratio": [round(float(v), 4) for v in mean / mean.mean()]}


def fit(data: Path) -> dict:
    files = sorted(f for f in data.iterdir() if f.name.startswith(("ckpt", "power-trace")))
    runs = [r for r in (fit_run(f) for f in files) if r is not None]
    if not runs:
        raise SystemExit(f"no steady training found in {data}")
    ratios = np.asarray([r["power_ratio"] for r in runs])
    return {
        "what": "per-slot power ratio (slot power / node mean) at equal work, steady DDP training",
        "fitted_by": "benchmarks/fit_slot_thermal.py",
        "source": ("../shared/data/real/wilkins-nvsmi-h100x8-titanx2/h100x8_gpt8b_ddp (nvidia-smi -lms 100 of an "
                   "8xH100 Azure VM, github.com/grantwilkins/training_profile @ 5f999fe2; no licence: only these "
                   "fitted numbers ship, never the logs)"),
        "device": "h100-sxm",
        "devices_per_node": SLOTS,
        "selection": f"samples with every GPU >= {MIN_UTIL_PCT:g} % utilization and node mean >= {MIN_NODE_MEAN_W:g} W",
        "power_ratio": [round(float(v), 4) for v in ratios.mean(axis=0)],
        "power_ratio_std_across_runs": [round(float(v), 4) for v in ratios.std(axis=0)],
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--write", action="store_true", help=f"write the fitted coefficients to {OUT}")
    args = ap.parse_args()
    if not args.data.is_dir():
        print(f"logs not found at {args.data} (pass --data or set POWERTRAIN_SHARED)", file=sys.stderr)
        return 2
    got = fit(args.data)
    print(f"per-slot power ratio (slot / node mean) in steady training, {len(got['runs'])} runs of {args.data.name}:")
    print("  run                                  samples  node W  " + "  ".join(f"gpu{i}  " for i in range(SLOTS)))
    for r in got["runs"]:
        print(f"  {r['file']:<36} {r['steady_samples']:>7}  {r['node_mean_w']:>6.0f}  "
              + "  ".join(f"{(v - 1) * 100:+5.1f}%" for v in r["power_ratio"]))
    print(f"  {'mean (shipped)':<36} {'':>7}  {'':>6}  " + "  ".join(f"{(v - 1) * 100:+5.1f}%" for v in got["power_ratio"]))
    print(f"  {'std across runs':<36} {'':>7}  {'':>6}  "
          + "  ".join(f"{v * 100:5.1f}% " for v in got["power_ratio_std_across_runs"]))
    spread = max(got["power_ratio"]) - min(got["power_ratio"])
    print(f"spread (hottest − coolest slot): {spread * 100:.1f} % of node mean power")
    if args.write:
        header = ("# Per-slot coefficients of the node thermal model (predict/slot_thermal.py). Generated by\n"
                  "# benchmarks/fit_slot_thermal.py from logs that may not be copied here (no licence); refit with it.\n")
        OUT.write_text(header + yaml.safe_dump(got, sort_keys=False, width=120))
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
