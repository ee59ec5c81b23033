"""advise's ranking of the study's 32×H200 layouts, per model (issue 17; shown in docs/advise.md).

For each of the study's four models, the study's layouts on 4 nodes × 8 H200 (DESIGN.md; as the
parallelism sweep ran them: full recompute, micro-batch 1, global batch 128, bf16, distributed
optimizer, sequence parallel with TP) are predicted and ranked the way `advise` ranks: by tokens/s
(objective throughput) and by J/token (objective energy). Then `advise` searches the model's whole
space on the same cluster (throughput objective) for comparison. Predictions, not measurements.

    python benchmarks/advise_study.py [--profile default]
"""

from __future__ import annotations

import argparse

from powertrain.advise import Objective, advise, make_request
from powertrain.predict import case_from_run_config, load_calibration, predict
from powertrain.predict.study import study_configs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--no-search", action="store_true", help="skip the whole-space search per model")
    args = ap.parse_args()
    cal = load_calibration(args.profile)
    rows: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for cfg in study_configs("32xH200"):
        _, model, rest = cfg.name.split("/", 2)
        label, variant, mb = rest.split("/")
        if variant != "recompute" or mb != "mb1":
            continue
        rows.setdefault(model, []).append((label, predict(case_from_run_config(cfg, calibration=cal), cal).metrics))
    for model, pts in rows.items():
        fast = sorted(pts, key=lambda p: -p[1]["tokens_per_s"])
        eff = sorted(pts, key=lambda p: p[1]["j_per_token"])
        print(f"## {model} on 32×H200 (study layouts, full recompute, mb1; predicted)")
        print("| layout | tok/s | rank (speed) | J/token | rank (energy) | peak W | hottest |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for label, m in fast:
            print(f"| {label} | {m['tokens_per_s']:,.0f} | {fast.index((label, m)) + 1} | {m['j_per_token']:.3g} | "
                  f"{eff.index((label, m)) + 1} | {m['power_peak_w']:.0f} | {m['hottest_slot']} "
                  f"{m['temp_peak_c']:.0f} °C |")
        same = fast[0][0] == eff[0][0]
        print(f"fastest: {fast[0][0]}; most energy-efficient: {eff[0][0]} "
              f"({'the same layout' if same else 'different layouts'})")
        if not args.no_search:
            adv = advise(make_request(model, "h200", 32, 4, 128), cal, top_n=1)
            t = adv.top[0]
            print(f"advise over the whole space ({adv.stats.enumerated:,} candidates): #1 {t.point.cand.label()}, "
                  f"{t.point.tokens_per_s:,.0f} tok/s ({t.point.tokens_per_s / fast[0][1]['tokens_per_s'] - 1:+.0%} vs "
                  "the study's fastest layout)")
            en = advise(make_request(model, "h200", 32, 4, 128, objective=Objective("energy")), cal, top_n=1)
            e = en.top[0].point
            print(f"advise, objective energy (with power caps, {en.stats.enumerated:,} candidates): #1 "
                  f"{e.cand.label()}, {e.j_per_token:.3g} J/token at {e.tokens_per_s:,.0f} tok/s; the fastest of "
                  f"the whole space uses {t.point.j_per_token:.3g} J/token: "
                  f"{'the same configuration' if e.cand.label() == t.point.cand.label() else 'different configurations'}")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
