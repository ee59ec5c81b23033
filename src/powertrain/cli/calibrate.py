"""``powertrain calibrate``: fit the predictor's coefficients to measured runs, save a named profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
    params: Annotated[str | None, typer.Option("--params", help="Comma-separated coefficients to fit, at most one per run (default: GEMM efficiency, per-layer overhead, intra-node link efficiency; for ranks on a host CPU: GEMM efficiency, the gloo latency scale where a run has TP or FSDP, and the per-layer overhead where two runs differ only in micro-batch size; gemm_eff means the one that sets the runs' GEMM rate). One these runs' predictions do not move is refused.")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Write the profile YAML here instead of the user profile folder.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing profile of that name (never any other "
                                                        "file).")] = False,
    allow_worse: Annotated[bool, typer.Option("--allow-worse", help="Write the profile even when it predicts the runs' "
                                                                    "step time worse than its base profile does.")] = False,
) -> None:
    """Fit the model's efficiency, overlap and power coefficients to measured runs and store them.

    Reads each run's resolved configuration (run.json), its measured step time (step events in
    the measured window) and, where sampled, its mean device power; fits a few coefficients and
    reports the step-time error before and after. Use the profile with
    `powertrain predict SPEC --profile NAME`.

    The step's fixed time (step_overhead_s: data loading, zeroing gradients, the loss's logging) is
    measured, not fitted: the median time of the runs' steps outside forward, backward and the
    optimizer, read from their events (pipeline runs left out). Name step_overhead_s in --params to
    fit it instead.

    Example: powertrain calibrate results/cpu-sweep --name cpu-laptop

    Every run must have been measured on the device its spec names, and all on the same one (the
    profile's): a CPU stand-in run of an h200 spec, or a mix of devices, is refused with one line.

    --params names at most one coefficient per run, and only ones these runs' predictions depend on: a
    coefficient no run moves (moe_layer_overhead_s on dense runs; gemm_eff_fp8 on fp8 runs of a known
    generation, which run at gemm_eff_16 × gemm_lowp_scale) would be fitted to any value, so it is refused.

    NAME is a plain name (no path separators, not . or ..); an existing profile is replaced only with
    --force. In a sweep folder, a damaged run is skipped with one line (exit code 1 at the end).

    A fit whose step-time error on the runs is larger than the base profile's on the same runs is not
    written (exit code 2, one line with both errors): every later prediction with it would be worse than
    with the base. --allow-worse writes it anyway.
    """
    from powertrain.cli.summarize import skipped_exit
    from powertrain.predict.calibrate import fit_calibration
    from powertrain.predict.calibration import save_calibration

    damaged: list[str] = []
    try:
        path = _profile_target(name, output, force)
        measured = _collect(runs, damaged)
        if not measured:
            raise ValueError("no measured runs found (predictions and failed runs are skipped)")
        _check_devices([Path(m.label) for m in measured], base)
        cal = fit_calibration(measured, name=name, base=base, params=_param_names(params))
        if not allow_worse:
            _check_not_worse(cal.error, base)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, style="red")
        raise typer.Exit(2) from None
    path = save_calibration(cal, path)
    e = cal.error
    out.print(f"fitted {', '.join(e['fitted']) or 'no step-time coefficient'} on {e['n_runs']} runs: step-time MAPE "
              f"{e['step_time_mape_before']:.1%} → {e['step_time_mape']:.1%}")
    for label, rel in e["per_run"].items():
        out.print(f"  {rel:+.1%}  {label}")
    for coeff, rec in e.get("measured", {}).items():
        out.print(f"measured, not fitted: {coeff} = {rec['value'] * 1e3:.1f} ms on {rec['runs']} run(s) "
                  f"(the step's time outside forward, backward and the optimizer; the base profile had "
                  f"{rec['base_value'] * 1e3:.1f} ms)")
    if e.get("fitted_power"):
        out.print(f"fitted {', '.join(e['fitted_power'])} on the runs' measured mean device power")
    for coeff, why in e.get("not_fitted", {}).items():
        out.print(f"not fitted: {coeff} ({why}); it keeps the base profile's value")
    for rec in cal.host_probes:  # what the CPU coefficients are relative to; predictions reuse it
        out.print(f"host probe kept for {rec['threads']}-thread ranks: fp32 matmul {rec['matmul_flops'] / 1e9:.1f} GFLOP/s, "
                  f"copy {rec['copy_bytes_per_s'] / 1e9:.1f} GB/s ({rec['how']})")
    out.print(f"profile {cal.name!r} written to {path}")
    skipped_exit(damaged)


def _check_not_worse(error: dict[str, Any], base: str) -> None:
    """Refuse (ValueError, one line with both errors) a fit that predicts its own runs' step time worse than the
    base profile it started from; a difference below a millionth is rounding, not worse."""
    fit, before = float(error["step_time_mape"]), float(error["step_time_mape_before"])
    if fit > before * (1 + 1e-6) + 1e-12:
        raise ValueError(f"the fit predicts these {error['n_runs']} runs' step time worse than the base profile "
                         f"{base!r} does (step-time MAPE {fit:.2%} against {before:.2%}), so nothing was written; fit "
                         "other coefficients (--params) or add runs, or pass --allow-worse to write it anyway")


def _param_names(params: str | None) -> list[str] | None:
    """``--params`` as coefficient names (a trailing comma is no name); None when not given."""
    if params is None:
        return None
    names = [p.strip() for p in params.split(",") if p.strip()]
    if not names:
        raise ValueError("--params names no coefficient; name some (e.g. gemm_eff,layer_overhead_s) or leave it out")
    return names


def measured_device(run_dir: Path) -> tuple[str, str]:
    """(the device a run's spec names, the device it was measured on): a stand-in's ``ran_on``, or
    ``cpu`` for ranks on the CPU (run.json ``rank_map``), whatever the spec names."""
    from powertrain.hardware import is_cpu_name
    from powertrain.store import RunDir

    info = RunDir(run_dir).read()
    cfg = info.get("config")
    hw = cfg.get("hardware") if isinstance(cfg, dict) else None
    named = str(hw.get("device", "cpu")) if isinstance(hw, dict) else "cpu"
    named = "cpu" if is_cpu_name(named) else named
    stand_in = info.get("stand_in")
    if isinstance(stand_in, dict) and stand_in.get("ran_on"):
        return named, str(stand_in["ran_on"])
    ranks = info.get("rank_map") or []
    on_cpu = bool(ranks and str(ranks[0].get("device", "")).startswith("cpu"))
    return named, "cpu" if on_cpu else named


def _check_devices(run_dirs: list[Path], base: str) -> None:
    """Refuse (ValueError, one line) runs measured on another device than their spec names, runs of
    several devices together, and runs of another device than the base profile's."""
    from powertrain.predict.calibration import load_calibration

    seen: dict[str, Path] = {}
    for d in run_dirs:
        named, ran = measured_device(d)
        if ran != named:
            raise ValueError(f"{d}: its spec names {named} but it was measured on {ran} (a stand-in run); "
                             f"calibrate {named} on runs measured on {named}")
        seen.setdefault(named, d)
    if len(seen) > 1:
        raise ValueError(f"runs measured on several devices ({', '.join(f'{k}: {v}' for k, v in seen.items())}); "
                         "fit one profile per device")
    dev = load_calibration(base).device
    if dev is not None and seen and dev not in seen and not (dev == "cpu" and "cpu" in seen):
        raise ValueError(f"the base profile {base!r} is for {dev} but the runs were measured on {next(iter(seen))}; "
                         "start from a profile of that device, or from default")


def _profile_target(name: str, output: Path | None, force: bool) -> Path:
    """Where the profile goes; refuses a name that is no plain name, and an existing file unless --force
    and it is a profile (``WriteRefused``, a ValueError)."""
    from powertrain.predict.calibration import user_calibration_dir
    from powertrain.store.targets import check_name, check_output_file

    check_name(name, "--name")
    target = output if output is not None else user_calibration_dir() / f"{name}.yaml"
    return check_output_file(target, "calibration profile", force=force, same_kind=_is_profile,
                             option="--output" if output is not None else "--name")


def _is_profile(path: Path) -> bool:
    import yaml

    from powertrain.core.yamlfile import load_yaml_file

    try:
        raw = load_yaml_file(path, "calibration profile")
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and "coefficients" in raw and "name" in raw


def _collect(paths: list[Path], damaged: list[str]) -> list[Any]:
    """``collect_runs`` of ``paths``, with each sweep folder's damaged runs left out (their lines go to
    ``damaged``); a damaged run given by itself raises :class:`powertrain.store.validate.DamagedRun`.
    As in ``collect_runs``, a folder's runs that are not measured ones (failed, predictions) are skipped."""
    from powertrain.predict.calibrate import collect_runs
    from powertrain.store.validate import DamagedRun, check_run

    measured: list[Any] = []
    for p in paths:
        found = sorted(c for c in p.iterdir() if (c / "run.json").is_file()) \
            if p.is_dir() and not (p / "run.json").is_file() else []
        if not found:  # a run directory, or something collect_runs names as neither
            if (p / "run.json").is_file():
                check_run(p)
            measured += collect_runs([p])
            continue
        for d in found:
            try:
                check_run(d)
            except DamagedRun as exc:
                damaged.append(str(exc))
                continue
            try:
                measured += collect_runs([d])
            except ValueError:
                continue
    return measured
