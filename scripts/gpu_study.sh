#!/usr/bin/env bash
# A one-GPU characterization (issue 30, deliverable 6), beside scripts/gpu_check.sh. Not part of .ci/run.
#
#   scripts/gpu_study.sh [OUT_DIR] [--install-torch] [--steps N] [--micro-batches 1,2,4,8] [--rehearse]
#
# On CUDA device 0, a micro-batch sweep of examples/run-llama-1gpu.yaml: micro-batch 1, 2, 4 and 8 at a
# global batch of 8 (the largest micro-batch, so every point trains the same tokens per step), each
# trained twice under the sampler with the energy counter: power polled at 20 Hz, and at 20 Hz with
# NVML's own buffer of power samples (the driver's fastest path: only where `powertrain run --help`
# lists --power-buffer; else that leg is skipped and gpu_study.md says so). In this order:
# 1. OUT_DIR/specs/mbN.yaml: the spec with knobs.micro_batch N (--steps: protocol.measured_steps);
# 2. OUT_DIR/predicted/mbN: `powertrain predict` of every configuration, all before the first run;
# 3. OUT_DIR/runs/mbN-20hz and mbN-buffer: `powertrain run`, then `powertrain summarize OUT_DIR/runs`
#    and one `powertrain report OUT_DIR/runs` (OUT_DIR/runs/report/report.html);
# 4. OUT_DIR/gpu_study.md: predicted vs measured for every run (step time, tokens/s, mean and peak
#    power, energy per token, SM clock) and where each figure came from.
# The GPU's settings are left as found: no power limit, no clock lock. Default OUT_DIR:
# results/gpu-study-<UTC time> (a folder that holds a study already is refused). Exit 0: every
# prediction, run, summary and the report succeeded; 1: one of them failed (the others still ran);
# 2: it cannot run here (no CUDA GPU: one line says so).
#
# Which Python: as scripts/gpu_check.sh — $PYTHON if set, else the first of .venv/bin/python,
# .venv-gpu/bin/python, python3 whose torch sees a CUDA GPU; --install-torch puts the CUDA build of
# torch==2.13.0 into .venv (see scripts/gpu_check.sh --help).
#
# --rehearse (or POWERTRAIN_GPU_STUDY_REHEARSE=1), for tests only: no GPU is used. Every step above
# runs on examples/rehearsal-llama-cpu.yaml (llama3-tiny trained on this CPU, standing in for the H200
# it predicts) at micro-batch 1 and 2, with $PYTHON or .venv/bin/python and the NVML stand-in of
# tests/standins as pynvml (its GPUs in $FAKE_NVML_STATE, default: one stand-in GPU written to
# OUT_DIR/stand-in-gpus.json). Its figures are labelled "stand-in (rehearsal)", never as measured.
set -euo pipefail
cd "$(dirname "$0")/.."

out=""
install_torch=0
steps=""
mbs=""
rehearse=0
case "${POWERTRAIN_GPU_STUDY_REHEARSE:-0}" in 0|"") ;; *) rehearse=1 ;; esac
TAG=gpu_study
# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh

while [ $# -gt 0 ]; do
  case "$1" in
    --install-torch) install_torch=1 ;;
    --rehearse) rehearse=1 ;;
    --steps|--micro-batches)
      [ $# -ge 2 ] || { echo "gpu_study: $1 needs a value (see --help)" >&2; exit 2; }
      if [ "$1" = --steps ]; then steps=$2; else mbs=$2; fi
      shift ;;
    -h|--help) gpu_help "$0"; exit 0 ;;
    -*) echo "gpu_study: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [ -n "$out" ]; then echo "gpu_study: one OUT_DIR only" >&2; exit 2; fi
      out=$1 ;;
  esac
  shift
done
if [ -n "$steps" ]; then
  case "$steps" in *[!0-9]*|0*) echo "gpu_study: --steps wants a whole number ≥ 1" >&2; exit 2 ;; esac
