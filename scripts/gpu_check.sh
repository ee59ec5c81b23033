#!/usr/bin/env bash
# The NVIDIA telemetry path end to end on one real GPU (issue 2, deliverable 6). Not part of .ci/run.
#
#   scripts/gpu_check.sh [OUT_DIR] [--install-torch] [--no-train] [--no-controls] [-- ARGS for python -m powertrain.launch.gpu_check]
#
# 1. Samples at 20 Hz around ~10 s idle, ~60 s bf16 matmul burn on CUDA device 0, ~10 s idle, then
#    checks that power rises well above idle, the energy counter agrees with the integral of power
#    within 5 %, temperatures and clocks move and throttle reasons are read. Writes
#    OUT_DIR/gpu_check.{json,md} and the run itself to OUT_DIR/run.
# 2. Unless --no-train: a short real training run on that GPU (examples/run-llama-1gpu.yaml: a ~0.6B
#    Llama, bf16, NCCL) with `powertrain run` under the sampler → OUT_DIR/train, then `powertrain
#    summarize` and `powertrain report` of both runs (OUT_DIR/*/report/report.html).
# 3. Unless --no-controls, and only as root: device controls on GPU 0 — a short bf16 load as found,
#    under a power limit of 60 % of the limit found and under an SM clock lock at 60 % of the highest
#    SM clock, each set through powertrain.control (ledger first, read back) and restored after; checks
#    the limit reads back, power stays under it, the clock stays at the lock, and the limit found is
#    back at the end → OUT_DIR/gpu_controls.{json,md}. Not root: skipped with one line.
# Default OUT_DIR: results/gpu-check-<UTC time>. Exit 0: all checks passed and the training run and
# reports succeeded; 1: a check or the training run failed; 2: the check could not run here.
#
# Which Python: $PYTHON if set, else the first of .venv/bin/python, .venv-gpu/bin/python, python3
# whose torch sees a CUDA GPU. The project's .venv (scripts/setup.sh) holds the CPU build of torch;
# --install-torch replaces it there with the CUDA build of torch==2.13.0 from PyPI (a few GB).
# A system Python with CUDA torch but without the project's packages gets .venv-gpu, a venv that
# sees the system packages (so its torch) and adds the project.
set -euo pipefail
cd "$(dirname "$0")/.."

out=""
install_torch=0
train=1
controls=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --install-torch) install_torch=1 ;;
    --no-train) train=0 ;;
    --no-controls) controls=0 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra+=("$@"); break ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [ -n "$out" ]; then echo "gpu_check: one OUT_DIR only" >&2; exit 2; fi
      out=$1 ;;
  esac
  shift
done
out=${out:-results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}

TAG=gpu_check
# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh
gpu_nvidia_smi "the check"

if ! gpu_find_python; then
  if [ "$install_torch" = 0 ]; then
    echo "gpu_check: no Python here has a torch that sees a CUDA GPU (tried ${PYTHON:+$PYTHON, }.venv, .venv-gpu, python3)." >&2
    echo "gpu_check: rerun with --install-torch to put the CUDA build of torch==2.13.0 into .venv, or set PYTHON=/path/to/python." >&2
    exit 2
  fi
  gpu_install_torch
fi
gpu_project_python

echo "gpu_check: using $py ($("$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"
set +e
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m powertrain.launch.gpu_check --out "$out" ${extra[@]+"${extra[@]}"}
rc=$?
set -e
case $rc in
  0) echo "gpu_check: PASSED — $out/gpu_check.md" ;;
  1) echo "gpu_check: FAILED — see $out/gpu_check.md" ;;
  *) [ -f "$out/gpu_check.md" ] || echo "gpu_check: could not run (exit $rc; no report written)"
     exit $rc ;;
esac

if [ "$train" = 1 ]; then
  pt() { PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m powertrain.cli "$@"; }
  echo "gpu_check: training examples/run-llama-1gpu.yaml on the GPU under the sampler → $out/train"
  if pt run examples/run-llama-1gpu.yaml --out "$out/train"; then
    pt summarize "$out/train" || rc=1
  else
    echo "gpu_check: the training run FAILED — see $out/train/logs/"
    rc=1
  fi
  for r in "$out/run" "$out/train"; do
    [ -f "$r/run.json" ] && { pt report "$r" || rc=1; }
  done
fi

if [ "$controls" = 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "gpu_check: device-controls step skipped: setting a power limit or a clock lock needs root (sudo scripts/gpu_check.sh)"
  else
    # Every setting is written to the node's ledger before it changes and restored after each load;
    # if this step is killed, `powertrain restore` (or the next `powertrain run`) puts the GPU back.
    echo "gpu_check: device controls on GPU 0: power limit and SM clock lock, each under load, then restored"
    set +e
    PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m powertrain.launch.gpu_check --controls --out "$out"
    crc=$?
    set -e
    case $crc in
      0) echo "gpu_check: controls PASSED — $out/gpu_controls.md" ;;
      1) echo "gpu_check: controls FAILED — $out/gpu_controls.md"; rc=1 ;;
      *) echo "gpu_check: controls could not run (exit $crc)"
         PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m powertrain.cli restore || true ;;
    esac
  fi
fi
exit $rc
