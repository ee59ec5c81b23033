"""The report's figures (matplotlib, Agg backend): one function per figure, each returning a Figure.

Run view: telemetry timelines per device with step windows shaded, step-time distribution, per-rank
step-time heatmap, phase breakdown per rank, the pipeline schedule of one step per stage (1F1B
pattern and bubble). Sweep view: the study's Fig. 4/8/13 (average and peak
temperature, power and SM clock per configuration with an efficiency line, grouped by model, failed /
OOM / rejected / not-run marked apart), configuration × device-slot heatmaps separated by node with
a per-slot mean row (Figs. 5/17), per-pipeline-stage time breakdown (Figs. 10/15), throughput vs
J/token with the Pareto front, and power / thermal rankings.

Every figure that shows a prediction says so in its labels; a field with no data is stated as
"not measured" (or, for an imported run, "not in the imported records") in the figure rather than
drawn as zeros. Legends sit outside the axes so they never hide data, and tick labels are thinned
to a readable count however many steps, ranks or devices a run has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

TIME_AXIS_GID = "time-axis"  # SVG id of the timelines' labelled time axis (the browser test reads its ticks)
MAX_TICK_LABELS = 24  # more labels than this on one axis of a 10-inch figure run into each other

STATUS_STYLE: dict[str, tuple[str, str]] = {  # status -> (colour, short label)
    "ok": ("#2b7bba", "ok"),
    "failed": ("#d62728", "FAILED"),
    "oom": ("#9467bd", "OOM"),
    "rejected": ("#7f7f7f", "REJECTED"),
    "unsupported": ("#8c564b", "UNSUPPORTED"),
    "duplicate": ("#c7c7c7", "DUPLICATE"),
    "not-run": ("#bbbbbb", "NOT RUN"),
    "running": ("#ff7f0e", "RUNNING"),
}
FIELD_LABEL = {
    "power_w": "power (W)", "temp_c": "temperature (°C)", "clock_sm_mhz": "SM clock (MHz)",
    "util_pct": "utilisation (%)", "cpu_util_pct": "host CPU utilisation (%)",
    "mem_used_bytes": "memory used (GiB)", "cgroup_mem_bytes": "cgroup memory (GiB)",
    "temp_mem_c": "memory temperature (°C)",
}
plt.rcParams.update({"figure.dpi": 100, "font.size": 9, "axes.titlesize": 10, "axes.grid": True,
                     "grid.alpha": 0.3, "svg.fonttype": "none"})


# More step windows than this on a panel 10 inches wide are each under two pixels: drawn one by one,
# a day of 2 s steps is 43 200 patches per panel (gigabytes), and they read as one shade anyway.
MAX_SHADED_SPANS = 500


def _shade_steps(ax: Any, step_spans: Sequence[tuple[float, float, str]]) -> None:
    """Each step window shaded, neighbours told apart by alternating depth; beyond
    :data:`MAX_SHADED_SPANS` windows, runs of the same window closer than half a pixel are one band of
    the mean depth (:func:`merge_spans`)."""
    spans = ([(a, b, w, 1) for a, b, w in step_spans] if len(step_spans) <= MAX_SHADED_SPANS
             else merge_spans(step_spans))
    for i, (a, b, window, n) in enumerate(spans):
        colour = "#2ca02c" if window == "measured" else "#ff7f0e"
        ax.axvspan(a, b, color=colour, alpha=0.14 if n > 1 else 0.10 if i % 2 == 0 else 0.18, lw=0)


def merge_spans(step_spans: Sequence[tuple[float, float, str]], pixels: int = 2000
                ) -> list[tuple[float, float, str, int]]:
    """Consecutive spans (by start) of the same window that overlap or leave a gap under 1/``pixels``
    of the whole extent, as one ``(start, end, window, how many)``."""
    if not step_spans:
        return []
    lo = min(a for a, _, _ in step_spans)
    hi = max(b for _, b, _ in step_spans)
    gap = (hi - lo) / pixels
    out: list[tuple[float, float, str, int]] = []
    for a, b, w in step_spans:
        if out and out[-1][2] == w and a - out[-1][1] <= gap:
            s0, e0, _, n = out[-1]
            out[-1] = (s0, max(e0, b), w, n + 1)
        else:
            out.append((a, b, w, 1))
    return out


def thin_ticks(n: int, most: int = MAX_TICK_LABELS) -> list[int]:
    """Indices of at most ``most`` evenly spaced labels out of ``n`` (first one kept, steps of 1, 2, 5,
    10, 20, 50, … so the labelled values are round)."""
    if n <= most:
        return list(range(n))
    stride = next(m * 10**e for e in range(12) for m in (1, 2, 5) if n / (m * 10**e) <= most)
    return list(range(0, n, stride))


def timelines(series: dict[str, dict[str, tuple[np.ndarray, ...]]], not_measured: dict[str, str],
              step_spans: Sequence[tuple[float, float, str]], title: str, *,
              absent: tuple[str, str] = ("Not measured in this run", "not measured")) -> Figure:
    """One panel per field with data (a line per device) and one panel listing what was not measured.

    ``series[field][device] = (seconds since start, values)`` or, for decimated series, ``(seconds,
    mean, min, max)`` per time bin (the band is drawn under the line); ``not_measured[field] = reason``;
    ``absent`` = (heading, per-field phrase) of that list, e.g. ("Not in the imported records",
    "not in the imported records") for an imported run. The data panels share the time axis and the
    lowest one carries its tick labels (SVG group id :data:`TIME_AXIS_GID`); the list of absent fields
    is a separate, unshared panel so it cannot hide them.
    """
    ratios = [1.0] * len(series) + ([0.22 + 0.1 * len(not_measured)] if not_measured else [])
    fig = plt.figure(figsize=(10, 1.9 * sum(ratios or [1]) + 0.6))
    gs = fig.add_gridspec(max(len(ratios), 1), 1, height_ratios=ratios or [1])
    axs: list[Any] = []
    for i in range(len(series)):
        axs.append(fig.add_subplot(gs[i], sharex=axs[0] if axs else None))
    for i, (ax, (field, devs)) in enumerate(zip(axs, series.items(), strict=True)):
        scale = 1 / 2**30 if field.endswith("_bytes") else 1.0
        for dev, (t, v, *band) in devs.items():
            (line,) = ax.plot(t, v * scale, lw=0.9, label=dev)
            if band:  # min and max of each time bin: the peaks a mean would flatten
                ax.fill_between(t, band[0] * scale, band[1] * scale, color=line.get_color(), alpha=0.1, lw=0)
        _shade_steps(ax, step_spans)
        ax.set_ylabel(FIELD_LABEL.get(field, field), fontsize=8)
        if i < len(series) - 1:
            ax.tick_params(labelbottom=False)  # one labelled time axis, at the bottom of the stack
        if len(devs) <= 16:  # right of the panel, never over the lines
            ax.legend(fontsize=6, ncol=1 if len(devs) <= 8 else 2, loc="upper left", bbox_to_anchor=(1.005, 1.0),
                      borderaxespad=0.0, frameon=False)
    if axs:
        bottom = axs[-1]
        bottom.set_xlabel("time since run start (s)  —  shaded: green measured steps, orange warm-up")
        bottom.xaxis.set_gid(TIME_AXIS_GID)
    if not_measured:
        ax = fig.add_subplot(gs[len(series)])
        ax.axis("off")
        heading, phrase = absent
        lines = [f"{FIELD_LABEL.get(f, f)}: {phrase} — {why}" for f, why in not_measured.items()]
        ax.text(0.01, 0.95, heading + "\n" + "\n".join(lines), va="top", ha="left", fontsize=8,
                transform=ax.transAxes, family="monospace")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def device_heatmap(labels: Sequence[str], secs: np.ndarray, matrix: np.ndarray, title: str, unit: str) -> Figure:
    """Devices × time, coloured by value: every device of a large run on one figure."""
    fig, ax = plt.subplots(figsize=(10, min(1.6 + 0.13 * len(labels), 11)))
    im = ax.imshow(matrix, aspect="auto", cmap="inferno", interpolation="nearest",
                   extent=(float(secs[0]), float(secs[-1]), len(labels) - 0.5, -0.5))
    rows = thin_ticks(len(labels), 64)
    ax.set_yticks(rows, [labels[i] for i in rows], fontsize=5 if len(rows) > 40 else 7)
    ax.set_xlabel("time since run start (s)")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label=unit)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def step_energy(steps: Sequence[int], energy_j: Sequence[float], title: str) -> Figure:
    """Energy of each measured step, with its mean."""
    e = np.asarray(energy_j, dtype=float)
    top = float(np.nanmax(e)) if e.size else 0.0
    unit, scale = ("MJ", 1e6) if top >= 1e6 else ("kJ", 1e3) if top >= 1e3 else ("J", 1.0)
    fig, ax = plt.subplots(figsize=(10, 2.8))
    ax.plot(list(steps), e / scale, marker=".", lw=0.8, color="#2b7bba")
    mean = float(np.nanmean(e)) / scale
    ax.axhline(mean, ls="--", color="k", lw=0.8, label=f"mean {mean:.3g} {unit} per step")
    ax.set_xlabel("measured step")
    ax.set_ylabel(f"energy per step ({unit})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0, frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def step_distribution(step_times: np.ndarray, rank_step_s: np.ndarray, ranks: Sequence[int], title: str) -> Figure:
    """Histogram of step times (slowest rank per step) and a box per rank."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
    a1.hist(step_times, bins=min(30, max(5, len(step_times))), color="#2b7bba")
    a1.axvline(float(np.mean(step_times)), color="k", ls="--", lw=1, label=f"mean {np.mean(step_times):.3g} s")
    a1.axvline(float(np.percentile(step_times, 99)), color="r", ls=":", lw=1,
               label=f"p99 {np.percentile(step_times, 99):.3g} s")
    a1.set_xlabel("step time (s)")
    a1.set_ylabel("steps")
    a1.legend(fontsize=7)
    data = [row[~np.isnan(row)] for row in rank_step_s]
    a2.boxplot(data, showfliers=True)
    keep = thin_ticks(len(ranks), 16)  # boxes sit at 1..n; label a readable subset with their own ranks
    a2.set_xticks([i + 1 for i in keep], [str(ranks[i]) for i in keep])
    a2.set_xlabel("rank")
    a2.set_ylabel("step time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def rank_heatmap(rank_step_s: np.ndarray, ranks: Sequence[int], steps: Sequence[int], title: str) -> Figure:
    """Ranks × measured steps, coloured by step duration: stragglers are the bright rows."""
    fig, ax = plt.subplots(figsize=(10, min(1.2 + 0.25 * len(ranks), 9)))
    im = ax.imshow(rank_step_s, aspect="auto", cmap="viridis", interpolation="nearest")
    rows, cols = thin_ticks(len(ranks), 32), thin_ticks(len(steps))
    ax.set_yticks(rows, [str(ranks[i]) for i in rows], fontsize=7)
    ax.set_xticks(cols, [str(steps[i]) for i in cols], fontsize=7)
    ax.set_xlabel("measured step")
    ax.set_ylabel("rank")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="step time (s)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def phase_breakdown(labels: Sequence[str], phases: Mapping[str, Sequence[float]], title: str, xlabel: str
                    ) -> Figure:
    """Stacked bars of seconds per phase kind (forward, backward, optimizer, comm, …) per group."""
    fig, ax = plt.subplots(figsize=(10, 3.4))
    bottom = np.zeros(len(labels))
    for kind, vals in phases.items():
        v = np.asarray(vals, dtype=float)
        ax.bar(range(len(labels)), v, bottom=bottom, label=kind)
        bottom += np.nan_to_num(v)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("seconds per measured step")
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0, frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _mark_missing(ax: Any, xs: Sequence[int], rows: Sequence[dict[str, Any]], y: float) -> None:
    for x, r in zip(xs, rows, strict=True):
        st = r.get("status", "ok")
        if st != "ok":
            colour, text = STATUS_STYLE.get(st, ("#000000", st.upper()))
            ax.text(x, y, text, rotation=90, ha="center", va="bottom", fontsize=7, color=colour, fontweight="bold",
                    zorder=5, bbox={"facecolor": "white", "edgecolor": colour, "alpha": 0.85, "pad": 1.5})


