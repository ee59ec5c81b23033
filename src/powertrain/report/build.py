"""Build the report of a run or a sweep: figures as PNG/SVG/PDF and one self-contained HTML page.

The HTML embeds every figure as a ``data:image/png;base64`` URI and its style inline, so the page
opens from a mail attachment or an air-gapped machine with no network. ``figures/`` next to it holds
the same figures as PNG, SVG and PDF for papers and slides.

Phase times (per rank, per pipeline stage) are *self* times: an interval nested in another on the same
rank (a pipeline stage's forward inside the ``pipeline`` phase, an expert all-to-all inside a forward)
is taken out of its parent, so stacked bars add up to the time spent instead of counting it twice.
What a pipeline phase keeps after its stage calls are taken out is its bubble and point-to-point waits.

An imported run (``run.json`` ``kind: import``) was measured elsewhere: the report says what is "not
in the imported records", never what is "not measured here".
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import os
import re
import shutil
import tempfile
from array import array
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from powertrain.analyze import format_value, is_sweep_dir, load_summary, load_sweep, window_text
from powertrain.analyze import steps as steps_mod
from powertrain.analyze import telemetry as tel
from powertrain.analyze.coverage import power_source_line, power_warnings
from powertrain.analyze.events import KEPT_STEP, RunEvents
from powertrain.analyze.metrics import METRICS
from powertrain.core.names import printable
from powertrain.report import figures as F
from powertrain.report.powercap import add_powercap_section
from powertrain.store.leftovers import remove_stale
from powertrain.store.rundir import RunDir, dir_mode, file_mode
from powertrain.store.targets import check_output_folder
from powertrain.store.validate import check_run

TIMELINE_FIELDS = ("power_w", "temp_c", "clock_sm_mhz", "util_pct", "cpu_util_pct", "mem_used_bytes",
                   "cgroup_mem_bytes")
MAX_POINTS_PER_DEVICE = 1500
MAX_TIMELINE_DEVICES = 32
FORMATS = ("png", "svg", "pdf")



def _esc(text: object) -> str:
    """HTML-escaped text from data, with control and bidi characters (a right-to-left override in a run
    name reverses what a reader sees) written as escapes, as the terminal shows them; line breaks and
    tabs stay."""
    s = str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() or c in "\n\t" else printable(c) for c in s)
    return html.escape(s)


class Report:
    """Collects sections (HTML fragments and figures) and writes the page and figure files."""

    def __init__(self, out: Path, title: str, formats: tuple[str, ...] = FORMATS) -> None:
        self.out = out
        self.title = title
        self.formats = formats
        self.parts: list[str] = []
        self.figures: list[Path] = []
        (out / "figures").mkdir(parents=True, exist_ok=True)

    def h(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{_esc(text)}</h{level}>")

    def p(self, text: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{_esc(text)}</p>')

    def raw(self, fragment: str) -> None:
        self.parts.append(fragment)

    def figure(self, name: str, make: Callable[[], Any], caption: str) -> None:
        import matplotlib.pyplot as plt

        fig = make()
        try:
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=110)
            png = buf.getvalue()
            for fmt in self.formats:
                path = self.out / "figures" / f"{name}.{fmt}"
                if fmt == "png":
                    path.write_bytes(png)
                else:
                    fig.savefig(path, format=fmt)
                self.figures.append(path)
        finally:
            plt.close(fig)
        data = base64.b64encode(png).decode()
        self.parts.append(
            f'<figure id="fig-{_esc(name)}"><img alt="{_esc(caption)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{_esc(caption)}</figcaption></figure>')

    def table(self, header: list[str], rows: list[list[Any]], cls: str = "") -> None:
        head = "".join(f"<th>{_esc(str(h))}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, _Html) else _esc(str(c))}</td>"
                                        for c in r) + "</tr>" for r in rows)
        self.parts.append(f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')

    def write(self) -> Path:
        page = _PAGE.format(title=_esc(self.title), body="\n".join(self.parts),
                            generated=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"))
        path = self.out / "report.html"
        tmp = path.with_suffix(".html.tmp")
        try:
            tmp.write_text(page, encoding="utf-8")
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return path


class _Html(str):
    """A table cell that is already HTML."""


def _status_badge(status: str) -> _Html:
    colour, text = F.STATUS_STYLE.get(status, ("#000", status))
    return _Html(f'<span class="badge" style="background:{colour}">{_esc(text)}</span>')


def _metrics_table(rep: Report, summ: dict[str, Any], absent: str = "not measured in this run") -> None:
    """Metrics with values first; the null ones, each with its reason, folded below."""
    metrics = summ.get("metrics") or {}
    why = summ.get("why_null") or {}
    rows, nulls = [], []
    for m in METRICS:
        if m.name not in metrics:
            continue
        v = metrics[m.name]
        if m.name.startswith("throttle_share_") and not v:
            continue  # reasons that never occurred (0) or were not measured (listed under throttle_share)
        if v is None:
            nulls.append([m.name, why.get(m.name, "")])
        else:
            rows.append([m.name, format_value(m.name, v), m.text + _read_from(summ, m.name)])
    if rows:
        rep.table(["metric", "value", "definition"], rows, cls="metrics")
    else:
        rep.p("No metric could be computed for this run (see below).", "note")
    if nulls:
        rep.raw(f"<details><summary>{len(nulls)} metrics are null ({_esc(absent)}) — why</summary>")
        rep.table(["metric", "why null"], nulls, cls="nulls")
        rep.raw("</details>")


def _read_from(summ: dict[str, Any], name: str) -> str:
    """Where a power figure was read from (``sources.power``): field, source, path and effective rate."""
    src = ((summ.get("sources") or {}).get("power") or {}).get(name)
    if not isinstance(src, dict):
        return ""
    what = " ".join(str(x) for x in (src.get("field"), src.get("source") and f"({src['source']})") if x)
    rate = src.get("rate_hz")
    parts = [what, src.get("path"), f"{rate:.3g} Hz" + (" fresh" if src.get("repeats") == "excluded" else "")
             if isinstance(rate, (int, float)) else None]
    return " — read from " + ", ".join(str(p) for p in parts if p)


def _compact(d: Any) -> str:
    """``k=v`` pairs of a config section, nested sections flattened, nulls left out."""
    if not isinstance(d, dict):
        return "—" if d is None else str(d)
    parts = []
    for k, v in d.items():
        if isinstance(v, dict):
            parts += [f"{k}.{k2}={v2}" for k2, v2 in v.items() if v2 is not None]
        elif v is not None:
            parts.append(f"{k}={v}")
    return ", ".join(parts) or "—"


def _fmt_s(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g} s"


# ---------------------------------------------------------------------------------------------------
# run view


def _step_spans(events: RunEvents, t0: int) -> list[tuple[float, float, str]]:
    """Per (step number, window) of the step events: (earliest start, latest end) in seconds since ``t0``,
    and the window ("" when none), by start; at equal starts in the order the events first come."""
    first = "min(_row)" if events.table_order else "min([rank, t_start_ns, _file, _row])"
    rows = events.rows(f'SELECT coalesce("window", \'\') AS w, min(t_start_ns) AS a, max(t_end_ns) AS b, {first} AS o '
                       "FROM ev WHERE kind = 'step' AND step IS NOT NULL AND t_start_ns IS NOT NULL "
                       "AND t_end_ns IS NOT NULL GROUP BY step, w ORDER BY a, o")
    return [((a - t0) / 1e9, (b - t0) / 1e9, w) for w, a, b, _ in rows]


HEATMAP_MIN_DEVICES = 17  # from this many devices on, power is also drawn as a device × time heatmap


def _timeline_series(run_path: Path, fields_supported: list[str], imported: bool = False
                     ) -> tuple[dict[str, Any], dict[str, str], int, tuple[list[str], np.ndarray, np.ndarray] | None]:
    """Per-field, per-device series (first MAX_TIMELINE_DEVICES; per time bin: seconds, mean, min, max),
    what is missing, t0, and — for many
    devices — every device's power as (labels, seconds, devices × time matrix). For an ``imported``
    run the reasons speak of the records, not of this machine's sensors."""
    con = duckdb.connect()
    heat = None
    try:
        n = tel.open_telemetry(con, run_path)
        sp = tel.span(con)
        if not n or sp is None:
            why = "the imported records hold no telemetry" if imported else "no telemetry was written"
            return {}, dict.fromkeys(("power_w", "temp_c", "clock_sm_mhz"), why), 0, None
        t0, t1 = sp
        bucket = max((t1 - t0) // MAX_POINTS_PER_DEVICE, 1)
        counts = con.execute("SELECT " + ", ".join(f"count({f})" for f in TIMELINE_FIELDS) + " FROM tel").fetchall()[0]
        present = [f for f, c in zip(TIMELINE_FIELDS, counts, strict=True) if c]
        series: dict[str, dict[str, tuple[np.ndarray, ...]]] = {}
        if present:
            # mean, min and max per bin: the line is the mean, the band the extremes, so a short peak
            # a mean would flatten is still drawn (bins stay MAX_POINTS_PER_DEVICE whatever the length)
            q = (f"SELECT host, device, (t_ns - {t0}) // {bucket} AS b, "
                 + ", ".join(f"avg({f}) AS {f}, min({f}) AS {f}__min, max({f}) AS {f}__max" for f in present)
                 + " FROM tel GROUP BY host, device, b ORDER BY host, device, b")
            t = con.sql(q).to_arrow_table()
            keys = sorted(set(zip(t["host"].to_pylist(), t["device"].to_pylist(), strict=True)), key=_natural)
            hosts = t["host"].to_numpy(zero_copy_only=False)
            devs = t["device"].to_numpy(zero_copy_only=False)
            secs = t["b"].to_numpy() * bucket / 1e9
            if "power_w" in present and len(keys) >= HEATMAP_MIN_DEVICES:
                heat = _power_matrix(keys, hosts, devs, t["b"].to_numpy(), t["power_w"].to_numpy(zero_copy_only=False),
                                     bucket)
            for f in present:
                vals = t[f].to_numpy(zero_copy_only=False).astype(float)
                lo = t[f"{f}__min"].to_numpy(zero_copy_only=False).astype(float)
                hi = t[f"{f}__max"].to_numpy(zero_copy_only=False).astype(float)
                for h, d in keys[:MAX_TIMELINE_DEVICES]:
                    sel = (hosts == h) & (devs == d) & ~np.isnan(vals)
                    if sel.any():
                        label = d if len({k[0] for k in keys}) == 1 else f"{h}/{d}"
                        series.setdefault(f, {})[label] = (secs[sel], vals[sel], lo[sel], hi[sel])
        missing = {}
        for f, why in (("power_w", "no power sensor on these devices"),
                       ("temp_c", "no temperature sensor on these devices"),
                       ("clock_sm_mhz", "no SM clock reading on these devices")):
            if f in series:
                continue
            if imported:  # measured elsewhere: what the source recorded is all that is known
                missing[f] = (f"the imported records have no {f} values in this window" if f in fields_supported
                              else f"the imported source did not record {f}")
            else:
                missing[f] = why + ("" if f not in fields_supported else " in this window")
        return series, missing, t0, heat
    finally:
        tel.release(con)
        con.close()


def _natural(key: tuple[str, str]) -> list[Any]:
    """node_2 before node_10, gpu2 before gpu10."""
    return [int(tok) if tok.isdigit() else tok for part in key for tok in re.split(r"(\d+)", part)]


def _power_matrix(keys: list[tuple[str, str]], hosts: np.ndarray, devs: np.ndarray, buckets: np.ndarray,
                  power: np.ndarray, bucket_ns: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Every device's bucketed power as a devices × time matrix (NaN where a device did not report)."""
    b0, b1 = int(buckets.min()), int(buckets.max())
    matrix = np.full((len(keys), b1 - b0 + 1), np.nan)
    row = {k: i for i, k in enumerate(keys)}
    idx = np.fromiter((row[(h, d)] for h, d in zip(hosts, devs, strict=True)), dtype=np.int64, count=len(hosts))
    matrix[idx, buckets.astype(np.int64) - b0] = power.astype(float)
    one_host = len({k[0] for k in keys}) == 1
    labels = [d if one_host else f"{h}/{d}" for h, d in keys]
    return labels, np.arange(b0, b1 + 1) * bucket_ns / 1e9, matrix


def build_run_report(path: Path, out: Path, formats: tuple[str, ...] = FORMATS) -> Path:
    summ = load_summary(path)
    info = RunDir(path).read()
    name = summ.get("run") or path.name
    pred = summ.get("kind") == "prediction"
    imported = info.get("kind") == "import"
    absent = "not in the imported records" if imported else "not measured in this run"
    rep = Report(out, f"powertrain report — {name}" + (" (PREDICTION)" if pred else ""), formats)
    _run_header(rep, summ, info, name, pred, imported)
    rep.h("Metrics")
    _metrics_table(rep, summ, absent)
    if pred:
        return rep.write()
    with RunEvents.open(path) as events:  # queried where they lie: a long run's events are never one table
        _run_timelines(rep, path, name, summ, info, events, imported, absent)
        _step_energy(rep, name, summ)
        _step_time(rep, name, events, info)
    _profiled_steps(rep, name, summ)
    _data_quality(rep, summ, imported)
    return rep.write()


def _run_header(rep: Report, summ: dict[str, Any], info: dict[str, Any], name: str, pred: bool, imported: bool
                ) -> None:
    """Title, where the run came from (imported, predicted, synthetic), its configuration and window,
    and the summary's notes."""
    rep.h(f"Run {name}", 1)
    if imported:
        src = info.get("import") or {}
        files = ", ".join(Path(str(x.get("path", "?"))).name for x in src.get("sources") or []) or "unknown sources"
        rep.p(f"Imported run: measured elsewhere, read from {src.get('format') or 'an unknown format'} records "
              f"({files}); only what those records hold is shown.", "note")
    if pred:
        rep.raw('<div class="banner">PREDICTION — these numbers come from the analytical model, not from a '
                'measurement.</div>')
    if info.get("synthetic"):
        rep.raw('<div class="banner synthetic">SYNTHETIC run: generated by '
                f'{_esc(str(info.get("generator")))}, not measured.</div>')
    cfg = summ.get("config") or {}
    model = cfg.get("model")
    model_name = (model.get("name") or json.dumps(model)) if isinstance(model, dict) else (model or "—")
    win = summ.get("window") or {}
    window = (window_text(summ).removeprefix("window: ") if pred else
              f"{window_text(summ).removeprefix('window: ')}; {win.get('measured_steps', 0)} measured steps")
    rep.table(["status", "reason", "model", "layout", "knobs", "hardware", "window"], [[
        _status_badge(summ.get("status") or "failed"), summ.get("reason") or "", model_name,
        _compact(cfg.get("layout")), _compact(cfg.get("knobs")), _compact(cfg.get("hardware")), window,
    ]], cls="info")
    if pred:
        rep.p(f"Prediction profile: {summ.get('profile') or '—'}; the model's validation error: "
              f"{json.dumps(summ.get('model_error')) if summ.get('model_error') is not None else 'not stated'}.")
    for note in summ.get("notes") or []:
        rep.p(note, "note")


def _run_timelines(rep: Report, path: Path, name: str, summ: dict[str, Any], info: dict[str, Any],
                   events: RunEvents, imported: bool, absent: str) -> None:
    """Telemetry per device over time (step windows shaded), and with many devices a power heatmap."""
    series, missing, t0, heat = _timeline_series(path, info.get("fields_supported") or [], imported)
    spans = _step_spans(events, t0) if events.num_rows and t0 else []
    rep.h("Timelines")
    n_dev = len(summ.get("per_device") or [])
    if n_dev > MAX_TIMELINE_DEVICES:
        rep.p(f"Line timelines show the first {MAX_TIMELINE_DEVICES} of {n_dev} devices; the power heatmap below "
              "and `powertrain trace` show all of them.", "note")
    if series or missing:
        heading = "Not in the imported records" if imported else "Not measured in this run"
        rep.figure("timelines", lambda: F.timelines(series, missing, spans, f"{name}: telemetry per device",
                                                    absent=(heading, absent)),
                   "Telemetry per device: the line is the mean of each time bin, the light band its minimum and "
                   f"maximum (at most {MAX_POINTS_PER_DEVICE} bins per device, so a short peak stays visible); "
                   "shaded: step windows (green measured, orange warm-up). "
                   + ("Fields the imported records do not hold are listed, not drawn as zeros." if imported else
                      "Fields this machine cannot measure are listed, not drawn as zeros."))
    if heat is not None:
        labels, secs, matrix = heat
        rep.figure("power_heatmap", lambda: F.device_heatmap(labels, secs, matrix, f"{name}: power of every device",
                                                             "power (W)"),
                   f"Power of all {len(labels)} devices over time (one row each, bucketed); a cool or hot row is a "
                   "device that differs from the rest.")


def _step_energy(rep: Report, name: str, summ: dict[str, Any]) -> None:
    step_energy = [(p["step"], p["energy_j"]) for p in summ.get("per_step") or [] if p.get("energy_j") is not None]
    if step_energy:
        rep.h("Energy per step")
        rep.figure("step_energy", lambda: F.step_energy([s for s, _ in step_energy], [e for _, e in step_energy],
                                                        f"{name}: energy per measured step"),
                   "Energy of each measured step: the integral of the summed power of every device over the "
                   "step window (devices that did not report in a sample period leave it out).")


def _step_time(rep: Report, name: str, events: RunEvents, info: dict[str, Any]) -> None:
    """Step-time distribution and per-rank heatmap, self time per phase per rank, the pipeline view."""
    sd = steps_mod.measured_steps(events, info.get("rank_map"), info.get("warmup_steps"))
    rep.h("Step time")
    if sd is None:
        rep.p("No measured step events in this run: step-time figures are skipped.", "note")
        return
    rep.figure("step_time", lambda: F.step_distribution(sd.step_time_s, sd.rank_step_s, sd.ranks,
                                                        f"{name}: step-time distribution"),
               "Left: step time (slowest rank) over measured steps. Right: per-rank step durations.")
    rep.figure("rank_heatmap", lambda: F.rank_heatmap(sd.rank_step_s, sd.ranks, sd.steps.tolist(),
                                                      f"{name}: per-rank step time"),
               "Per-rank step time across measured steps: a straggler is a bright row.")
    # the analysis' own phases of the measured steps: selecting by step number alone would also take
    # the warm-up (or another epoch's) events of a number that a rank used more than once
    phases = sd.phases
    if phases:
        kinds = sorted({p["kind"] for p in phases})
        ranks = sd.ranks
        vals = {k: [sum(p["seconds"] for p in phases if p["rank"] == r and p["kind"] == k) / sd.n
                    for r in ranks] for k in kinds}
        rep.figure("phases", lambda: F.phase_breakdown([str(r) for r in ranks], vals,
                                                       f"{name}: time per phase per rank", "rank"),
                   "Seconds per measured step in each phase kind, from the ranks' step-phase events (self "
                   "time: a phase nested in another is taken out of it).")
    _pipeline_view(rep, name, events, sd, info.get("rank_map") or [])


def _profiled_steps(rep: Report, name: str, summ: dict[str, Any]) -> None:
    profs = summ.get("profiles") or []
    if profs:
        labels = [f"rank {p['rank']} step {p['step']}" for p in profs]
        vals = {k.removesuffix("_s").replace("_", " "): [p[k] for p in profs] for k in PROFILE_PARTS}
        rep.figure("profiles", lambda: F.phase_breakdown(labels, vals, f"{name}: profiled steps",
                                                         "profiled rank and step"),
                   "From torch.profiler traces: compute only, compute overlapped with communication, exposed "
                   "communication, idle, per profiled step.")


def _data_quality(rep: Report, summ: dict[str, Any], imported: bool = False) -> None:
    dq = summ.get("data_quality") or {}
    rep.h("Data quality")
    rep.table(["fields supported", "not in the imported records" if imported else "not measured", "clock skew",
               "requested rate"], [[
        ", ".join(dq.get("fields_supported") or []) or "none recorded",
        ", ".join(dq.get("not_measured") or []) or "—",
        (f"{dq['clock_skew_ns']} ns" if dq.get("clock_skew_ns") is not None else "")
        + f" ({dq.get('clock_skew_note', '')})",
        json.dumps(dq.get("rate_hz_requested")),
    ]], cls="info")
    rows = [[f"{d['host']}/{d['device']}", d.get("samples"),
             "—" if d.get("rate_hz") is None else f"{d['rate_hz']:.3g} Hz",
             d.get("gaps"), _fmt_s(d.get("gap_s")), _fmt_s(d.get("max_interval_s")),
             d.get("clock_steps_back") or 0, d.get("long_gaps") or 0,
             _fmt_s(d.get("edge_held_s")) if d.get("energy_why_null") is None else d["energy_why_null"]]
            for d in dq.get("devices") or []]
    if rows:
        rep.table(["device", "samples in window", "achieved rate", "gaps (> 2.5 periods)", "time in gaps",
                   "longest interval", "clock steps back", "gaps energy does not bridge",
                   "energy: edges held (or why null)"], rows)
    _power_quality(rep, summ)
    missing = dq.get("missing_devices") or {}
    if missing.get("why"):
        rep.p(f"Missing from the data: {missing['why']}; the run's energy is unknown.", "note")
    for field, bad in sorted((dq.get("implausible") or {}).items()):
        kinds = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in sorted(bad.get("kinds", {}).items()))
        rep.p(f"{field}: {bad.get('count')} implausible reading(s) kept out of every metric ({kinds}) on "
              f"{', '.join(bad.get('devices') or [])}.", "note")
    for note in dq.get("telemetry_notes") or []:
        rep.p(note, "note")


def _hz(v: Any) -> str:
    return "—" if not isinstance(v, (int, float)) else f"{v:.3g} Hz"


def _power_quality(rep: Report, summ: dict[str, Any]) -> None:
    """What the power figures were read from: the run's line, per device its field, samples and repeats,
    rates, update period, window and where its peak came from; then what the fields cannot resolve."""
    line = power_source_line(summ)
    if line:
        rep.p(line)
    rows = []
    for d in (summ.get("data_quality") or {}).get("devices") or []:
        pw = d.get("power")
        if not pw:
            continue
        u, w = pw.get("update_period_s"), pw.get("averaging_window_s")
        rows.append([f"{d['host']}/{d['device']}", ", ".join(str(x) for x in (pw.get("source"), pw.get("nvml")) if x)
                     or "not recorded", pw.get("samples"), "not marked" if pw.get("repeats") is None else pw["repeats"],
                     _hz(pw.get("rate_hz")), _hz(pw.get("polled_rate_hz")),
                     "—" if u is None else f"{u * 1e3:.3g} ms ({pw.get('update_period_from')})",
                     "not recorded" if w is None else f"{w * 1e3:.3g} ms",
                     f"{format_value('power_peak_w', pw.get('peak_w'))} ({pw.get('peak_from')})"])
    if rows:
        rep.table(["device", "power_w source", "samples (repeats not counted)", "repeats", "sample rate",
                   "polled rate", "update period", "averaging window", "peak (from)"], rows, cls="power")
    for warning in power_warnings(summ):
        rep.p(f"Warning: {warning}", "note")


# ---------------------------------------------------------------------------------------------------
# sweep view


def _efficiency(rows: list[dict[str, Any]]) -> tuple[str, str]:
    for key, label in (("tokens_per_j", "tokens/J"), ("mfu", "MFU"), ("tokens_per_s", "tokens/s")):
        if any(r.get(key) is not None for r in rows):
            return key, label
    return "tokens_per_j", "tokens/J"


def build_sweep_report(path: Path, out: Path, formats: tuple[str, ...] = FORMATS,
                       damaged: list[str] | None = None) -> Path:
    """``damaged``: collect a damaged run's one-line problem there and go on (else it raises)."""
    from powertrain.analyze.sweep import sweep_table, write_sweep_table

    rows, summaries = load_sweep(path, damaged=damaged)
    write_sweep_table(path, sweep_table(rows))
    rep = Report(out, f"powertrain sweep report — {path.name}", formats)
    _sweep_header(rep, path, rows)
    fig_rows = [r for r in rows if r["status"] != "duplicate"]  # a duplicate is another run's twin: listed above
    _per_configuration(rep, rows, fig_rows)
    rep.h("Per device slot across configurations (study Figs. 5, 17)")
    done = [(r, summaries[r["id"]]) for r in rows if r["id"] in summaries and summaries[r["id"]].get("per_device")]
    _slot_heatmaps(rep, done)
    rep.h("Per pipeline stage time breakdown (study Figs. 10, 15)")
    stage_labels, stage_vals, stage_src = _stage_breakdown(done, path)
    if stage_labels:
        rep.figure("stage_breakdown", lambda: F.phase_breakdown(
            stage_labels, stage_vals, f"time per category per pipeline stage (from {stage_src})",
            "configuration / stage"),
            f"Seconds per step in each category, averaged over the ranks of each pipeline stage, from {stage_src}"
            + (": compute only, compute overlapped with communication, exposed communication, idle."
               if stage_src == "profiler traces" else "."))
    else:
        rep.p("No phase events or profiler traces in these runs: the per-stage breakdown is skipped.", "note")
    add_powercap_section(rep, fig_rows)  # only when a run of the sweep set a power limit or a clock lock
    _throughput_and_rankings(rep, rows)
    return rep.write()


def _sweep_header(rep: Report, path: Path, rows: list[dict[str, Any]]) -> None:
    """Title, run counts per status, the predictions banner, and one table row per run."""
    rep.h(f"Sweep {path.name}", 1)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    rep.p("Runs: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + (f"; {sum(r['kind'] == 'prediction' for r in rows)} predictions" if any(
              r["kind"] == "prediction" for r in rows) else ""))
    if any(r["kind"] == "prediction" for r in rows):
        rep.raw('<div class="banner">This sweep contains PREDICTIONS (marked "pred", hatched or hollow): '
                'modelled, not measured.</div>')
    rep.table(["run", "status", "kind", "model", "configuration", "step time", "tokens/s", "power mean",
               "temp peak", "J/token", "reason"],
              [[r["id"], _status_badge(r["status"]), r["kind"], r.get("model") or "—", r["label"],
                format_value("step_time_mean_s", r.get("step_time_mean_s")),
                format_value("tokens_per_s", r.get("tokens_per_s")), format_value("power_mean_w", r.get("power_mean_w")),
                format_value("temp_peak_c", r.get("temp_peak_c")), format_value("j_per_token", r.get("j_per_token")),
                (r.get("reason") or "")[:160]] for r in rows], cls="sweep")


