"""``powertrain calibrate``: fit the predictor's coefficients to measured runs, save a named profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from powertrain.cli import app

out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)


@app.command("calibrate")
def calibrate_cmd(
    runs: Annotated[list[Path], typer.Argument(help="Measured run directories, or sweep folders of them.")],
    name: Annotated[str, typer.Option("--name", "-n", help="Name of the profile to write.")],
    base: Annotated[str, typer.Option("--base", help="Profile to start from.")] = "default",
    params: Annotated[str | None, typer.Option("--params", help="Comma-separated coefficients to fit (default: GEMM efficiency, per-layer overhead, intra-node link efficiency).")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Write the profile YAML here instead of the user profile folder.")] = None,
) -> None:
    """Fit the model's efficiency, overlap and power coefficients to measured runs and store them.

    Reads each run's resolved configuration (run.json), its measured step time (step events in
    the measured window) and, where sampled, its mean device power; fits a few coefficients and
    reports the step-time error before and after. Use the profile with
    `powertrain predict SPEC --profile NAME`.

    Example: powertrain calibrate results/cpu-sweep --name cpu-laptop
    """
    from powertrain.predict.calibrate import collect_runs, fit_calibration
    from powertrain.predict.calibration import save_calibration

    try:
        measured = collect_runs(runs)
        if not measured:
            raise ValueError("no measured runs found (predictions and failed runs are skipped)")
        cal = fit_calibration(measured, name=name, base=base,
                              params=[p.strip() for p in params.split(",")] if params else None)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    path = save_calibration(cal, output)
    e = cal.error
    out.print(f"fitted {', '.join(e['fitted'])} on {e['n_runs']} runs: step-time MAPE "
              f"{e['step_time_mape_before']:.1%} → {e['step_time_mape']:.1%}")
    for label, rel in e["per_run"].items():
        out.print(f"  {rel:+.1%}  {label}")
    for rec in cal.host_probes:  # what the CPU coefficients are relative to; predictions reuse it
        out.print(f"host probe kept for {rec['threads']}-thread ranks: fp32 matmul {rec['matmul_flops'] / 1e9:.1f} GFLOP/s, "
                  f"copy {rec['copy_bytes_per_s'] / 1e9:.1f} GB/s ({rec['how']})")
    out.print(f"profile {cal.name!r} written to {path}")
