"""Fit the device power model's few coefficients on the real GPU data at hand, and print each fit's residual.

What is fitted on what (docs/model.md §6 gives the equations and the sources):

* the **voltage–frequency curve** (``vf_floor``, ``vf_knee``): the Perseus (SOSP'24) A100 stage profiles —
  measured time and energy of every pipeline stage's forward and backward of GPT-3 175B and BLOOM at every
  SM clock from 855 to 1410 MHz (Apache-2.0, ../shared/data/real/perseus-sosp24-pipeline-energy);
* the **full-clock GEMM draw** of Hopper (``predict.dvfs.H200_BURN``): the H200 burn of docs/gpu-validation.md
  (699.3 W at 1500 MHz of 1980) through that curve — exact by construction, printed as a check;
* the **phase draws and the limiter's window** (``power_compute``, ``power_memory``,
  ``power_limiter_window_s``): the one real GPU training run we have (the H200 run of
  docs/gpu-validation.md: 88.4 ms/step, 644.8 W mean, 793.6 W peak on the 20 Hz instantaneous field, SM clock
  mean 1917 MHz, power-capped on 100 % of samples) and the mean GPU power of steady DDP training of an 8B GPT
  on 8×H100 (the Wilkins nvidia-smi logs, ../shared/data/real/wilkins-nvsmi-h100x8-titanx2, 555 W);
  ``power_wait`` and ``memory_clock_floor`` are the profile's, fitted on the Zeus A40 + V100 power-limit traces
  (``benchmarks/zeus_power_limits.py --write``, run first); ``power_limiter_release_s`` keeps its prior (no data
  here pins it).

    python benchmarks/fit_power.py            # print the current profile's figures
    python benchmarks/fit_power.py --fit      # fit the phase draws and window, print, and save them in the profile
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from powertrain.predict import Case, load_calibration, predict
from powertrain.predict.calibrate import _nelder_mead
from powertrain.predict.calibration import SHIPPED_DIR, Calibration, save_calibration
from powertrain.spec.run import RunConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("POWERTRAIN_SHARED", ROOT.parent / "shared")) / "data" / "real"
H200_RUN = {"spec": ROOT / "examples" / "run-llama-1gpu.yaml", "step_s": 0.0884, "mean_w": 644.8, "peak_w": 793.6,
            "clock_mhz": 1917.0, "throttle_power": 1.0}
WILKINS_MEAN_W = None  # measured from the logs when they are at hand (fit_slot_thermal.fit)
FIT = ("power_compute", "power_memory", "power_limiter_window_s")
BOUNDS = {"power_compute": (0.3, 1.1), "power_memory": (0.05, 0.8), "power_limiter_window_s": (0.01, 0.5)}


def vf_fit(perseus: Path) -> list[tuple[str, float, float, float]]:
    """(file, v_floor, r_knee, RMS W) of ``P = P_static + D·r·v(r)²`` per series, shape shared per file."""
    out = []
    for f in sorted((perseus / "stage_profile").glob("*a100*.csv")):
        series: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for row in csv.DictReader(f.open()):
            series.setdefault((row["stage"], row["instruction"]), []).append(
                (float(row["frequency"]), float(row["energy"]) / float(row["time"])))
        fmax = max(fq for s in series.values() for fq, _ in s)
        best = (math.inf, 0.0, 0.0)
        for vf in np.arange(0.60, 1.0001, 0.01):
            for knee in np.arange(0.40, 0.96, 0.01):
                err = n = 0.0
                for pts in series.values():
                    r = np.array([fq / fmax for fq, _ in pts])
                    p = np.array([w for _, w in pts])
                    v = vf + (1 - vf) * np.clip((r - knee) / (1 - knee), 0, None)
                    x = np.column_stack([np.ones_like(r), r * v * v])
                    coef, *_ = np.linalg.lstsq(x, p, rcond=None)
                    err += float(np.sum((p - x @ coef) ** 2))
                    n += len(p)
                if err < best[0]:
                    best = (err, float(vf), float(knee), math.sqrt(err / n))
        out.append((f.stem, best[1], best[2], best[3]))
    return out


def h200_run(cal: Calibration) -> dict[str, float]:
    cfg = RunConfig.model_validate(yaml.safe_load(H200_RUN["spec"].read_text()))
    m = predict(cfg, cal).metrics
    return {"step_s": m["step_time_mean_s"], "mean_w": m["power_mean_w"], "peak_w": m["power_peak_w"],
            "clock_mhz": m["clock_sm_mean_mhz"], "throttle_power": m["throttle_share_power_cap"]}


def wilkins_case() -> Case:
    """Llama-style 8B GPT of the Wilkins logs: hidden 4096, 36 layers, seq 2048, micro-batch 1, gradient accumulation
    2, bf16, DDP on 8×H100 (the source's scripts); FFN width, heads and vocabulary assumed Llama-3-8B's. Its
    trainer (eager PyTorch, flash-attn, fused AdamW) is not powertrain's: predicted as the fused-kernel engine."""
    from powertrain.hardware import get_device

    return Case(layers=36, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq_len=2048, dp=8,
                micro_batch=1, global_batch=16, device=get_device("h100-sxm"), devices_per_node=8, measured_steps=50)


def wilkins_measured() -> float | None:
    logs = SHARED / "wilkins-nvsmi-h100x8-titanx2" / "h100x8_gpt8b_ddp"
    if not logs.is_dir():
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("fit_slot_thermal", Path(__file__).with_name("fit_slot_thermal.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fit_slot_thermal"] = mod
    spec.loader.exec_module(mod)
    runs = mod.fit(logs)["runs"]
    return sum(r["node_mean_w"] * r["steady_samples"] for r in runs) / sum(r["steady_samples"] for r in runs)


def residuals(cal: Calibration, wilkins_w: float | None) -> dict[str, float]:
    """log(predicted/measured) of each fitted figure."""
    got = h200_run(cal)
    out = {k: math.log(got[k] / H200_RUN[k]) for k in ("step_s", "mean_w", "peak_w", "clock_mhz")}
    out["throttle_short"] = max(0.0, 0.8 - got["throttle_power"])  # at least 80 % of the window power-capped
    if wilkins_w:
        out["wilkins_mean_w"] = math.log(predict(wilkins_case(), cal).metrics["power_mean_w"] / wilkins_w)
    return out


def fit(cal: Calibration, wilkins_w: float | None) -> Calibration:
    x0 = np.log([getattr(cal.coefficients, k) for k in FIT])

    def make(x: np.ndarray) -> Calibration:
        return cal.with_coefficients(**{k: float(min(BOUNDS[k][1], max(BOUNDS[k][0], math.exp(v))))
                                        for k, v in zip(FIT, x, strict=True)})

    def loss(x: np.ndarray) -> float:
        res = residuals(make(x), wilkins_w)
        return sum(v * v for k, v in res.items() if k != "step_s") + 0.25 * res["step_s"] ** 2

    best = _nelder_mead(loss, x0, iters=200, step=0.2)
    return make(best)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--fit", action="store_true", help="fit and save the phase draws and the limiter window")
    args = ap.parse_args()
    cal = load_calibration(args.profile)
    perseus = SHARED / "perseus-sosp24-pipeline-energy"
    if perseus.is_dir():
        for name, vf, knee, rms in vf_fit(perseus):
            print(f"V–f curve, Perseus {name}: floor {vf:.2f}, knee {knee:.2f} ({rms:.1f} W RMS); "
                  f"profile uses {cal.coefficients.vf_floor:.2f}, {cal.coefficients.vf_knee:.2f}")
    from powertrain.predict.dvfs import H200_BURN, burn_headroom, dynamic_scale

    c = cal.coefficients
    full = H200_BURN["idle_w"] + burn_headroom(c) * (H200_BURN["tdp_w"] - H200_BURN["idle_w"])
    print(f"H200 burn: 699.3 W at {H200_BURN['clock_mhz']:.0f} MHz → {full:.0f} W at {H200_BURN['max_clock_mhz']:.0f} MHz "
          f"(g = {dynamic_scale(H200_BURN['clock_mhz'] / H200_BURN['max_clock_mhz'], c):.3f})")
    wilkins_w = wilkins_measured()
    if args.fit:
        cal = fit(cal, wilkins_w)
        out = SHIPPED_DIR / f"{cal.name}.yaml" if args.profile == "default" else Path(args.profile)
        save_calibration(replace(cal), out)
        print("fitted: " + ", ".join(f"{k} = {getattr(cal.coefficients, k):.4g}" for k in FIT) + f" → {out}")
    got = h200_run(cal)
    print("H200 training run (examples/run-llama-1gpu.yaml), predicted vs measured:")
    for k, unit in (("step_s", "s"), ("mean_w", "W"), ("peak_w", "W (instantaneous field, 20 Hz)"),
                    ("clock_mhz", "MHz"), ("throttle_power", "share power-capped")):
        print(f"  {k:<16} {got[k]:>9.4g} vs {H200_RUN[k]:>9.4g} {unit}  ({got[k] / H200_RUN[k] - 1:+.1%})")
    if wilkins_w:
        p = predict(wilkins_case(), cal).metrics["power_mean_w"]
        print(f"8×H100 DDP 8B (Wilkins logs): mean GPU power {p:.0f} W vs {wilkins_w:.0f} W measured ({p / wilkins_w - 1:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
