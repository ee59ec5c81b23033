"""``powertrain predict``: the analytical model on a run spec, a sweep spec, or the study's matrices."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from powertrain.cli import app
from powertrain.cli.plan import MAX_POINTS_HELP, fail
from powertrain.spec.bounds import DEFAULT_MAX_POINTS, shown

if TYPE_CHECKING:
    from powertrain.predict import Calibration, Prediction
    from powertrain.spec.run import RunConfig

    Results = list[tuple[RunConfig, Prediction]]

out = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)

_COLS = (("tokens_per_s", "tok/s", "{:,.0f}"), ("mfu", "MFU", "{:.1%}"), ("step_time_mean_s", "step s", "{:.3g}"),
         ("power_mean_w", "W mean", "{:.0f}"), ("power_peak_w", "W peak", "{:.0f}"), ("j_per_token", "J/tok", "{:.3g}"),
         ("clock_sm_mean_mhz", "MHz", "{:.0f}"), ("throttle_share_power_cap", "capped", "{:.0%}"),
         ("throttle_share_thermal_sw", "hot-thr", "{:.0%}"), ("temp_peak_c", "°C peak", "{:.0f}"),
         ("hottest_slot", "hottest", "{}"), ("link_bw_share", "NVLink", "{:.0%}"), ("mem_per_device_bytes", "GiB/dev", "{:.3g}"))
PEAK_NOTE = ("W peak: the instantaneous field (power_w, a ~25 ms average refreshed every 100 ms) as a 20 Hz sampler "
             "records it over the measured window; capped / hot-thr: share of device time power-capped / thermally "
             "slowed; MHz: mean SM clock; NVLink: bytes sent ÷ step ÷ NVLink bandwidth. --json has every field's peak "
             "(breakdown.power.peaks) and each slot's clock and temperature (breakdown.slots).")


def _fmt(key: str, fmt: str, v: Any) -> str:
    if v is None:
        return "—"
    if key == "mem_per_device_bytes":
        v = float(v) / 2**30
    return fmt.format(v)


@app.command("predict")
def predict_cmd(
    spec: Annotated[Path | None, typer.Argument(help="Run spec or sweep spec YAML (omit with --study).")] = None,
    profile: Annotated[str, typer.Option("--profile", "-p", help="Calibration profile name or YAML path.")] = "default",
    out_dir: Annotated[Path | None, typer.Option("--out", "-o", help="Write each prediction as a run directory here.")] = None,
    study: Annotated[bool, typer.Option("--study", help="Predict the study's 32×H200 and 64×H100 matrices.")] = False,
    figure: Annotated[Path | None, typer.Option("--figure", help="With --study: write the cluster comparison (PNG+SVG) to this stem.")] = None,
    timeline: Annotated[Path | None, typer.Option("--timeline", help="Draw the first configuration's power over a few steps at ≤ 1 ms, with what a 20 Hz sampler would record (PNG+SVG), to this stem.")] = None,
    hardware: Annotated[list[Path] | None, typer.Option("--hardware", help="Extra hardware catalog YAML (repeatable), added after $POWERTRAIN_HARDWARE's files; a later entry of the same name wins.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print summaries as JSON lines (one object per line).")] = False,
    force: Annotated[bool, typer.Option("--force", help="With --out: replace earlier predictions there (never a "
                                                        "measured or imported run).")] = False,
    max_points: Annotated[int, typer.Option("--max-points", min=1, help=MAX_POINTS_HELP)] = DEFAULT_MAX_POINTS,
) -> None:
    """Predict memory, step time, throughput, power, energy and temperature without running anything.

    Every result is labelled a prediction, with its profile and the model's validation error. The
    "tok/s 80% interval" column is where 80 % of runs the profile never saw fall: it comes from the
    profile's leave-one-source-out errors (`benchmarks/predict_accuracy.py`), not from its fit. With --out, each configuration becomes a run directory (kind "prediction") that `report` and
    `compare` read like a measured run.

    CPU specs: the CPU's speed comes from the profile's host probe when the profile was fitted on CPU
    runs (`powertrain calibrate`; another thread count scales its nearest probe), so repeated calls give
    identical numbers on any machine; a profile with no probe takes a fresh probe of this host, which
    varies with the host's load (a note says so).

    Examples:

      powertrain predict examples/study-h200-parallelism.yaml --profile default

      powertrain predict sweep.yaml --out results/predicted

      powertrain predict --study --figure results/study-clusters

      powertrain predict examples/run-llama-1gpu.yaml --timeline results/llama-1gpu-power
    """
    _check_options(spec, study, figure, out_dir, force)
    if hardware:
        _use_hardware_files(hardware)
    cal = _calibration_or_exit(profile)
    skipped: list[str] = []
    configs = _configs_or_exit(spec, study, max_points, skipped)
    t0 = time.perf_counter()
    results = _predict_all(configs, cal, skipped)
    elapsed = time.perf_counter() - t0
    _report_skipped(spec, skipped, predicted=len(results))
    if out_dir is not None:
        _write_run_dirs(results, out_dir, force)
    _note_fresh_probes(results, cal)
    if as_json:
        _print_json(results)
    else:
        _print_table(results, cal, elapsed)
    if study and figure is not None:
        _write_figure(results, figure)
    if timeline is not None and results:
        _write_timeline(results[0], timeline)


def _check_options(spec: Path | None, study: bool, figure: Path | None, out_dir: Path | None, force: bool) -> None:
    """Options that only act together with another: alone they would be accepted and do nothing."""
    if spec is not None and study:
        fail(f"{shown(spec)} and --study: --study predicts the study's matrices, not a spec; give one of them")
    if figure is not None and not study:
        fail("--figure draws the --study comparison: add --study, or drop --figure")
    if force and out_dir is None:
        fail("--force applies to --out (replace earlier predictions there): add --out DIR, or drop --force")


def _use_hardware_files(hardware: list[Path]) -> None:
    """Add user hardware YAML to the catalog (for this process and what it starts).

    The files go after those already in $POWERTRAIN_HARDWARE, never instead of them: a site's entries stay,
    and a --hardware entry of the same name wins, the order ``hardware.load_catalog`` documents."""
    from powertrain.hardware.catalog import use_catalog_file

    for h in hardware:
        use_catalog_file(h)


def _calibration_or_exit(profile: str) -> Calibration:
    from powertrain.predict import load_calibration

    try:
        return load_calibration(profile)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


def _report_skipped(spec: Path | None, skipped: list[str], predicted: int) -> None:
    """One line per skipped configuration; when nothing was predicted, one error line instead (exit 1)."""
    if predicted == 0:  # nothing valid remains
        first = f"; {skipped[0]}" if skipped else ""
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        fail(f"{shown(spec) if spec else 'the study'}: nothing was predicted, every configuration was skipped"
             f"{first}{more}", code=1)
    for why in skipped:
        err.print(f"[yellow]skipped[/] {escape(shown(why))}")


def _configs_or_exit(spec: Path | None, study: bool, max_points: int = DEFAULT_MAX_POINTS,
                     skipped: list[str] | None = None) -> list[RunConfig]:
    """The configurations to predict: the study's matrices, or every grid point of ``spec``."""
    if study:
        from powertrain.predict.study import study_configs

        return list(study_configs())
    if spec is None:
        err.print("[red]error:[/] give a SPEC file, or --study for the study's matrices")
        raise typer.Exit(2)
    from powertrain.plan.planner import run_id
    from powertrain.plan.sweep_spec import SpecError, expand, load_sweep_spec

    try:
        sweep_spec = load_sweep_spec(spec)
    except SpecError as exc:
        fail(str(exc))
    try:
        expanded = expand(sweep_spec, max_points)
    except SpecError as exc:
        fail(f"{shown(spec)}: {exc}")
    configs = []
    for e in expanded:
        if e.config is None:
            (skipped if skipped is not None else []).append(f"grid point {e.index}: {e.error}")
        else:
            # name each grid point as the planner does, so predictions line up with measured runs
            configs.append(e.config.model_copy(update={"name": run_id(e.settings)}) if e.settings else e.config)
    return configs


