"""Measured node power of the MLPerf v4.0 SMC runs against the node-power model's host terms.

For each MLPerf Training v4.0 run of Sustainable Metal Cloud with node power logs (``../shared/data/real/
mlperf-v4.0-smc-h100``, README §1; the 8-node LoRA run also ships in ``examples/data``):

* **measured** (:func:`measured_node_power`): each node's mean power over the training blocks
  (``block_start`` → ``block_stop``: init before run_start and every evaluation excluded) and over the whole
  run (``run_start`` → ``run_stop``), on the project's one energy integral (:mod:`powertrain.core.energy`:
  trapezoid, edges held ≤ 5 s), averaged over the nodes; AC, and DC where the run was logged on the DC side too
  (GPT-3 only). MLLOG records are read with the importer's reader (:func:`powertrain.importers.mlperf.iter_mllog`);
* **the node** (:func:`node_from_system`): the run's ``system_*.json`` (CPU model and count, cores, memory,
  drives, NVSwitch generation, cooling) turned into a :class:`~powertrain.hardware.NodeSpec` host description,
  on the catalog's H100 node for what the JSON does not state (NICs); the SMC nodes are immersion cooled;
* **host terms** (:func:`powertrain.predict.node_power.node_power`): every non-GPU term of that node, W DC, and
  **the GPU power that closes the gap**: measured DC − host terms (AC runs: measured AC × the model's
  power-supply efficiency − host terms), per GPU;
* **the GPU side as it is today**: ``powertrain.predict.predict(case)``'s mean GPU power for the published run
  (``predict.published``; the LoRA entries publish no layout, so theirs is read from the run's own NeMo config
  dump, said so). The GPU model is being rewritten: this number will move; the host terms are what this check
  holds.

    python benchmarks/predict_power_check.py [--data DIR] [--profile default]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from powertrain.core.energy import clean_readings, windows_energy
from powertrain.hardware import DeviceSpec, HostSpec, NodeSpec, get_device
from powertrain.importers.mlperf import iter_mllog
from powertrain.predict import load_calibration, predict
from powertrain.predict.node_power import NodePower, node_power
from powertrain.predict.published import load_published, run_from_entry

SHARED = Path(os.environ.get("POWERTRAIN_SHARED", Path(__file__).resolve().parents[2] / "shared"))
DEFAULT_DATA = SHARED / "data/real/mlperf-v4.0-smc-h100"
SHIPPED_LORA = Path(__file__).resolve().parents[1] / "examples/data/mlperf-v4.0-smc-h100-llama2-lora-8node"
RUN_ID = "mlperf40_smc_gpt3_512gpu_power"


@dataclass(frozen=True)
class MlperfRun:
    label: str
    folder: str  # under --data
    published_id: str  # the run of predict/data/calibration_runs.yaml the prediction is made for


RUNS = (
    MlperfRun("GPT-3 175B pretraining, 64 nodes × 8 H100", "gpt3-175b_64node_512gpu", RUN_ID),
    MlperfRun("Llama-2-70B LoRA, 8 nodes × 8 H100", "llama2-70b-lora_8node_64gpu",
              "mlperf40_smc_h100_llama2_70b_lora_64gpu_power"),
    MlperfRun("Llama-2-70B LoRA, 1 node × 8 H100", "llama2-70b-lora_1node_8gpu",
              "mlperf40_smc_h100_llama2_70b_lora_8gpu_power"),
)

# Host CPUs of the systems read here, by the model name's last token: (cores, TDP W, source). Intel ARK.
KNOWN_CPUS = {
    "8462Y+": (32, 300.0, "Intel ARK: Intel Xeon Platinum 8462Y+ (Sapphire Rapids), 32 cores, TDP 300 W"),
}


# --- measured: MLLOG windows and node power -------------------------------------------------------------------


def result_windows(result: Path) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """(run_start, run_stop) and the training blocks (block_start → block_stop), epoch ms, of a result log:
    the records of the first rank prefix that logs run_start (the other ranks repeat them)."""
    recs = list(iter_mllog(result))
    prefix = next(pre for _, pre, r in recs if r["key"] == "run_start")
    mine = [r for _, pre, r in recs if pre == prefix]
    t = {k: next(int(r["time_ms"]) for r in mine if r["key"] == k) for k in ("run_start", "run_stop")}
    blocks, open_at = [], None
    for r in mine:
        if r["key"] == "block_start":
            open_at = int(r["time_ms"])
        elif r["key"] == "block_stop" and open_at is not None:
            blocks.append((max(open_at, t["run_start"]), min(int(r["time_ms"]), t["run_stop"])))
            open_at = None
    return (t["run_start"], t["run_stop"]), blocks


def power_readings(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(t_ns, W) of one node's ``power_reading`` records (``"value": "null"`` and other non-numbers skipped),
    cleaned on the project's rule (exact repeats dropped, same-time readings averaged)."""
    t, w = [], []
    for _, _, r in iter_mllog(path):
        if r["key"] != "power_reading":
            continue
        try:
            v = float(r.get("value"))
        except (TypeError, ValueError):
            continue
        t.append(int(r["time_ms"]) * 1_000_000)
        w.append(v)
    cleaned = clean_readings(np.asarray(t, dtype=np.int64), np.asarray(w, dtype=float))
    return cleaned.t_ns, cleaned.value


