"""Does `advise` order layouts as published runs order them? (issue 17 acceptance)

On the published calibration runs (``calibration_runs.yaml``, the packaged copy unless ``--file``),
every pair of configurations with the same model, GPU type, GPU count, global batch, sequence length
and precision but a different layout or micro-batch is ranked twice: by the published throughput and
by the predictor `advise` ranks with (:func:`powertrain.predict.predict`, tokens/s). A configuration
that Megatron-Bridge republished in several releases counts once, at the median of its repeats (the
data's README: "group by configuration"); that gives the issue's "about 15 pairs" (15). A pair counts
as *decided* when its published gap exceeds the prediction interval (the wider of the two runs'
relative half-widths, from :func:`powertrain.advise.search.throughput_interval`); the target is
≥ 80 % agreement on decided pairs. Every pair is printed with both orders; the same check with every
published row its own run (pairs then also compare two software releases) is printed after it.

    python benchmarks/advise_accuracy.py [--profile default] [--file calibration_runs.yaml]

Runs whose recompute setting is not published are predicted with the least recompute that fits,
as `benchmarks/predict_accuracy.py` does.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import defaultdict
from pathlib import Path

from powertrain.advise.search import throughput_interval
from powertrain.predict import Calibration, Case, load_calibration, predict
from powertrain.predict.published import CALIBRATION_RUNS, PublishedRun, load_published
from powertrain.predict.validation import complete_recompute


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


def _predicted(r: PublishedRun, cal: Calibration) -> tuple[float, float]:
    """(predicted tokens/s per GPU, relative half-width of its prediction interval)."""
    assert r.case is not None
    p = predict(r.case, cal)
    lo, hi, _ = throughput_interval(p, r.case.is_moe)
    return p.metrics["tokens_per_s_per_device"], (hi - lo) / 2 / p.metrics["tokens_per_s"]


def configurations(runs: list[PublishedRun]) -> list[list[PublishedRun]]:
    """The runs of one job grouped by layout: a configuration repeated across framework releases is one
    configuration (the data's README: "repeats configurations across releases ... group by
    configuration"), its published throughput the median of its repeats."""
    by: dict[tuple[object, ...], list[PublishedRun]] = defaultdict(list)
    for r in runs:
        assert r.case is not None
        by[layout_key(r.case)].append(r)
    return list(by.values())


def _measured(cfg: list[PublishedRun]) -> float:
    return float(statistics.median(r.tokens_per_s_per_gpu or 0.0 for r in cfg))


def _label(cfg: list[PublishedRun]) -> str:
    first = cfg[0].id
    return first if len(cfg) == 1 else f"{first} (+{len(cfg) - 1} repeat{'s' if len(cfg) > 2 else ''}: " + \
        ", ".join(_release(r) for r in cfg[1:]) + ")"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default", help="calibration profile (default: %(default)s)")
    ap.add_argument("--file", type=Path, default=CALIBRATION_RUNS, help="published runs YAML")
    args = ap.parse_args()
    cal = load_calibration(args.profile)
    groups: dict[tuple[object, ...], list[PublishedRun]] = defaultdict(list)
    usable, _ = complete_recompute(load_published(args.file), cal.coefficients)  # as every scorer prepares them
    for r in usable:
        if r.tokens_per_s_per_gpu:
            groups[job_key(r)].append(r)
    decided = agree_decided = agree_all = total = 0
    for _key, runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        for a, b in itertools.combinations(configurations(runs), 2):
            ra, rb = a[0], b[0]
            assert ra.case is not None and rb.case is not None
            (ta, wa), (tb, wb) = _predicted(ra, cal), _predicted(rb, cal)
            ma, mb = _measured(a), _measured(b)
            width = max(wa, wb)
            gap = abs(ma / mb - 1)
            same = (ma > mb) == (ta > tb)
            total += 1
            agree_all += same
            is_decided = gap > width
            decided += is_decided
            agree_decided += same and is_decided
            print(f"{ra.gpu} ×{ra.case.world} gb{ra.case.global_batch} seq{ra.case.seq_len} {ra.case.precision} "
                  f"({ra.source})")
            print(f"  A {_label(a)}: {layout_text(ra.case)}\n  B {_label(b)}: {layout_text(rb.case)}")
            print(f"  published {ma:,.0f} vs {mb:,.0f} tok/s/GPU ({'A>B' if ma > mb else 'B>A'}); "
                  f"advise {ta:,.0f} vs {tb:,.0f} ({'A>B' if ta > tb else 'B>A'}); gap {gap:.1%}, "
                  f"interval ±{width:.1%}: {'agree' if same else 'DISAGREE'}{'' if is_decided else ' (inside the interval)'}")
    print()
    print(f"configuration pairs: {total}; order agrees on {agree_all}/{total} ({agree_all / max(total, 1):.0%})")
    share = agree_decided / decided if decided else float("nan")
    print(f"decided pairs (published gap > prediction interval): {decided}; agree on {agree_decided} "
          f"({share:.0%}); target ≥ 80 %: {'met' if decided and share >= 0.8 else 'NOT met'}")
    per_run(groups, cal)
    return 0


def per_run(groups: dict[tuple[object, ...], list[PublishedRun]], cal: Calibration) -> None:
    """The same check with every published row its own run (repeats across releases kept apart): a
    pair then also compares two software releases, which is printed with each disagreement."""
    decided = agree = total = 0
    misses = []
    for runs in groups.values():
        for a, b in itertools.combinations(runs, 2):
            assert a.case is not None and b.case is not None and a.tokens_per_s_per_gpu and b.tokens_per_s_per_gpu
            if layout_key(a.case) == layout_key(b.case):
                continue  # same layout (repeats, other software versions): not a layout comparison
            (ta, wa), (tb, wb) = _predicted(a, cal), _predicted(b, cal)
            gap = abs(a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1)
            same = (a.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu) == (ta > tb)
            total += 1
            if gap > max(wa, wb):
                decided += 1
                agree += same
                if not same:
                    misses.append(f"{a.id} vs {b.id}" + ("" if _release(a) == _release(b) else
                                                          f" (releases {_release(a)} and {_release(b)})"))
    print(f"per published row (repeats across releases not merged): {total} pairs, {decided} decided, agree on "
          f"{agree} ({agree / max(decided, 1):.0%})")
    for m in misses:
        print(f"  disagrees: {m}")


if __name__ == "__main__":
    raise SystemExit(main())
