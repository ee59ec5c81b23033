"""The power-cap response of real GPUs (Zeus NSDI'23 traces), fitted on two GPU types, scored on the other two.

Data: ../shared/data/real/zeus-nsdi23-power-limit-traces (Apache-2.0, ml-energy/zeus): one measured epoch per
(workload, batch size, power limit) on one A40, V100, P100 and RTX 6000 — time per epoch and average power,
limits from each GPU's minimum to its maximum in 25 W steps. Workloads: BERT-base (SQuAD, Sentiment140),
ResNet-50, ShuffleNet-v2, DeepSpeech2, NCF.

What a user has is their job's run at the default limit. So per (workload, batch size, GPU) the row at the
highest limit is the **anchor**: its time and power are given, and the model predicts every other limit's
time and average power from the device physics powertrain's predictor uses (predict/dvfs.py, the governor of
predict/governor.py on a one-stage timeline):

* the job's step at full clock is a busy part (a share ``c`` of it compute-bound, the rest memory-bound) and
  a light part (host work, data loading: the GPU waits); the busy share ``b`` follows from the anchor's
  power, given the rest;
* the governor holds the highest mean over its window at the limit; compute-bound time stretches by 1/clock;
* the GPU's full-clock GEMM draw is its dynamic range × a headroom ratio: **fitted** for the A40 and the V100,
  for the P100 and the RTX 6000 the mean of those two (a prior: nothing of theirs is fitted).

Fitted on the A40 and V100 rows (the anchors excluded): each GPU's headroom and each network's compute share
``c``; the phase draws, the V–f curve and the limiter are the shipped profile's (fitted on H100/H200 and
A100 data, not here). Scored on the P100 and RTX 6000 rows with those: throughput (1/time) and average power,
MAPE over every non-anchor row. Target (issue 28): within 10 % on both. The J/token-optimal limit — the one
with the lowest energy per epoch — is compared too: inside the range, not at its lowest end, wherever the
measurements say so.

    python benchmarks/zeus_power_limits.py [--data DIR]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from powertrain.hardware import DeviceSpec, get_device
from powertrain.predict import load_calibration
from powertrain.predict.calibrate import _nelder_mead
from powertrain.predict.calibration import SHIPPED_DIR, Coefficients, save_calibration
from powertrain.predict.governor import stage_clocks
from powertrain.predict.timeline import PassWork, StageWork, StepWork

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("POWERTRAIN_SHARED", ROOT.parent / "shared")) / "data/real/zeus-nsdi23-power-limit-traces"
GPUS = {"a40": "a40", "v100": "v100-pcie-32gb", "p100": "p100-pcie-16gb", "rtx6000": "quadro-rtx-6000"}
FIT_ON, SCORE_ON = ("a40", "v100"), ("p100", "rtx6000")
# a held-out GPU takes the fitted headroom of the fitted GPU of its product line: the P100 (Pascal) that of the V100
# (Volta), its successor among HBM data-centre parts; the RTX 6000 (Turing TU102) that of the A40 (Ampere GA102),
# its successor among GDDR workstation parts. A prior stated before scoring, not fitted on them.
PRIOR_FROM = {"p100": "v100", "rtx6000": "a40"}
TARGET = 0.10
STARTS_POWER_WAIT = (0.02, 0.18)  # the fit's starting waiting draws: near the H200 run's, and the pre-physics prior


@dataclass
class Workload:
    gpu: str
    network: str
    key: tuple[str, str, str]
    limits: list[float]
    time_s: list[float]
    power_w: list[float]

    @property
    def anchor(self) -> int:
        return int(np.argmax(self.limits))


def load(data: Path) -> list[Workload]:
    out = []
    for gpu in GPUS:
        groups: dict[tuple[str, str, str], dict[float, tuple[float, float]]] = defaultdict(dict)
        for row in csv.DictReader((data / f"summary_power_{gpu}.csv").open()):
            key = (row["dataset"], row["network"], row["batch_size"])
            # a few (workload, limit) points were measured twice: their mean
            pl = float(row["power_limit"])
            t, p = float(row["time_per_epoch"]), float(row["average_power"])
            if pl in groups[key]:
                t0, p0 = groups[key][pl]
                t, p = (t0 + t) / 2, (p0 + p) / 2
            groups[key][pl] = (t, p)
        for key, rows in groups.items():
            if len(rows) < 2:
                continue
            lim = sorted(rows)
            out.append(Workload(gpu, key[1], key, lim, [rows[x][0] for x in lim], [rows[x][1] for x in lim]))
    return out


def _work(busy: float, compute_share: float, floor: float) -> StepWork:
    """A one-stage step of 1 s at full clock: ``busy`` of it GPU work (``compute_share`` of that clock-bound), the
    rest host time the GPU waits through."""
    fwd = PassWork(compute=busy * compute_share, memory=busy * (1 - compute_share), comm=0.0, host=0.0,
                   longest=busy * compute_share, passes=1.0)
    idle = PassWork(0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    return StepWork(stages=(StageWork("all", 1, fwd, idle, 0.0),), micro_batches=1, pp=1, vp=1, in_run_comm=0.0,
                    tail_comm=0.0, optimizer=0.0, fixed=max(0.0, 1.0 - busy), memory_floor=floor)


def response(dev: DeviceSpec, c: Coefficients, busy: float, share: float, limit: float) -> tuple[float, float]:
    """(step seconds, mean power) of the workload under ``limit``."""
    work = _work(busy, share, c.memory_clock_floor)
    composed, stages = stage_clocks(dev, c, work, min(limit, dev.tdp_w), {"all": 1.0})
    return composed.total_s, stages["all"].timeline.mean_w


def busy_from_anchor(dev: DeviceSpec, c: Coefficients, share: float, limit: float, power: float) -> float:
    """The busy share at which the workload draws the anchor's power at the anchor's limit (bisection: power rises
    with it)."""
    lo, hi = 1e-3, 1.0
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if response(dev, c, mid, share, limit)[1] < power:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def predict_workload(w: Workload, dev: DeviceSpec, c: Coefficients, share: float) -> tuple[list[float], list[float]]:
    """Predicted (throughput ratio to the anchor's, average power) at every limit of ``w``."""
    a = w.anchor
    busy = busy_from_anchor(dev, c, share, w.limits[a], w.power_w[a])
    t0, _ = response(dev, c, busy, share, w.limits[a])
    thr, pw = [], []
    for lim in w.limits:
        t, p = response(dev, c, busy, share, lim)
        thr.append(t0 / t)
        pw.append(p)
    return thr, pw


def device(gpu: str, headroom: float, c: Coefficients) -> DeviceSpec:
    dev = get_device(GPUS[gpu])
    return replace(dev, power_at_peak_w=dev.idle_w + headroom * (dev.tdp_w - dev.idle_w))


def errors(ws: list[Workload], heads: dict[str, float], shares: dict[str, float], c: Coefficients
           ) -> tuple[list[float], list[float]]:
    """Relative errors of throughput and of average power over every non-anchor row."""
    e_t, e_p = [], []
    devs = {g: device(g, heads[g], c) for g in heads}
    for w in ws:
        thr, pw = predict_workload(w, devs[w.gpu], c, shares[w.network])
        t0 = w.time_s[w.anchor]
        for i in range(len(w.limits)):
            if i == w.anchor:
                continue
            e_t.append(thr[i] / (t0 / w.time_s[i]) - 1)
            e_p.append(pw[i] / w.power_w[i] - 1)
    return e_t, e_p


def fit(ws: list[Workload], c: Coefficients, iters: int = 150
        ) -> tuple[dict[str, float], dict[str, float], float, float]:
    """Each fitted GPU's headroom, each network's compute share, the waiting draw (``power_wait``: the clock tree
    between kernels) and the clock below which memory-bound work slows (``memory_clock_floor``), on ``ws``."""
    nets = sorted({w.network for w in ws})

    def unpack(x: np.ndarray) -> tuple[dict[str, float], dict[str, float], float, float]:
        heads = {g: 1.0 + math.exp(v) for g, v in zip(FIT_ON, x[: len(FIT_ON)], strict=True)}
        shares = {n: 1 / (1 + math.exp(-v)) for n, v in zip(nets, x[len(FIT_ON):-2], strict=True)}
        return heads, shares, float(min(1.0, math.exp(x[-2]))), float(1 / (1 + math.exp(-x[-1])))

    def loss(x: np.ndarray) -> float:
        heads, shares, wait, floor = unpack(x)
        e_t, e_p = errors(ws, heads, shares, replace(c, power_wait=wait, memory_clock_floor=floor))
        return float(np.mean(np.abs(np.log1p(e_t))) + np.mean(np.abs(np.log1p(e_p))))

    # the loss has more than one basin (a large headroom with a high waiting draw against a smaller one with a
    # low draw): start from fixed points that do not depend on the profile (a start taken from the profile made
    # the answer depend on whatever the profile last held), restart each from its end, keep the lowest loss
    best_x, best_loss = None, math.inf
    for wait0 in STARTS_POWER_WAIT:
        x = np.array([math.log(1.9)] * len(FIT_ON) + [0.0] * len(nets) + [math.log(wait0), 0.0])
        for _ in range(2):
            x = _nelder_mead(loss, x, iters=iters, step=0.4)
        got = loss(x)
        print(f"  fit from power_wait {wait0:g}: loss {got:.4f}", file=sys.stderr)
        if got < best_loss:
            best_x, best_loss = x, got
    assert best_x is not None
    return unpack(best_x)


def energy_optimum(w: Workload, powers: list[float], time_ratio: list[float] | None = None) -> float:
    """The limit with the lowest energy per epoch (measured, or predicted from throughput ratios)."""
    if time_ratio is None:
        energy = [p * t for p, t in zip(powers, w.time_s, strict=True)]
    else:
        energy = [p / r for p, r in zip(powers, time_ratio, strict=True)]
    return w.limits[int(np.argmin(energy))]


def optimum_is_inside(w: Workload, optimum: float) -> bool:
    """Whether the measurements say the J-optimal limit lies inside the range, not at its lowest end: the
    measured optimum is above the lowest limit, the lowest limit binds there (average power at least 90 % of
    it: a limit the GPU never reaches changes nothing, and the epochs' differences are run-to-run spread) and
    the lowest limit costs at least 2 % more energy than the optimum. (Refined after the first reading counted
    every P100 optimum above the lowest limit, which were all unbound limits.)"""
    lo = int(np.argmin(w.limits))
    if optimum <= w.limits[lo] or w.power_w[lo] < 0.9 * w.limits[lo]:
        return False
    energy = {lim: p * t for lim, p, t in zip(w.limits, w.power_w, w.time_s, strict=True)}
    return energy[w.limits[lo]] >= 1.02 * energy[optimum]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--write", action="store_true",
                    help="save the fitted power_wait and memory_clock_floor in the profile (then rerun "
                         "benchmarks/fit_power.py --fit: its phase draws are fitted with these)")
    args = ap.parse_args()
    if not args.data.is_dir():
        print(f"Zeus traces not found at {args.data} (pass --data or set POWERTRAIN_SHARED)", file=sys.stderr)
        return 2
    c = load_calibration(args.profile).coefficients
    ws = [w for w in load(args.data) if w.network]
    train = [w for w in ws if w.gpu in FIT_ON]
    test = [w for w in ws if w.gpu in SCORE_ON]
    heads, shares, wait, floor = fit(train, c, args.iters)
    c = replace(c, power_wait=wait, memory_clock_floor=floor)
    prof = load_calibration(args.profile).coefficients
    print(f"fitted: waiting draw power_wait = {wait:.3f} of the power range (profile: {prof.power_wait:.3f}); "
          f"memory_clock_floor = {floor:.2f} (profile: {prof.memory_clock_floor:.2f})")
    if args.write:
        cal = load_calibration(args.profile)
        cal = replace(cal, coefficients=replace(cal.coefficients, power_wait=round(wait, 4),
                                                memory_clock_floor=round(floor, 4)))
        out = SHIPPED_DIR / f"{cal.name}.yaml" if args.profile == "default" else Path(args.profile)
        print(f"  saved in {save_calibration(cal, out)}")
    heads_all = {**heads, **{g: heads[PRIOR_FROM[g]] for g in SCORE_ON}}
    print(f"fitted on {', '.join(FIT_ON)} ({len(train)} workloads): headroom " +
          ", ".join(f"{g} {h:.2f}" for g, h in heads.items()) + "; held out, from their product line's: " +
          ", ".join(f"{g} {heads_all[g]:.2f} (as {PRIOR_FROM[g]})" for g in SCORE_ON))
    print("compute share of the busy part per network: " + ", ".join(f"{n} {s:.2f}" for n, s in sorted(shares.items())))
    ok = True
    for label, group in (("fitted on", train), ("scored on (held out)", test)):
        for gpu in sorted({w.gpu for w in group}):
            sub = [w for w in group if w.gpu == gpu]
            e_t, e_p = errors(sub, heads_all, shares, c)
            mt, mp = float(np.mean(np.abs(e_t))), float(np.mean(np.abs(e_p)))
            optimum_ok = optimum_total = 0
            for w in sub:
                thr, pw = predict_workload(w, device(gpu, heads_all[gpu], c), c, shares[w.network])
                meas = energy_optimum(w, w.power_w)
                pred = energy_optimum(w, pw, thr)
                if optimum_is_inside(w, meas):  # the measurements put the optimum inside the range
                    optimum_total += 1
                    optimum_ok += pred > min(w.limits)
            print(f"  {label:<22} {gpu:<8} {len(e_t):>4} rows: throughput MAPE {mt:.1%}, average power MAPE {mp:.1%}; "
                  f"J-optimal limit inside the range where measured so (lowest limit binding, ≥ 2 % more energy): {optimum_ok}/{optimum_total}")
            if label.startswith("scored"):
                ok &= mt <= TARGET and mp <= TARGET
    print(f"target ≤ {TARGET:.0%} on the held-out GPUs: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
