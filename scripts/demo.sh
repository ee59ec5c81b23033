#!/usr/bin/env bash
# The README's main job: a small real characterization sweep on this CPU, and its report.
#   8 runs of Llama-3-tiny on 2 CPU ranks (DDP vs 1F1B pipeline × micro-batch 1/2 × recompute
#   none/full), each under the per-node telemetry sampler; then summaries, the HTML report and a
#   Perfetto trace of one run. A few minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/demo-$(date +%Y%m%d-%H%M%S)}
pt=.venv/bin/powertrain

$pt plan examples/cpu-sweep.yaml
$pt sweep examples/cpu-sweep.yaml --out "$out"
$pt report "$out"
first=$(ls -d "$out"/*/ | grep -v '/report/$' | head -n 1)
$pt trace "$first" -o "$out/report/trace-$(basename "$first").json"
echo
echo "demo: sweep folder  $out"
echo "demo: report        $out/report/report.html"
echo "demo: Perfetto      $out/report/trace-$(basename "$first").json  (open in https://ui.perfetto.dev)"
