"""``powertrain monitor``: run any command under the per-node sampler."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from powertrain.cli.root import PowerBufferOption, app, shown_text
from powertrain.monitor import MonitorError, run_command
from powertrain.slurm_tasks import run_task_command, slurm_task
from powertrain.store.tables import telemetry_files
from powertrain.telemetry.quicklook import per_device

if TYPE_CHECKING:
    from powertrain.live.parse import LiveStepParser

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
    devices = per_device(telemetry_files(run_dir))
    n_rows = sum(d["rows"] for d in devices)
    dur = (info["end_ns"] - info["start_ns"]) / 1e9 if info.get("end_ns") else None
    status = info.get("status")
    colour = "green" if status == "ok" else "red"
    console.print(f"[bold]run[/] {shown_text(run_dir)}  [{colour}]{shown_text(status)}[/]"
                  + (f" — {shown_text(info['reason'])}" if info.get("reason") else ""))
    console.print(f"duration {dur:.1f} s, {n_rows} telemetry rows" if dur is not None else "")
    table = Table(show_header=True, header_style="bold")
    for col in ("device", "rows", "rate", "field", "mean", "peak"):
        table.add_column(col)
    for dev in devices:
        first = True
        for field, (mean, peak) in dev["levels"].items():
            table.add_row(
                shown_text(f"{dev['host']}/{dev['device']}") if first else "",
                str(dev["rows"]) if first else "",
                f"{dev['rate_hz']:.1f} Hz" if first and dev["rate_hz"] else "",
                shown_text(field), _fmt(field, mean), _fmt(field, peak),
            )
            first = False
        for field, total in dev["totals"].items():
            table.add_row("", "", "", shown_text(f"Δ {field}"), _fmt(field, total), "")
    console.print(table)
    if info.get("not_measured"):
        console.print(f"[yellow]not measured on this host:[/] {shown_text(', '.join(map(str, info['not_measured'])))}")
    for note in info.get("telemetry_notes", []):
        console.print(f"[dim]· {shown_text(note)}[/]")


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
    parse: Annotated[str | None, typer.Option(
        "--parse", help="Turn the command's printed step lines into step events, live: megatron, "
                        "torchtitan or nemo (for engines you cannot edit).")] = None,
    seq_len: Annotated[int | None, typer.Option(
        "--seq-len", min=1,
        help="With --parse: tokens per sample (>= 1), to count tokens (logs do not print it).")] = None,
    warmup_steps: Annotated[int | None, typer.Option(
        "--warmup-steps", min=0,
        help="Leading steps of each rank that are warm-up, excluded from metrics: steps the command marks "
             "with powertrain.step without a window (default 0: all measured), and with --parse the "
             "parsed step lines (default 1).")] = None,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", metavar="[HOST:]PORT",
        help="Serve live readings for Prometheus on this port (dcgm-exporter names); HOST defaults "
             "to 127.0.0.1, give 0.0.0.0:PORT with --prometheus-public to expose it on the network.")] = None,
    prometheus_public: Annotated[bool, typer.Option(
        "--prometheus-public", help="Allow --prometheus on a non-loopback address (a warning is printed).")] = False,
    power_buffer: PowerBufferOption = True,
) -> None:
    """Run COMMAND under the per-node telemetry sampler and leave a run directory.

    The run directory gets run.json (command, exit code, times, host, devices and the fields they
    support), telemetry/<host>.parquet (one row per device per sample), and logs/ (the command's
    output and the sampler's log). The command's exit code is passed through.

    Examples:

      powertrain monitor --out runs/loop -- python examples/cpu_train_loop.py --steps 30

      powertrain monitor --out runs/burn --rate 50 -- python train.py --steps 100

      powertrain monitor --out runs/gpt --parse megatron --seq-len 4096 -- torchrun ... pretrain_gpt.py ...

      srun -N2 --ntasks-per-node=8 powertrain monitor --out /shared/runs/x -- python train.py

    A loop that marks steps (`with powertrain.step(i, tokens=...)`) writes them into this run;
    steps without a window are all measured, less --warmup-steps per rank.

    Under srun with several tasks, task 0 owns the run, the first task of each node runs that node's
    sampler, and every task runs COMMAND: one run directory, one sampler per node (--out must be on
    a filesystem every node shares).
    """
    if not command:
        err.print("[red]error:[/] no command given. Put it after `--`, e.g. "
                  "powertrain monitor --out runs/x -- python train.py")
        raise typer.Exit(2)
    if out is None:
        out = Path("runs") / f"monitor-{dt.datetime.now():%Y%m%d-%H%M%S}"
    parser = None
    try:
        _check_pairs(parse, seq_len, prometheus, prometheus_public)
        _check_listen(prometheus, prometheus_public)  # a bad value is a usage error before anything starts
        _check_out(out)
        task = slurm_task()
        # one line before anything starts; under srun only one task per node serves --prometheus
        _check_rate_and_port(rate, prometheus if task is None else None)
        parser = _step_parser(parse, out, seq_len, warmup_steps, task)
        kw = _run_options(rate, backends, not quiet, parser, prometheus, warmup_steps) | {"power_buffer": power_buffer}
        if task is not None:
            code, info = run_task_command(command, out, task, **kw)
        else:
            code, info = run_command(command, out, **kw)
    except (MonitorError, ValueError) as exc:
        err.print(f"[red]error:[/] {shown_text(exc)}")
        raise typer.Exit(2) from None
    finally:
        if parser is not None:
            parser.close()
    _report(parser, out, info)
    raise typer.Exit(code if code >= 0 else 128 - code)


def _report(parser: LiveStepParser | None, out: Path, info: dict[str, Any]) -> None:
    """What ``--parse`` made of the output, then the run's summary (a Slurm task that does not own the
    run has none)."""
    if parser is not None:
        _report_parsed(parser, out)
    if info:
        print_summary(out, info)
        sys.stdout.flush()


def _check_pairs(parse: str | None, seq_len: int | None, prometheus: str | None, public: bool) -> None:
    """Options read only through another one: alone they would be accepted and change nothing."""
    if seq_len is not None and not parse:
        raise ValueError("--seq-len counts tokens of --parse step lines: add --parse ENGINE, or drop --seq-len")
    if public and not prometheus:
        raise ValueError("--prometheus-public opens the --prometheus endpoint to the network: add --prometheus "
                         "[HOST:]PORT, or drop --prometheus-public")


def _check_listen(prometheus: str | None, public: bool = False) -> None:
    """``--prometheus``: a bad ``[HOST:]PORT``, or a non-loopback one without ``--prometheus-public``,
    raises ``ValueError``; a public one prints a warning and is allowed for the sampler (environment)."""
    if prometheus:
        import os

        from powertrain.live.prometheus import PUBLIC_ENV, check_public, parse_listen

        addr, port = parse_listen(prometheus)
        if check_public(addr, public):
            os.environ[PUBLIC_ENV] = "1"  # the sampler process inherits the permission
            err.print(f"warning: Prometheus endpoint {addr}:{port} is reachable from the network; anyone who can "
                      "reach this host can read its telemetry", markup=False, highlight=False, style="yellow")


def _check_out(out: Path) -> None:
    """``--out``: a folder name (``''`` and ``.`` are refused: the current directory is no new run), and
    not a sweep folder, a sweep's or run's own files, or a folder inside a run."""
    from powertrain.store.targets import check_new_run_dir, check_path_text

    check_path_text(out, "--out")
    check_new_run_dir(out, "--out")


def _run_options(rate: float, backends: str, echo: bool, parser: LiveStepParser | None, prometheus: str | None,
                 warmup_steps: int | None) -> dict[str, Any]:
    """Keyword arguments of :func:`run_command` / :func:`run_task_command` from the options."""
    return {"rate_hz": rate, "backends": backends if backends == "auto" else backends.split(","),
            "echo": echo, "on_output": parser.feed if parser else None,
            "on_exit": parser.close if parser else None, "prometheus": prometheus,
            # run.json's declared warm-up, applied to steps recorded without a window
            "warmup_steps": warmup_steps or 0}


def _step_parser(parse: str | None, out: Path, seq_len: int | None, warmup_steps: int | None,
                 task: Mapping[str, int] | None) -> LiveStepParser | None:
    """``--parse``: the live parser of the command's step lines, else ``None``."""
    if not parse:
        return None
    from powertrain.live.parse import LiveStepParser

    # under srun each task parses its own output into its own rank's file
    return LiveStepParser(parse, out, seq_len=seq_len, warmup_steps=1 if warmup_steps is None else warmup_steps,
                          default_rank=task["procid"] if task else 0)


def _report_parsed(parser: LiveStepParser, out: Path) -> None:
    """What ``--parse`` made of the command's output."""
    err.print(f"parsed {parser.lines} {parser.engine} step line(s) into {parser.steps} event(s) in "
              f"{shown_text(out)}/events/")
    if parser.lines == 0:
        err.print(f"[yellow]no {parser.engine} step line was seen in the command's output[/]")


def _check_rate_and_port(rate: float, prometheus: str | None) -> None:
    """``--rate`` within what the sampler accepts, and the ``--prometheus`` port free to bind: a
    ``ValueError`` naming the option here, instead of the sampler failing after the run started."""
    from powertrain.core.sampling import check_rate_hz

    check_rate_hz(rate, "--rate")
    if not prometheus:
        return
    import socket

    from powertrain.live.prometheus import parse_listen

    addr, port = parse_listen(prometheus)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter binds
            probe.bind(infos[0][4])
    except OSError as exc:
        raise ValueError(f"--prometheus {prometheus}: cannot listen on {addr}:{port}: "
                         f"{exc.strerror or exc}") from None