def _per_configuration(rep: Report, rows: list[dict[str, Any]], fig_rows: list[dict[str, Any]]) -> None:
    """Per model: step time and throughput panels; temperature, power and clock panels where sensed."""
    eff, eff_label = _efficiency(rows)
    models = sorted({str(r.get("model")) for r in fig_rows})
    rep.h("Step time and throughput per configuration")
    for i, model in enumerate(models):
        mrows = [r for r in fig_rows if str(r.get("model")) == model]
        rep.figure(f"perf_{i}_{_safe(model)}", partial(F.performance_panels, model, mrows),
                   f"{model}: mean step time (whisker: p99) and tokens/s; MFU and utilisation. Runs that did not "
                   "finish are labelled FAILED / OOM / REJECTED / NOT RUN.")
    rep.h("Temperature, power and SM clock per configuration (study Figs. 4, 8, 13)")
    sensed = any(r.get(k) is not None for r in fig_rows
                 for k in ("temp_mean_c", "power_mean_w", "clock_sm_mean_mhz"))
    if not sensed:
        rep.p("Temperature, power and SM clock: not measured in any run of this sweep (these devices have no "
              "such sensors); the study's per-configuration thermal and power figures need them.", "note")
    for i, model in enumerate(models if sensed else []):
        mrows = [r for r in fig_rows if str(r.get("model")) == model]
        rep.figure(f"study_{i}_{_safe(model)}", partial(F.study_panels, model, mrows, eff, eff_label),
                   f"{model}: average and peak temperature and power, mean SM clock per configuration; "
                   f"line: {eff_label}. Runs that did not finish are labelled FAILED / OOM / REJECTED / NOT RUN.")


