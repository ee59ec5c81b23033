#!/usr/bin/env bash
# The NVIDIA telemetry path end to end on one real GPU (issue 2, deliverable 6). Not part of .ci/run.
#
#   scripts/gpu_check.sh [OUT_DIR] [--install-torch] [--no-train] [--no-controls] [--rehearse] [-- ARGS for python -m powertrain.launch.gpu_check]
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
#
# --rehearse, for tests only: no GPU is used. The NVML stand-in of tests/standins is pynvml for every
# process (one stand-in GPU in OUT_DIR/stand-in-gpus.json whose power follows the load of the program
# that samples it, and whose temperatures and SM clock follow that power); step 1 burns bf16 matmuls on
# this CPU (gpu_check --cpu, 2 s idle, 7 s burn); step 2 trains examples/rehearsal-llama-cpu.yaml on
# this CPU under the sampler; step 3 is not rehearsed (its load is a CUDA kernel and the stand-in's
# power does not obey a limit). Every report says REHEARSAL; no figure in it is a GPU's.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=gpu_check
# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh

out=""
install_torch=0
rehearse=0
train=1
controls=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --install-torch) install_torch=1 ;;
    --no-train) train=0 ;;
    --no-controls) controls=0 ;;
    --rehearse) rehearse=1 ;;
    -h|--help) gpu_help "$0"; exit 0 ;;
    --) shift; extra+=("$@"); break ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [ -n "$out" ]; then echo "gpu_check: one OUT_DIR only" >&2; exit 2; fi
      out=$1 ;;
  esac
  shift
done
out=${out:-results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}

burn_args=()
train_spec=examples/run-llama-1gpu.yaml
if [ "$rehearse" = 1 ]; then
  py=${PYTHON:-.venv/bin/python}
  export PYTHONPATH="$PWD/tests/standins/nvml_shim:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p "$out"
  FAKE_NVML_STATE="$(cd "$out" && pwd)/stand-in-gpus.json"
  export FAKE_NVML_STATE
  # idle 80 W; the burn's CPU load drives it towards 650 W; +0.05 °C per W over 2 s; 345 MHz when idle
  gpu_stand_in '{"power_mw": 80000, "temp_c_per_w": 0.05, "clock_sm_idle_mhz": 345,
             "sensor_spec": {"waveform": "cpu_load", "args": {"idle_w": 80, "busy_w": 650}}}' \
    || { echo "gpu_check: cannot run here: $py cannot write the NVML stand-in's state" >&2; exit 2; }
  project_ok "$py" || { echo "gpu_check: cannot run here: $py cannot import numpy, pyarrow, pynvml and powertrain (scripts/setup.sh)" >&2; exit 2; }
  echo "gpu_check: REHEARSAL on the NVML stand-in (tests/standins; state $FAKE_NVML_STATE), burn and training on this CPU — no GPU is used"
  burn_args=(--cpu --idle 2 --burn 7 --size 256)
  train_spec=examples/rehearsal-llama-cpu.yaml
  controls=0
  echo "gpu_check: device-controls step not rehearsed: its load is a CUDA kernel and the stand-in's power does not obey a limit"
else
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
fi

echo "gpu_check: using $py ($("$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"
set +e
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m powertrain.launch.gpu_check --out "$out" \
  ${burn_args[@]+"${burn_args[@]}"} ${extra[@]+"${extra[@]}"}
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
  if [ "$rehearse" = 1 ]; then
    # a training step's power (the H200 run's 1.1 Hz swing) behind the 25-ms-of-100-ms sensor
    gpu_stand_in '{"sensor_spec": {"waveform": "training_swing"}}' \
      || { echo "gpu_check: cannot write the NVML stand-in's state for the training step" >&2; exit 2; }
  fi
  echo "gpu_check: training $train_spec under the sampler → $out/train"
  if pt run "$train_spec" --out "$out/train"; then
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
