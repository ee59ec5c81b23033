"""How well `predict` matches published, measured training runs (calibration_runs.yaml).

Prints throughput (tokens/s per GPU) MAPE per source, per GPU type and per architecture, the
worst runs, and the memory check (no published run may be predicted not to fit). Targets:
dense ≤ 12%, MoE ≤ 20%.

    python benchmarks/predict_accuracy.py                    # score the shipped default profile
    python benchmarks/predict_accuracy.py --refit            # refit its global coefficients, save it
    python benchmarks/predict_accuracy.py --cross-validate   # leave-one-source-out: fit on the rest

Runs whose recompute setting is not published are predicted with the least recompute that fits
(a framework that has to fit recomputes). Runs lacking a layout, batch or sequence length are
listed as not evaluable.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from powertrain.predict.calibrate import _nelder_mead
from powertrain.predict.calibration import SHIPPED_DIR, Calibration, load_calibration, save_calibration
from powertrain.predict.core import predict
from powertrain.predict.memory import least_recompute_that_fits, memory_per_device
from powertrain.predict.published import CALIBRATION_RUNS, PublishedRun, load_published

DEFAULT_FILE = CALIBRATION_RUNS  # the packaged copy (src/powertrain/predict/data/); --file reads another
# Global coefficients with physical meaning that the refit may move (never per run).
FIT_PARAMS = ("gemm_eff_16", "gemm_eff_fp8", "gemm_eff_fp4", "gemm_knee", "attn_eff_ratio",
              "elementwise_scale", "moe_dispatch_passes", "moe_layer_overhead_s", "overlap_eff", "tp_overlap_exposed", "comm_eff_inter",
              "power_clock_exponent")
BOUNDS = {"gemm_eff_16": (0.3, 0.95), "gemm_eff_fp8": (0.2, 0.95), "gemm_eff_fp4": (0.15, 0.95),
          "gemm_knee": (4, 2048), "attn_eff_ratio": (0.15, 1.2), "elementwise_scale": (0.2, 5),
          "moe_dispatch_passes": (1, 120), "overlap_eff": (0.2, 1.0), "tp_overlap_exposed": (0.0, 1.0),
          "comm_eff_inter": (0.2, 1.0), "moe_layer_overhead_s": (1e-5, 0.02), "power_clock_exponent": (1.0, 3.0)}


def prepare(path: Path, profile: Calibration) -> tuple[list[PublishedRun], list[PublishedRun]]:
    runs = load_published(path)
    usable, skipped = [], []
    for r in runs:
        if r.skip or r.case is None:
            skipped.append(r)
            continue
        if not r.recompute_stated:
            r.case = replace(r.case, recompute=least_recompute_that_fits(r.case, profile.coefficients))
        usable.append(r)
    return usable, skipped


def rel_errors(runs: list[PublishedRun], profile: Calibration) -> list[float]:
    out = []
    for r in runs:
        tps = predict(r.case, profile).metrics["tokens_per_s_per_device"]
        out.append(tps / r.tokens_per_s_per_gpu - 1)
    return out


def fit(runs: list[PublishedRun], profile: Calibration) -> Calibration:
    """Refit FIT_PARAMS: mean |log error|, dense and MoE weighted equally, within physical bounds."""
    dense = [r for r in runs if r.arch != "moe"]
    moe = [r for r in runs if r.arch == "moe"]
    x0 = np.log([getattr(profile.coefficients, p) for p in FIT_PARAMS])

    def make(x: np.ndarray) -> Calibration:
        vals = {}
        for k, v in zip(FIT_PARAMS, x, strict=True):
            lo, hi = BOUNDS[k]
            vals[k] = float(min(hi, max(lo, math.exp(v))))
        return profile.with_coefficients(**vals)

    def objective(x: np.ndarray) -> float:
        p = make(x)
        loss = 0.0
        for group in (dense, moe):
            if group:
                loss += float(np.mean([abs(math.log1p(e)) for e in rel_errors(group, p)]))
        return loss

    best = _nelder_mead(objective, x0, iters=int(_ARGS.iters), step=0.25)
    return make(best)


def table(title: str, groups: dict[str, list[float]]) -> None:
    print(f"\n{title:<34} {'runs':>5} {'MAPE':>7} {'bias':>7}")
    for k in sorted(groups):
        v = groups[k]
        print(f"{k:<34} {len(v):>5} {np.mean(np.abs(v)) * 100:>6.1f}% {np.mean(v) * 100:>+6.1f}%")


def report(runs: list[PublishedRun], profile: Calibration, skipped: list[PublishedRun]) -> dict[str, float]:
    errs = rel_errors(runs, profile)
    by_src: dict[str, list[float]] = defaultdict(list)
    by_gpu: dict[str, list[float]] = defaultdict(list)
    by_arch: dict[str, list[float]] = defaultdict(list)
    for r, e in zip(runs, errs, strict=True):
        by_src[f"{r.source} ({r.arch})"].append(e)
        by_gpu[f"{r.case.device.name} ({r.arch})"].append(e)
        by_arch[r.arch].append(e)
    table("source", by_src)
    table("GPU type", by_gpu)
    table("architecture", by_arch)
    worst = sorted(zip(runs, errs, strict=True), key=lambda x: -abs(x[1]))[:8]
    print("\nlargest errors:")
    for r, e in worst:
        print(f"  {r.id:<58} {e * 100:+6.1f}%")
    nofit = []
    for r in runs:
        total, _ = memory_per_device(r.case, profile.coefficients)
        if total > r.case.device.memory_bytes:
            nofit.append((r.id, total / r.case.device.memory_bytes))
    print(f"\nmemory: {len(runs) - len(nofit)}/{len(runs)} published runs predicted to fit")
    for rid, ratio in nofit:
        print(f"  NOT FIT: {rid} ({ratio:.2f}× capacity)")
    notes = [r for r in runs if r.note]
    for r in notes:
        print(f"  note: {r.id}: {r.note}")
    print(f"not evaluable: {len(skipped)} runs")
    for r in skipped:
        print(f"  {r.id}: {r.skip}")
    out = {"dense_mape": float(np.mean(np.abs(by_arch.get("dense", [0])))),
           "moe_mape": float(np.mean(np.abs(by_arch.get("moe", [0])))), "n_runs": len(runs), "not_fit": len(nofit)}
    ok_d = out["dense_mape"] <= 0.12
    ok_m = out["moe_mape"] <= 0.20
    print(f"\ndense MAPE {out['dense_mape'] * 100:.1f}% (target ≤ 12%: {'met' if ok_d else 'NOT met'}); "
          f"MoE MAPE {out['moe_mape'] * 100:.1f}% (target ≤ 20%: {'met' if ok_m else 'NOT met'}); "
          f"not fitting: {len(nofit)}")
    return out


def cross_validate(path: Path, profile: Calibration) -> None:
    runs, _ = prepare(path, profile)
    sources = sorted({r.source for r in runs})
    print("\nleave-one-source-out (fit on the other sources, score the held-out one):")
    for src in sources:
        train = [r for r in runs if r.source != src]
        test = [r for r in runs if r.source == src]
        p = fit(train, profile)
        e = rel_errors(test, p)
        print(f"  {src:<28} {len(test):>4} runs  MAPE {np.mean(np.abs(e)) * 100:6.1f}%")


def main() -> int:
    global _ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE,
                    help="calibration_runs.yaml to read (default: the copy packaged with powertrain)")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--refit", action="store_true", help="refit the global coefficients and save the default profile")
    ap.add_argument("--cross-validate", action="store_true")
    ap.add_argument("--iters", type=int, default=300)
    _ARGS = ap.parse_args()
    if not _ARGS.file.is_file():
        print(f"calibration file {_ARGS.file} not found; pass --file", file=sys.stderr)
        return 2
    profile = load_calibration(_ARGS.profile)
    runs, skipped = prepare(_ARGS.file, profile)
    if _ARGS.refit:
        print(f"refitting {len(FIT_PARAMS)} global coefficients on {len(runs)} runs …", flush=True)
        profile = fit(runs, profile)
        runs, skipped = prepare(_ARGS.file, profile)
    res = report(runs, profile, skipped)
    if _ARGS.refit:
        profile = replace(profile, name="default", fitted_on=[f"calibration_runs.yaml ({len(runs)} runs)"], error={
            "throughput_mape_dense": round(res["dense_mape"], 4), "throughput_mape_moe": round(res["moe_mape"], 4),
            "validated_on": "powertrain/predict/data/calibration_runs.yaml (in-sample)",
            "metric": "tokens/s per GPU, mean absolute percentage error"})
        out = save_calibration(profile, SHIPPED_DIR / "default.yaml")
        print(f"saved {out}")
    if _ARGS.cross_validate:
        cross_validate(_ARGS.file, profile)
    return 0


_ARGS = argparse.Namespace(iters=300)

if __name__ == "__main__":
    raise SystemExit(main())
