"""Side-by-side comparison of two runs (measured or predicted) or two sweeps, with ratios.

Each side of two runs names the window its figures are over (``window``, ``window_text``): energy,
power and time of a run are over its own window (see ``docs/metrics.md``).

``ratio = B / A`` for every metric both sides have (``None`` when either is null or A is 0); the
``better`` column says which side is better for metrics with a direction (see
:data:`powertrain.analyze.metrics.METRICS`). Sweeps are matched run by run on the run id, falling
back to the configuration label and model when ids differ (e.g. a measured sweep against the
predicted one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from powertrain.analyze.metrics import METRICS
from powertrain.analyze.summary import load_summary, window_text
from powertrain.analyze.sweep import is_sweep_dir, load_sweep

SWEEP_KEY_METRICS = ("step_time_mean_s", "tokens_per_s", "mfu", "power_mean_w", "power_peak_w", "temp_peak_c",
                     "j_per_token", "throttle_share")


def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a == 0:
        return None
    return float(b) / float(a)


def _better(name: str, a: Any, b: Any) -> str:
    m = next((x for x in METRICS if x.name == name), None)
    if m is None or not m.better or a is None or b is None or a == b:
        return ""
    if m.better == "higher":
        return "B" if b > a else "A"
    return "B" if b < a else "A"


def compare_metrics(ma: dict[str, Any], mb: dict[str, Any], names: list[str] | None = None,
                    keep_null: bool = False) -> list[dict[str, Any]]:
    rows = []
    for m in METRICS:
        if names is not None and m.name not in names:
            continue
        a, b = ma.get(m.name), mb.get(m.name)
        if a is None and b is None and not keep_null:
            continue
        rows.append({"metric": m.name, "a": a, "b": b, "ratio": _ratio(a, b), "better": _better(m.name, a, b)})
    return rows


def _no_verdict_across_kinds(rows: list[dict[str, Any]], kind_a: Any, kind_b: Any) -> list[dict[str, Any]]:
    """Measured against predicted: B/A is the prediction's error, not a win for either side."""
    if (kind_a == "prediction") != (kind_b == "prediction"):
        for r in rows:
            r["better"] = ""
    return rows


def compare_runs(a: str | Path, b: str | Path, keep_null: bool = False) -> dict[str, Any]:
    sa, sb = load_summary(a), load_summary(b)
    rows = compare_metrics(sa.get("metrics") or {}, sb.get("metrics") or {}, keep_null=keep_null)
    return {
        "a": {"path": str(a), "run": sa.get("run"), "kind": sa.get("kind"), "status": sa.get("status"),
              "window": sa.get("window"), "window_text": window_text(sa)},
        "b": {"path": str(b), "run": sb.get("run"), "kind": sb.get("kind"), "status": sb.get("status"),
              "window": sb.get("window"), "window_text": window_text(sb)},
        "rows": _no_verdict_across_kinds(rows, sa.get("kind"), sb.get("kind")),
    }


def compare_sweeps(a: str | Path, b: str | Path, metrics: tuple[str, ...] = SWEEP_KEY_METRICS,
                   keep_null: bool = False) -> dict[str, Any]:
    """Pair the runs of two sweeps; each pair's rows leave out metrics null on both sides unless
    ``keep_null`` (a CPU sweep has no power or temperature: listing them per run only adds noise)."""
    ra, _ = load_sweep(a)
    rb, _ = load_sweep(b)
    by_id = {r["id"]: r for r in rb}
    by_cfg = {(r.get("model"), r["label"]): r for r in rb}
    pairs, used = [], set()
    for r in ra:
        other = by_id.get(r["id"]) or by_cfg.get((r.get("model"), r["label"]))
        if other is not None and other["id"] not in used:
            used.add(other["id"])
            pairs.append({"id_a": r["id"], "id_b": other["id"], "model": r.get("model"), "label": r["label"],
                          "status_a": r["status"], "status_b": other["status"], "kind_a": r["kind"],
                          "kind_b": other["kind"], "rows": _no_verdict_across_kinds(
                              compare_metrics(r, other, list(metrics), keep_null=keep_null), r["kind"], other["kind"])})
    return {"a": str(a), "b": str(b), "pairs": pairs,
            "only_a": [r["id"] for r in ra if r["id"] not in {p["id_a"] for p in pairs}],
            "only_b": [r["id"] for r in rb if r["id"] not in used]}


def compare(a: str | Path, b: str | Path, keep_null: bool = False) -> dict[str, Any]:
    """Compare two runs or two sweeps (``kind`` says which); mixing a run and a sweep is an error.

    Metrics null on both sides are left out unless ``keep_null``."""
    sa, sb = is_sweep_dir(a), is_sweep_dir(b)
    if sa != sb:
        raise ValueError(f"cannot compare a {'sweep' if sa else 'run'} ({a}) with a {'sweep' if sb else 'run'} ({b}): "
                         "give two run directories or two sweep folders")
    if sa:
        return {"kind": "sweeps", **compare_sweeps(a, b, keep_null=keep_null)}
    return {"kind": "runs", **compare_runs(a, b, keep_null=keep_null)}
