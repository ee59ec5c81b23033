"""Figures of predictions that reports can call (matplotlib, PNG + SVG)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

MODELS = ("gpt3-175b", "llama3-70b", "mixtral-8x7b", "mixtral-8x22b")
PANELS = (
    ("tokens_per_s", "throughput (tokens/s)", max),
    ("j_per_token", "energy (J/token)", min),
    ("power_peak_w", "peak power per GPU (W)", None),
    ("temp_peak_c", "hottest slot (°C)", None),
)


def plot_cluster_comparison(points: list[Any], out_stem: str | Path, title: str | None = None) -> list[Path]:
    """Compare clusters per model, as the study did: throughput, J/token, peak power, hottest slot; and
    below, the study's physics: peak power against micro-batch (one line per model and layout, per
    cluster) and per-slot temperature and throttling (:func:`_physics_row`).

    ``points`` are :class:`~powertrain.predict.study.StudyPoint` (or objects with ``cluster``,
    ``model`` and ``prediction``). For each model and cluster the bar shows the configuration with
    the highest predicted throughput among those that fit; the whisker spans all fitting
    configurations. Writes ``<out_stem>.png`` and ``.svg`` and returns their paths. Every panel is
    labelled as predicted.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for p in points:
        if p.prediction.fits:
            groups[(p.model, p.cluster)].append(p)
    clusters = sorted({c for _, c in groups})
    models = [m for m in MODELS if any((m, c) in groups for c in clusters)]
    models += sorted({m for m, _ in groups} - set(models))
    fig, grid = plt.subplots(2, 4, figsize=(17, 8.6))
    axes = grid[0]
    width = 0.8 / max(1, len(clusters))
    for ax, (metric, label, _) in zip(axes, PANELS, strict=True):
        for ci, cl in enumerate(clusters):
            xs, ys, lo, hi, notes = [], [], [], [], []
            for mi, m in enumerate(models):
                pts = groups.get((m, cl), [])
                vals = [p.prediction.metrics[metric] for p in pts if p.prediction.metrics.get(metric) is not None]
                if not vals:
                    continue
                best = max(pts, key=lambda p: p.prediction.metrics["tokens_per_s"])
                y = best.prediction.metrics[metric]
                xs.append(mi + (ci - (len(clusters) - 1) / 2) * width)
                ys.append(y)
                lo.append(y - min(vals))
                hi.append(max(vals) - y)
                notes.append(best.prediction.metrics.get("hottest_slot") if metric == "temp_peak_c" else None)
            ax.bar(xs, ys, width=width * 0.95, label=cl, yerr=[lo, hi], capsize=3)
            for x, y, n in zip(xs, ys, notes, strict=True):
                if n:
                    ax.annotate(n, (x, y), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                                textcoords="offset points")
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=20, fontsize=8)
        ax.set_title(f"{label} — predicted", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    _physics_row(grid[1], points, clusters)
    fig.suptitle(title or "Predicted: clusters compared per model (bar: fastest fitting configuration; "
                 "whisker: range over fitting configurations)", fontsize=10)
    fig.tight_layout()
    out = Path(out_stem)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for p in paths:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths


def _physics_row(axes: Any, points: list[Any], clusters: list[str]) -> None:
    """Peak power vs micro-batch per cluster (two panels), per-slot temperature, per-slot throttle share.

    Peak power: the ``recompute`` variant where a point's label names one (the study's micro-batch sweep
    ran with full recompute and no overlap), else every point; one line per model and layout. Slots:
    over the fitting configurations of each cluster, the mean steady temperature of each slot (whisker:
    min–max) and the share of configurations in which the slot throttles.
    """
    colours = {m: f"C{i}" for i, m in enumerate(MODELS)}
    for ax, cl in zip(axes[:2], [*clusters, None, None][:2], strict=True):
        if cl is None:
            ax.set_visible(False)
            continue
        lines: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
        pts = [p for p in points if p.cluster == cl and p.prediction.metrics.get("power_peak_w") is not None]
        swept = [p for p in pts if "/recompute/" in f"/{p.label}/"] or pts
        for p in swept:
            layout = p.label.split("/")[0]
            lines[(p.model, layout)].append((p.config.knobs.micro_batch, p.prediction.metrics["power_peak_w"]))
        for (model, layout), xy in sorted(lines.items()):
            xy.sort()
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", ms=3, lw=1, alpha=0.8,
                    color=colours.get(model, "grey"), label=model if layout == min(
                        lay for m, lay in lines if m == model) else None)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch")
        ax.set_title(f"{cl}: peak W/GPU vs micro-batch — predicted", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _slot_panels(axes[2], axes[3], points, clusters)


def _slot_panels(ax_t: Any, ax_th: Any, points: list[Any], clusters: list[str]) -> None:
    width = 0.8 / max(1, len(clusters))
    for ci, cl in enumerate(clusters):
        per_slot: dict[int, list[tuple[float, bool]]] = defaultdict(list)
        for p in points:
            if p.cluster != cl or not p.prediction.fits:
                continue
            for s in p.prediction.breakdown.get("slots") or []:
                per_slot[int(str(s["slot"])[3:])].append((float(s["steady_c"]), bool(s["throttled"])))
        if not per_slot:
            continue
        slots = sorted(per_slot)
        xs = [s + (ci - (len(clusters) - 1) / 2) * width for s in slots]
        mean = [sum(t for t, _ in per_slot[s]) / len(per_slot[s]) for s in slots]
        lo = [m - min(t for t, _ in per_slot[s]) for m, s in zip(mean, slots, strict=True)]
        hi = [max(t for t, _ in per_slot[s]) - m for m, s in zip(mean, slots, strict=True)]
        ax_t.bar(xs, mean, width=width * 0.95, yerr=[lo, hi], capsize=2, label=cl)
        share = [sum(th for _, th in per_slot[s]) / len(per_slot[s]) for s in slots]
        ax_th.bar(xs, share, width=width * 0.95, label=cl)
    for ax, title in ((ax_t, "steady °C per slot (whisker: range)"), (ax_th, "share throttling, per slot")):
        ax.set_xlabel("slot (gpuN)")
        ax.set_title(f"{title} — predicted", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    lows = [b.get_height() - 3 for b in ax_t.patches]
    if lows:
        ax_t.set_ylim(bottom=max(0.0, min(lows)))  # the slot spread is a few degrees: do not start at 0
    ax_th.set_ylim(0, 1)