def window_mean_w(t_ns: np.ndarray, w: np.ndarray, windows: list[tuple[int, int]], span: tuple[int, int]) -> float:
    """Mean power (W) over ``windows`` (epoch ms): their energy on :func:`powertrain.core.energy.windows_energy`
    (edges held ≤ 5 s against ``span``) ÷ their seconds."""
    a = np.array([x for x, _ in windows], dtype=np.int64) * 1_000_000
    b = np.array([y for _, y in windows], dtype=np.int64) * 1_000_000
    e, why = windows_energy(t_ns, w, a, b, span=(span[0] * 1_000_000, span[1] * 1_000_000))
    if why:
        raise ValueError(why)
    return float(np.sum(e) / (np.sum(b - a) / 1e9))


def measured_node_power(data: Path) -> dict[str, Any]:
    """Mean node power of one MLPerf run folder over its training blocks (``train``) and its whole run (``run``),
    per side (``ac``; ``dc`` where logged): the mean over nodes of each node's window mean, with the nodes' range."""
    result = next(p for p in sorted(data.glob("result_*.txt*")))
    run, blocks = result_windows(result)
    out: dict[str, Any] = {"run_s": (run[1] - run[0]) / 1000, "train_s": sum(b - a for a, b in blocks) / 1000,
                           "blocks": len(blocks)}
    for side, folder in (("ac", "power_ac"), ("dc", "power_dc_gz")):
        files = sorted((data / folder).glob("node_*.txt*"))
        if not files:
            continue
        series = [power_readings(f) for f in files]
        distinct = len({(s[0].tobytes(), s[1].tobytes()) for s in series})
        for name, windows in (("run", [run]), ("train", blocks)):
            means = [window_mean_w(t, w, windows, run) for t, w in series]
            out[side, name] = float(np.mean(means))
            out[side, name, "range"] = (min(means), max(means))
        out[side, "nodes"], out[side, "distinct"] = len(files), distinct
    return out


# --- the node: system_*.json → host description ----------------------------------------------------------------


def _number_in(text: Any) -> float | None:
    m = re.search(r"[0-9]+(?:\.[0-9]+)?", str(text or ""))
    return float(m.group()) if m else None


def node_from_system(system_json: Path) -> tuple[NodeSpec, str, list[str], DeviceSpec]:
    """(node, cooling, what was assumed, the accelerator's catalog entry) of an MLPerf system description: the catalog node of its accelerator
    (network, NVLink) with a host built from what the JSON states (CPU model → cores and TDP from Intel ARK, CPU
    count, memory, drives, NVSwitch generation, cooling). What it does not state is left out of the host and the
    node-power model says what it assumes (NICs: the node's nic_count; power supplies; DPUs; per-part watts)."""
    import json

    sj = json.loads(system_json.read_text())
    base = get_device(str(sj["accelerator_model_name"]))
    said: list[str] = []
    cpu = str(sj.get("host_processor_model_name", ""))
    key = next((k for k in KNOWN_CPUS if cpu.endswith(k)), None)
    if key is None:
        raise ValueError(f"{system_json}: host CPU {cpu!r} is not in KNOWN_CPUS (add its cores and TDP from its data "
                         "sheet)")
    cores, tdp, cpu_src = KNOWN_CPUS[key]
    cores = int(_number_in(sj.get("host_processor_core_count")) or cores)
    mem = str(sj.get("host_memory_capacity", ""))
    mem_gb = (_number_in(mem) or 0.0) * (1024 if "TB" in mem.upper() else 1)
    drives = sum(int(n) for n in re.findall(r"(\d+)\s*x", str(sj.get("host_storage_capacity", ""))))
    link = str(sj.get("accelerator_interconnect", ""))
    # an 8-GPU HGX H100 / H200 baseboard carries four third-generation NVSwitch chips (DGX H100 user guide)
    nvswitches = 4 if "NVSWITCH GEN3" in link.upper() and base.node.devices_per_node == 8 else None
    if nvswitches:
        said.append("NVSwitch Gen3 on an 8-GPU board: the 4 chips of the HGX H100 baseboard")
    cooling_text = str(sj.get("cooling", "")).lower()
    cooling = "immersion" if "immersion" in cooling_text else "liquid" if "liquid" in cooling_text else "air"
    host = HostSpec(cpu_sockets=int(_number_in(sj.get("host_processors_per_node")) or 0), cpu_cores=cores,
                    cpu_tdp_w=tdp, memory_gb=mem_gb or None, drives=drives or None, nvswitches=nvswitches,
                    source=f"{system_json.name}: {cpu}, {mem}, {sj.get('host_storage_capacity')}, {link}, "
                           f"{sj.get('cooling')}; {cpu_src}")
    return replace(base.node, host=host), cooling, said, base