def _predict_all(configs: list[RunConfig], cal: Calibration, skipped: list[str] | None = None) -> Results:
    from powertrain.predict import predict

    results = []
    for cfg in configs:
        try:
            results.append((cfg, predict(cfg, cal)))
        except (KeyError, ValueError) as exc:
            why = str(exc.args[0]) if type(exc) is KeyError and exc.args else str(exc)  # KeyError's str quotes
            (skipped if skipped is not None else []).append(f"{cfg.name}: {why}")
    return results


def _write_run_dirs(results: Results, out_dir: Path, force: bool = False) -> None:
    """One configuration: ``out_dir`` is its run directory; several: one run directory each under it.

    Every target is checked before anything is written (never over a measured run, --force only over
    predictions; names are one path component); a refusal is one line, exit 2."""
    from powertrain.predict import write_prediction
    from powertrain.store.targets import WriteRefused, check_name, check_run_target

    try:
        targets = []
        for cfg, _ in results:
            if len(results) > 1:
                if (out_dir / "run.json").is_file():
                    raise WriteRefused(f"--out {out_dir}: is a run directory; several predictions need a folder "
                                       "of their own")
                target = out_dir / check_name(cfg.name.replace("/", "_"), "run name")
            else:
                target = out_dir
            if target in targets:
                raise WriteRefused(f"--out {out_dir}: two configurations are both named {target.name!r}")
            targets.append(check_run_target(target, "prediction", force=force))
        for (cfg, pred), target in zip(results, targets, strict=True):
            write_prediction(target, cfg, pred, force=force)
    except (WriteRefused, OSError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, style="red")
        raise typer.Exit(2) from None
    err.print(f"wrote {len(results)} prediction run director{'y' if len(results) == 1 else 'ies'} under {out_dir}")


