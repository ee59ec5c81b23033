"""``powertrain plan``: the table of runs a sweep spec gives, checked before anything launches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from powertrain.cli import app
from powertrain.plan.planner import Plan, plan
from powertrain.plan.sweep_spec import SpecError, load_sweep_spec

out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)

_STYLE = {"planned": "green", "rejected": "red", "unsupported": "yellow", "duplicate": "dim"}


def _gib(v: float | None) -> str:
    # three significant figures: a tiny CPU model's few MiB stay visible instead of reading 0.0
    return "—" if v is None else f"{v / 2**30:.3g}"


def print_plan(p: Plan, console: Console = out, show_all: bool = True) -> None:
    table = Table(title=f"sweep {p.spec.name}", header_style="bold", show_lines=False)
    for col in ("id", "model", "layout", "mb", "gb", "recompute", "mem/dev GiB", "fits", "status", "reason"):
        table.add_column(col, overflow="fold")
    shown = [r for r in p.runs if show_all or r.status != "planned" or r.warnings]
    for r in shown:
        c = r.config
        table.add_row(
            r.id,
            c.model.name if c else "—",
            c.layout.label() if c else "—",
            str(c.knobs.micro_batch) if c else "—",
            str(c.knobs.global_batch) if c else "—",
            c.knobs.recompute if c else "—",
            _gib(r.mem_per_device_bytes),
            {True: "yes", False: "no", None: "—"}[r.fits],
            f"[{_STYLE[r.status]}]{r.status}[/]",
            escape("; ".join(r.reasons + r.warnings)),
        )
    if shown:
        console.print(table)
    counts = p.counts()
    console.print(
        f"{len(p.runs)} runs: [green]{counts['planned']} to launch[/], [red]{counts['rejected']} rejected[/] "
        f"(invalid or predicted not to fit), [yellow]{counts['unsupported']} unsupported by the built-in "
        f"trainer[/], [dim]{counts['duplicate']} duplicates merged[/]"
        + (f"; {warned} launched although predicted not to fit" if (warned := sum(bool(r.warnings) for r in p.runs))
           else "")
    )


@app.command("plan")
def plan_cmd(
    spec: Annotated[Path, typer.Argument(help="Sweep spec YAML (or a single-run spec).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON instead of a table.")] = False,
    problems: Annotated[bool, typer.Option("--problems", help="Only show runs that will not launch.")] = False,
) -> None:
    """Expand a sweep spec into runs and check each one WITHOUT launching anything.

    Every run is validated (world size = product of degrees, heads and KV heads divisible by TP,
    layers ≥ pipeline stages, experts divisible by EP, global batch divisible by micro-batch × DP,
    enough pipeline micro-batches, …) and sized with the analytical memory model. Rejections name the
    violated rule and a fix; runs whose knobs change nothing for their layout are merged.

    Example:  powertrain plan examples/study-h200-microbatch.yaml --problems
    """
    try:
        p = plan(load_sweep_spec(spec))
    except SpecError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps({"name": p.spec.name, "counts": p.counts(), "runs": [r.to_dict() for r in p.runs]},
                              indent=2, default=str))
        return
    print_plan(p, show_all=not problems)
