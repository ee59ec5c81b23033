"""The CPU acceptance check of `predict`: calibrate on four measured layouts, predict the others.

Runs llama3-tiny on this machine's CPU with `powertrain run` in twenty-four configurations (or reuses run
directories already there), calibrates a profile on four of them (DP1, DP2, TP2, and DP2 at micro-batch 4
so that the fit can tell per-layer host time from GEMM efficiency) and predicts the others, printing each
error against the 20% target, in groups scored apart:

* *validation* — PP2, micro-batch 4, full recompute, TP2 with sequence parallelism: earlier work added
  model terms after seeing misses on these, so their score is a validation score, not a held-out one;
* *frozen* — the layouts of ``predict_cpu_frozen.yaml``, fixed (and committed) before any tuning of
  issue 15; read once on 2026-12-01, and its misses prompted the CPU per-step-time change, so it is a
  validation list since;
* *frozen2* — the layouts of ``predict_cpu_frozen2.yaml``, fixed (and committed) before that change;
  read once on 2026-12-01 (3 of 6 within 20 %, MAPE 31.0 %), and its misses at larger micro-batches
  prompted the change of what the check calibrates on, so it is a validation list since;
* *frozen3* — the layouts of ``predict_cpu_frozen3.yaml``, fixed (and committed) before that change (it
  was fixed for a probed GEMM knee, which was dropped unread: the host's small matmuls turned out to run at
  its full rate): the held-out score of the model as it is now.

The profile keeps the host probe its runs recorded; predictions use it, not a fresh probe of the
predicting machine.

    python benchmarks/predict_cpu_check.py                               # results/predict-cpu-check
    python benchmarks/predict_cpu_check.py --dir /tmp/cpu-check          # launch what is missing
    python benchmarks/predict_cpu_check.py --dir /tmp/cpu-check --no-launch

Step times on a shared 2-core machine are only as steady as the machine: the script prints each
run's coefficient of variation so a noisy measurement is visible next to its error.

Measured on a quiet 2-core machine (fp32, global batch 8; 2026-12-01, code at 3844588), calibrated on DP1,
DP2, TP2 and DP2 at micro-batch 4: frozen3 6 of 6 within 20 % (MAPE 9.9 %); the lists read before it:
validation 4 of 4 (4.9 %), frozen 3 of 4 (8.9 %), frozen2 5 of 6 (12.6 %); docs/model.md §9 ("The
CPU check") has the table. Each run records the probe its launcher took (``run.json["host_probe"]``, pinned
to the ranks' threads), and calibration and prediction use those records, so re-running this script on
the same run directories prints the same numbers.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

# calibrated on four: one model at two token counts per micro-batch (dp2-mb4), so the fit can tell the
# per-layer host time from GEMM efficiency (calibrate.py: _per_layer_time_unseen); until 2026-12-01 it was
# the first three alone, and dp2-mb4 was a validation layout
FIT = ("dp1", "dp2", "tp2", "dp2-mb4")
# "validation": earlier work added model terms after seeing misses on these, so they are not held out
HELD_OUT = ("pp2", "dp1-mb4", "dp2-full", "tp2-sp")
# the frozen held-out lists, each fixed (committed) before the change it judges, each scored apart:
# predict_cpu_frozen.yaml → "frozen", predict_cpu_frozen2.yaml → "frozen2", and so on
FROZEN_FILES = sorted(Path(__file__).parent.glob("predict_cpu_frozen*.yaml"))
SPECS = {
    "dp1": (1, "{tp: 1, pp: 1}", 1, "none"),
    "dp2": (2, "{tp: 1, pp: 1}", 1, "none"),
    "tp2": (2, "{tp: 2, pp: 1}", 1, "none"),
    "pp2": (2, "{tp: 1, pp: 2, pp_schedule: 1f1b}", 1, "none"),
    "dp1-mb4": (1, "{tp: 1, pp: 1}", 4, "none"),
    "dp2-full": (2, "{tp: 1, pp: 1}", 1, "full"),
    "tp2-sp": (2, "{tp: 2, pp: 1, sequence_parallel: true}", 1, "none"),
    "dp2-mb4": (2, "{tp: 1, pp: 1}", 4, "none"),
}


def _frozen(path: Path) -> dict[str, tuple[int, str, int, str]]:
    import yaml

    raw = yaml.safe_load(path.read_text())["layouts"]
    return {str(k): (int(v[0]), str(v[1]), int(v[2]), str(v[3])) for k, v in raw.items()}


FROZEN = {f.stem.removeprefix("predict_cpu_"): _frozen(f) for f in FROZEN_FILES}  # group name → its layouts
for _layouts in FROZEN.values():
    SPECS.update(_layouts)


def spec_text(name: str) -> str:
    dpn, layout, mb, rc = SPECS[name]
    return (f"name: {name}\nmodel: llama3-tiny\nlayout: {layout}\n"
            f"knobs: {{micro_batch: {mb}, global_batch: 8, recompute: {rc}, precision: fp32}}\n"
            f"hardware: {{nodes: 1, devices_per_node: {dpn}, device: cpu}}\n"
            "protocol: {warmup_steps: 2, measured_steps: 6}\n")


def step_cv(run_dir: Path) -> float:
    import pyarrow.compute as pc

    from powertrain.store import read_events

    ev = read_events(run_dir)
    st = ev.filter(pc.and_(pc.equal(ev["kind"], "step"), pc.equal(ev["window"], "measured")))
    d = (np.asarray(st["t_end_ns"].to_pylist(), float) - np.asarray(st["t_start_ns"].to_pylist(), float)) / 1e9
    return float(np.std(d) / np.mean(d)) if len(d) else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("results/predict-cpu-check"),
                    help="folder holding (or to hold) the eight run directories (default: %(default)s)")
    ap.add_argument("--no-launch", action="store_true", help="only use run directories already there")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    for name in SPECS:
        run = args.dir / name
        if (run / "run.json").is_file() or args.no_launch:
            continue
        spec = args.dir / f"{name}.yaml"
        spec.write_text(spec_text(name))
        print(f"running {name} …", flush=True)
        subprocess.run([sys.executable, "-m", "powertrain.cli", "run", str(spec), "--out", str(run), "-q"], check=False)

    import json

    from powertrain.predict import collect_runs, fit_calibration, predict

    def finished(n: str) -> bool:
        f = args.dir / n / "run.json"
        return f.is_file() and json.loads(f.read_text()).get("status") == "ok"

    have = {n for n in SPECS if finished(n)}
    if not set(FIT) <= have:
        print(f"missing calibration runs: {sorted(set(FIT) - have)}", file=sys.stderr)
        return 2
    runs = collect_runs([args.dir / n for n in FIT])
    prof = fit_calibration(runs, name="cpu-check")
    print(f"calibrated {', '.join(prof.error['fitted'])} on {', '.join(FIT)}: step-time error "
          f"{prof.error['step_time_mape_before']:.1%} → {prof.error['step_time_mape']:.1%}")
    co = prof.coefficients
    print("  " + ", ".join(f"{k} = {getattr(co, k):.4g}" for k in prof.error["fitted"])
          + f"  ({runs[0].case.device.source})")
    print(f"\n{'run':<18} {'measured s':>11} {'predicted s':>12} {'error':>8} {'step CV':>8}")
    errs: dict[str, list[float]] = {"validation": [], **{g: [] for g in FROZEN}}
    group = {n: g for g, layouts in FROZEN.items() for n in layouts}
    steps: dict[str, tuple[int, float, float]] = {}  # held-out run → (devices, measured s, predicted s)
    for name in FIT + HELD_OUT + tuple(group):
        if name not in have:
            print(f"{name:<18} (missing)")
            continue
        m = collect_runs([args.dir / name])[0]
        p = predict(m.case, prof).metrics["step_time_mean_s"]
        e = p / m.step_time_s - 1
        if name not in FIT:
            steps[name] = (SPECS[name][0], m.step_time_s, p)
        kind = "fit" if name in FIT else group.get(name, "validation")
        if kind != "fit":
            errs[kind].append(e)
        tag = "fit" if kind == "fit" else f"{kind}: " + ("ok" if abs(e) <= 0.2 else "MISS")
        print(f"{name:<18} {m.step_time_s:>11.3f} {p:>12.3f} {e:>+8.1%} {step_cv(args.dir / name):>8.1%}  {tag}")
    for kind, es in errs.items():
        within = sum(abs(e) <= 0.2 for e in es)
        mape = float(np.mean(np.abs(es))) if es else float("nan")
        print(f"{kind} layouts within 20%: {within}/{len(es)}, MAPE {mape:.1%}"
              + (f" (predict_cpu_{kind}.yaml, fixed before the change it judges)" if kind in FROZEN else
                 " (looked at while developing: a validation score, not a held-out one)"))
    ranking(steps)
    return 0


def ranking(steps: dict[str, tuple[int, float, float]]) -> None:
    """Pairs of predicted runs on the same number of devices (same model, global batch and precision here),
    ordered by throughput as measured and as predicted, judged by predict.validation's rule; micro-batch pairs
    (same layout and recompute) counted apart."""
    from powertrain.predict.validation import is_right

    pairs = [(a, b) for i, a in enumerate(steps) for b in list(steps)[i + 1:] if steps[a][0] == steps[b][0]]
    if not pairs:
        return
    judged = []
    for a, b in pairs:
        (_, ma, pa_), (_, mb, pb) = steps[a], steps[b]
        same_but_mb = SPECS[a][1] == SPECS[b][1] and SPECS[a][3] == SPECS[b][3]
        judged.append((a, b, same_but_mb, is_right(ma / mb, pa_ / pb), ma / mb, pa_ / pb))  # throughput b ÷ a
    right = sum(j[3] for j in judged)
    mb = [j for j in judged if j[2]]
    print(f"pairs on the same device count ordered right: {right}/{len(judged)}; micro-batch pairs (same layout "
          f"and recompute): {sum(j[3] for j in mb)}/{len(mb)} (every run here was looked at: validation)")
    for a, b, _, ok, m, p in judged:
        if not ok:
            print(f"  wrong: {a} → {b}: measured ×{m:.3f}, predicted ×{p:.3f} in tokens/s")


if __name__ == "__main__":
    raise SystemExit(main())
