"""``powertrain sweep``: run a sweep spec, locally or through Slurm, resumably."""

from __future__ import annotations

import fnmatch
import math
import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from powertrain.cli.plan import MAX_POINTS_HELP, fail, load_and_plan, nothing_valid, print_plan
from powertrain.cli.root import app, shown_text
from powertrain.launch.sweep import SweepError, SweepOptions, SweepRunner, check_sweep_folder
from powertrain.plan.planner import Plan
from powertrain.plan.state import SweepLocked, SweepState
from powertrain.plan.sweep_spec import SweepSpec
from powertrain.spec.bounds import DEFAULT_MAX_POINTS, control_char
from powertrain.spec.slurm import directive_word
from powertrain.store.targets import WriteRefused

err = Console(stderr=True, soft_wrap=True)


class _Progress:
    """done / running / failed / left and an ETA from the mean duration of finished runs."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.current: str | None = None
        self.state: SweepState | None = None

    def update(self, state: SweepState, current: str | None) -> None:
        self.state, self.current = state, current

    def __rich__(self) -> Table:
        table = Table.grid(padding=(0, 2))
        if self.state is None:
            table.add_row("planning…")
            return table
        runs = self.state.runs
        count = {s: sum(1 for r in runs if r.get("status") == s) for s in ("ok", "failed", "oom", "running", "planned")}
        durations = [r["ended"] - r["started"] for r in runs if r.get("ended") and r.get("started")]
        left = count["planned"] + count["running"]
        eta = f"{(sum(durations) / len(durations)) * left / 60:.1f} min" if durations else "—"
        table.add_row(f"[green]done {count['ok']}[/]", f"[red]failed {count['failed'] + count['oom']}[/]",
                      f"[cyan]running {count['running']}[/]", f"left {left}", f"ETA {eta}",
                      f"elapsed {(time.monotonic() - self.t0) / 60:.1f} min")
        if self.current:
            table.add_row(f"[cyan]▶ {shown_text(self.current)}[/]")
        return table


@app.command("sweep")
def sweep_cmd(
    spec: Annotated[Path, typer.Argument(help="Sweep spec YAML (or a single-run spec: a sweep of one).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Results folder (default: results/<sweep name>).")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="local or slurm (default: the spec's launch.backend).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a sweep in this folder; finished runs are kept.")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="With --resume: re-run failed and OOM runs.")] = False,
    only: Annotated[str | None, typer.Option("--only", help="Run only run ids matching this glob, e.g. '*tp2*'.")] = None,
    interrupted: Annotated[str | None, typer.Option("--interrupted", help="With --resume: rerun (default) or fail a run that was cut off.")] = None,
    time_limit_min: Annotated[float | None, typer.Option("--time-limit", help="Minutes per run (default: the spec's).")] = None,
    max_points: Annotated[int, typer.Option("--max-points", min=1, help=MAX_POINTS_HELP)] = DEFAULT_MAX_POINTS,
    allow_unapplied: Annotated[bool, typer.Option("--allow-unapplied", help="Passed to every run: a device control that cannot be set here is recorded as not applied instead of failing the run.")] = False,
) -> None:
    """Plan a sweep, then run every valid run: one after another on this machine (local), or one
    Slurm job per run (slurm). State lives in OUT/sweep.json; Ctrl-C stops after cleaning up the
    current run, and `--resume` picks up where it stopped without re-running what finished.

    A failed run (not one out of memory) is run again up to launch.retries times, after
    launch.retry_backoff_s seconds, doubled each time; sweep.json keeps every attempt. A power-cap
    or clock sweep (knobs.power_limit_w, sm_clock_mhz, mem_clock_mhz as axes) sets each value
    before the run's warm-up and restores the devices after it; it needs root on GPU nodes.

    A run spec is a sweep of one: how its protocol repeats, cool-down and idle baseline are applied.
    launch.partition, account, qos, slurm_extra (an allow-list of sbatch options) and pending_limit_min
    (a job pending longer is cancelled, its run failed) are refused where the sweep runs locally.

    Example:  powertrain sweep examples/cpu-sweep.yaml --out results/cpu && powertrain report results/cpu

    Example:  powertrain sweep examples/study-h200-powercap.yaml --out results/powercap  (Slurm jobs whose
    runs may set power limits: root, or a prolog that grants it)
    """
    p = load_and_plan(spec, max_points)
    sweep_spec = p.spec
    _check_options(out, time_limit_min)
    _check_resume_options(resume, retry_failed, interrupted)
    chosen = _backend(spec, sweep_spec, backend)
    folder = out or Path("results") / sweep_spec.name
    if chosen == "slurm":
        try:  # the results folder is written into every job's #SBATCH --output
            directive_word("--out", str(folder.absolute()))
        except ValueError as exc:
            fail(str(exc))
    none = nothing_valid(p, spec)
    if none:  # nothing is created; the line names the first reason, `powertrain plan` shows them all
        fail(f"{none} (`powertrain plan` lists every run)", code=1)
    _check_only(only, p)
    _check_folder(folder, p)
    print_plan(p, console=err, show_all=False, spec=spec)
    progress = _Progress()
    opts = SweepOptions(backend=chosen, resume=resume, retry_failed=retry_failed, only=only,
                        interrupted=interrupted or "rerun", time_limit_s=time_limit_min * 60 if time_limit_min else None,
                        allow_unapplied=allow_unapplied)
    runner = SweepRunner(p, folder, opts, on_change=progress.update)

    def on_signal(signum: int, _frame: object) -> None:
        err.print(f"[yellow]{signal.Signals(signum).name}: stopping after the current run is cleaned up; "
                  f"continue later with --resume[/]")
        runner.request_stop()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Live(progress, console=err, refresh_per_second=2, transient=False):
            state = runner.run()
    except (SweepLocked, SweepError, WriteRefused) as exc:  # WriteRefused: a link planted in the folder
        fail(str(exc))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    err.print()
    failed = [r for r in state.runs if r.get("status") in ("failed", "oom")]
    unfinished = [r for r in state.runs if r.get("status") in ("planned", "running")]
    # runs that --only did not select were not asked for: they are not a failure of this command
    left = [r for r in unfinished if only is None or fnmatch.fnmatch(r["id"], only)]
    err.print(f"sweep folder: {shown_text(folder)}")
    for r in failed:  # a reason can quote a run's output: escaped, so its markup and escape sequences are shown
        err.print(f"[red]{shown_text(r['status'])}[/] {shown_text(r['id'])}: {shown_text((r.get('reason') or '')[:300])}")
    if left:
        err.print(f"[yellow]{len(left)} run(s) not finished; continue with --resume[/]")
    if len(unfinished) > len(left):
        err.print(f"{len(unfinished) - len(left)} run(s) outside --only {only!r} left as planned")
    raise typer.Exit(1 if failed or left else 0)


def _check_folder(folder: Path, p: Plan) -> None:
    """A link planted in the sweep folder is refused before anything is printed or written (the runner checks
    again under its lock)."""
    try:
        check_sweep_folder(folder, [r.id for r in p.runs])
    except WriteRefused as exc:
        fail(str(exc))


def _backend(spec: Path, sweep_spec: SweepSpec, backend: str | None) -> str:
    """--backend, else the spec's; the Slurm-only launch options are refused where the sweep runs locally."""
    chosen = backend or sweep_spec.launch.backend
    if chosen not in ("local", "slurm"):
        err.print("[red]error:[/] --backend must be local or slurm")
        raise typer.Exit(2)
    launch = sweep_spec.launch
    slurm_only = [f"launch.{k}" for k in ("partition", "account", "qos", "slurm_extra") if getattr(launch, k)]
    if "pending_limit_min" in launch.model_fields_set:  # has a default: refused only when the spec sets it
        slurm_only.append("launch.pending_limit_min")
    if chosen == "local" and slurm_only:  # the local backend starts no job: they would be accepted and ignored
        one = len(slurm_only) == 1
        fail(f"{spec}: {', '.join(slurm_only)} appl{'ies' if one else 'y'} to Slurm jobs, and this sweep runs "
             f"locally; drop {'it' if one else 'them'} or run with --backend slurm")
    return chosen