def _note_fresh_probes(results: Results, cal: Calibration) -> None:
    """Say where a CPU speed came from a probe of this host rather than from the calibration."""
    fresh = sorted({p["source"] for _, pred in results if (p := pred.breakdown.get("host_probe"))})
    for src in fresh:
        if not src.startswith("calibration profile"):
            err.print(f"[yellow]note:[/] CPU speed from the {src} (profile {cal.name!r} holds no probe for these "
                      "ranks' threads); to predict from the probes of measured runs, calibrate on them "
                      "(`powertrain calibrate RUN... --name NAME`) and predict with --profile NAME")


def _print_json(results: Results) -> None:
    """JSON lines: one compact object per configuration, nothing else on stdout."""
    for cfg, pred in results:
        sys.stdout.write(json.dumps(pred.summary(cfg.model_dump(mode="json")), default=str) + "\n")
    sys.stdout.flush()


def _print_table(results: Results, cal: Calibration, elapsed: float) -> None:
    table = Table(title=f"PREDICTED with profile {cal.name!r}", header_style="bold")
    table.add_column("run", overflow="fold")
    for _, label, _ in _COLS:
        table.add_column(label, justify="right")
    table.add_column("tok/s 80% interval", justify="right")
    table.add_column("fits")
    from powertrain.predict.output import prediction_interval

    for cfg, pred in results:
        m = pred.metrics
        iv = prediction_interval(pred)
        table.add_row(cfg.name, *(_fmt(k, f, m.get(k)) for k, _, f in _COLS),
                      "—" if iv is None else f"{iv[0]:,.0f}–{iv[1]:,.0f}",
                      "yes" if pred.fits else "[red]no[/]")
    out.print(table)
    if any(p.metrics.get("power_peak_w") is not None for _, p in results):
        out.print(PEAK_NOTE)
    # no pooled or in-sample "model error" here: the held-out notes below quote clean sets only, GPU rows only
    out.print(f"{len(results)} configurations predicted in {elapsed:.2f} s.")
    from powertrain.hardware import describe_hardware, device_by_name, is_cpu_name

    for name in dict.fromkeys(c.hardware.device for c, _ in results if not is_cpu_name(c.hardware.device)):
        dev, note = device_by_name(name, "hardware.device")
        if note:
            out.print(f"note: {escape(note)}")
        out.print(f"hardware assumed: {escape(describe_hardware(dev))}")

    # the held-out runs are GPU runs: what they say is for GPU rows
    with_interval = [c for c, p in results if prediction_interval(p) is not None and not is_cpu_name(c.hardware.device)]
    for arch in ("dense", "moe"):
        if any((c.model.experts > 1) == (arch == "moe") for c in with_interval):
            note = heldout_note(cal.error, arch)
            if note:
                out.print(note)
    unseen = unvalidated_devices([p.breakdown["device"] for c, p in results if not is_cpu_name(c.hardware.device)])
    if unseen:
        out.print(f"note: no published run on a GPU of the generation of {', '.join(unseen)} was fitted or held out: "
                  "its GEMM efficiency ratio is the literature's or, where none is known, Hopper's, so these rows' "
                  "figures and interval are not validated")


