"""``powertrain report PATH``: a self-contained HTML report and PNG/SVG/PDF figures of a run or sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from powertrain.cli.root import app

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@app.command()
def report(
    path: Annotated[Path, typer.Argument(help="A run directory (with run.json) or a sweep folder of runs.")],
    output: Annotated[Path | None, typer.Option("-o", "--out", help="Output folder (default: PATH/report).")] = None,
    formats: Annotated[str, typer.Option("--formats", help="Figure files to write besides the HTML: "
                                                           "comma list of png, svg, pdf; empty: none (the HTML "
                                                           "embeds its figures either way).")] = "png,svg,pdf",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing report folder given with --out "
                                                        "(never anything else).")] = False,
) -> None:
    """Write [bold]report.html[/] — one page, figures embedded, opens with no network — and
    [bold]figures/[/] (PNG, SVG, PDF).

    A run gets telemetry timelines with step windows shaded, the step-time distribution, a per-rank
    step-time heatmap and a data-quality panel. A sweep gets the study's per-configuration
    temperature / power / SM-clock figures grouped by model (failed, OOM, rejected and not-run runs
    marked apart), configuration × device-slot heatmaps, per-stage time breakdowns, throughput vs
    J/token with the Pareto front, and power and thermal rankings. Predictions are labelled as such.

    Examples:

      powertrain report results/cpu-sweep

      powertrain report runs/dp2 --out out/dp2-report --formats png

    The default folder PATH/report is rewritten each time; an existing --out folder is replaced only
    with --force and only when it holds a report. In a sweep, a damaged run is skipped with one line
    (the report covers the others; exit code 1).
    """
    from powertrain.report import build_report

    fmts = tuple(f.strip().lower() for f in formats.split(",") if f.strip())
    bad = [f for f in fmts if f not in ("png", "svg", "pdf")]
    if bad:
        err.print(f"[red]error:[/] unknown figure format(s) {', '.join(bad)}; use png, svg, pdf")
        raise typer.Exit(2)
    if force and output is None:  # the default folder PATH/report is rewritten anyway
        err.print("[red]error:[/] --force applies to --out (replace an existing report folder there): add --out DIR, "
                  "or drop --force")
        raise typer.Exit(2)
    from powertrain.cli.summarize import skipped_exit

    damaged: list[str] = []
    try:
        with err.status(f"building the report of {path} …"):
            html_path = build_report(path, output, fmts, force=force, damaged=damaged)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError) as exc:  # DamagedRun, WriteRefused
        err.print(f"error: {exc}", markup=False, highlight=False, style="red")
        raise typer.Exit(2) from None
    out.print(str(html_path))
    skipped_exit(damaged)