def study_panels(model: str, rows: Sequence[dict[str, Any]], efficiency: str, efficiency_label: str) -> Figure:
    """The study's Fig. 4 / 8 / 13: per configuration, average and peak temperature, power and SM clock
    (bars), with an efficiency line on the right axis; runs that did not finish are marked by status."""
    labels = [r["label"] + (" (pred)" if r.get("kind") == "prediction" else "") for r in rows]
    xs = list(range(len(rows)))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), layout="constrained")
    panels = (("temp_mean_c", "temp_peak_c", "temperature (°C)"), ("power_mean_w", "power_peak_w", "power (W)"),
              ("clock_sm_mean_mhz", None, "SM clock (MHz)"))
    for ax, (avg, peak, ylabel) in zip(axes, panels, strict=True):
        a = np.array([r.get(avg) if r.get(avg) is not None else np.nan for r in rows], dtype=float)
        width = 0.38 if peak else 0.7
        hatch = ["//" if r.get("kind") == "prediction" else "" for r in rows]
        ax.bar(np.array(xs) - (width / 2 if peak else 0), a, width, color="#6baed6", label="average",
               hatch=hatch, edgecolor="#08519c", lw=0.5)
        if peak:
            p = np.array([r.get(peak) if r.get(peak) is not None else np.nan for r in rows], dtype=float)
            ax.bar(np.array(xs) + width / 2, p, width, color="#fd8d3c", label="peak", hatch=hatch,
                   edgecolor="#a63603", lw=0.5)
        finite = a[np.isfinite(a)]
        lo = float(np.nanmin(finite)) if len(finite) else 0.0
        if not len(finite):
            ax.text(0.5, 0.5, "not measured in these runs", transform=ax.transAxes, ha="center", color="#555")
        ax.set_ylim(bottom=max(0.0, lo * 0.8) if len(finite) else 0)
        _mark_missing(ax, xs, rows, ax.get_ylim()[0])
        ax.set_xticks(xs, labels, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        eff = np.array([r.get(efficiency) if r.get(efficiency) is not None else np.nan for r in rows], dtype=float)
        if np.isfinite(eff).any():
            ax2 = ax.twinx()
            ax2.plot(xs, eff, "o-", color="#238b45", lw=1.2, ms=4, label=efficiency_label)
            ax2.set_ylabel(efficiency_label, color="#238b45", fontsize=8)
            ax2.grid(False)
        ax.set_xlim(-0.6, len(rows) - 0.4)  # every configuration, also those with no bar (status marks)
    # One legend for all three panels, outside them (over the bars it hid the first configurations).
    handles = [Patch(facecolor="#6baed6", edgecolor="#08519c", label="average"),
               Patch(facecolor="#fd8d3c", edgecolor="#a63603", label="peak"),
               plt.Line2D([], [], color="#238b45", marker="o", lw=1.2, ms=4, label=efficiency_label)]
    if any(r.get("kind") == "prediction" for r in rows):
        handles.append(Patch(facecolor="white", edgecolor="#555", hatch="//", label="predicted"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle(f"{model}: temperature, power and SM clock per configuration "
                 f"(line: {efficiency_label}; hatched: predicted)")
    return fig


def performance_panels(model: str, rows: Sequence[dict[str, Any]]) -> Figure:
    """Per configuration: mean step time (bar, p99 as a whisker), throughput and MFU (lines), and the
    host/device utilisation where measured — what a machine without power or thermal sensors measures."""
    labels = [r["label"] + (" (pred)" if r.get("kind") == "prediction" else "") for r in rows]
    xs = np.arange(len(rows))

    def col(key: str) -> np.ndarray:
        return np.array([r.get(key) if r.get(key) is not None else np.nan for r in rows], dtype=float)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2), layout="constrained")
    mean, p99 = col("step_time_mean_s"), col("step_time_p99_s")
    hatch = ["//" if r.get("kind") == "prediction" else "" for r in rows]
    a1.bar(xs, mean, 0.6, color="#6baed6", edgecolor="#08519c", lw=0.5, hatch=hatch, label="mean step time")
    a1.errorbar(xs, mean, yerr=[np.zeros(len(xs)), np.nan_to_num(p99 - mean)], fmt="none", ecolor="k", capsize=3,
                lw=0.8, label="p99")
    a1.set_ylabel("step time (s)")
    _mark_missing(a1, list(xs), rows, 0.0)
    a1b = a1.twinx()
    a1b.plot(xs, col("tokens_per_s"), "o-", color="#238b45", ms=4, lw=1.2, label="tokens/s")
    a1b.set_ylabel("tokens/s", color="#238b45")
    a1b.grid(False)
    a2.plot(xs, 100 * col("mfu"), "s-", color="#6a3d9a", ms=4, lw=1.2, label="MFU (%)")
    for key, label, style in (("util_mean_pct", "device utilisation (%)", "^--"),
                              ("cpu_util_mean_pct", "host CPU utilisation (%)", "v--")):
        v = col(key)
        if np.isfinite(v).any():
            a2.plot(xs, v, style, ms=4, lw=1, label=label)
    a2.set_ylabel("%")
    a2.set_ylim(bottom=0)
    # Legends above each panel, outside the axes: inside they covered the first configurations' bars.
    h1, l1 = a1.get_legend_handles_labels()
    h1b, l1b = a1b.get_legend_handles_labels()
    a1.legend(h1 + h1b, l1 + l1b, fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=3, frameon=False,
              borderaxespad=0.0)
    a2.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=3, frameon=False, borderaxespad=0.0)
    for ax in (a1, a2):
        ax.set_xticks(xs, labels, rotation=35, ha="right", fontsize=7)
    fig.suptitle(f"{model}: step time, throughput and utilisation per configuration (hatched: predicted)")
    return fig