# --- the GPU side as it is today ---------------------------------------------------------------------------------


def layout_from_log(result: Path) -> dict[str, int]:
    """The parallel layout and batch a NeMo MLPerf log's config dump states (first value of each key)."""
    keys = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
            "micro_batch_size": "micro", "global_batch_size": "global"}
    out: dict[str, int] = {}
    with open(result, errors="replace") as fh:
        for line in fh:
            m = re.match(r"^\s*\d*:?\s*(\w+):\s*(\d+)\s*$", line)
            if m and m.group(1) in keys and keys[m.group(1)] not in out:
                out[keys[m.group(1)]] = int(m.group(2))
    return out


def predicted_gpu_w(run: MlperfRun, data: Path, profile: str) -> tuple[float | None, str]:
    """(mean GPU power predict() gives for the published run, how the case was made); None with the reason."""
    entry = next((r for r in load_published() if r.id == run.published_id), None)
    if entry is None:
        return None, f"no published run {run.published_id}"
    how = f"published run {run.published_id}"
    case = entry.case
    if case is None and entry.raw is not None:
        lay = layout_from_log(next(data.glob("result_*.txt*")))
        count = int(entry.raw["hardware"]["count"])
        if {"tp", "pp", "cp", "micro", "global"} <= set(lay):
            dp = count // (lay["tp"] * lay["pp"] * lay["cp"])
            raw = {**entry.raw, "parallel": {**entry.raw["parallel"], "tp": lay["tp"], "pp": lay["pp"], "cp": lay["cp"],
                                             "dp": dp},
                   "batch": {**entry.raw["batch"], "micro": lay["micro"], "global": lay["global"]}}
            case = run_from_entry(raw).case
            how += (f" (its layout is not published: TP{lay['tp']}·PP{lay['pp']}·CP{lay['cp']}·DP{dp}, micro-batch "
                    f"{lay['micro']}, global batch {lay['global']} read from this run's NeMo config dump)")
    if case is None:
        return None, f"{how}: {entry.skip}"
    return predict(case, load_calibration(profile)).metrics["power_mean_w"], how


def _terms(p: NodePower) -> str:
    parts = (("CPUs", p.cpus_w), ("memory", p.memory_w), ("NICs", p.nics_w), ("NVSwitch/baseboard", p.baseboard_w),
             ("storage", p.storage_w), ("other", p.other_w), ("fans", p.fans_w))
    return " + ".join(f"{name} {w:.0f}" for name, w in parts if w is not None)


