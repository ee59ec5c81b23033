"""``powertrain plan``: the table of runs a sweep spec gives, checked before anything launches."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from powertrain.cli import app
from powertrain.cli.root import shown_text
from powertrain.plan.planner import Plan, PlannedRun, plan
from powertrain.plan.sweep_spec import SpecError, load_sweep_spec
from powertrain.spec.bounds import DEFAULT_MAX_POINTS, shown

out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)

_STYLE = {"planned": "green", "rejected": "red", "unsupported": "yellow", "duplicate": "dim"}

MAX_POINTS_HELP = "Refuse a grid of more points than this (counted from the axes, before expansion)."

# A table of more rows than this is summarised (the first rows of each status, the reasons counted):
# rich lays out every row before it prints the first, and a 99 360-point grid's table took 290 s and
# 4.8 GB to say mostly "rejected". ``--all`` prints every row anyway; ``--json`` writes them all.
TABLE_MAX_ROWS = 1_000
SUMMARY_ROWS_EACH = 10  # rows of each status (and of runs launched with a warning) a summary shows
SUMMARY_REASONS = 30  # reason groups a summary lists, the most frequent first


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


def print_plan(p: Plan, console: Console = out, show_all: bool = True, *, every_row: bool = False,
               spec: Path | None = None) -> None:
    """The plan's table, then its counts. Over :data:`TABLE_MAX_ROWS` rows (unless ``every_row``) the
    table holds the first rows of each status, the reasons are counted by rule, and a line says how many
    rows were left out and how to see them (``spec`` names the file in that line)."""
    rows = shown_runs(p, show_all)
    total = len(rows)
    if total > TABLE_MAX_ROWS and not every_row:
        rows = _sample(rows)
    if rows:
        console.print(_table(p, rows))
    if len(rows) < total:
        console.print(_reasons_table(shown_runs(p, show_all)))
        again = f"powertrain plan {shown_text(shown(spec)) if spec else 'SPEC'}{'' if show_all else ' --problems'}"
        console.print(f"{total - len(rows)} of {total} rows left out (the first {SUMMARY_ROWS_EACH} of each status "
                      f"are shown): `{again} --all` prints every row, `{again} --json` writes them all as JSON",
                      highlight=False)
    _print_counts(p, console)


def _sample(rows: list[PlannedRun]) -> list[PlannedRun]:
    """The first :data:`SUMMARY_ROWS_EACH` rows of each status (launched with a warning apart), in order."""
    taken: Counter[tuple[str, bool]] = Counter()
    kept = []
    for r in rows:
        key = (r.status, bool(r.warnings))
        if taken[key] < SUMMARY_ROWS_EACH:
            taken[key] += 1
            kept.append(r)
    return kept


def _rule(reason: str) -> str:
    """The rule a reason names: ``[world_size] …`` → ``world_size``, ``memory: needs …`` → ``memory``."""
    if reason.startswith("[") and "]" in reason:
        return reason[1:reason.index("]")]
    head, colon, _ = reason.partition(":")
    return head if colon and len(head) <= 40 else reason[:60]


def _reasons_table(rows: list[PlannedRun]) -> Table:
    """Runs that will not launch (or launch with a warning) counted by status and rule, with the first
    run of each and its reason, the most frequent first."""
    groups: Counter[tuple[str, str]] = Counter()
    first: dict[tuple[str, str], PlannedRun] = {}
    for r in rows:
        why = (r.reasons or r.warnings or [""])[0]
        if r.status == "planned" and not r.warnings:
            continue
        key = (r.status, _rule(why))
        groups[key] += 1
        first.setdefault(key, r)
    table = Table(title="by reason", header_style="bold")
    for col in ("status", "rule", "runs", "first run", "its reason"):
        table.add_column(col, overflow="fold")
    for (status, rule), n in groups.most_common(SUMMARY_REASONS):
        r = first[(status, rule)]
        table.add_row(f"[{_STYLE[status]}]{status}[/]", shown_text(rule), str(n), shown_text(r.id),
                      shown_text("; ".join(r.reasons + r.warnings)))
    if len(groups) > SUMMARY_REASONS:
        table.caption = f"{len(groups) - SUMMARY_REASONS} less frequent reason(s) not listed"
    return table


def _table(p: Plan, shown: list[PlannedRun]) -> Table:
    table = Table(title=f"sweep {shown_text(p.spec.name)}", header_style="bold", show_lines=False)
    # the device controls column only where a run sets one (a power-cap or clock sweep)
    with_controls = any(r.config and r.config.knobs.controls() for r in p.runs)
    # the task column only where a run fine-tunes with LoRA (every other run trains all weights)
    with_task = any(r.config and r.config.task.is_lora for r in p.runs)
    cols = ("id", "model", "layout", *(("task",) if with_task else ()), "mb", "gb", "recompute",
            *(("controls",) if with_controls else ()),
            "mem/dev GiB", "fits", "status", "reason")
    for col in cols:
        table.add_column(col, overflow="fold")
    for r in shown:
        c = r.config
        table.add_row(
            shown_text(r.id),  # names from the spec: escaped, so no escape sequence or bidi override is obeyed
            shown_text(c.model.name) if c else "—",
            c.layout.label() if c else "—",
            *((shown_text(c.task.label()) if c else "—",) if with_task else ()),
            str(c.knobs.micro_batch) if c else "—",
            str(c.knobs.global_batch) if c else "—",
            c.knobs.recompute if c else "—",
            *((controls_label(c.knobs.controls()) if c else "—",) if with_controls else ()),
            _gib(r.mem_per_device_bytes),
            {True: "yes", False: "no", None: "—"}[r.fits],
            f"[{_STYLE[r.status]}]{r.status}[/]",
            shown_text("; ".join(r.reasons + r.warnings + _notes(r))),
        )
    return table


def _print_counts(p: Plan, console: Console) -> None:
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


def echo_plan_json(p: Plan, runs: list[PlannedRun]) -> None:
    """``{"name", "counts", "runs": [...]}`` on stdout, as ``json.dumps(indent=2)`` writes it, one run at a
    time: a 99 360-run plan's one string (and its list of dicts) cost hundreds of MB at once."""
    head = json.dumps({"name": p.spec.name, "counts": p.counts()}, indent=2, default=str)
    typer.echo(head[:-2] + ',\n  "runs": [', nl=False)  # head ends with "\n}": the object stays open
    for i, r in enumerate(runs):
        # a string's own newlines are written \n in JSON: every newline here is the layout's
        body = json.dumps(r.to_dict(), indent=2, default=str).replace("\n", "\n    ")
        typer.echo(("," if i else "") + "\n    " + body, nl=False)
    typer.echo("\n  ]\n}" if runs else "]\n}")