def slot_heatmap(run_labels: Sequence[str], slots: Sequence[tuple[str, str]], values: np.ndarray, title: str,
                 unit: str) -> Figure:
    """Configuration × device slot, with node boundaries drawn and a per-slot mean row at the bottom."""
    mean_row = np.nanmean(values, axis=0) if np.isfinite(values).any() else np.full(values.shape[1], np.nan)
    data = np.vstack([values, np.full((1, values.shape[1]), np.nan), mean_row[None, :]])
    fig, ax = plt.subplots(figsize=(min(3 + 0.45 * len(slots), 16), 1.4 + 0.32 * len(data)))
    masked = np.ma.masked_invalid(data)
    cmap = plt.get_cmap("inferno").with_extremes(bad="#eeeeee")
    im = ax.imshow(masked, aspect="auto", cmap=cmap, interpolation="nearest")
    ax.set_yticks(range(len(data)), [*run_labels, "", "per-slot mean"], fontsize=7)
    ax.set_xticks(range(len(slots)), [f"{h}\n{d}" for h, d in slots], fontsize=6)
    hosts = [h for h, _ in slots]
    for i in range(1, len(hosts)):
        if hosts[i] != hosts[i - 1]:
            ax.axvline(i - 0.5, color="white", lw=2.5)
    ax.axhline(len(values) + 0.5, color="white", lw=1)
    ax.grid(False)
    if values.size and values.shape[0] * values.shape[1] <= 400:
        for (i, j), v in np.ndenumerate(data):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=5.5,
                        color="white" if v < np.nanmean(data) else "black")
    fig.colorbar(im, ax=ax, label=unit)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated in (higher throughput, lower J/token), sorted by throughput."""
    idx = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            idx.append(i)
    return sorted(idx, key=lambda i: points[i][0])


def throughput_energy(rows: Sequence[dict[str, Any]]) -> Figure:
    """Tokens/s vs J/token per configuration, the Pareto front drawn; predictions hollow."""
    pts = [(r["tokens_per_s"], r["j_per_token"]) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    models = sorted({str(r.get("model")) for r in rows})
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(models)}
    for r, (x, y) in zip(rows, pts, strict=True):
        pred = r.get("kind") == "prediction"
        c = colours[str(r.get("model"))]
        ax.scatter([x], [y], s=36, facecolors="none" if pred else c, edgecolors=c, lw=1.2)
        ax.annotate(r["label"] + (" (pred)" if pred else ""), (x, y), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    front = pareto_front(pts)
    if front:
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "k--o", lw=1, ms=11, mfc="none",
                 label="Pareto front")
    handles = [Patch(color=colours[m], label=m) for m in models]
    ax.legend(handles=[*handles, *ax.get_legend_handles_labels()[0]], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)  # beside the points, not on them
    ax.set_xlabel("throughput (tokens/s, whole job)")
    ax.set_ylabel("energy per token (J/token)")
    ax.set_title("Throughput vs energy per token (hollow: predicted)")
    fig.tight_layout()
    return fig


def ranking(rows: Sequence[dict[str, Any]], metric: str, title: str, unit: str) -> Figure:
    """Horizontal bars of one metric across configurations, highest first."""
    rs = sorted([r for r in rows if r.get(metric) is not None], key=lambda r: r[metric], reverse=True)
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.28 * max(len(rs), 1)))
    ax.barh(range(len(rs)), [r[metric] for r in rs],
            color=["#fdae6b" if r.get("kind") == "prediction" else "#e6550d" for r in rs])
    ax.set_yticks(range(len(rs)), [f"{r.get('model')} {r['label']}" + (" (pred)" if r.get("kind") == "prediction"
                                                                        else "") for r in rs], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    fig.tight_layout()
    return fig


PIPE_COLOURS = {"forward": "#4c8fd0", "loss": "#9cc3ea", "backward": "#e0803a"}


def pipeline_schedule(rows: Sequence[tuple[str, Sequence[tuple[str, int, float, float]], tuple[float, float] | None]],
                      title: str) -> Figure:
    """One measured step of a pipeline run: a row per stage, a box per micro-batch's forward ("F<k>",
    blue) and backward ("B<k>", orange); the grey band is the stage's pipeline phase, so what stays
    grey between boxes is the bubble and the point-to-point waits.

    ``rows = [(label, [(kind, microbatch, start_ms, end_ms), …], (phase_start_ms, phase_end_ms) or None)]``
    with kind ``forward`` / ``loss`` / ``backward``; times in ms since the step began.
    """
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.55 * max(len(rows), 1)))
    end = max([b for _, boxes, _ in rows for *_, b in boxes] + [p[1] for *_, p in rows if p] + [1e-9])
    for y, (_, boxes, span) in enumerate(rows):
        if span is not None:
            ax.broken_barh([(span[0], span[1] - span[0])], (y - 0.42, 0.84), facecolors="#dddddd", lw=0)
        for kind, mb, a, b in boxes:
            ax.broken_barh([(a, b - a)], (y - 0.36, 0.72), facecolors=PIPE_COLOURS.get(kind, "#888888"),
                           edgecolors="white", lw=0.4)
            if kind != "loss" and (b - a) > end / 90:  # label a box only where the text fits
                ax.text((a + b) / 2, y, f"{'F' if kind == 'forward' else 'B'}{mb}", ha="center", va="center",
                        fontsize=6, color="white" if kind == "backward" else "black")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("time since the step began (ms)")
    ax.grid(False)
    ax.legend(handles=[Patch(color=PIPE_COLOURS["forward"], label="forward (F<micro-batch>)"),
                       Patch(color=PIPE_COLOURS["loss"], label="loss (last stage)"),
                       Patch(color=PIPE_COLOURS["backward"], label="backward (B<micro-batch>)"),
                       Patch(color="#dddddd", label="bubble / p2p wait")],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0, frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    return fig