def _check_options(out: Path | None, time_limit_min: float | None) -> None:
    """--out and --time-limit, refused with one line before anything is created."""
    if out is not None and control_char(str(out)):
        fail(f"--out: the results folder path holds {control_char(str(out))}; choose a path without one")
    if time_limit_min is not None and not (math.isfinite(time_limit_min) and 0 < time_limit_min <= 525_600):
        fail(f"--time-limit: {time_limit_min!r} is not a number of minutes between 0 and 525600 (a year)")


def _check_resume_options(resume: bool, retry_failed: bool, interrupted: str | None) -> None:
    """--retry-failed and --interrupted act on the runs of a sweep being resumed: alone they would do nothing."""
    if interrupted is not None and interrupted not in ("rerun", "fail"):
        fail(f"--interrupted: {interrupted!r} is not rerun or fail; give one of them")
    given = [o for o, on in (("--retry-failed", retry_failed), ("--interrupted", interrupted is not None)) if on]
    if given and not resume:
        one = len(given) == 1
        fail(f"{' and '.join(given)} appl{'ies' if one else 'y'} with --resume (to the runs of the sweep in --out): "
             f"add --resume, or drop {'it' if one else 'them'}")


def _check_only(only: str | None, p: Plan) -> None:
    """--only that selects no run to launch would run nothing and exit 0 as if the sweep were done."""
    if only is None:
        return
    ids = [r.id for r in p.to_launch]
    if not any(fnmatch.fnmatch(i, only) for i in ids):
        examples = ", ".join(ids[:2]) + (", …" if len(ids) > 2 else "")
        fail(f"--only {only!r} matches none of the {len(ids)} run id(s) this sweep can launch ({examples}); "
             "fix the glob (`powertrain plan SPEC` lists every run id)")