fi
if [ "$rehearse" = 1 ]; then spec=examples/rehearsal-llama-cpu.yaml; mbs=${mbs:-1,2}
else spec=examples/run-llama-1gpu.yaml; mbs=${mbs:-1,2,4,8}; fi
case "$mbs" in *[!0-9,]*|,*|*,|*,,*|0*|*,0*|"") echo "gpu_study: --micro-batches wants a comma list of whole numbers, e.g. 1,2,4,8" >&2; exit 2 ;; esac
mbs=${mbs//,/ }
out=${out:-results/gpu-study-$(date -u +%Y%m%dT%H%M%SZ)}
for d in specs predicted runs; do
  [ ! -e "$out/$d" ] || { echo "gpu_study: $out already holds a study ($out/$d): give a new OUT_DIR" >&2; exit 2; }
done


if [ "$rehearse" = 1 ]; then
  # The stand-in pynvml (not NVIDIA's library) for this script's every process: one stand-in node.
  py=${PYTHON:-.venv/bin/python}
  export PYTHONPATH="$PWD/tests/standins/nvml_shim:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p "$out"
  if [ -z "${FAKE_NVML_STATE:-}" ]; then
    FAKE_NVML_STATE="$(cd "$out" && pwd)/stand-in-gpus.json"
    export FAKE_NVML_STATE
    # one stand-in GPU; where the stand-in has one, a known power waveform behind a sensor that
    # averages 25 ms of every 100 ms, with the driver's sample buffer (tests/standins/fake_nvml.py)
    gpu_stand_in '{"sensor_spec": {"waveform": "training_swing"}}' \
      || { echo "gpu_study: cannot run here: $py cannot write the NVML stand-in's state" >&2; exit 2; }
  fi
  project_ok "$py" || { echo "gpu_study: cannot run here: $py cannot import numpy, pyarrow, pynvml and powertrain (scripts/setup.sh)" >&2; exit 2; }
  echo "gpu_study: REHEARSAL on the NVML stand-in (tests/standins; state $FAKE_NVML_STATE) with $spec on this CPU — no GPU is used"
else
  if ! gpu_find_python; then
    if [ "$install_torch" = 0 ]; then
      echo "gpu_study: cannot run here: no Python has a torch that sees a CUDA GPU (tried ${PYTHON:+$PYTHON, }.venv, .venv-gpu, python3; --install-torch or PYTHON=/path/to/python)" >&2
      exit 2
    fi
    gpu_install_torch
  fi
  gpu_project_python
  gpu_nvidia_smi "the study"
  echo "gpu_study: using $py ($("$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"
fi

pt() { PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m powertrain.cli "$@"; }
# The energy counter and power come from NVML: refuse here, in one line, where it cannot be opened.
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -c '
import sys
from powertrain.telemetry.backend import BackendUnavailable
from powertrain.telemetry.nvidia import NvidiaBackend
try:
    NvidiaBackend(probe_s=0).close()
except BackendUnavailable as exc:
    sys.exit(f"gpu_study: cannot run here: {exc}")' || exit 2

buffer_flag=--power-buffer
legs="20hz"
run_help=$(COLUMNS=200 pt run --help 2>/dev/null) || run_help=""
if grep -Eq -- "(^|[^-[:alnum:]])$buffer_flag([^-[:alnum:]]|$)" <<<"$run_help"; then
  legs="20hz buffer"
else
  echo "gpu_study: \`powertrain run\` has no $buffer_flag option here: the NVML-buffer leg is skipped (20 Hz polled only)"
fi

# 1. One spec per micro-batch, at the global batch of the largest micro-batch, for the GPU found here
#    (its catalog name; a GPU the catalog does not know keeps the spec's); checked before anything runs.
mkdir -p "$out/specs" "$out/predicted" "$out/runs" "$out/logs"
device=""
if [ "$rehearse" = 0 ]; then
  device=$(PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -c '
import torch
from powertrain.hardware.catalog import UnknownDeviceError, resolve_device
try:
    print(resolve_device(torch.cuda.get_device_name(0)))
except UnknownDeviceError:
    pass' 2>/dev/null) || device=""
fi
gb=0
for n in $mbs; do if [ "$n" -gt "$gb" ]; then gb=$n; fi; done
[ -z "$device" ] || echo "gpu_study: this GPU is $device in the hardware catalog: the specs and predictions are for it"
for n in $mbs; do
  "$py" -c '
import sys, yaml
src, dst, mb, gb, steps, device = sys.argv[1:]
spec = yaml.safe_load(open(src))
name = spec.get("name", "run")
spec["name"] = f"{name}-mb{mb}"
spec.setdefault("knobs", {}).update(micro_batch=int(mb), global_batch=int(gb))
if steps:
    spec.setdefault("protocol", {})["measured_steps"] = int(steps)
hw = spec.setdefault("hardware", {})
was = hw.get("device")
if device and device != was:
    hw["device"] = device
open(dst, "w").write(f"# {src} with micro_batch {mb}, global_batch {gb}"
                     + (f", hardware.device {device}" if device and device != was else "")
                     + " (scripts/gpu_study.sh)\n" + yaml.safe_dump(spec, sort_keys=False))' \
    "$spec" "$out/specs/mb$n.yaml" "$n" "$gb" "$steps" "$device"
  pt run "$out/specs/mb$n.yaml" --check --rate 20 --backends nvidia,host >"$out/logs/check-mb$n.txt" 2>&1 \
    || { cat "$out/logs/check-mb$n.txt" >&2; echo "gpu_study: $out/specs/mb$n.yaml is refused (above); nothing was run" >&2; exit 1; }
done

# 2. Every prediction before the first measurement.
rc=0
for n in $mbs; do
  if pt predict "$out/specs/mb$n.yaml" --out "$out/predicted/mb$n" >"$out/logs/predict-mb$n.txt" 2>&1; then
    echo "gpu_study: predicted micro-batch $n → $out/predicted/mb$n"
  else
    tail -n 5 "$out/logs/predict-mb$n.txt" >&2
    echo "gpu_study: the prediction of micro-batch $n FAILED (log: $out/logs/predict-mb$n.txt)" >&2
    rc=1
  fi
done

# 3. The runs (no device control is set: the GPU runs as found), their summaries and one report.
for n in $mbs; do
  for leg in $legs; do
    flags=(--rate 20 --backends nvidia,host --quiet)
    how="power polled at 20 Hz"
    if [ "$leg" = buffer ]; then flags+=("$buffer_flag"); how="$how and NVML's buffer ($buffer_flag)"
    elif [ "$legs" != 20hz ]; then flags+=(--no-power-buffer); fi  # the buffer is on by default: polled only
    echo "gpu_study: training micro-batch $n, $how → $out/runs/mb$n-$leg"
    pt run "$out/specs/mb$n.yaml" --out "$out/runs/mb$n-$leg" "${flags[@]}" \
      || { echo "gpu_study: the run mb$n-$leg FAILED — see $out/runs/mb$n-$leg/logs/" >&2; rc=1; }
  done
done
pt summarize "$out/runs" --quiet || rc=1
pt report "$out/runs" || rc=1

# 4. The predicted-vs-measured table.
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" - "$out" "$spec" "$rehearse" "$legs" $mbs <<'PY' || rc=1
import datetime as dt
import json
import sys
from pathlib import Path

out, spec, rehearse, legs, mbs = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4].split(), sys.argv[5:]
MEAS = "stand-in (rehearsal)" if rehearse else "measured"
COLS = [("step time (ms)", "step_time_mean_s", 1e3, "{:.1f}"), ("tokens/s", "tokens_per_s", 1, "{:,.0f}"),
        ("mean power (W)", "power_mean_w", 1, "{:.1f}"), ("peak power (W)", "power_peak_w", 1, "{:.1f}"),
        ("energy per token (J)", "j_per_token", 1, "{:.3g}"), ("SM clock (MHz)", "clock_sm_mean_mhz", 1, "{:.0f}")]
LEG = {"20hz": "polled 20 Hz", "buffer": "20 Hz + NVML buffer"}


def load(p: Path) -> dict:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def cell(v, scale, fmt) -> str:
    return "—" if v is None else fmt.format(v * scale)


def measured(summ: dict) -> tuple[dict, dict | None]:
    """The run's metrics; in a rehearsal the ranks ran on the CPU, so its GPU figures are the NVML
    stand-in's own device entry (sampled, attributed to no rank), and its energy per token that entry's
    energy over the measured window's tokens."""
    m = dict(summ.get("metrics") or {})
    gpu = next((d for d in summ.get("per_device") or [] if d.get("kind") == "gpu"), None)
    if rehearse and gpu is not None:
        for k in ("power_mean_w", "power_peak_w", "clock_sm_mean_mhz"):
            m[k] = gpu.get(k)
        secs = (summ.get("window") or {}).get("seconds")
        tok = m.get("tokens_per_s")
        m["j_per_token"] = (gpu["energy_j"] / (tok * secs)
                            if gpu.get("energy_j") is not None and tok and secs else None)
    return m, gpu


info = {}
rows, sources, starts, pred_times = [], [], [], []
for mb in mbs:
    pdir = out / "predicted" / f"mb{mb}"
    pred = (load(pdir / "summary.json").get("metrics")) or {}
    if (pdir / "run.json").exists():
        pred_times.append((pdir / "run.json").stat().st_mtime_ns)
    for leg in legs:
        rdir = out / "runs" / f"mb{mb}-{leg}"
        run, summ = load(rdir / "run.json"), load(rdir / "summary.json")
        info = info or run
        if run.get("start_ns"):
            starts.append(run["start_ns"])
        meas, gpu = measured(summ)
        status = run.get("status", "not run")
        line = [mb, LEG[leg], status]
        for _, key, scale, fmt in COLS:
            line += [cell(pred.get(key), scale, fmt), cell(meas.get(key), scale, fmt) if status == "ok" else "—"]
        rows.append(line)
        q = next((d for d in (summ.get("data_quality") or {}).get("devices", []) if gpu and d.get("device") == gpu["device"]), {})
        e = gpu if rehearse and gpu else meas
        src = {k: v for k, v in (summ.get("sources") or {}).items()
               if v not in (None, {}, [], "") and any(w in k for w in ("power", "energy", "sample", "rate"))}
        sources.append(f"- `mb{mb}-{leg}`: {gpu['device'] + ' ' if gpu else ''}sampled at "
                       f"{cell((gpu or {}).get('rate_hz'), 1, '{:.1f}')} Hz; energy from the {q.get('energy_from', '—')}: "
                       f"counter {cell(e.get('energy_counter_j'), 1, '{:.1f}')} J, ∫power "
                       f"{cell(e.get('energy_integral_j'), 1, '{:.1f}')} J over the measured window"
                       + (f"; summary sources: `{json.dumps(src)}`" if src else ""))

gpu_dev = next((d for d in info.get("devices", []) if d.get("vendor") == "nvidia"), {})
drv = (info.get("device_software") or {}).get("nvidia_driver")
when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
head = ["micro-batch", "power path", "status"]
for name, *_ in COLS:
    head += [f"{name}, predicted", f"{name}, {MEAS}"]
md = [f"# GPU study{' — REHEARSAL on the NVML stand-in' if rehearse else ''} — {when}", ""]
if rehearse:
    md += ["**Rehearsal, not a measurement.** The runs trained on this machine's CPU; the power, clock "
           "and energy figures are the NVML stand-in's scripted values (`tests/standins`), labelled "
           f"“{MEAS}”. No GPU was read. Predictions are for the spec's device.", ""]
md += [f"Spec: `{spec}` with micro-batch {', '.join(mbs)}; device "
       f"{gpu_dev.get('name', '—')} ({gpu_dev.get('device', '—')}), driver {drv or '—'}. Predictions: "
       "`powertrain predict` (default profile, not fitted to these runs). Energy comes from the GPU's energy "
       "counter where it has one. Report: `runs/report/report.html`.", ""]
if "buffer" not in legs:
    md += ["The NVML-buffer leg was not run: `powertrain run` here has no `--power-buffer` option.", ""]
if pred_times and starts:
    ok = max(pred_times) < min(starts)
    md += [f"Predictions written by {dt.datetime.fromtimestamp(max(pred_times) / 1e9, dt.UTC).isoformat(timespec='seconds')}; "
           f"first run started {dt.datetime.fromtimestamp(min(starts) / 1e9, dt.UTC).isoformat(timespec='seconds')}"
           f"{' (every prediction before every run)' if ok else ' — a prediction is NOT older than every run'}.", ""]
md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
md += ["", f"Where the {MEAS} figures come from:", "", *sources, ""]
(out / "gpu_study.md").write_text("\n".join(md))
print(f"gpu_study: table in {out / 'gpu_study.md'}")
PY

if [ "$rc" = 0 ]; then echo "gpu_study: DONE — $out/gpu_study.md, report $out/runs/report/report.html"
else echo "gpu_study: something FAILED (above) — $out/gpu_study.md"; fi
exit $rc