def check_run(run: MlperfRun, data: Path, profile: str, shown: set[str] | None = None) -> dict[str, Any]:
    """Print one run's measured node power, the model's host terms, the GPU power that closes the gap, and the
    GPU side predict() gives today; returns the numbers. ``shown``: assumptions already printed (not repeated)."""
    meas = measured_node_power(data)
    node, cooling, said, gpu_dev = node_from_system(next(data.glob("system_*.json")))
    dpn = node.devices_per_node
    host = node_power(0.0, node, cooling, ranks=dpn)  # immersion: no term depends on the GPUs' draw but the PSU's
    assert host.host_w is not None and host.psu_efficiency is not None, host.why_null
    print(f"\n{run.label} ({data.name}; {meas['blocks']} training blocks, {meas['train_s']:.0f} s of "
          f"{meas['run_s']:.0f} s run_start→run_stop; {cooling} cooled)")
    for side in ("ac", "dc"):
        if (side, "run") not in meas:
            continue
        lo, hi = meas[side, "train", "range"]
        same = (f", {meas[side, 'distinct']} distinct logs" if meas[side, "distinct"] < meas[side, "nodes"] else "")
        print(f"  measured node power ({side.upper()}): training {meas[side, 'train']:.0f} W (nodes {lo:.0f}–{hi:.0f}),"
              f" whole run {meas[side, 'run']:.0f} W; {meas[side, 'nodes']} node log(s){same}")
    print(f"  host terms (DC, model): {host.host_w:.0f} W = {_terms(host)} (CPU load {host.cpu_load:.0%})")
    seen = set() if shown is None else shown
    new = [line for line in [*said, *host.notes] if line not in seen]
    for line in new:
        print(f"    assumed: {line}")
    if len(new) < len(said) + len(host.notes):
        print("    assumed: as for the run above" if not new else "    (and as for the run above)")
    seen.update(new)
    out: dict[str, Any] = {"measured": meas, "host_w": host.host_w, "psu_efficiency": host.psu_efficiency}
    if ("dc", "train") in meas:
        gpu_dc = meas["dc", "train"] - host.host_w
        print(f"  GPU power that closes the gap (DC training − host): {gpu_dc:.0f} W per node, {gpu_dc / dpn:.0f} W "
              f"per GPU; measured AC/DC {meas['ac', 'train'] / meas['dc', 'train']:.3f} (the model's, supplies not "
              f"described: {1 / host.psu_efficiency:.3f})")
    else:
        gpu_dc = meas["ac", "train"] * host.psu_efficiency - host.host_w
        print(f"  GPU power that closes the gap (AC training × {host.psu_efficiency:.0%} − host): {gpu_dc:.0f} W per "
              f"node, {gpu_dc / dpn:.0f} W per GPU")
    out["implied_gpu_w"] = gpu_dc / dpn
    if gpu_dc / dpn > 0.97 * gpu_dev.tdp_w:
        print(f"    note: {gpu_dc / dpn:.0f} W per GPU is at or above the {gpu_dev.name}'s {gpu_dev.tdp_w:.0f} W power "
              "limit, which caps a GPU's mean: the host terms are too low, or this node's power path is not the "
              "model's (the site's AC/DC ratio, 1.017 on the GPT-3 run, is above any power supply's efficiency: its "
              "DC meter likely reads a DC bus ahead of DC-DC stages inside the node)")
    gpu, how = predicted_gpu_w(run, data, profile)
    out["predicted_gpu_w"] = gpu
    if gpu is None:
        print(f"  predicted GPU mean: none ({how})")
        return out
    pred = node_power(dpn * gpu, node, cooling, ranks=dpn)
    assert pred.dc_w is not None and pred.ac_w is not None
    out["predicted_node_dc_w"], out["predicted_node_ac_w"] = pred.dc_w, pred.ac_w
    side = "dc" if ("dc", "train") in meas else "ac"
    mine = pred.dc_w if side == "dc" else pred.ac_w
    print(f"  predicted GPU mean (predict(), profile {profile!r}, GPU model as of today): {gpu:.0f} W per GPU "
          f"({gpu / out['implied_gpu_w'] - 1:+.1%} against the gap); node {pred.dc_w:.0f} W DC, {pred.ac_w:.0f} W AC "
          f"→ {mine / meas[side, 'train'] - 1:+.1%} ({side.upper()}, training) — {how}")
    return out


