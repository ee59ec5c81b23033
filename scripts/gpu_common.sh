# Sourced, not run: what scripts/gpu_check.sh and scripts/gpu_study.sh share — which Python runs on
# the GPU and the project's packages in it. The caller sets TAG (its name: the prefix of every line
# printed here) and runs from the repository root. Selection, in gpu_find_python: $PYTHON if set, else
# the first of .venv/bin/python, .venv-gpu/bin/python, python3 whose torch sees a CUDA GPU.

# nvidia-smi's view of the GPUs, one line each (or one line saying it is not there); $1: what goes on
# without it ("the check").
gpu_nvidia_smi() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,persistence_mode,power.limit --format=csv,noheader \
      | sed "s/^/$TAG: nvidia-smi: /" || true
  else
    echo "$TAG: nvidia-smi not found (continuing: $1 reads NVML through nvidia-ml-py)"
  fi
}

cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
project_ok() {
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$1" -c 'import numpy, pyarrow, pynvml, powertrain.monitor' \
    >/dev/null 2>&1
}

# py ← the first candidate whose torch sees a CUDA GPU; returns 1 (py empty) when none does.
gpu_find_python() {
  py=""
  local cand
  for cand in "${PYTHON:-}" .venv/bin/python .venv-gpu/bin/python python3; do
    [ -n "$cand" ] || continue
    [ -x "$cand" ] || command -v "$cand" >/dev/null 2>&1 || continue
    if cuda_torch "$cand"; then py=$cand; return 0; fi
  done
  return 1
}

# --install-torch: scripts/setup.sh, then the CUDA build of torch==2.13.0 from PyPI into .venv; py ← it.
# Exits 2 when that torch sees no GPU.
gpu_install_torch() {
  scripts/setup.sh
  echo "$TAG: installing the CUDA build of torch==2.13.0 from PyPI into .venv"
  .venv/bin/python -m pip uninstall -y -q torch
  # Bypass any local wheel mirror configured for CPU-only machines: PyPI's Linux torch is the CUDA build.
  env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    .venv/bin/python -m pip install -q --index-url https://pypi.org/simple torch==2.13.0
  cuda_torch .venv/bin/python || {
    echo "$TAG: torch installed but it sees no CUDA GPU (driver too old for this torch build?)" >&2
    exit 2
  }
  py=.venv/bin/python
}

# Make sure $py imports the project's packages: .venv gets scripts/setup.sh; another Python with CUDA
# torch gets .venv-gpu (its system packages, so its torch, plus the project) and py ← that. Exits 2
# when that fails.
gpu_project_python() {
  project_ok "$py" && return 0
  case "$py" in
    .venv/bin/python) scripts/setup.sh ;;
    *)
      echo "$TAG: $py has CUDA torch but not the project's packages; making .venv-gpu (system packages + the project)"
      "$py" -m venv --system-site-packages .venv-gpu
      .venv-gpu/bin/python -m pip install -q -e ".[nvidia]" || {
        echo "$TAG: could not install the project into .venv-gpu (offline?); install numpy, pyarrow and nvidia-ml-py for $py" >&2
        exit 2
      }
      py=.venv-gpu/bin/python ;;
  esac
  project_ok "$py" || { echo "$TAG: $py still cannot import numpy, pyarrow, pynvml and powertrain" >&2; exit 2; }
}

# --help: the calling script's header comment (line 2 up to the first line that is not a comment).
gpu_help() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$1"
}

# --rehearse: write one stand-in GPU to $FAKE_NVML_STATE for tests/standins' pynvml; $1: its FakeGpu keyword
# arguments as JSON (a power waveform behind the 25-ms-of-100-ms sensor, and what follows it). Needs $py and
# tests/ on PYTHONPATH.
gpu_stand_in() {
  "$py" -c 'import json, sys; from pathlib import Path; from standins.fake_nvml import FakeGpu
from standins.nvml_state import write_state
write_state(Path(sys.argv[1]), [FakeGpu(**json.loads(sys.argv[2]))])' "$FAKE_NVML_STATE" "$1"
}
