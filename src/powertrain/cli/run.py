"""``powertrain run``: train one configuration with the built-in trainer, under the node's sampler."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from powertrain.cli import app
from powertrain.monitor import MonitorError
from powertrain.spec.run import load_run_config
from powertrain.spec.validate import validate

err = Console(stderr=True)


def _step_summary(run_dir: Path) -> str | None:
    """Measured-window step time and throughput, from the events the ranks wrote."""
    from powertrain.store.tables import read_events

    ev = read_events(run_dir).to_pylist()
    steps = [e for e in ev if e["kind"] == "step" and e["window"] == "measured" and e["rank"] == 0]
    if not steps:
        return None
    secs = [(e["t_end_ns"] - e["t_start_ns"]) / 1e9 for e in steps]
    mean = sum(secs) / len(secs)
    gt = next((e for e in steps if e["attrs"]), None)
    tokens = None
    if gt is not None:
        import json

        tokens = json.loads(gt["attrs"]).get("global_tokens")
    tput = f", {tokens / mean:,.0f} tokens/s" if tokens else ""
    return f"measured window: {len(steps)} steps, mean step {mean * 1e3:.1f} ms{tput}"


@app.command(no_args_is_help=True)
def run(
    spec: Annotated[Path, typer.Argument(help="Single-run YAML spec (model, layout, knobs, hardware, protocol, data).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory to create (default: runs/<name>-<time>).")] = None,
    rate: Annotated[float, typer.Option("--rate", help="Telemetry samples per second per device.")] = 20.0,
    backends: Annotated[str, typer.Option("--backends", help="auto, or a comma list of nvidia, amd, host.")] = "auto",
    timeout: Annotated[float | None, typer.Option("--timeout", help="Stop the run after this many seconds.")] = None,
    check_only: Annotated[bool, typer.Option("--check", help="Only validate the spec; start nothing.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print per-step progress.")] = False,
) -> None:
    """Train SPEC with the built-in reference trainer and leave a complete run directory.

    The configuration is checked first: a broken rule (world size ≠ product of the degrees, heads
    not divisible by tp, fewer layers than stages, …) is reported with a fix and nothing starts.
    Then torchrun starts hardware.devices_per_node ranks (CPU + gloo, or CUDA + NCCL when GPUs
    are present) under the telemetry sampler. The run directory gets run.json (resolved spec,
    status, rank map with dp/tp/pp/cp/ep coordinates), telemetry/, events/rank-<r>.parquet (step,
    forward, backward, optimizer, communication intervals with warm-up/measured windows, tokens,
    loss), logs/rank-<r>.log and, when asked, profiles/.

    Example:  powertrain run examples/run-gpt-tp2-sp.yaml --out runs/tp2
    """
    try:
        cfg = load_run_config(spec)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    violations = validate(cfg)
    if violations:
        err.print(f"[red]error:[/] {spec} cannot run ({len(violations)} problem(s)); nothing was started:")
        for v in violations:
            err.print(f"  [bold]{v.rule}[/]: {escape(v.message)}\n    fix: {escape(v.fix)}")
        raise typer.Exit(2)
    if check_only:
        err.print(f"[green]ok:[/] {spec} is valid ({cfg.model.name}, {cfg.layout.resolve(cfg.world).label()}, "
                  f"world {cfg.world})")
        return
    if out is None:
        out = Path("runs") / f"{cfg.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    from powertrain.launch.local import launch_local

    try:
        res = launch_local(cfg, out, rate_hz=rate, backends=backends if backends == "auto" else backends.split(","),
                           echo=not quiet, timeout_s=timeout)
    except (MonitorError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    colour = "green" if res.status == "ok" else "red"
    err.print(f"[bold]run[/] {escape(str(res.run_dir))}  [{colour}]{res.status}[/]"
              + (f" — {escape(res.reason)}" if res.reason else ""))
    summary = _step_summary(res.run_dir)
    if summary:
        err.print(summary)
    if res.status != "ok" and res.info.get("error_tail"):
        err.print(res.info["error_tail"], markup=False, highlight=False)
    raise typer.Exit(0 if res.status == "ok" else 1)
