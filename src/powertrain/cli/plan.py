"""``powertrain plan``: the table of runs a sweep spec gives, checked before anything launches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from powertrain.cli import app
from powertrain.plan.planner import Plan, PlannedRun, plan
from powertrain.plan.sweep_spec import SpecError, load_sweep_spec
from powertrain.spec.bounds import DEFAULT_MAX_POINTS, shown

out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)

_STYLE = {"planned": "green", "rejected": "red", "unsupported": "yellow", "duplicate": "dim"}

MAX_POINTS_HELP = "Refuse a grid of more points than this (counted from the axes, before expansion)."


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr (control characters escaped, no markup read from it), then exit ``code``."""
    err.print(f"[red]error:[/] {escape(shown(message))}", emoji=False, highlight=False)
    raise typer.Exit(code)


def load_and_plan(spec: Path, max_points: int) -> Plan:
    """The plan of SPEC, or exit 2 with one line naming the file and the problem."""
    try:
        sweep_spec = load_sweep_spec(spec)
    except SpecError as exc:
        fail(str(exc))
    try:
        return plan(sweep_spec, max_points)
    except SpecError as exc:
        fail(f"{shown(spec)}: {exc}")


def nothing_valid(p: Plan, spec: Path) -> str | None:
    """One line when no run of the plan can launch (every run rejected, unsupported or merged), else None."""
    if p.to_launch:
        return None
    c = p.counts()
    first = next((r for r in p.runs if r.reasons), None)
    why = f"; {first.id}: {first.reasons[0]}" if first else ""
    return (f"{shown(spec)}: nothing to launch: of {len(p.runs)} run(s), {c['rejected']} rejected and "
            f"{c['unsupported']} unsupported by the built-in trainer{why}")


def _gib(v: float | None) -> str:
    # three significant figures: a tiny CPU model's few MiB stay visible instead of reading 0.0
    return "—" if v is None else f"{v / 2**30:.3g}"


def controls_label(knobs: dict[str, object]) -> str:
    """A run's device controls in a few characters: ``500 W · SM 1200–1500 · mem 2619``, ``—`` when none."""
    parts = []
    if "power_limit_w" in knobs:
        parts.append(f"{knobs['power_limit_w']:g} W")
    sm = knobs.get("sm_clock_mhz")
    if isinstance(sm, list):
        parts.append(f"SM {sm[0]}" if sm[0] == sm[1] else f"SM {sm[0]}–{sm[1]}")
    if "mem_clock_mhz" in knobs:
        parts.append(f"mem {knobs['mem_clock_mhz']}")
    return " · ".join(parts) or "—"


def shown_runs(p: Plan, show_all: bool = True) -> list[PlannedRun]:
    """The runs a plan shows: all, or (``show_all`` False) those that will not launch or are launched
    although predicted not to fit. Knobs that change nothing are counted below the table instead: a study
    sweep sets them across layouts on purpose, and listing those runs would bury the problems."""
    return [r for r in p.runs if show_all or r.status != "planned" or r.warnings]


def _notes(r: PlannedRun) -> list[str]:
    """A launched run's knobs that change nothing for its layout: a warning, not a refusal (a study sweep
    crosses variants with layouts); the run gets them at their defaults."""
    if r.status != "planned" or not r.unused_knobs:
        return []
    one = len(r.unused_knobs) == 1
    return [f"warning: {', '.join(r.unused_knobs)} change{'s' if one else ''} nothing here; the run uses "
            f"{'its default' if one else 'their defaults'}"]


def print_plan(p: Plan, console: Console = out, show_all: bool = True) -> None:
    table = Table(title=f"sweep {p.spec.name}", header_style="bold", show_lines=False)
    # the device controls column only where a run sets one (a power-cap or clock sweep)
    with_controls = any(r.config and r.config.knobs.controls() for r in p.runs)
    # the task column only where a run fine-tunes with LoRA (every other run trains all weights)
    with_task = any(r.config and r.config.task.is_lora for r in p.runs)
    cols = ("id", "model", "layout", *(("task",) if with_task else ()), "mb", "gb", "recompute",
            *(("controls",) if with_controls else ()),
            "mem/dev GiB", "fits", "status", "reason")
    for col in cols:
        table.add_column(col, overflow="fold")
    shown = shown_runs(p, show_all)
    for r in shown:
        c = r.config
        table.add_row(
            r.id,
            c.model.name if c else "—",
            c.layout.label() if c else "—",
            *((c.task.label() if c else "—",) if with_task else ()),
            str(c.knobs.micro_batch) if c else "—",
            str(c.knobs.global_batch) if c else "—",
            c.knobs.recompute if c else "—",
            *((controls_label(c.knobs.controls()) if c else "—",) if with_controls else ()),
            _gib(r.mem_per_device_bytes),
            {True: "yes", False: "no", None: "—"}[r.fits],
            f"[{_STYLE[r.status]}]{r.status}[/]",
            escape("; ".join(r.reasons + r.warnings + _notes(r))),
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
        + (f"; {noop} launched with knobs that change nothing for their layout, at their defaults (named in "
           "the reason column of the full `powertrain plan`)" if (noop := sum(bool(_notes(r)) for r in p.runs)) else "")
    )


@app.command("plan")
def plan_cmd(
    spec: Annotated[Path, typer.Argument(help="Sweep spec YAML (or a single-run spec).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON instead of a table.")] = False,
    problems: Annotated[bool, typer.Option("--problems", help="Only show runs that will not launch, or launch although predicted not to fit (also with --json).")] = False,
    max_points: Annotated[int, typer.Option("--max-points", min=1, help=MAX_POINTS_HELP)] = DEFAULT_MAX_POINTS,
) -> None:
    """Expand a sweep spec into runs and check each one WITHOUT launching anything.

    Every run is validated (world size = product of degrees, heads and KV heads divisible by TP,
    layers ≥ pipeline stages, experts divisible by EP, global batch divisible by micro-batch × DP,
    enough pipeline micro-batches, …) and sized with the analytical memory model. Rejections name the
    violated rule and a fix; runs whose knobs change nothing for their layout are merged, and a run
    kept with such knobs carries a warning naming them (it runs them at their defaults). A sweep
    that sets device controls (power limit, clock locks) shows them in a controls column; on the
    CPU backend such a run is rejected (nothing there to set).

    Exit status: 0 when at least one run would launch, 1 when none would (every run rejected or
    unsupported), 2 when the spec itself is refused (one line naming the file and the field).

    Example:  powertrain plan examples/study-h200-microbatch.yaml --problems
    """
    p = load_and_plan(spec, max_points)
    if as_json:
        typer.echo(json.dumps({"name": p.spec.name, "counts": p.counts(),
                               "runs": [r.to_dict() for r in shown_runs(p, show_all=not problems)]},
                              indent=2, default=str))
    else:
        print_plan(p, show_all=not problems)
    none = nothing_valid(p, spec)
    if none:
        fail(none, code=1)
