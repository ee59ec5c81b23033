"""``powertrain summarize PATH``: compute a run's summary.json, or a sweep's summary.parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from powertrain.analyze import format_value, is_sweep_dir, load_summary, summarize_sweep
from powertrain.analyze.metrics import METRICS
from powertrain.cli import app

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def print_run_summary(summ: dict, console: Console = out) -> None:
    label = "PREDICTION" if summ.get("kind") == "prediction" else "measured"
    console.print(f"[bold]{summ.get('run')}[/] ({label}) status [bold]{summ.get('status')}[/]")
    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("why null / definition", overflow="fold")
    metrics = summ.get("metrics") or {}
    why = summ.get("why_null") or {}
    for m in METRICS:
        if m.name not in metrics:
            continue
        v = metrics[m.name]
        table.add_row(m.name, format_value(m.name, v), why.get(m.name, "") if v is None else "")
    console.print(table)


@app.command()
def summarize(
    path: Annotated[Path, typer.Argument(help="A run directory (with run.json) or a sweep folder.")],
    refresh: Annotated[bool, typer.Option("--refresh", help="Recompute even where summary.json is current.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Write the files, print only their paths.")] = False,
) -> None:
    """Compute the metrics of a run (writes [bold]summary.json[/]) or of every run of a sweep (writes
    each run's summary.json and the sweep table [bold]summary.parquet[/], one row per run).

    Every metric is defined in docs/metrics.md; a metric without data is null and says why.
    """
    if not path.exists():
        err.print(f"[red]error:[/] {path} does not exist")
        raise typer.Exit(2)
    try:
        if is_sweep_dir(path):
            with err.status(f"summarizing the runs of {path} …"):
                table = summarize_sweep(path, refresh=refresh)
            if not quiet:
                t = Table(show_header=True, header_style="bold")
                for col in ("id", "status", "step_time_mean_s", "tokens_per_s", "power_mean_w", "temp_peak_c",
                            "j_per_token"):
                    t.add_column(col)
                for r in table.to_pylist():
                    t.add_row(r["id"], r["status"], *[format_value(c, r.get(c)) for c in
                                                      ("step_time_mean_s", "tokens_per_s", "power_mean_w",
                                                       "temp_peak_c", "j_per_token")])
                out.print(t)
            out.print(str(path / "summary.parquet"))
        else:
            summ = load_summary(path, refresh=refresh)
            if not quiet:
                print_run_summary(summ)
            out.print(str(path / "summary.json"))
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
