#!/usr/bin/env bash
# Set up everything powertrain needs on a fresh machine, idempotently:
#   - a virtual environment in .venv with torch==2.13.0 (CPU wheel) installed *before* the project,
#     so nothing pulls a CUDA build, then the project itself (editable) with its dev/train extras;
#   - with --system: the system packages later tests need (Slurm, Chromium), when missing and when
#     we are root with apt; otherwise those tests skip with one line saying why.
# Re-running is fast: the Python part is skipped while pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

want_system=0
for arg in "$@"; do
  case "$arg" in
    --system) want_system=1 ;;
    *) echo "usage: scripts/setup.sh [--system]" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "powertrain needs Python >= 3.11"'

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi

pip_install() {  # quiet on success; on failure show pip's output (minus the local-index noise) and stop
  local log; log=$(mktemp)
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" >&2 || true
    echo "setup: pip install $* failed" >&2
    rm -f "$log"; exit 1
  fi
  rm -f "$log"
}

stamp=.venv/.powertrain-setup
digest=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
  echo "setup: installing torch==2.13.0 (CPU) and the project into .venv"
  pip_install torch==2.13.0 numpy
  pip_install -e ".[dev,train,hf,lightning]"
  .venv/bin/python -c 'import torch, powertrain; print(f"setup: torch {torch.__version__}, powertrain {powertrain.__version__}")'
  echo "$digest" > "$stamp"
fi
# Byte-compile the editable sources (only what changed): with PYTHONDONTWRITEBYTECODE set, as on these
# machines, every short-lived process (CLI call, sampler, rank) would otherwise compile them again.
.venv/bin/python -m compileall -q src >/dev/null

if [ "$want_system" = 1 ]; then
  missing=()
  command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm munge)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing system packages: ${missing[*]}"
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "setup: cannot install ${missing[*]} (needs root with apt-get); the tests that need them will skip"
    fi
  fi
fi
