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


def plot_step_timeline(prediction: Any, out_stem: str | Path, steps: int = 3, title: str | None = None) -> list[Path]:
    """One configuration's power, as predicted, over ``steps`` steps of its hungriest stage at ≤ 1 ms, with what a
    20 Hz sampler of the instantaneous field would record over it (each read the field's last value: the mean of
    its window at its last update), the 1 s average field, the power limit and the clock. Labelled predicted.
    Writes ``<out_stem>.png`` and ``.svg``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from powertrain.predict.physics import SAMPLER_HZ
    from powertrain.predict.sensors import sensors_of

    phys = prediction.physics
    if phys is None:
        raise ValueError("no power model for this device (no sensor): nothing to draw")
    sp = max(phys.stages.values(), key=lambda s: s.timeline.mean_w)
    tl = sp.timeline
    dt = min(1e-3, tl.seconds / 2000)
    t1, w1 = tl.render(dt=dt)
    n = max(1, steps)
    t = np.concatenate([t1 + k * tl.seconds for k in range(n)])
    w = np.tile(w1, n)
    fields = sensors_of(prediction.device)
    cum = np.concatenate([[0.0], np.cumsum(w * dt)])

    def field(window: float, update: float, phase: float) -> tuple[np.ndarray, np.ndarray]:
        """The field's value at each of its updates: the mean over its window ending there."""
        ups = np.arange(phase + window, t[-1], update)
        hi = np.clip(np.searchsorted(t, ups), 1, len(t))
        lo = np.clip(np.searchsorted(t, ups - window), 0, len(t) - 1)
        return ups, (cum[hi] - cum[lo]) / np.maximum(dt, (hi - lo) * dt)

    inst, avg = fields["instant"], fields["average"]
    ups, vals = field(inst.window_s, inst.update_s, 0.37 * inst.update_s)
    reads = np.arange(0.0, t[-1], 1 / SAMPLER_HZ)
    idx = np.searchsorted(ups, reads, side="right") - 1
    ok = idx >= 0
    fig, ax = plt.subplots(figsize=(12, 4.2))
    ax.plot(t, w, lw=0.7, color="C0", label=f"power at {dt * 1e3:.1g} ms (model, no sensor)")
    ax.step(reads[ok], vals[idx[ok]], where="post", lw=1.2, color="C1",
            label=f"{inst.name} ({inst.window_s * 1e3:.0f} ms window, every {inst.update_s * 1e3:.0f} ms), "
                  f"read at {SAMPLER_HZ:g} Hz")
    if avg.window_s < t[-1]:
        au, av = field(avg.window_s, avg.update_s, 0.0)
        ax.plot(au, av, lw=1.2, color="C2", label=f"{avg.name}")
    limit = prediction.breakdown["power"]["limit_w"]
    ax.axhline(limit, color="red", lw=0.8, ls="--", label=f"power limit {limit:.0f} W")
    ax.axhline(tl.mean_w, color="grey", lw=0.8, ls=":", label=f"mean {tl.mean_w:.0f} W")
    top = prediction.device.max_sm_clock_mhz
    clock = f"{sp.clock * top:.0f} MHz" if top else f"{sp.clock:.0%} of the maximum"
    ax.set_xlabel("time (s)")
    ax.set_ylabel("W per GPU")
    who = "every device (no pipeline)" if sp.stage.name == "all" else f"the {sp.stage.name} pipeline stage"
    ax.set_title(title or f"Predicted: {n} steps of {who} at {clock} "
                          f"(power-capped {sp.throttle_power:.0%} of the time) — predicted, not measured", fontsize=10)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.92)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out_stem)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for p in paths:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths


def _physics_row(axes: Any, points: list[Any], clusters: list[str]) -> None:
    """The study's physics, predicted: against micro-batch (the ``recompute`` variant where a point's label names
    one — the study's micro-batch sweep ran with full recompute and no overlap — else every point; one line per
    model and layout, the first cluster), the peak at the study's sampler and the share of time power-capped;
    the mean steady temperature of each slot per cluster (whisker: min–max over configurations; hatched: the
    share of configurations in which the slot throttles); NVLink utilisation per layout."""
    from powertrain.predict.physics import STUDY_SAMPLER

    colours = {m: f"C{i}" for i, m in enumerate(MODELS)}
    cl = clusters[0] if clusters else None
    pts = [p for p in points if p.cluster == cl and p.prediction.metrics.get("power_peak_w") is not None]
    swept = [p for p in pts if "/recompute/" in f"/{p.label}/"] or pts
    for ax, what, label in ((axes[0], "peak", f"peak W ({STUDY_SAMPLER[0]} field, {STUDY_SAMPLER[1]:g} Hz)"),
                            (axes[1], "capped", "share power-capped")):
        lines: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
        for p in swept:
            m = p.prediction.metrics
            v = (p.prediction.breakdown["power"]["peaks"]["study"]["power_w"] if what == "peak"
                 else m["throttle_share_power_cap"])
            lines[(p.model, p.label.split("/")[0])].append((p.config.knobs.micro_batch, v))
        for (model, layout), xy in sorted(lines.items()):
            xy.sort()
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", ms=3, lw=1, alpha=0.8,
                    color=colours.get(model, "grey"),
                    label=model if layout == min(lay for mm, lay in lines if mm == model) else None)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch")
        ax.set_title(f"{cl}: {label} vs micro-batch — predicted", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_ylim(0, 1.05)
    _slot_panel(axes[2], points, clusters)
    _link_panel(axes[3], points, clusters)


def _slot_panel(ax: Any, points: list[Any], clusters: list[str]) -> None:
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
        share = [sum(th for _, th in per_slot[s]) / len(per_slot[s]) for s in slots]
        bars = ax.bar(xs, mean, width=width * 0.95, yerr=[lo, hi], capsize=2, label=cl)
        for b, sh in zip(bars, share, strict=True):
            if sh > 0:
                b.set_hatch("//")
                ax.annotate(f"{sh:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", fontsize=6)
    ax.set_xlabel("slot (gpuN)")
    ax.set_title("steady °C per slot (hatched: throttles) — predicted", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    lows = [b.get_height() - 3 for b in ax.patches]
    if lows:
        ax.set_ylim(bottom=max(0.0, min(lows)))  # the slot spread is a few degrees: do not start at 0


def _link_panel(ax: Any, points: list[Any], clusters: list[str]) -> None:
    """NVLink bytes ÷ step ÷ bandwidth per layout (mean over its configurations), per cluster."""
    width = 0.8 / max(1, len(clusters))
    layouts: list[str] = []
    for p in points:
        lay = f"{p.model.split('-')[0]} {p.label.split('/')[0]}"
        if lay not in layouts:
            layouts.append(lay)
    for ci, cl in enumerate(clusters):
        vals = []
        for lay in layouts:
            got = [p.prediction.metrics["link_bw_share"] for p in points if p.cluster == cl and p.prediction.fits
                   and f"{p.model.split('-')[0]} {p.label.split('/')[0]}" == lay
                   and p.prediction.metrics.get("link_bw_share") is not None]
            vals.append(sum(got) / len(got) if got else 0.0)
        ax.barh([i + (ci - (len(clusters) - 1) / 2) * width for i in range(len(layouts))], vals, height=width * 0.95,
                label=cl)
    ax.set_yticks(range(len(layouts)))
    ax.set_yticklabels(layouts, fontsize=6)
    ax.set_xlabel("NVLink bytes ÷ step ÷ bandwidth")
    ax.set_title("link utilisation per layout — predicted", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8)
