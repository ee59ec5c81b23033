"""Does `advise` order layouts as published runs order them? (issue 17 acceptance)

On the published calibration runs (``calibration_runs.yaml``, the packaged copy unless ``--file``),
every pair of runs with the same model, GPU type, GPU count, global batch, sequence length and
precision but a different layout or micro-batch is ranked twice: by the published throughput and by
the predictor `advise` ranks with (:func:`powertrain.predict.predict`, tokens/s). A pair counts as
*decided* when its published gap exceeds the prediction interval (the wider of the two runs'
relative half-widths, from :func:`powertrain.advise.search.throughput_interval`); the target is
≥ 80 % agreement on decided pairs. Every pair is printed with both orders.

    python benchmarks/advise_accuracy.py [--profile default] [--file calibration_runs.yaml]

Runs whose recompute setting is not published are predicted with the least recompute that fits,
as `benchmarks/predict_accuracy.py` does.
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from powertrain.advise.search import throughput_interval
from powertrain.predict import Case, load_calibration, predict
from powertrain.predict.memory import least_recompute_that_fits
from powertrain.predict.published import CALIBRATION_RUNS, PublishedRun, load_published


def job_key(r: PublishedRun) -> tuple[object, ...]:
    c = r.case
    assert c is not None
    # the published precision text: fp8 recipes differ ("fp8cs", "mxfp8", "fp8 delayed"), and across them
    # a throughput gap is a precision difference, not a layout one
    prec = str((r.raw or {}).get("precision", c.precision)).lower()
    return (c.layers, c.hidden, c.ffn, c.heads, c.kv_heads, c.experts, c.top_k, c.vocab, c.seq_len, r.gpu, c.world,
            c.global_batch, prec)


def _release(r: PublishedRun) -> str:
    """The framework release a run was measured with (Megatron-Bridge ids start with it: mbridge_25.11_…)."""
    parts = r.id.split("_")
    return parts[1] if parts[0] == "mbridge" and len(parts) > 1 else str((r.raw or {}).get("framework", ""))


def layout_key(c: Case) -> tuple[object, ...]:
    return (c.tp, c.pp, c.cp, c.ep, c.vp, c.micro_batch, c.fsdp, c.recompute, c.sequence_parallel)


def layout_text(c: Case) -> str:
    parts = [f"TP{c.tp}", f"PP{c.pp}", f"DP{c.dp}"] + [f"{k}{v}" for k, v in (("CP", c.cp), ("EP", c.ep), ("V", c.vp))
                                                      if v > 1]
    return "·".join(parts) + (" FSDP" if c.fsdp else "") + f" mb{c.micro_batch} rc-{c.recompute}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default", help="calibration profile (default: %(default)s)")
    ap.add_argument("--file", type=Path, default=CALIBRATION_RUNS, help="published runs YAML")
    args = ap.parse_args()
    cal = load_calibration(args.profile)
    groups: dict[tuple[object, ...], list[PublishedRun]] = defaultdict(list)
    for r in load_published(args.file):
        if r.skip or r.case is None or not r.tokens_per_s_per_gpu:
            continue
        if not r.recompute_stated:
            r.case = replace(r.case, recompute=least_recompute_that_fits(r.case, cal.coefficients))
        groups[job_key(r)].append(r)
    decided = agree_decided = agree_all = total = 0
    same_rel = [0, 0]  # decided pairs measured with one framework release: [pairs, agreeing]
    for _key, runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        for a, b in itertools.combinations(runs, 2):
            assert a.case is not None and b.case is not None and a.tokens_per_s_per_gpu and b.tokens_per_s_per_gpu
            if layout_key(a.case) == layout_key(b.case):
                continue  # same layout (repeats, other software versions): not a layout comparison
            pa, pb = predict(a.case, cal), predict(b.case, cal)
            ta, tb = pa.metrics["tokens_per_s_per_device"], pb.metrics["tokens_per_s_per_device"]
            ia, ib = throughput_interval(pa, a.case.is_moe), throughput_interval(pb, b.case.is_moe)
            width = max((ia[1] - ia[0]) / 2 / pa.metrics["tokens_per_s"], (ib[1] - ib[0]) / 2 / pb.metrics["tokens_per_s"])
            gap = abs(a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1)
            same = (a.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu) == (ta > tb)
            total += 1
            agree_all += same
            is_decided = gap > width
            decided += is_decided
            agree_decided += same and is_decided
            one_release = _release(a) == _release(b) and a.source == b.source
            if is_decided and one_release:
                same_rel[0] += 1
                same_rel[1] += same
            pub = "A>B" if a.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu else "B>A"
            adv = "A>B" if ta > tb else "B>A"
            print(f"{a.gpu} ×{a.case.world} gb{a.case.global_batch} seq{a.case.seq_len} {a.case.precision} "
                  f"({a.source})")
            print(f"  A {a.id}: {layout_text(a.case)}   B {b.id}: {layout_text(b.case)}")
            print(f"  published {a.tokens_per_s_per_gpu:,.0f} vs {b.tokens_per_s_per_gpu:,.0f} tok/s/GPU ({pub}); "
                  f"advise {ta:,.0f} vs {tb:,.0f} ({adv}); gap {gap:.1%}, interval ±{width:.1%}: "
                  f"{'agree' if same else 'DISAGREE'}{'' if is_decided else ' (inside the interval)'}"
                  f"{'' if one_release else '; measured with different releases'}")
    print()
    print(f"pairs: {total}; order agrees on {agree_all}/{total} ({agree_all / max(total, 1):.0%}) of all pairs")
    share = agree_decided / decided if decided else float("nan")
    print(f"decided pairs (published gap > prediction interval): {decided}; agree on {agree_decided} "
          f"({share:.0%}); target ≥ 80 %: {'met' if decided and share >= 0.8 else 'NOT met'}")
    print(f"  of which measured with one framework release: {same_rel[0]}, agree on {same_rel[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
