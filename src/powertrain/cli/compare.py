"""``powertrain compare A B``: two runs (measured or predicted) or two sweeps, side by side."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, JustifyMethod
from rich.table import Table

from powertrain.analyze import format_value
from powertrain.cli.root import app, shown_text
from powertrain.core.names import printable

# Piped into a file (`| tee`), rich would fold the table to 80 columns; keep it readable there too.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, soft_wrap=True)

# (column, justification) of the two tables: two runs, and two sweeps matched run by run
_RUN_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("metric", "left"), ("A", "right"), ("B", "right"), ("B/A", "right"), ("better", "center"))
_SWEEP_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("run", "left"), ("status A / B", "left"), ("metric", "left"), ("A", "right"), ("B", "right"),
    ("B/A", "right"), ("better", "center"))


def _ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.3f}×"


def _side(meta: dict) -> str:
    tag = "PREDICTION" if meta.get("kind") == "prediction" else "measured"
    # names from the runs' files, escaped: no terminal escape sequence, bidi override or markup is obeyed
    window = f"\n    {shown_text(meta['window_text'])}" if meta.get("window_text") else ""
    return f"{shown_text(meta.get('run'))} ({tag}, {shown_text(meta.get('status'))}){window}"


def _hidden_line(n: int, per_pair: bool = False) -> None:
    if n > 0:
        where = " (summed over the run pairs)" if per_pair else ""
        out.print(f"{n} metric value(s) null on both sides hidden{where} — not measured or not predicted "
                  "there; --all lists them")


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="Run directory or sweep folder A (the baseline).")],
    b: Annotated[Path, typer.Argument(help="Run directory or sweep folder B (compared with A).")],
    all_metrics: Annotated[bool, typer.Option("--all", help="Also list metrics null on both sides.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Side-by-side metrics of two runs — measured or predicted — or of two sweeps (matched run by run),
    with the ratio B/A and which side is better. Predictions are labelled.

    Metrics null on both sides (e.g. power on a machine without power sensors) are left out and
    counted in one line; --all lists them.

    Examples:

      powertrain compare runs/dp2 runs/dp2-predicted

      powertrain compare results/cpu-sweep results/cpu-sweep-predicted

      powertrain compare runs/a runs/b --all --json > a-vs-b.json
    """
    from powertrain.analyze.compare import SWEEP_KEY_METRICS
    from powertrain.analyze.compare import compare as do_compare
    from powertrain.analyze.metrics import METRICS

    for p in (a, b):
        if not p.exists():
            err.print(f"[red]error:[/] {shown_text(p)} does not exist")
            raise typer.Exit(2)
    try:
        res = do_compare(a, b, keep_null=all_metrics)
    except (ValueError, OSError) as exc:  # a damaged run is a DamagedRun (ValueError): RUN: file: problem
        err.print(f"error: {printable(exc)}", markup=False, highlight=False, style="red")
        raise typer.Exit(2) from None
    if as_json:
        out.print_json(json.dumps(res, default=str))
        return
    if res["kind"] == "runs":
        t = Table(title=f"A = {_side(res['a'])}\nB = {_side(res['b'])}", header_style="bold")
        for col, just in _RUN_COLUMNS:
            t.add_column(col, justify=just)
        for r in res["rows"]:
            t.add_row(r["metric"], format_value(r["metric"], r["a"]), format_value(r["metric"], r["b"]),
                      _ratio(r["ratio"]), r["better"])
        out.print(t)
        if not all_metrics:
            _hidden_line(len(METRICS) - len(res["rows"]))
        return
    t = Table(title=f"A = {shown_text(res['a'])}\nB = {shown_text(res['b'])}", header_style="bold")
    for col, just in _SWEEP_COLUMNS:
        t.add_column(col, justify=just)
    for p in res["pairs"]:
        name = shown_text(p["id_a"] if p["id_a"] == p["id_b"] else f"{p['id_a']} / {p['id_b']}")
        kinds = {p["kind_a"], p["kind_b"]}
        if "prediction" in kinds:
            name += f"\n({p['kind_a']} / {p['kind_b']})"
        status = shown_text(f"{p['status_a']} / {p['status_b']}")
        if not p["rows"]:  # e.g. a rejected run on both sides: keep the pair visible
            t.add_row(name, status, "(no metric on either side)", "—", "—", "—", "", end_section=True)
        for i, r in enumerate(p["rows"]):
            t.add_row(name if i == 0 else "", status if i == 0 else "", r["metric"], format_value(r["metric"], r["a"]),
                      format_value(r["metric"], r["b"]), _ratio(r["ratio"]), r["better"],
                      end_section=i == len(p["rows"]) - 1)
    out.print(t)
    if not all_metrics:
        _hidden_line(sum(len(SWEEP_KEY_METRICS) - len(p["rows"]) for p in res["pairs"]), per_pair=True)
    if res["only_a"] or res["only_b"]:
        out.print(f"only in A: {shown_text(', '.join(map(str, res['only_a'])) or '—')}; "
                  f"only in B: {shown_text(', '.join(map(str, res['only_b'])) or '—')}")
