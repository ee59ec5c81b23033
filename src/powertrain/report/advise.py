"""The advice as a self-contained HTML report: the request, the ranked table, why #1 beats #2, the
power caps of #1 and one figure — every feasible configuration's predicted throughput against
J/token, coloured by predicted peak power per GPU, the Pareto front marked, the top N numbered.

Everything on the page is a prediction and says so. The page uses the report package's
:class:`~powertrain.report.build.Report` (same layout and figure files as run and sweep reports).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from powertrain.advise import Advice, as_dict
from powertrain.advise.powercap import cap_sweep, default_caps, knee
from powertrain.predict import Calibration
from powertrain.report.build import Report
from powertrain.store.targets import check_output_folder

MAX_SCATTER = 20_000  # points drawn (the fastest first); the front and the top N are always drawn


def advice_figure(adv: Advice) -> Figure:
    """Throughput vs J/token of the feasible points, coloured by peak power; front and top N marked."""
    pts = sorted((p for p in adv.points if p.j_per_token is not None), key=lambda p: -p.tokens_per_s)[:MAX_SCATTER]
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    if pts:
        sc = ax.scatter([p.tokens_per_s for p in pts], [p.j_per_token or 0.0 for p in pts],
                        c=[p.power_peak_w or 0.0 for p in pts], cmap="plasma", s=8, alpha=0.6, lw=0)
        fig.colorbar(sc, ax=ax, label="predicted peak power per GPU (W)")
    front = adv.pareto
    if front:
        ax.plot([p.tokens_per_s for p in front], [p.j_per_token or 0.0 for p in front], "k--o", lw=1, ms=6, mfc="none",
                label="Pareto front (speed vs energy)")
    for i, r in enumerate(adv.top, 1):
        if r.point.j_per_token is not None:
            ax.annotate(f"#{i}", (r.point.tokens_per_s, r.point.j_per_token), fontsize=8, xytext=(4, 4),
                        textcoords="offset points")
    ax.set_xlabel("predicted throughput (tokens/s, whole job)")
    ax.set_ylabel("predicted energy per token (J/token, GPUs)")
    ax.set_title(f"{adv.request.model.name} on {adv.request.world}× {adv.request.device.name}: "
                 "every feasible configuration (predicted)")
    if front:
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def _top_rows(adv: Advice) -> list[list[Any]]:
    rows = []
    for i, r in enumerate(adv.top, 1):
        m = r.prediction.metrics

        def f(key: str, fmt: str, m: dict[str, Any] = m) -> str:
            return "—" if m.get(key) is None else fmt.format(m[key])

        rows.append([i, r.point.cand.label(), f("tokens_per_s", "{:,.0f}"),
                     f"{r.interval[0]:,.0f}–{r.interval[1]:,.0f}", f("mfu", "{:.1%}"), f("j_per_token", "{:.3g}"),
                     f("power_peak_w", "{:.0f}"), f("power_mean_w", "{:.0f}"),
                     f"{m.get('hottest_slot') or '—'} {f('temp_peak_c', '{:.0f}')}",
                     f"{f('throttle_share_power_cap', '{:.0%}')} / {f('throttle_share_thermal_sw', '{:.0%}')}",
                     f"{m['mem_per_device_bytes'] / 2**30:.1f}"])
    return rows


def write_advice_html(adv: Advice, out: Path, calibration: Calibration, force: bool = False) -> Path:
    """Write ``out``/report.html (+ figures/ and advice.json); refuses a non-empty folder of another kind."""
    out = check_output_folder(out, "advice report", force=force, option="--html",
                              same_kind=lambda p: (p / "advice.json").is_file())
    req, st = adv.request, adv.stats
    rep = Report(out, f"advise: {req.model.name} on {req.world}× {req.device.name}", formats=("png", "svg"))
    rep.h("Request")
    rep.p(f"{req.model.name} (seq {req.model.seq_len}), {req.world}× {req.device.name} on {req.nodes} node(s), "
          f"global batch {req.global_batch}, {req.precision}, engine {req.engine}; objective {req.objective.kind}; "
          f"profile {adv.calibration}. All numbers are predictions (estimates), not measurements.")
    rep.p(f"Searched {st.enumerated:,} candidates in {adv.seconds:.1f} s: {st.rejected_rules:,} broke plan's rules, "
          f"{st.rejected_memory:,} did not fit in memory, {st.kept:,} predicted, {len(adv.points):,} within the limits.")
    rep.h("Top configurations (predicted)")
    rep.table(["#", "configuration", "tok/s", "interval", "MFU", "J/tok", "W peak", "W mean", "hottest °C",
               "capped / hot-thr", "GiB/GPU"], _top_rows(adv))
    rep.p(f"Interval: {adv.top[0].interval[2]}")
    rep.h("Why #1 beats #2")
    rep.raw("<pre>" + "\n".join(_esc(x) for x in adv.explanation) + "</pre>")
    if req.device.has_power_sensor:
        rep.h("Speed vs energy")
        rep.figure("advice-throughput-energy", lambda: advice_figure(adv),
                   "Predicted throughput vs J/token of every feasible configuration, coloured by predicted peak "
                   "power per GPU; dashed: the Pareto front; #N: the top N")
        caps = default_caps(adv.top[0].point.cand.case, site_cap=req.constraints.power_cap_w)  # none above the site's
        pts = cap_sweep(replace(adv.top[0].point.cand.case, power_limit_w=None), calibration, caps)
        k = knee(pts)
        rep.h("Power caps for #1 (predicted)")
        rep.p(f"Lowest J/token at {'the default limit' if k.cap_w is None else f'{k.cap_w:.0f} W'}.")
        rep.table(["cap W", "tok/s", "J/tok", "node J/tok", "clock", "node peak kW", "hot-thr", "hottest °C"],
                  [["default" if p.cap_w is None else f"{p.cap_w:.0f}", f"{p.tokens_per_s:,.0f}",
                    f"{p.j_per_token:.3g}", "unknown" if p.node_j_per_token is None else f"{p.node_j_per_token:.3g}",
                    f"{p.clock_factor:.0%}", "unknown" if p.node_peak_w is None else f"{p.node_peak_w / 1000:.2f}",
                    f"{p.throttle_share:.0%}", f"{p.temp_peak_c:.0f}"]
                   for p in pts])
    (out / "advice.json").write_text(json.dumps(as_dict(adv), default=str, indent=1))
    return rep.write()


def _esc(text: str) -> str:
    import html

    return html.escape(text)
