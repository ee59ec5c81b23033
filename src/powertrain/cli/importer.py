"""``powertrain import KIND SOURCE... --out RUN_DIR``: other tools' records → a run directory."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from powertrain.cli import app
from powertrain.cli.root import shown_text
from powertrain.core.names import printable

if TYPE_CHECKING:
    from powertrain.importers.common import RunBuilder

KIND_HELP = (
    "Format of the sources: nvsmi (nvidia-smi --query-gpu CSV), mlperf (MLLOG power/result logs or "
    "a submission run folder), zeus (Zeus window/power CSV, Perseus .prof.json), powertraces "
    "(long per-GPU CSV), study_csv (<metric>_<rank>.csv files or their folder), framework_log "
    "(Megatron-LM, torchtitan, NeMo step lines), kineto (PyTorch profiler traces), or auto."
)


@app.command("import")
def import_cmd(  # long function: mostly the typer declarations of the import options
    kind: str = typer.Argument(..., help=KIND_HELP, metavar="KIND"),
    sources: list[Path] = typer.Argument(..., help="Files or folders to read (.gz is fine).", metavar="SOURCE..."),
    out: Path = typer.Option(..., "--out", "-o", help="Run directory to create (must not exist or be empty)."),
    tz: str | None = typer.Option(
        None, "--tz", help="Time zone of local-time stamps in the sources (IANA name, UTC, +HH:MM). "
        "Default: this machine's zone; recorded in run.json. Refused when no source holds a local time "
        "(Perseus profiles, NeMo logs, Zeus windows, MLLOG, stamps with their own zone) and no --anchor or "
        "--window time is written without a zone."),
    gpus: int | None = typer.Option(
        None, "--gpus", min=1, help="nvsmi without an index/uuid column: GPUs per sample (default: inferred)."),
    host: list[str] | None = typer.Option(
        None, "--host", help="nvsmi: host name for each file, in order (default node0, node1, ...)."),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", min=1, help="study_csv: ranks per node (rank → node, slot; default 8)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="framework_log: sequence length, to count tokens."),
    anchor: str | None = typer.Option(
        None, "--anchor", metavar="TIME",
        help="For sources without wall-clock times (NeMo progress bars, Megatron logs without [date] stamps, "
        "Perseus profiles, Zeus windows on the monotonic clock): when the first step started, as ISO-8601 "
        "(2024-05-01T10:00:05; without a zone it is read in --tz) or epoch seconds. Such a source is refused "
        "without it. With a GPU CSV of the same job: take the time in that CSV where GPU power first rises to "
        "its training level (or the job's start from the scheduler, e.g. sacct -o Start, plus the start-up "
        "time printed in the log); a warning says when the steps then fall outside the CSV."),
    warmup_steps: int | None = typer.Option(
        None, "--warmup-steps", min=0, metavar="N",
        help="Steps at the start that are warm-up, not measured (default 0; MLPerf measures only inside its "
        "own run_start → run_stop). Every other imported step is in the measured window."),
    detect: bool = typer.Option(True, "--detect/--no-detect",
                                help="Find checkpoint dips, stalls and the end of activity in GPU power."),
    hta: bool = typer.Option(False, "--hta", help="kineto: also record Holistic Trace Analysis' overlap figure "
                             "(pip install 'powertrain[kineto]')."),
    name: str | None = typer.Option(None, "--name", help="Run name stored in run.json (default: folder name)."),
    result: str | None = typer.Option(
        None, "--result", metavar="N",
        help="mlperf: a benchmark folder as MLCommons publishes it (result_N.txt beside power/result_N/) is "
        "imported whole, one run directory per result under --out (named result_N); --result N imports only "
        "result_N into --out."),
    window: str | None = typer.Option(
        None, "--window", metavar="START,END",
        help="The run's measurement window, when you know it better than the sources do: two times, each "
        "ISO-8601 (without a zone read in --tz) or epoch seconds. Written to run.json as the run's window "
        "(source \"user --window\"); energy, power and time are reported over it."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier import at --out (never a measured run "
                               "or a prediction)."),
    max_bytes: str = typer.Option(
        "2GiB", "--max-bytes", metavar="N",
        help="Size cap per source file, counted while reading (decompressed for .gz): bytes, or with a unit "
        "KiB, MiB, GiB (default 2GiB). A source over it is refused with one line."),
) -> None:
    """Import GPU logs, MLPerf power logs, Zeus/Perseus outputs, training logs or profiler traces.

    The run directory holds telemetry/*.parquet, events/*.parquet and run.json (provenance: every source with its sha256, what was mapped to which column, what was dropped). It is written atomically: after an error nothing is left behind.

    Examples:

      powertrain import nvsmi gpu.csv --out runs/old1 --tz Europe/Berlin

      powertrain import mlperf results/gpt3/ --out runs/mlperf-gpt3

      powertrain import mlperf training_results_v4.0/SMC/results/SMC_H100/gpt3 --out runs/gpt3  (every result_N)

      powertrain import auto gpu.csv train.log --out runs/joined

      powertrain import framework_log nemo.log --anchor 2024-05-01T10:00:05 --warmup-steps 2 --out runs/nemo

    Every imported step is in the measured window (less --warmup-steps), so `powertrain summarize` and
    `powertrain report` show step time, throughput and, where power was imported, energy.

    An option that no source of the import reads (--gpus, --host, --gpus-per-node, --seq-len, --anchor,
    --warmup-steps, --hta; --tz unless a source holds local wall-clock stamps or an --anchor / --window
    time has no zone) is refused.
    """
    _check_hosts(host)
    anchor_ns = _anchor_ns(anchor, tz)
    cap = _max_bytes(max_bytes)
    options: dict[str, Any] = dict(anchor_ns=anchor_ns, tz=tz, gpus=gpus, hosts=host or None,
                                   gpus_per_node=gpus_per_node, seq_len=seq_len, detect_events=detect, name=name,
                                   hta=hta or None, warmup_steps=warmup_steps)
    if window is not None:  # --window
        options["window_ns"] = _window_ns(window, tz)
    from powertrain.importers.common import reads_zone

    # --tz also places the --anchor / --window times written without a zone, whatever the sources hold
    options["zone_of_options"] = any(reads_zone(t) for t in [anchor or "", *(window or "").split(",")] if t)
    runs = _mlperf_runs(kind, sources, result)
    if runs is None:
        builder, run_dir = _import(kind, sources, out, force=force, max_bytes=cap, **options)
        _print_result(builder, run_dir)
        return
    if len(runs) > 1:
        typer.echo(f"{sources[0]}: a benchmark folder with {len(runs)} runs ({', '.join(n for n, _ in runs)}) "
                   f"→ one run directory each under {out}")
    for run_name, run_sources in runs:
        target = out if result is not None else out / run_name
        builder, run_dir = _import("mlperf", run_sources, target, force=force, max_bytes=cap, **options)
        _print_result(builder, run_dir)


def _mlperf_runs(kind: str, sources: list[Path], result: str | None) -> list[tuple[str, list[Path]]] | None:
    """The runs of an MLCommons-published benchmark folder (all, or ``--result N``); None for other sources."""
    from powertrain.importers.detect import detect_kind
    from powertrain.importers.mlperf import benchmark_runs

    is_mlperf = kind == "mlperf" or (kind == "auto" and len(sources) == 1 and sources[0].is_dir()
                                     and detect_kind(sources[0]) == "mlperf")
    runs = benchmark_runs(sources[0]) if is_mlperf and len(sources) == 1 else None
    if result is not None and not is_mlperf:
        raise _fail(ValueError("--result applies to mlperf sources only: drop it"))
    if runs is None:
        if result is not None:
            raise _fail(ValueError(f"--result {result}: {', '.join(map(str, sources))} is not a benchmark folder "
                                   "laid out as MLCommons publishes results (result_N.txt beside power/result_N/)"))
        return None
    if result is None:
        return runs
    want = result if result.startswith("result_") else f"result_{result}"
    chosen = [r for r in runs if r[0] == want]
    if not chosen:
        raise _fail(ValueError(f"--result {result}: {sources[0]} has no {want}; its runs are "
                               f"{', '.join(n for n, _ in runs)}"))
    return chosen


def _fail(exc: Exception) -> typer.Exit:
    # one line: control characters a source put in the message (a binary header, say) are escaped
    Console(stderr=True, highlight=False).print(f"[red]error: {shown_text(exc)}[/red]", soft_wrap=True)
    return typer.Exit(2)


def _check_hosts(hosts: list[str] | None) -> None:
    """``--host``: each a name (a host names its telemetry file: ``../../x`` would write outside the run)."""
    from powertrain.core.names import check_name

    for i, h in enumerate(hosts or []):
        try:
            check_name(h, "--host" if len(hosts or []) == 1 else f"--host #{i + 1}")
        except ValueError as exc:
            raise _fail(exc) from None


def _anchor_ns(anchor: str | None, tz: str | None) -> int | None:
    from powertrain.importers.common import parse_anchor

    try:
        return parse_anchor(anchor, tz) if anchor is not None else None
    except ValueError as exc:
        raise _fail(exc) from None


def _window_ns(window: str, tz: str | None) -> tuple[int, int]:
    """``--window START,END`` → epoch ns (a bad value is one red line, exit 2)."""
    from powertrain.importers.registry import parse_window

    try:
        return parse_window(window, tz)
    except ValueError as exc:
        raise _fail(exc) from None


def _max_bytes(text: str) -> int:
    """``--max-bytes``: ``N`` bytes or ``N`` with KiB/MiB/GiB (also K/M/G, KB/MB/GB as powers of 1024)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise _fail(ValueError(f"--max-bytes {text!r}: give a positive size such as 500MiB, 2GiB or 1048576"))
    unit = m.group(2).upper()
    return int(float(m.group(1)) * (1024 ** ("KMGT".find(unit) + 1) if unit else 1))


def _import(kind: str, sources: list[Path], out: Path, *, force: bool = False, max_bytes: int | None = None,
            **options: Any) -> tuple[RunBuilder, Path]:
    """Build and write the run directory; a refused source is one red line (exit 2), a tolerated
    quirk one yellow warning line each (the importers' :class:`ImportWarning_`)."""
    from powertrain.importers import SourceFormatError, build
    from powertrain.importers.common import ImportWarning_, byte_cap
    from powertrain.store.targets import check_run_target

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImportWarning_)
        try:
            check_run_target(out.absolute(), "import", force=force)  # before reading anything
            with byte_cap(max_bytes):
                builder = build(kind, sources, **options)
            run_dir = builder.write(out, force=force)
        except (SourceFormatError, OSError, ValueError, ImportError) as exc:
            raise _fail(exc) from None
    err = Console(stderr=True, highlight=False)
    for w in caught:
        if issubclass(w.category, ImportWarning_):
            err.print(f"[yellow]warning: {shown_text(w.message)}[/yellow]", soft_wrap=True)
    return builder, run_dir


def _print_result(builder: RunBuilder, run_dir: Path) -> None:
    """What was imported: rows, hosts, devices, events by kind, window, job devices, detected events, energy."""
    tel = builder.telemetry()
    ev = builder.events()
    devices = {(h, d) for h, d in zip(tel.column("host").to_pylist(), tel.column("device").to_pylist(), strict=True)} \
        if tel.num_rows else set()
    typer.echo(f"imported {len(builder.sources)} source(s) as {builder.format} → {printable(run_dir)}")
    typer.echo(f"  telemetry: {tel.num_rows} rows, {len({h for h, _ in devices})} host(s), {len(devices)} device(s)")
    kinds: dict[str, int] = {}
    for k in ev.column("kind").to_pylist() if ev.num_rows else []:
        kinds[k] = kinds.get(k, 0) + 1
    typer.echo(f"  events: {ev.num_rows} rows" + (f" ({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))})" if kinds else ""))
    mw = builder.info.get("measured_window")
    if mw:
        typer.echo(f"  measured window: {mw['measured_steps']} step(s) from step {mw['first_measured_step']}"
                   f" ({mw['warmup_steps']} warm-up)")
    if "job_device_count" in builder.info:
        n = builder.info["job_device_count"]
        typer.echo(f"  job devices: {n if n is not None else 'unknown'} ({builder.info.get('job_device_count_source')})")
    det = builder.info.get("detected_events")
    if det:
        typer.echo(f"  detected events: {len(det)} (" + printable(", ".join(sorted({str(d['name']) for d in det}))) + ")")
    _print_energy(builder, run_dir)
    if builder.dropped:
        typer.echo(f"  not imported: {len(builder.dropped)} item(s), listed in run.json import.dropped")


def _print_energy(builder: RunBuilder, run_dir: Path) -> None:
    """The run's energy as ``summary.json`` states it (written here), naming its window; for MLPerf
    also the measurement-window energy and the MLCommons score beside it."""
    from powertrain.analyze.summary import load_summary

    tel = builder.telemetry()
    has_power = tel.num_rows > 0 and tel.column("power_w").null_count < tel.num_rows
    ml = builder.info.get("mlperf") or {}
    if not has_power and "mlperf" not in builder.info:
        return
    summ = load_summary(run_dir)
    win = summ.get("window") or {}
    energy = (summ.get("metrics") or {}).get("energy_j")
    where = f"{win.get('source', 'no window')}, {win.get('seconds') or 0:.1f} s"
    if energy is not None:
        typer.echo(f"  energy ({where}): {energy / 3.6e6:.4f} kWh = {energy:.0f} J (summary.json energy_j)")
    else:
        why = (summ.get("why_null") or {}).get("energy_j") or (ml.get("why_null") or {}).get("energy_run_j")
        typer.echo(f"  energy ({where}): unknown — {why or 'no power readings in the window'}")
    held = ml.get("edge_held_s") or {}
    if held.get("nodes_held"):
        typer.echo(f"    edges held: {held['nodes_held']} node(s), up to {held['max']:.2f} s "
                   "(data_quality edge_held_s per node)")
    if ml.get("measurement_window_energy_kwh") is not None:
        typer.echo(f"  measurement-window energy (power_measurement_start→stop, nodes): "
                   f"{ml['measurement_window_energy_kwh']:.4f} kWh")
    if ml.get("score_kwh") is not None:
        parts = ml.get("score_parts_j") or {}
        rep = ml.get("reported_energy_kwh")
        extra = (f"; submitter's total_power.txt {rep} kWh, nodes {100 * ml['score_nodes_vs_reported_rel']:+.3f}%"
                 if rep and ml.get("score_nodes_vs_reported_rel") is not None else "")
        typer.echo(f"  MLCommons score (mean power × time-to-train): {ml['score_kwh']:.4f} kWh = nodes "
                   f"{(parts.get('nodes') or 0) / 3.6e6:.4f} + switch {(parts.get('switch') or 0) / 3.6e6:.4f}{extra}")
