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
    """Compare clusters per model, as the study did: throughput, J/token, peak power, hottest slot.

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
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
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
