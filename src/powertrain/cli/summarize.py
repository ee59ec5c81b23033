"""``powertrain summarize PATH``: compute a run's summary.json, or a sweep's summary.parquet."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from powertrain.analyze import format_value, is_sweep_dir, load_summary, summarize_sweep, window_text
from powertrain.analyze.coverage import power_source_line, power_warnings
from powertrain.analyze.metrics import METRICS
from powertrain.cli.root import app, shown_text
from powertrain.core.names import printable

# Piped or captured, rich would fold the table to 80 columns; keep run ids whole there too.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, soft_wrap=True)


def _null_line(metrics: dict, why: dict) -> str | None:
    """One line for every metric without a value: how many, and the commonest reasons."""
    null = [m.name for m in METRICS if m.name in metrics and metrics[m.name] is None]
    if not null:
        return None
    reasons = Counter(why.get(n) or "no reason recorded" for n in null)
    top = "; ".join(f"{c} × {r}" for r, c in reasons.most_common(3))
    more = f"; {len(reasons) - 3} other reason(s)" if len(reasons) > 3 else ""
    return (f"{len(null)} metrics have no value here ({top}{more}) — summary.json says why for each; "
            "--all lists them")


def _per_node(summ: dict, console: Console) -> None:
    """Several nodes: each node's mean power and energy, and the spread between them."""
    nodes = [n for n in summ.get("per_node") or [] if n.get("power_sum_mean_w") is not None]
    if len(nodes) < 2:
        return
    powers = [n["power_sum_mean_w"] for n in nodes]
    lo, hi = min(powers), max(powers)
    console.print(f"{len(nodes)} nodes: mean power {format_value('power_mean_w', lo)} … "
                  f"{format_value('power_mean_w', hi)} (spread {(hi - lo) / lo:.1%} of the lowest)")
    if len(nodes) > 16:  # a table per node stops being readable; the report has the heatmap
        return
    table = Table(show_header=True, header_style="bold")
    for col in ("node", "devices", "mean power", "energy"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for n in nodes:
        table.add_row(shown_text(n.get("host")), shown_text(n.get("devices")), format_value("power_mean_w", n["power_sum_mean_w"]),
                      format_value("energy_j", n.get("energy_j")))
    console.print(table)


def print_run_summary(summ: dict, console: Console = out, show_all: bool = False) -> None:
    """The metrics that have a value (all of them, with why null, when ``show_all``)."""
    label = "PREDICTION" if summ.get("kind") == "prediction" else "measured"
    # names and texts come from the run's files: shown escaped (no terminal escape, bidi override or markup obeyed)
    console.print(f"[bold]{shown_text(summ.get('run'))}[/] ({label}) status [bold]{shown_text(summ.get('status'))}[/]")
    console.print(printable(window_text(summ)), markup=False, highlight=False)
    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    if show_all:
        table.add_column("why null", overflow="fold")
    metrics = summ.get("metrics") or {}
    why = summ.get("why_null") or {}
    for m in METRICS:
        if m.name not in metrics:
            continue
        v = metrics[m.name]
        if v is None and not show_all:
            continue
        row = [m.name, format_value(m.name, v)]
        table.add_row(*row, *([shown_text(why.get(m.name, "")) if v is None else ""] if show_all else []))
    if table.row_count:
        console.print(table)
    else:
        console.print("no metric has a value for this run")
    _per_node(summ, console)
    _power_sources(summ, console)
    line = None if show_all else _null_line(metrics, why)
    if line:
        console.print(printable(line), style="dim", markup=False)


def _power_sources(summ: dict, console: Console) -> None:
    """What the power figures were read from (field, source, effective rate, window, peak and energy
    paths), then what they cannot resolve (aliasing, short phases) and ∫power against the counter."""
    line = power_source_line(summ)
    if line:
        console.print(printable(line), markup=False, highlight=False)
    for warning in power_warnings(summ):
        console.print(f"warning: {printable(warning)}", style="yellow", markup=False, highlight=False)


_SWEEP_COLS = ("step_time_mean_s", "tokens_per_s", "mfu", "power_mean_w", "temp_peak_c", "j_per_token")


def print_sweep_table(rows: list[dict], console: Console = out, show_all: bool = False) -> None:
    """One line per run; columns null in every run are left out and named in one line."""
    cols = [c for c in _SWEEP_COLS if show_all or any(r.get(c) is not None for r in rows)]
    t = Table(show_header=True, header_style="bold")
    for col in ("id", "status", *cols):
        t.add_column(col, justify="left" if col in ("id", "status") else "right")
    for r in rows:
        status = shown_text(r["status"]) + (" (PREDICTION)" if r.get("kind") == "prediction" else "")
        t.add_row(shown_text(r["id"]), status, *[format_value(c, r.get(c)) for c in cols])
    console.print(t)
    hidden = [c for c in _SWEEP_COLS if c not in cols]
    if hidden:
        console.print(f"{', '.join(hidden)}: null in every run (not measured or not predicted) — --all shows these columns",
                      style="dim")


@app.command()
def summarize(
    path: Annotated[Path, typer.Argument(help="A run directory (with run.json) or a sweep folder.")],
    refresh: Annotated[bool, typer.Option("--refresh", help="Recompute even where summary.json is current.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Write the files, print only their paths.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Also list metrics without a value, with the reason.")] = False,
) -> None:
    """Compute the metrics of a run (writes [bold]summary.json[/]) or of every run of a sweep (writes
    each run's summary.json and the sweep table [bold]summary.parquet[/], one row per run).

    Every metric is defined in docs/metrics.md. Only metrics with a value are printed, then one
    line counting the null ones and why (e.g. no power sensor on a CPU machine); --all lists them.

    Examples:

      powertrain summarize runs/dp2

      powertrain summarize results/cpu-sweep --refresh

      powertrain summarize runs/dp2 --all
    """
    if quiet and show_all:
        err.print("error: --all shows more of the printed table and --quiet prints none: drop one of them",
                  markup=False, highlight=False, style="red")
        raise typer.Exit(2)
    if not path.exists():
        err.print(f"[red]error:[/] {shown_text(path)} does not exist")
        raise typer.Exit(2)
    damaged: list[str] = []
    try:
        if is_sweep_dir(path):
            with err.status(f"summarizing the runs of {shown_text(path)} …"):
                table = summarize_sweep(path, refresh=refresh, damaged=damaged)
            if not quiet:
                print_sweep_table(table.to_pylist(), show_all=show_all)
            out.print(shown_text(path / "summary.parquet"))
        else:
            summ = load_summary(path, refresh=refresh)
            if not quiet:
                print_run_summary(summ, show_all=show_all)
            out.print(shown_text(path / "summary.json"))
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError) as exc:  # DamagedRun is a ValueError
        _error_line(exc)
        raise typer.Exit(2) from None
    skipped_exit(damaged)


def _error_line(exc: BaseException) -> None:
    """One line on stderr, the message as it is (no markup read from paths or file contents)."""
    err.print(f"error: {printable(exc)}", markup=False, highlight=False, style="red")


def skipped_exit(damaged: list[str]) -> None:
    """Sweeps: one line per damaged run left out, then the count and exit code 1 (nothing when none)."""
    if not damaged:
        return
    for line in damaged:
        err.print(f"skipped damaged run: {printable(line)}", markup=False, highlight=False, style="yellow")
    err.print(f"{len(damaged)} damaged run(s) skipped", markup=False, highlight=False, style="yellow")
    raise typer.Exit(1)
