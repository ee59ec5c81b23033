"""``powertrain monitor``: run any command under the per-node sampler."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from powertrain.cli import app
from powertrain.monitor import MonitorError, run_command
from powertrain.store.tables import read_telemetry
from powertrain.telemetry.quicklook import per_device

err = Console(stderr=True, soft_wrap=True)

_UNITS = {"_w": "W", "_c": "°C", "_mhz": "MHz", "_pct": "%", "_bytes": "B", "_1m": ""}


def _fmt(field: str, value: float | None) -> str:
    if value is None:
        return "—"
    if field.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    unit = next((u for s, u in _UNITS.items() if field.endswith(s)), "")
    return f"{value:.1f} {unit}".strip()


def print_summary(run_dir: Path, info: dict[str, Any], console: Console = err) -> None:
    """Duration, samples, per-device means and peaks, and what was not measured here."""
    tel = read_telemetry(run_dir)
    dur = (info["end_ns"] - info["start_ns"]) / 1e9 if info.get("end_ns") else None
    status = info.get("status")
    colour = "green" if status == "ok" else "red"
    console.print(f"[bold]run[/] {run_dir}  [{colour}]{status}[/]" + (f" — {info['reason']}" if info.get("reason") else ""))
    console.print(f"duration {dur:.1f} s, {tel.num_rows} telemetry rows" if dur is not None else "")
    table = Table(show_header=True, header_style="bold")
    for col in ("device", "rows", "rate", "field", "mean", "peak"):
        table.add_column(col)
    for dev in per_device(tel):
        first = True
        for field, (mean, peak) in dev["levels"].items():
            table.add_row(
                f"{dev['host']}/{dev['device']}" if first else "",
                str(dev["rows"]) if first else "",
                f"{dev['rate_hz']:.1f} Hz" if first and dev["rate_hz"] else "",
                field, _fmt(field, mean), _fmt(field, peak),
            )
            first = False
        for field, total in dev["totals"].items():
            table.add_row("", "", "", f"Δ {field}", _fmt(field, total), "")
    console.print(table)
    if info.get("not_measured"):
        console.print(f"[yellow]not measured on this host:[/] {', '.join(info['not_measured'])}")
    for note in info.get("telemetry_notes", []):
        console.print(f"[dim]· {note}[/]")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    no_args_is_help=True,
)
def monitor(
    command: Annotated[list[str] | None, typer.Argument(help="The command to run, after `--`.")] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Run directory to create (default: runs/monitor-<time>).")
    ] = None,
    rate: Annotated[float, typer.Option("--rate", help="Samples per second per device.")] = 20.0,
    backends: Annotated[
        str, typer.Option("--backends", help="auto, or a comma list of nvidia, amd, host.")
    ] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not echo the command's output.")] = False,
) -> None:
    """Run COMMAND under the per-node telemetry sampler and leave a run directory.

    The run directory gets run.json (command, exit code, times, host, devices and the fields they
    support), telemetry/<host>.parquet (one row per device per sample), and logs/ (the command's
    output and the sampler's log). The command's exit code is passed through.

    Example:  powertrain monitor --out runs/burn --rate 50 -- python train.py --steps 100
    """
    if not command:
        err.print("[red]error:[/] no command given. Put it after `--`, e.g. "
                  "powertrain monitor --out runs/x -- python train.py")
        raise typer.Exit(2)
    if out is None:
        out = Path("runs") / f"monitor-{dt.datetime.now():%Y%m%d-%H%M%S}"
    try:
        code, info = run_command(command, out, rate_hz=rate,
                                 backends=backends if backends == "auto" else backends.split(","),
                                 echo=not quiet)
    except (MonitorError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    print_summary(out, info)
    sys.stdout.flush()
    raise typer.Exit(code if code >= 0 else 128 - code)