def _slot_heatmaps(rep: Report, done: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """Mean temperature, mean power and link bytes per step of each device slot in each finished run."""
    slots = sorted({(d["host"], d["device"]) for _, s in done for d in s["per_device"] if d.get("kind") != "cpu"}
                   or {(d["host"], d["device"]) for _, s in done for d in s["per_device"]},
                   key=lambda k: (k[0], F_slot_key(k[1])))
    if not (done and slots):
        rep.p("No finished run with per-device telemetry: slot heatmaps skipped.", "note")
        return
    for key, title, unit, scale in (("temp_mean_c", "mean temperature", "°C", 1.0),
                                    ("power_mean_w", "mean power", "W", 1.0),
                                    ("link_tx_bytes", "link bytes sent per step", "GiB/step", 1 / 2**30)):
        vals = np.full((len(done), len(slots)), np.nan)
        for i, (_, s) in enumerate(done):
            n_steps = (s.get("window") or {}).get("measured_steps") or 0
            for d in s["per_device"]:
                k = (d["host"], d["device"])
                if k in slots and d.get(key) is not None:
                    v = d[key] * scale
                    if key == "link_tx_bytes":
                        v = v / n_steps if n_steps else np.nan
                    vals[i, slots.index(k)] = v
        if np.isfinite(vals).any():
            labels = [f"{r.get('model')} {r['label']}" + ("" if r["status"] == "ok" else f" [{r['status'].upper()}]")
                      + (" (pred)" if r.get("kind") == "prediction" else "") for r, _ in done]
            rep.figure(f"slots_{key}", partial(F.slot_heatmap, labels, slots, vals,
                                               f"{title} per configuration × device slot (nodes separated)", unit),
                       f"{title} of each device slot in each configuration; white lines separate nodes; the "
                       "bottom row is the per-slot mean over configurations.")
        else:
            rep.p(f"{title}: not measured in any run of this sweep.", "note")


def _throughput_and_rankings(rep: Report, rows: list[dict[str, Any]]) -> None:
    """Throughput against energy per token (with the Pareto front), and rankings of key metrics."""
    rep.h("Throughput vs energy")
    pts = [r for r in rows if r.get("tokens_per_s") is not None and r.get("j_per_token") is not None]
    if pts:
        rep.figure("throughput_energy", lambda: F.throughput_energy(pts),
                   "Each configuration's throughput against its energy per token; the dashed line is the "
                   "Pareto front (no configuration is both faster and more frugal).")
    else:
        rep.p("No run has both a throughput and an energy measurement: the Pareto plot is skipped.", "note")
    rep.h("Rankings")
    for metric, title, unit in (("tokens_per_s", "Throughput per configuration", "tokens/s"),
                                ("power_peak_w", "Peak power per configuration", "W"),
                                ("temp_peak_c", "Peak temperature per configuration", "°C"),
                                ("throttle_share", "Share of samples throttled", "share")):
        if any(r.get(metric) is not None for r in rows):
            rep.figure(f"rank_{metric}", partial(F.ranking, rows, metric, title, unit), f"{title}, highest first.")
        else:
            rep.p(f"{title}: not measured in any run of this sweep.", "note")


def F_slot_key(device: str) -> tuple[str, int]:
    digits = "".join(ch for ch in device if ch.isdigit())
    return (device.rstrip("0123456789"), int(digits) if digits else -1)


PROFILE_PARTS = ("compute_only_s", "overlap_s", "comm_exposed_s", "idle_s")


def _stage_breakdown(done: list[tuple[dict[str, Any], dict[str, Any]]], sweep: Path
                     ) -> tuple[list[str], dict[str, list[float]], str]:
    """Per configuration and pipeline stage: seconds per category. From profiler traces when any run
    has them (compute / overlap / exposed communication / idle), else from the self times of the
    ranks' phase events (read from each run's ``events/``)."""
    if any(s.get("profiles") for _, s in done):
        labels: list[str] = []
        groups: list[dict[str, float]] = []
        for r, s in done:
            profs = s.get("profiles") or []
            if not profs:
                continue
            stage_of = {pr["rank"]: (pr.get("coords") or {}).get("pp", 0) for pr in s.get("per_rank") or []}
            for st in sorted({stage_of.get(p["rank"], 0) for p in profs}):
                sel = [p for p in profs if stage_of.get(p["rank"], 0) == st]
                labels.append(f"{r['label']} / stage {st}")
                groups.append({k.removesuffix("_s").replace("_", " "): float(np.mean([p[k] for p in sel]))
                               for k in PROFILE_PARTS})
        kinds = [k.removesuffix("_s").replace("_", " ") for k in PROFILE_PARTS]
        return labels, {k: [g.get(k, 0.0) for g in groups] for k in kinds}, "profiler traces"
    labels = []
    groups = []
    for r, s in done:
        run_path = sweep / str(r["id"])
        sd = None
        if (run_path / "events").is_dir():
            with RunEvents.open(run_path) as events:
                sd = steps_mod.measured_steps(events)
        phases = sd.phases if sd is not None else []  # as in the run's report: a reused number counts once per use
        n = sd.n if sd is not None else 0
        if not phases or not n:
            continue
        stage_of = {pr["rank"]: (pr.get("coords") or {}).get("pp", 0) for pr in s.get("per_rank") or []}
        stages = sorted({stage_of.get(p["rank"], 0) for p in phases})
        for st in stages:
            ranks = {rk for rk, v in stage_of.items() if v == st} or {p["rank"] for p in phases}
            acc: dict[str, float] = {}
            for p in phases:
                if p["rank"] in ranks:
                    acc[p["kind"]] = acc.get(p["kind"], 0.0) + p["seconds"] / n / len(ranks)
            labels.append(f"{r['label']} / stage {st}")
            groups.append(acc)
    kinds = sorted({k for g in groups for k in g})
    return labels, {k: [g.get(k, 0.0) for g in groups] for k in kinds}, "phase events"


def _attrs(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        out = json.loads(text)
    except ValueError:
        return {}  # free text, not a JSON object: no stage recorded
    return out if isinstance(out, dict) else {}


MAX_PIPELINE_ROWS = 32


# A stage call: a forward / backward event with a micro-batch and ``attrs.stage`` (JSON; LIKE is a
# first cut, :func:`_attrs` decides).
_STAGE_CALL = "kind IN ('forward', 'backward') AND microbatch IS NOT NULL AND attrs LIKE '%stage%'"


class _StageCalls:
    """What the pipeline view needs of the stage calls of the measured steps (one replica's), gathered
    one event at a time: the calls of the last measured step that has any, and per (stage, rank) the
    counts, durations and steps, so nothing holds every call of a long run."""

    def __init__(self, order: dict[tuple[int, int], int]) -> None:
        self.order = order  # measured step -> its place in the run
        self.last: tuple[int, int] | None = None  # the latest measured step with stage calls
        self.mine: list[dict[str, Any]] = []  # its calls, in the events' order
        self.durations: dict[tuple[int, int], dict[str, array]] = {}  # (stage, rank) -> what -> ns
        self.sids: dict[tuple[int, int], dict[tuple[int, int], None]] = {}  # (stage, rank) -> its steps, in order
        self.rank_busy: dict[tuple[int, tuple[int, int]], int] = {}  # (rank, step) -> ns in stage calls
        self.spans: dict[tuple[int, tuple[int, int]], tuple[int, int]] = {}  # (rank, step) -> pipeline phase

    def add(self, rank: int, sid: tuple[int, int], stage: int, what: str, microbatch: int, a: int, b: int) -> None:
        key = (stage, rank)
        self.durations.setdefault(key, {}).setdefault(what, array("q")).append(b - a)
        self.sids.setdefault(key, {})[sid] = None
        self.rank_busy[(rank, sid)] = self.rank_busy.get((rank, sid), 0) + b - a
        if self.last is None or self.order[sid] > self.order[self.last]:
            self.last, self.mine = sid, []  # an earlier rank had no call in it (it would have set it)
        if sid == self.last:
            self.mine.append({"rank": rank, "stage": stage, "what": what, "microbatch": microbatch,
                              "t_start_ns": a, "t_end_ns": b})


def _stage_calls(events: RunEvents, sd: Any, rank_map: list[dict[str, Any]]) -> _StageCalls:
    """The stage calls and pipeline phases of the measured steps, one rank at a time in time order.

    A step is (repeat, number) as in the analysis (steps_mod.event_repeats): an event belongs to the
    last use of its number on its rank that started at or before it (the first when none did)."""
    calls = _StageCalls({sid: j for j, sid in enumerate(zip(sd.repeats.tolist(), sd.steps.tolist(), strict=True))})
    measured = calls.order
    coords = {int(e["rank"]): e.get("coords") or {} for e in rank_map if "rank" in e}
    events.register_steps("_pipeline_steps", np.unique(sd.steps))
    where = (f"step IN (SELECT step FROM _pipeline_steps) AND (kind IN ('forward', 'backward', 'phase') "
             f"OR ({KEPT_STEP}))")
    first_steps = "CASE WHEN kind = 'step' THEN 0 ELSE 1 END"  # a step counts for what starts with it
    for rank in events.ranks(where):
        uses: dict[int, int] = {}  # step number -> this rank's step events of it started so far
        c = coords.get(rank, {})
        other_replica = bool(c.get("dp", 0) or c.get("tp", 0) or c.get("cp", 0))  # repeats the same schedule
        for rows in events.rank_chunks(rank, where, "kind, name, step, t_start_ns, t_end_ns, microbatch, attrs",
                                       first_steps):
            for kind, name, step, a, b, mb, attrs in rows:
                if kind == "step":
                    uses[step] = uses.get(step, 0) + 1
                    continue
                sid = (max(uses.get(step, 0) - 1, 0), step)
                if sid not in measured:
                    continue  # a warm-up use of a measured step's number
                if kind == "phase":
                    if name == "pipeline":
                        calls.spans[(rank, sid)] = (a, b)
                    continue
                at = _attrs(attrs)
                if "stage" in at and mb is not None and not other_replica:
                    calls.add(rank, sid, int(at["stage"]), "loss" if at.get("part") == "loss" else kind, mb, a, b)
    return calls


def _pipeline_view(rep: Report, name: str, events: RunEvents, sd: Any, rank_map: list[dict[str, Any]]) -> None:
    """Per pipeline stage: one measured step's forward / backward per micro-batch (the 1F1B pattern and
    its bubble), and a table of stage call counts, mean durations and bubble share over the measured steps.

    Drawn only where ranks recorded stage calls (forward / backward events with ``attrs.stage``, as the
    built-in trainer's timed pipeline stages write); one data-parallel / tensor-parallel replica is shown.
    """
    if not events.one(f"SELECT count(*) FROM ev WHERE {_STAGE_CALL}")[0]:
        return  # no stage call in the run: nothing to read
    calls = _stage_calls(events, sd, rank_map)
    best = calls.last
    if best is None:
        return  # no stage call of a measured step on the replica shown
    rep.h("Per pipeline stage")
    # the last measured step, past warm-up, typical of the steady state (the last with stage calls
    # when it has none and no pipeline phase either: there is nothing to draw of it)
    last, mine, spans = (int(sd.repeats[-1]), int(sd.steps[-1])), calls.mine, calls.spans
    if last != best and not any(s == last for _, s in spans):
        last = best
    elif last != best:
        mine = []
    step = f"{last[1]}" + (f" (use {last[0] + 1} of that number)" if last[0] else "")
    ranks_of = sorted(calls.sids)[:MAX_PIPELINE_ROWS]
    t0 = min([c["t_start_ns"] for c in mine] + [a for (r, s), (a, _) in spans.items() if s == last])
    rows = []
    for stage, rank in ranks_of:
        boxes = [(c["what"], int(c["microbatch"]), (c["t_start_ns"] - t0) / 1e6, (c["t_end_ns"] - t0) / 1e6)
                 for c in mine if c["stage"] == stage and c["rank"] == rank]
        sp = spans.get((rank, last))
        rows.append((f"stage {stage} (rank {rank})", sorted(boxes, key=lambda b: b[2]),
                     ((sp[0] - t0) / 1e6, (sp[1] - t0) / 1e6) if sp else None))
    rep.figure("pipeline_schedule", lambda: F.pipeline_schedule(
        rows, f"{name}: pipeline schedule of measured step {step}, per stage"),
        f"Measured step {step}: each stage's forward (F) and backward (B) of every micro-batch, in the order the "
        "schedule ran them; grey is the rank's pipeline phase not spent in them: bubble and point-to-point waits "
        "(with virtual stages, also the time the rank spends on its other stages, drawn on their own rows).")
    table = []
    for stage, rank in ranks_of:
        fwd = calls.durations[(stage, rank)].get("forward", array("q"))
        bwd = calls.durations[(stage, rank)].get("backward", array("q"))
        # bubble share of the rank's pipeline phase; a rank holding several stages shares one phase
        shares = [1 - calls.rank_busy[(rank, s)] / (spans[(rank, s)][1] - spans[(rank, s)][0])
                  for s in calls.sids[(stage, rank)] if (rank, s) in spans and spans[(rank, s)][1] > spans[(rank, s)][0]]

        def mean_ms(ns: array) -> str:
            return "—" if not ns else f"{np.mean(np.frombuffer(ns, dtype=np.int64)) / 1e6:.3g} ms"

        table.append([stage, rank, len(fwd) // max(sd.n, 1), len(bwd) // max(sd.n, 1), mean_ms(fwd), mean_ms(bwd),
                      "—" if not shares else f"{100 * float(np.mean(shares)):.1f} %"])
    rep.table(["stage", "rank", "forwards per step", "backwards per step", "forward (mean)", "backward (mean)",
               "bubble + p2p wait (share of the rank's pipeline phase)"], table, cls="pipeline")


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in text)


def is_report_folder(p: Path) -> bool:
    """A folder ``build_report`` wrote: ``report.html`` and ``figures/`` (PNG, SVG, PDF) only."""
    names = {c.name for c in p.iterdir() if not c.name.startswith(".")}
    if not names or not names <= {"report.html", "figures"}:
        return False
    fig = p / "figures"
    return not fig.exists() or (fig.is_dir() and all(f.suffix in (".png", ".svg", ".pdf") for f in fig.iterdir()))


def build_report(path: str | Path, out: str | Path | None = None, formats: tuple[str, ...] = FORMATS, *,
                 force: bool = False, damaged: list[str] | None = None) -> Path:
    """Write ``report.html`` (self-contained) and ``figures/*`` for a run or sweep; returns the HTML path.

    ``out`` defaults to ``<path>/report``, which is rewritten each time (the command's own folder); an
    ``out`` that exists is replaced only with ``force`` and only when it holds a report (never a run's
    files). The report is built in a hidden sibling folder and renamed into place, so a failure leaves
    neither an empty folder nor temporary files. ``damaged`` (sweeps): see :func:`build_sweep_report`.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    out_dir = Path(out) if out else path / "report"
    check_output_folder(out_dir, "report", force=force or out is None, same_kind=is_report_folder)
    is_run = (path / "run.json").exists()  # a run.json that is no file is a damaged run, said by check_run
    if is_run:
        check_run(path)
    elif not is_sweep_dir(path):
        raise FileNotFoundError(
            f"{path} is neither a run directory (no run.json) nor a sweep folder (no sweep.json and no subfolder "
            "with a run.json)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out_dir.parent, [f".{out_dir.name}.building-*", f".{out_dir.name}.old-*"])  # a killed report's
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.building-"))
    try:
        if is_run:
            build_run_report(path, staging, formats)
        else:
            build_sweep_report(path, staging, formats, damaged)
        _into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "report.html"


def _into_place(staging: Path, out_dir: Path) -> None:
    """Give the built report the mode policy's modes, then swap it in for ``out_dir`` (old one removed)."""
    for root, _dirs, files in os.walk(staging):
        os.chmod(root, dir_mode())
        for f in files:
            os.chmod(os.path.join(root, f), file_mode())
    old = None
    if out_dir.is_dir():
        old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
        os.rename(out_dir, old / "report")
    os.rename(staging, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1300px;
       color: #222; padding: 0 1em; }}
h1 {{ font-size: 1.5em; }} h2 {{ font-size: 1.15em; border-bottom: 1px solid #ddd; margin-top: 1.6em; }}
table {{ border-collapse: collapse; font-size: 0.82em; margin: 0.6em 0; }}
th, td {{ border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }} table.metrics td:nth-child(2) {{ white-space: nowrap; }}
details {{ margin: 0.4em 0; }} summary {{ cursor: pointer; color: #555; }}
table.info td {{ max-width: 320px; word-break: break-word; }}
figure {{ margin: 0.8em 0; }} figure img {{ max-width: 100%; border: 1px solid #eee; }}
figcaption {{ font-size: 0.8em; color: #555; }}
.badge {{ color: white; border-radius: 3px; padding: 0 5px; font-size: 0.85em; white-space: nowrap; }}
.banner {{ background: #fff3cd; border: 1px solid #e0c36a; padding: 0.5em 0.8em; font-weight: bold; }}
.banner.synthetic {{ background: #e8f0fe; border-color: #9ab; }}
.note {{ color: #8a5a00; font-size: 0.88em; }}
footer {{ color: #777; font-size: 0.75em; margin-top: 2em; }}
</style>
<script>
// Records script errors in the page itself (the browser test reads data-errors from the DOM).
window.addEventListener("error", function (e) {{ document.documentElement.dataset.errors =
  (document.documentElement.dataset.errors || "") + (e.message || "resource error") + ";"; }}, true);
</script></head>
<body>
{body}
<footer>generated by powertrain on {generated}; self-contained (figures embedded), no network needed.</footer>
<script>
// Records, in the page itself, whether every figure decoded: the browser test reads these from the DOM.
window.addEventListener("load", function () {{
  var imgs = Array.prototype.slice.call(document.images);
  document.body.dataset.figures = imgs.length;
  document.body.dataset.loaded = imgs.filter(function (i) {{ return i.complete && i.naturalWidth > 0; }}).length;
}});
</script>
</body></html>
"""