def _sibling(name: str) -> Any:
    """A benchmark module next to this one (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def device_checks(profile: str) -> None:
    """The device power model against the real GPU data it was fitted on (benchmarks/fit_power.py): the V–f curve
    on the Perseus A100 profiles, the H200 burn, the H200 training run, 8×H100 DDP (Wilkins)."""
    fp = _sibling("fit_power")
    from powertrain.predict.dvfs import H200_BURN, burn_headroom, clock_for_scale

    cal = load_calibration(profile)
    c = cal.coefficients
    perseus = fp.SHARED / "perseus-sosp24-pipeline-energy"
    print("\nGPU power model (predict/dvfs.py, predict/governor.py), profile " + repr(cal.name))
    if perseus.is_dir():
        for name, vf, knee, rms in fp.vf_fit(perseus):
            print(f"  V–f curve, Perseus {name}: voltage floor {vf:.2f}, knee {knee:.2f} ({rms:.1f} W RMS); "
                  f"profile {c.vf_floor:.2f}, {c.vf_knee:.2f}")
    b = H200_BURN
    full = b["idle_w"] + burn_headroom(c) * (b["tdp_w"] - b["idle_w"])
    r = clock_for_scale((b["tdp_w"] - b["idle_w"]) / (full - b["idle_w"]), c)
    print(f"  H200 burn (bf16 8192² GEMMs): predicted {b['tdp_w']:.0f} W ({b['tdp_w'] / b['tdp_w']:.0%} of the limit) at "
          f"{r * b['max_clock_mhz']:.0f} MHz; measured {b['power_w']} W at {b['clock_mhz']:.0f} MHz (the fit: the burn "
          f"sets the {full:.0f} W full-clock GEMM draw)")
    got = fp.h200_run(cal)
    print("  H200 training run (examples/run-llama-1gpu.yaml), predicted vs measured (docs/gpu-validation.md):")
    for k, unit in (("step_s", "s/step"), ("mean_w", "W mean"), ("peak_w", "W peak, instantaneous field at 20 Hz"),
                    ("clock_mhz", "MHz SM clock mean"), ("throttle_power", "share of time power-capped")):
        m = fp.H200_RUN[k]
        print(f"    {got[k]:>9.4g} vs {m:>9.4g} {unit} ({got[k] / m - 1:+.1%})")
    w = fp.wilkins_measured()
    if w:
        p = predict(fp.wilkins_case(), cal).metrics["power_mean_w"]
        print(f"  8×H100 DDP of an 8B GPT (Wilkins nvidia-smi logs, steady training): mean GPU power predicted {p:.0f} W, "
              f"measured {w:.0f} W ({p / w - 1:+.1%}; FFN/heads/vocab assumed Llama-3-8B's)")


def zeus_check(profile: str) -> None:
    """Power-cap response on the Zeus traces, fitted on two GPU types and scored on the other two."""
    z = _sibling("zeus_power_limits")
    print("\nPower-cap response, Zeus NSDI'23 traces (benchmarks/zeus_power_limits.py):")
    sys.argv = [sys.argv[0], "--profile", profile]
    z.main()


def study_check(profile: str) -> None:
    """The study's micro-batch sweep (examples/study-h200-microbatch.yaml): per layout, peak power at the study's
    sampler, the share power-capped and the hottest slot, micro-batch 1 → 8."""
    from collections import defaultdict

    from powertrain.plan.sweep_spec import expand, load_sweep_spec
    from powertrain.predict import case_from_run_config
    from powertrain.predict.physics import STUDY_SAMPLER

    cal = load_calibration(profile)
    rows: dict[tuple[str, str], list[tuple[int, Any]]] = defaultdict(list)
    for e in expand(load_sweep_spec(Path(__file__).resolve().parents[1] / "examples" / "study-h200-microbatch.yaml")):
        if e.config is None:
            continue
        case = case_from_run_config(e.config)
        if case.micro_batch * case.dp > case.global_batch:
            continue
        rows[(e.config.model.name, e.config.layout.label())].append((case.micro_batch, predict(case, cal)))
    print(f"\nThe study's micro-batch sweep on 32×H200 (examples/study-h200-microbatch.yaml): peak at the study's sampler "
          f"({STUDY_SAMPLER[0]} field, {STUDY_SAMPLER[1]:g} Hz, an assumption), share power-capped, mean W, hottest slot")
    for (model, layout), pts in sorted(rows.items()):
        pts.sort(key=lambda t: t[0])
        cells = []
        for mb, p in pts:
            pk = p.breakdown["power"]["peaks"]["study"]["power_w"]
            cells.append(f"mb{mb} {pk:.0f} W/{p.metrics['throttle_share_power_cap']:.0%}/{p.metrics['power_mean_w']:.0f}/"
                         f"{p.metrics['temp_peak_c']:.0f}°C")
        print(f"  {model:<14} {layout:<26} " + "  ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the mlperf-v4.0-smc-h100 folder")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--no-zeus", action="store_true", help="skip the Zeus power-limit fit (several minutes)")
    args = ap.parse_args()
    found = [(r, args.data / r.folder) for r in RUNS if (args.data / r.folder).is_dir()]
    if not found and SHIPPED_LORA.is_dir():
        found = [(RUNS[1], SHIPPED_LORA)]
    if not found:
        print(f"MLPerf data not found at {args.data} (pass --data or set POWERTRAIN_SHARED)", file=sys.stderr)
        return 2
    print("MLPerf Training v4.0, Sustainable Metal Cloud H100 (immersion cooled): node power, measured and modelled")
    shown: set[str] = set()
    for run, folder in found:
        check_run(run, folder, args.profile, shown)
    device_checks(args.profile)
    if not args.no_zeus:
        zeus_check(args.profile)
    study_check(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
