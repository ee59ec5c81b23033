"""``powertrain trace RUN -o trace.json``: a Perfetto / Chrome trace of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from powertrain.cli.root import app

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@app.command()
def trace(
    path: Annotated[Path, typer.Argument(help="A run directory (with run.json).")],
    output: Annotated[Path, typer.Option("-o", "--out", help="Trace file to write (JSON).")] = Path("trace.json"),
    max_points: Annotated[int, typer.Option("--max-points", min=10,
                                            help="Most samples per counter track; longer runs are bucketed "
                                                 "(means).")] = 20_000,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing trace file (never any other file).")
                     ] = False,
) -> None:
    """Write a Chrome/Perfetto trace: one counter track per device and measured field (power,
    temperature, clocks, …; counters as rates), one slice track per rank (steps and their phases),
    all on one time base. Open it at [bold]https://ui.perfetto.dev[/] or chrome://tracing.

    Example:

      powertrain trace runs/dp2 -o out/dp2-trace.json
    """
    from powertrain.trace import export_trace

    if not (path / "run.json").exists():
        err.print(f"[red]error:[/] {path} is not a run directory (no run.json); for a sweep, pass one of its runs")
        raise typer.Exit(2)
    try:
        counts = export_trace(path, output, max_points=max_points, force=force)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError) as exc:  # DamagedRun, WriteRefused
        err.print(f"error: {exc}", markup=False, highlight=False, style="red")
        raise typer.Exit(2) from None
    err.print(f"{counts.get('C', 0)} counter samples, {counts.get('X', 0)} slices")
    out.print(str(output))
