#!/usr/bin/env bash
# The README's main job: a small real characterization run on this CPU and its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/demo-$(date +%Y%m%d-%H%M%S)}
.venv/bin/powertrain monitor --out "$out" -- .venv/bin/python examples/cpu_train_loop.py --steps 40
echo "demo: run directory $out"
