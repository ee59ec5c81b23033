"""``powertrain advise``: the best layout for a model on a cluster under power, thermal and memory limits."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from powertrain.cli import app
from powertrain.cli.plan import fail

if TYPE_CHECKING:
    from powertrain.advise.search import Advice
    from powertrain.predict import Calibration

out = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True)


def _floats(text: str | None, option: str) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{option} {text!r}: give comma-separated numbers, e.g. 700,600,500")


@app.command("advise")
def advise_cmd(  # long function: one typed option per input, constraint and output, as typer needs them
    model: Annotated[str, typer.Option("--model", "-m", help="Catalog model name, or a YAML file with a model "
                                                             "(or a run spec whose model: is one).")],
    hardware: Annotated[str, typer.Option("--hardware", help="A catalog device name (a near name says which entry it became), cpu, or the path of a hardware YAML describing one device (your GPU and network: see docs/model.md §2).")],
    gpus: Annotated[int, typer.Option("--gpus", "-g", min=1, help="Devices (ranks) in all.")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", min=1, help="Samples per optimizer step.")],
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", min=1, help="Nodes the devices are spread over (default: as many of the device's nodes as --gpus needs).")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1, help="Sequence length (default: the "
                                                                         "model's).")] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="fp32, bf16, fp16, fp8, fp4 (default bf16; "
                                                                      "fp32 on a CPU).")] = None,
    engine: Annotated[str | None, typer.Option("--engine", help="builtin (powertrain's trainer: its limits apply) "
                                                                "or megatron (default for GPUs).")] = None,
    objective: Annotated[str, typer.Option("--objective", "-O", help="throughput, energy (J/token), time "
                                                                     "(--tokens), cost (--tokens and prices), "
                                                                     "pareto.")] = "throughput",
    tokens: Annotated[float | None, typer.Option("--tokens", help="Tokens to train (time and cost).")] = None,
    gpu_hour_price: Annotated[float | None, typer.Option("--gpu-hour-price", help="Price per GPU-hour.")] = None,
    kwh_price: Annotated[float | None, typer.Option("--kwh-price", help="Price per kWh.")] = None,
    power_cap: Annotated[float | None, typer.Option("--power-cap", help="Per-GPU power limit (W) the site allows.")] = None,
    node_kw: Annotated[float | None, typer.Option("--node-kw", help="Node power budget (kW, predicted peak at the wall: GPUs + host, through the power supplies).")] = None,
    rack_kw: Annotated[float | None, typer.Option("--rack-kw", help="Rack power budget (kW, predicted peak).")] = None,
    nodes_per_rack: Annotated[int | None, typer.Option("--nodes-per-rack", min=1, help="Nodes sharing --rack-kw "
                                                                                        "(default: all).")] = None,
    max_temp: Annotated[float | None, typer.Option("--max-temp", help="Hottest GPU may reach this (°C).")] = None,
    no_throttle: Annotated[bool, typer.Option("--no-throttle", help="Refuse layouts predicted to slow any GPU thermally (power capping, which most large GEMMs on Hopper are under, is not refused: it is the 'capped' column).")] = False,
    mem_headroom: Annotated[float | None, typer.Option("--mem-headroom", help="Share of each device's memory kept free beyond the predicted need (default 0.1: fragmentation, NCCL buffers and peaks the memory model does not count; 0 uses it all).")] = None,
    power_caps: Annotated[str | None, typer.Option("--power-caps", help="Power caps to search, W (default with an "
                                                                        "energy objective or a power limit: "
                                                                        "100…50 % of TDP).")] = None,
    clock_locks: Annotated[str | None, typer.Option("--clock-locks", help="SM clock locks to search, as fractions "
                                                                          "of the maximum, e.g. 0.9,0.8.")] = None,
    max_vp: Annotated[int, typer.Option("--max-vp", min=1, max=64, help="Most virtual stages tried.")] = 8,
    top: Annotated[int, typer.Option("--top", min=1, max=100, help="How many to list.")] = 5,
    profile: Annotated[str, typer.Option("--profile", "-p", help="Calibration profile name or YAML path.")] = "default",
    emit: Annotated[list[str] | None, typer.Option("--emit", help="FILE.yaml (runnable spec of #1 + FILE-sweep.yaml "
                                                                  "of the top N), or megatron, nemo, torchtitan "
                                                                  "(print flags; with --json, in the JSON). "
                                                                  "Repeatable.")] = None,
    max_sm_clock_mhz: Annotated[int | None, typer.Option("--max-sm-clock-mhz", min=1, max=100_000, help=(
        "The GPUs' maximum SM clock (MHz; nvidia-smi -q -d CLOCK, Max Clocks): --clock-locks are fractions of it, "
        "predicted as that clock and written by --emit as knobs.sm_clock_mhz (default: the catalog's, where it "
        "has one)."))] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Folder for the advice report (report.html, figures/, advice.json).")] = None,
    placement: Annotated[Path | None, typer.Option("--placement", help="Measured or imported run directory "
                                                                       "(per-slot profile → stage placement), or "
                                                                       "'model' for the predictor's slot model.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the advice as one JSON object (--emit, --html "
                                                         "still write their files; messages go to stderr).")] = False,
    no_anchors: Annotated[bool, typer.Option("--no-anchors", help="Rank by the raw prediction even for layout "
                                                                  "families the profile's own runs measured.")] = False,
) -> None:
    """Find the best layout for a model on a cluster under power, thermal and memory limits.

    Enumerates every layout (TP, PP with schedule and virtual stages, DP/FSDP, EP, CP, micro-batch,
    recompute, distributed optimizer, overlap flags, power caps, clock locks), rejects those that break
    `plan`'s rules or do not fit in memory before predicting, predicts the rest with `predict`, keeps
    those inside the limits and ranks them. Everything shown is a prediction (estimate) with its interval.

    Examples:

      powertrain advise -m gpt3-175b --hardware h200 -g 32 -n 4 -b 128

      powertrain advise -m llama3-70b --hardware h200 -g 32 -n 4 -b 128 -O energy --node-kw 6 --html advice.html

      powertrain advise -m mixtral-8x7b --hardware h100 -g 64 -n 8 -b 256 --emit top.yaml --emit megatron

      powertrain advise -m llama3-70b --hardware h100 -g 8 -b 64 --placement runs/imported-h100x8
    """
    from powertrain.advise import Constraints, Objective, make_request

    try:
        req = make_request(
            model, hardware, gpus, nodes, global_batch, seq_len=seq_len, precision=precision, engine=engine,
            constraints=Constraints(power_cap_w=power_cap, node_kw=node_kw, rack_kw=rack_kw,
                                    nodes_per_rack=nodes_per_rack, max_temp_c=max_temp, no_throttle=no_throttle,
                                    **({} if mem_headroom is None else {"mem_headroom": mem_headroom})),
            objective=Objective(objective, tokens, gpu_hour_price, kwh_price),
            power_caps=_floats(power_caps, "--power-caps"), clock_locks=_floats(clock_locks, "--clock-locks"),
            max_vp=max_vp, max_sm_clock_mhz=max_sm_clock_mhz)
    except ValueError as exc:
        fail(str(exc))
    _check_clock_emit(req.clock_locks, max_sm_clock_mhz)
    if max_sm_clock_mhz is None and req.device.max_sm_clock_mhz is not None:
        max_sm_clock_mhz = int(req.device.max_sm_clock_mhz)  # the catalog's, when the user gives none
    cal = _calibration(profile)
    adv = _search(req, cal, top, quiet=as_json, anchors=not no_anchors)
    # with --json stdout holds the one JSON object only: what the text mode prints goes into it or to stderr
    say = err if as_json else out
    doc: dict[str, Any] = {}
    if not as_json:
        _print_advice(adv)
        _print_power(adv, cal)
    placed = _placement(adv, cal, placement, doc, show=not as_json) if placement is not None else None
    emitted = [_emit(adv, target, placed, max_sm_clock_mhz, say, show_flags=not as_json) for target in emit or []]
    if html is not None:
        from powertrain.report.advise import write_advice_html

        write_advice_html(adv, html, cal)
        say.print(f"HTML report: {escape(str(html))}")
    if as_json:
        _print_json(adv, doc, emitted, html)


def _check_clock_emit(locks: tuple[float, ...], max_mhz: int | None) -> None:
    """--max-sm-clock-mhz is what --clock-locks are fractions of: without locks it is read by nothing. (A lock on
    a GPU whose maximum is unknown is refused by the request: it could be neither predicted nor written.)"""
    if max_mhz is not None and not locks:
        fail("--max-sm-clock-mhz converts --clock-locks fractions to MHz: add --clock-locks or drop it")


def _calibration(profile: str) -> Calibration:
    from powertrain.predict import load_calibration

    try:
        return load_calibration(profile)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))


def _search(req: Any, cal: Calibration, top: int, quiet: bool, anchors: bool = True) -> Advice:
    """Run the search with a progress bar that appears once it has taken more than a second."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from powertrain.advise import NoFeasibleLayout, advise

    t0 = time.perf_counter()
    bar: dict[str, Any] = {}

    def progress(done: int, total: int) -> None:
        if quiet or time.perf_counter() - t0 < 1.0:
            return
        if not bar:
            bar["p"] = Progress(TextColumn("advise: candidates"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=err, transient=True)
            bar["p"].start()
            bar["t"] = bar["p"].add_task("search", total=total)
        bar["p"].update(bar["t"], completed=done)

    try:
        return advise(req, cal, top_n=top, progress=progress, anchors=anchors)
    except NoFeasibleLayout as exc:
        fail(str(exc), code=1)
    finally:
        if bar:
            bar["p"].stop()


_COLS = (("tok/s", "{:,.0f}"), ("interval", "{}"), ("MFU", "{:.1%}"), ("J/tok", "{:.3g}"), ("W peak", "{:.0f}"),
         ("W mean", "{:.0f}"), ("MHz", "{:.0f}"), ("capped", "{:.0%}"), ("hottest", "{}"), ("hot-thr", "{:.0%}"),
         ("GiB/GPU", "{:.1f}"))


def _row(r: Any) -> list[str]:
    m = r.prediction.metrics
    lo, hi, _ = r.interval
    hot = f"{m['hottest_slot']} {m['temp_peak_c']:.0f}°C" if m.get("temp_peak_c") is not None else None
    p = r.point  # tokens/s, MFU, J/token as ranked (anchored where the profile measured the family)
    vals = (p.tokens_per_s, f"{lo:,.0f}–{hi:,.0f}", p.mfu, p.j_per_token, m["power_peak_w"],
            m["power_mean_w"], m.get("clock_sm_mean_mhz"), m.get("throttle_share_power_cap"), hot,
            m.get("throttle_share_thermal_sw"), m["mem_per_device_bytes"] / 2**30)
    return ["—" if v is None else f.format(v) for (_, f), v in zip(_COLS, vals, strict=True)]


def _print_advice(adv: Advice) -> None:
    req, st = adv.request, adv.stats
    out.print(f"[bold]advise[/]: {escape(req.model.name)} (seq {req.model.seq_len}) on {req.world}× "
              f"{escape(req.device.name)} ({req.nodes} node(s)), global batch {req.global_batch}, {req.precision}, "
              f"engine {req.engine}; objective {req.objective.kind}; profile {escape(adv.calibration)}")
    from powertrain.hardware import describe_hardware

    if req.hardware_note:
        out.print(f"note: {escape(req.hardware_note)}")
    out.print(f"hardware assumed: {escape(describe_hardware(req.device))}")
    from powertrain.advise.request import DEFAULT_MEM_HEADROOM, MEM_HEADROOM_WHY

    head = req.constraints.mem_headroom
    why = f" (the default: {MEM_HEADROOM_WHY}; --mem-headroom 0 uses it all)" if head == DEFAULT_MEM_HEADROOM else ""
    out.print(f"memory: {head:.0%} of each device's memory kept free{why}")
    out.print(f"searched {st.enumerated:,} candidates in {adv.seconds:.1f} s ({st.enumerated / adv.seconds:,.0f}/s): "
              f"{st.rejected_rules:,} broke plan's rules, {st.rejected_memory:,} did not fit in memory, "
              f"{st.same_as_uncapped:,} caps or clock locks would not bind, {st.kept:,} predicted, {len(adv.points):,} within the "
              "limits")
    t = Table(title="top configurations (predicted: estimates)", title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("configuration")
    for name, _ in _COLS:
        t.add_column(name, justify="right")
    from powertrain.advise.space import equivalent_groups, unique_labels
    from powertrain.predict.validation import PREDICTED_TIE

    labels = unique_labels([r.point.cand for r in adv.top])
    for i, (r, label) in enumerate(zip(adv.top, labels, strict=True), 1):
        mark = f" (anchored ×{r.point.anchor:.2f})" if r.point.anchor != 1.0 else ""
        t.add_row(str(i), escape(label + mark), *_row(r))
    out.print(t)
    for g in equivalent_groups([r.point.tokens_per_s for r in adv.top], PREDICTED_TIE):
        if len(g) > 1:
            out.print(f"equivalent: #{g[0] + 1}–#{g[-1] + 1} are within {PREDICTED_TIE:.0%} of each other, the model's "
                      "resolution (a tie it cannot order): pick by memory (GiB/GPU), the fewest knobs, or measure them "
                      "(--emit sweep)")
    for n in adv.notes:
        out.print(f"note: {escape(n)}")
    out.print(f"interval: {escape(adv.top[0].interval[2])}")
    out.print("[bold]why #1 beats #2[/]")
    for line in adv.explanation:
        out.print(escape(line))
    if adv.pareto and req.device.has_power_sensor:
        out.print(f"Pareto front (speed vs energy): {len(adv.pareto)} point(s), fastest "
                  f"{adv.pareto[0].tokens_per_s:,.0f} tok/s at {adv.pareto[0].j_per_token:.3g} J/tok, most efficient "
                  f"{adv.pareto[-1].tokens_per_s:,.0f} tok/s at {adv.pareto[-1].j_per_token:.3g} J/tok")


def _print_power(adv: Advice, cal: Calibration) -> None:
    """The knee of #1 over power caps, and the throttling it is predicted to have at each cap tried."""
    if not adv.request.device.has_power_sensor:
        return
    from powertrain.advise.powercap import cap_sweep, default_caps, knee

    case = adv.top[0].point.cand.case
    from dataclasses import replace

    caps = default_caps(case, site_cap=adv.request.constraints.power_cap_w)  # none above --power-cap
    pts = cap_sweep(replace(case, power_limit_w=None), cal, caps)
    k = knee(pts)
    known = any(p.node_j_per_token is not None for p in pts)
    kn = knee(pts, node=True) if known else None
    host = (f"counting the host, at {_cap(kn.cap_w)} ({kn.node_j_per_token:.3g} J/tok)" if kn is not None else
            "node power unknown (the hardware catalog describes no host for this node)")
    out.print(f"[bold]power caps for #1[/] (estimates): lowest J/token at {_cap(k.cap_w)} "
              f"({k.j_per_token:.3g} J/tok, {k.tokens_per_s:,.0f} tok/s); {host}")
    t = Table(show_edge=False)
    for col in ("cap", "tok/s", "J/tok", "node J/tok", "clock", "MHz", "capped", "node peak kW", "hot-thr", "hottest °C"):
        t.add_column(col, justify="right")
    for p in pts:
        t.add_row(_cap(p.cap_w), f"{p.tokens_per_s:,.0f}", f"{p.j_per_token:.3g}",
                  "unknown" if p.node_j_per_token is None else f"{p.node_j_per_token:.3g}", f"{p.clock_factor:.0%}",
                  "—" if p.clock_mhz is None else f"{p.clock_mhz:.0f}",
                  "—" if p.capped_share is None else f"{p.capped_share:.0%}",
                  "unknown" if p.node_peak_w is None else f"{p.node_peak_w / 1000:.2f}", f"{p.throttle_share:.0%}",
                  f"{p.temp_peak_c:.0f}")
    out.print(t)


def _cap(w: float | None) -> str:
    return "default limit" if w is None else f"{w:.0f} W"


def _emit(adv: Advice, target: str, placed: tuple[Any, Any] | None, max_sm_clock_mhz: int | None,
          say: Console, show_flags: bool = True) -> dict[str, Any]:
    """Write or print one --emit target; a placement of #1 goes into its spec (device order, split).
    Returns what was emitted (for --json, where flags are not printed but returned)."""
    from powertrain.advise.emit import emit_flags, emit_spec, emit_sweep

    req, first = adv.request, adv.top[0].point.cand
    extra: dict[str, Any] = {}
    if placed is not None and placed[0] is first:
        extra = {"device_order": placed[1].device_order, "pp_split": placed[1].pp_split}
    try:
        if target.endswith((".yaml", ".yml")):
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)  # `--emit out/top.yaml` in a fresh folder
            notes = emit_spec(first, req, path, max_sm_clock_mhz=max_sm_clock_mhz, **extra)
            sweep = path.with_name(f"{path.stem}-sweep{path.suffix}")
            sweep_notes = emit_sweep([r.point.cand for r in adv.top], req, sweep, max_sm_clock_mhz=max_sm_clock_mhz)
            say.print(f"wrote {escape(str(path))} (#1) and {escape(str(sweep))} (top {len(adv.top)}, for a "
                      f"confirmation: powertrain sweep {escape(str(sweep))})")
            for n in notes:
                say.print(f"  note: {escape(n)}")
            return {"target": target, "spec": str(path), "sweep": str(sweep), "notes": notes,
                    "sweep_notes": sweep_notes}
        flags = emit_flags(first, req, target, max_sm_clock_mhz)
        if show_flags:
            out.print(f"[bold]{escape(target)} flags for #1[/]")
            out.print(flags, markup=False, highlight=False)
        return {"target": target, "flags": flags}
    except ValueError as exc:  # names --emit itself
        fail(str(exc))
    except OSError as exc:
        fail(f"--emit {target}: {exc}")


def _placement(adv: Advice, cal: Calibration, run_dir: Path, doc: dict[str, Any],
               show: bool = True) -> tuple[Any, Any] | None:
    """The slot profile and the placement (printed with ``show``, recorded in ``doc`` for --json);
    returns (placed candidate, Placement) or None."""
    from powertrain.advise.placement import place_stages, predicted_profile, slot_profile

    # the best-ranked configuration with a (non-interleaved) pipeline: placement moves stages, so it needs one
    cands = [p.cand for p in sorted(adv.points, key=lambda p: p.score) if p.cand.case.pp > 1 and p.cand.case.vp == 1][:1]
    try:
        if str(run_dir) == "model":  # no measured run: the predictor's slot thermal model
            prof = predicted_profile((cands[0] if cands else adv.top[0].point.cand).case, cal)
        else:
            prof = slot_profile(run_dir)
    except (OSError, ValueError) as exc:
        fail(f"--placement: {exc}")
    doc["slot_profile"] = prof.to_dict()
    if show:
        _print_profile(prof)
    if not cands:
        doc["placement"] = None
        if show:
            out.print("placement: no feasible configuration has a (non-interleaved) pipeline; nothing to place")
        return None
    cand = cands[0]
    try:
        pl = place_stages(cand.case, prof, cal)
    except ValueError as exc:
        fail(str(exc))
    doc["placement"] = {"label": cand.label(), **pl.to_dict()}
    if show:
        _print_placed(cand, pl)
    return cand, pl


def _print_profile(prof: Any) -> None:
    t = Table(title=f"per-slot profile of {escape(prof.source)} (busy samples)", title_justify="left")
    for col in ("slot", "samples", "°C mean", "°C p95", "SM MHz", "throttled", "W mean", "util %", "speed"):
        t.add_column(col, justify="right")
    for s in prof.slots:
        v = prof.speed.get(s.slot)
        cells = (s.temp_mean_c, s.temp_p95_c, s.clock_mean_mhz, s.throttle_share, s.power_mean_w, s.util_mean_pct)
        fmts = ("{:.1f}", "{:.1f}", "{:.0f}", "{:.1%}", "{:.0f}", "{:.0f}")
        t.add_row(s.slot, str(s.busy_samples), *["—" if x is None else f.format(x) for f, x in zip(fmts, cells,
                                                                                                 strict=True)],
                  "—" if v is None else f"{v:.3f}")
    out.print(t)
    out.print(f"speed from: {escape(prof.speed_from)}")


def _print_placed(cand: Any, pl: Any) -> None:
    from powertrain.advise.placement import placement_gain

    out.print(f"[bold]placement for {escape(cand.label())}[/]: launch.device_order {pl.device_order}; "
              f"layout.pp_split {pl.pp_split}")
    out.print(f"slowest-stage step (estimate): {pl.step_before_s:.4g} s (even split, rank i on GPU i) → "
              f"{pl.step_after_s:.4g} s ({placement_gain(pl):+.1%}); uniform slots {pl.step_uniform_s:.4g} s")
    for n in pl.notes:
        out.print(f"  note: {escape(n)}")


def _print_json(adv: Advice, doc: dict[str, Any], emitted: list[dict[str, Any]], html: Path | None) -> None:
    import json

    from powertrain.advise import as_dict
    from powertrain.hardware import describe_hardware

    d = {**as_dict(adv), **doc,
         "hardware": {"assumed": describe_hardware(adv.request.device), "note": adv.request.hardware_note}}
    if emitted:
        d["emitted"] = emitted
    if html is not None:
        d["html"] = str(html)
    out.print_json(json.dumps(d, default=str))