def unvalidated_devices(devices: list[str]) -> list[str]:
    """Catalog devices among ``devices`` whose GPU generation no packaged published run (calibration or held
    out) has: what the model says about them rests on priors alone."""
    from powertrain.predict.precision import generation

    gens = {d: generation(d) for d in dict.fromkeys(devices)}
    if all(g in _VALIDATED_GENERATIONS for g in gens.values()):
        return []
    seen = published_generations()
    return [d for d, g in gens.items() if g not in seen]


# generations every packaged published set is known to cover (checked against the files by a test); others are
# looked up in the files, which is slower and only needed for rarer devices
_VALIDATED_GENERATIONS = frozenset({"volta", "ampere", "hopper", "blackwell", "blackwell_ultra", "cdna3", "cdna4"})


def published_generations() -> set[str]:
    """GPU generations of the packaged published runs (calibration file and held-out sets)."""
    from powertrain.predict.precision import generation
    from powertrain.predict.published import HELDOUT_FILES, load_published

    runs = load_published() + [r for path in HELDOUT_FILES for r in load_published(path)]
    return {generation(r.case.device.name) for r in runs if r.case is not None}


def heldout_note(error: dict[str, Any], arch: str) -> str | None:
    """One line on how the profile did on ``arch`` ("dense" or "moe") runs of the clean held-out sets
    (``predict/data/validation_ledger.yaml``: never fitted on, no change made after reading them), from
    ``error.heldout`` (written by benchmarks/predict_accuracy.py --save-heldout); where no clean set has such
    runs, that the figures are validation figures only. Validation sets are never pooled into it."""
    from powertrain.predict.validation import ledger

    books = ledger()
    label = "MoE" if arch == "moe" else "dense"
    sets = [(v[arch], books[name].label) for name, v in (error.get("heldout") or {}).items()
            if name in books and books[name].status == "clean" and isinstance(v, dict)
            and isinstance(v.get(arch), dict) and "interval_80_share" in v[arch]]
    if not sets:
        return (f"note: no clean held-out set has {label} runs: the {label} interval and error are validation "
                "figures only (docs/model.md §9)")
    n = sum(int(h["runs"]) for h, _ in sets)
    share = sum(h["interval_80_share"] * h["runs"] for h, _ in sets) / n
    mape = sum(h["mape"] * h["runs"] for h, _ in sets) / n
    bias = sum(h["bias"] * h["runs"] for h, _ in sets) / n
    return (f"note: held out ({', '.join(lbl for _, lbl in sets)}: {n} {label} runs never fitted on, no change made "
            f"after reading them): throughput error {mape:.0%}, mean {bias:+.0%}; the 80 % interval held {share:.0%}")


def _write_timeline(result: tuple[RunConfig, Prediction], stem: Path) -> None:
    from powertrain.predict.figures import plot_step_timeline

    cfg, pred = result
    if pred.physics is None:
        err.print(f"note: --timeline: {cfg.name} runs on {pred.breakdown['device']}, which has no power model (no "
                  "sensor): no timeline drawn")
        return
    step = pred.metrics["step_time_mean_s"]
    # ≥ 2.5 s where the step allows, so the 1 s average field has updates to draw; at most 40 steps
    for p in plot_step_timeline(pred, stem, steps=max(1, min(40, math.ceil(2.5 / step))) if step else 1):
        out.print(f"wrote {p}")


def _write_figure(results: Results, figure: Path) -> None:
    from powertrain.predict.figures import plot_cluster_comparison
    from powertrain.predict.study import StudyPoint

    # the study's names are cluster/model/layout/variant/mb; a point's label is what follows the model, as
    # predict_study labels it (the figure reads the layout from it)
    pts = [StudyPoint(c.name.split("/")[0], c.model.name, c.name.split("/", 2)[2], c, p) for c, p in results]
    for p in plot_cluster_comparison(pts, figure):
        out.print(f"wrote {p}")