@app.command("plan")
def plan_cmd(
    spec: Annotated[Path, typer.Argument(help="Sweep spec YAML (or a single-run spec).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON instead of a table.")] = False,
    problems: Annotated[bool, typer.Option("--problems", help="Only show runs that will not launch, or launch although predicted not to fit (also with --json).")] = False,
    max_points: Annotated[int, typer.Option("--max-points", min=1, help=MAX_POINTS_HELP)] = DEFAULT_MAX_POINTS,
    every_row: Annotated[bool, typer.Option("--all", help=f"Print every row of the table (over {TABLE_MAX_ROWS:,} rows it is summarised: the first rows of each status and the reasons counted).")] = False,
) -> None:
    """Expand a sweep spec into runs and check each one WITHOUT launching anything.

    Every run is validated (world size = product of degrees, heads and KV heads divisible by TP,
    layers ≥ pipeline stages, experts divisible by EP, global batch divisible by micro-batch × DP,
    enough pipeline micro-batches, …) and sized with the analytical memory model. Rejections name the
    violated rule and a fix; runs whose knobs change nothing for their layout are merged, and a run
    kept with such knobs carries a warning naming them (it runs them at their defaults). A sweep
    that sets device controls (power limit, clock locks) shows them in a controls column; on the
    CPU backend such a run is rejected (nothing there to set).

    A plan of more than 1,000 rows is summarised: the first rows of each status, the reasons counted
    by rule, and how many rows were left out (`--all` prints every row, `--json` writes them all).

    Exit status: 0 when at least one run would launch, 1 when none would (every run rejected or
    unsupported), 2 when the spec itself is refused (one line naming the file and the field).

    Example:  powertrain plan examples/study-h200-microbatch.yaml --problems
    """
    p = load_and_plan(spec, max_points)
    if as_json:
        echo_plan_json(p, shown_runs(p, show_all=not problems))
    else:
        print_plan(p, show_all=not problems, every_row=every_row, spec=spec)
    none = nothing_valid(p, spec)
    if none:
        fail(none, code=1)
