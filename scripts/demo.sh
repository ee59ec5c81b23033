#!/usr/bin/env bash
# The README's main job, in three parts, a few minutes on a 2-core machine:
#   1. real GPU data: the MLPerf Training v4.0 Llama-2-70B LoRA run on 8 nodes × 8 H100 (node power
#      every 2 s, shipped in examples/data/, Apache-2.0) imported and reported — power timelines,
#      energy, per-node spread: the study's subject, which this CPU cannot sense;
#   2. a small real characterization sweep on this CPU: 8 runs of Llama-3-tiny on 2 CPU ranks (DDP vs
#      1F1B pipeline × micro-batch 1/2 × recompute none/full), each under the per-node sampler, then
#      summaries, the HTML report and a Perfetto trace of one run;
#   3. the predictor fitted to this machine on the sweep's four no-recompute runs (`calibrate`), then the
#      whole sweep spec predicted with it, and predicted against measured in one comparison (the four
#      full-recompute runs were not fitted on).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/demo-$(date +%Y%m%d-%H%M%S)}
pt=.venv/bin/powertrain
mlperf_data=examples/data/mlperf-v4.0-smc-h100-llama2-lora-8node
mkdir -p "$out"

echo "== 1/3  real GPU record: MLPerf v4.0 Llama-2-70B LoRA, 8 nodes × 8 H100 (node AC power every 2 s)"
$pt import mlperf "$mlperf_data" --out "$out/mlperf-llama2-lora-8node"
$pt summarize "$out/mlperf-llama2-lora-8node"
$pt report "$out/mlperf-llama2-lora-8node" --formats png

echo
echo "== 2/3  CPU sweep on this machine (measured)"
$pt plan examples/cpu-sweep.yaml
$pt sweep examples/cpu-sweep.yaml --out "$out/cpu-sweep"
$pt summarize "$out/cpu-sweep"
$pt report "$out/cpu-sweep" --formats png
first=$(ls -d "$out"/cpu-sweep/*/ | grep -v '/report/$' | head -n 1)
trace="$out/cpu-sweep/report/trace-$(basename "$first").json"
$pt trace "$first" -o "$trace"

echo
echo "== 3/3  the same sweep predicted: a profile fitted on this machine's four runs without recompute"
echo "        (micro-batch 1 and 2, so the fit can tell per-layer host time from GEMM speed); the four"
echo "        with full recompute were not fitted on"
profile="$out/cpu-profile.yaml"
fit=("$out"/cpu-sweep/*rcnone*/)
# GEMM efficiency and the per-layer host time: these runs' few collectives (DDP's gradient all-reduce,
# the pipeline's sends) do not pin gloo's latency, so it keeps the base profile's value. A noisy machine
# can measure micro-batch 2 no faster than 1, and the per-layer time then runs to its bound (refused):
# GEMM efficiency alone is fitted then, and only if that is refused too the default profile is used
if ! $pt calibrate "${fit[@]}" --name demo-cpu --output "$profile" --params gemm_eff,layer_overhead_s; then
  echo "demo: refused (above); fitting GEMM efficiency alone"
  if ! $pt calibrate "${fit[@]}" --name demo-cpu --output "$profile" --params gemm_eff --force; then
    echo "demo: refused again (above); predicting with the default profile, NOT fitted to this machine"
    profile=default
  fi
fi
# A sibling folder: a prediction inside the sweep folder would be read as one of its runs.
$pt predict examples/cpu-sweep.yaml --profile "$profile" --out "$out/cpu-sweep-predicted"
$pt compare "$out/cpu-sweep" "$out/cpu-sweep-predicted" | tee "$out/predicted-vs-measured.txt"

echo
echo "demo: Perfetto trace of one run    $trace  (open in https://ui.perfetto.dev)"
echo "demo: CPU sweep report             $out/cpu-sweep/report/report.html"
echo "demo: real-GPU (MLPerf) report     $out/mlperf-llama2-lora-8node/report/report.html"
echo "demo: predicted vs measured        $out/predicted-vs-measured.txt"
