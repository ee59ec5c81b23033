"""How many configurations `predict` evaluates per second (target ≥ 10,000 on this machine).

Three workloads, each timed by wall clock and by process CPU time (on a shared machine the CPU
time is the honest figure: wall time also counts time other processes held the cores):

* ``predict(case)``: the per-configuration path on prepared Cases (what a sweep or a planner loops);
* ``predict(RunConfig)``: the same, flattening a validated RunConfig first;
* the study's two matrices (32×H200 and 64×H100), built and predicted from scratch.

The baseline, measured in the same run, is building one RunConfig with pydantic (what any sweep
pays per configuration anyway); ratios are printed so the figure survives a slower or busier machine.

    python benchmarks/predict_speed.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from powertrain.predict import case_from_run_config, load_calibration, predict
from powertrain.predict.study import predict_study, study_configs
from powertrain.spec.run import RunConfig


def rate(fn: Callable[[], object], items: int, seconds: float) -> tuple[float, float]:
    """(items per wall second, items per CPU second), the best of repeated runs lasting ``seconds``."""
    best_wall = best_cpu = 0.0
    end = time.perf_counter() + seconds
    while True:
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w1, c1 = time.perf_counter(), time.process_time()
        best_wall = max(best_wall, items / (w1 - w0))
        best_cpu = max(best_cpu, items / max(c1 - c0, 1e-9))
        if w1 > end:
            return best_wall, best_cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="time per workload")
    args = ap.parse_args()
    prof = load_calibration()
    configs = list(study_configs())
    cases = [case_from_run_config(c) for c in configs]
    raw = [c.model_dump() for c in configs[:100]]

    def build() -> None:
        for r in raw:
            RunConfig.model_validate(r)

    def on_cases() -> None:
        for c in cases:
            predict(c, prof)

    def on_configs() -> None:
        for c in configs:
            predict(c, prof)

    def whole_study() -> None:
        predict_study(prof)

    base_w, base_c = rate(build, len(raw), args.seconds)
    rows = [("baseline: build a RunConfig", base_w, base_c)]
    rows.append(("predict(case)", *rate(on_cases, len(cases), args.seconds)))
    rows.append(("predict(RunConfig)", *rate(on_configs, len(configs), args.seconds)))
    sw, sc = rate(whole_study, len(configs), args.seconds)
    rows.append((f"study matrices ({len(configs)} configs, build + predict)", sw, sc))
    print(f"{'workload':<52} {'configs/s wall':>15} {'configs/s CPU':>14} {'× baseline':>11}")
    for name, w, c in rows:
        print(f"{name:<52} {w:>15,.0f} {c:>14,.0f} {c / base_c:>10.1f}×")
    best = rows[1][2]
    print(f"\npredict(case): {best:,.0f} configurations per CPU-second (target ≥ 10,000: "
          f"{'met' if best >= 10_000 else 'NOT met'}); the study's {len(configs)} configurations take "
          f"{len(configs) / sc:.2f} CPU-s ({len(configs) / sw:.2f} s wall; target < 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
