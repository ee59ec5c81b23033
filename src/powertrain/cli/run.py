"""``powertrain run``: train one configuration with the built-in trainer, under the node's sampler."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from powertrain.cli.plan import fail
from powertrain.cli.root import PowerBufferOption, app, shown_text
from powertrain.core.names import printable
from powertrain.monitor import MonitorError
from powertrain.plan.sweep_spec import pydantic_message
from powertrain.spec.bounds import load_spec_yaml, shown
from powertrain.spec.effective import sweep_protocol, unused_knobs
from powertrain.spec.run import RunConfig, load_run_config
from powertrain.spec.validate import validate

if TYPE_CHECKING:
    from powertrain.launch.local import RunResult

err = Console(stderr=True, soft_wrap=True)  # one message, one line (terminals wrap it)

# Keys only a sweep spec has (a RunConfig forbids them): their presence means the user meant `sweep`.
_SWEEP_KEYS = ("base", "grid", "variants", "launch")


def _sweep_spec_error(spec: Path) -> str | None:
    """One line naming the right command when SPEC is a sweep spec, instead of pydantic's dump."""
    try:
        raw = load_spec_yaml(spec)
    except ValueError:
        return None  # load_run_config reports unreadable, oversized and malformed files itself
    if not isinstance(raw, dict):
        return None
    keys = [k for k in _SWEEP_KEYS if k in raw]
    if keys == ["launch"] and "model" in raw:  # a run spec's own launch: (device_order), not a sweep's
        return None
    if not keys:
        return None
    return (f"{spec} is a sweep spec (it has {', '.join(keys)}); use `powertrain plan {spec}` to check it "
            f"and `powertrain sweep {spec}` to run it")


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
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.001, max=1e9,
                                                  help="Stop the run after this many seconds.")] = None,
    check_only: Annotated[bool, typer.Option("--check", help="Only validate the spec and the options; start nothing.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print per-step progress.")] = False,
    nnodes: Annotated[int | None, typer.Option("--nnodes", min=1, help="Nodes of the run (= hardware.nodes); under srun: SLURM_NNODES.", rich_help_panel="Several nodes")] = None,
    node_rank: Annotated[int | None, typer.Option("--node-rank", min=0, help="This node's index, 0 owns the run; under srun: SLURM_NODEID.", rich_help_panel="Several nodes")] = None,
    master_addr: Annotated[str | None, typer.Option("--master-addr", help="Node 0's address; under srun: the job's first host.", rich_help_panel="Several nodes")] = None,
    master_port: Annotated[int | None, typer.Option("--master-port", min=1, max=65535, help="A free port on node 0; under srun: derived from the job id.", rich_help_panel="Several nodes")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Label of this node's telemetry (default: the host name).", rich_help_panel="Several nodes")] = None,
    allow_unapplied: Annotated[bool, typer.Option("--allow-unapplied", help="Run even when a device control (knobs.power_limit_w, sm_clock_mhz, mem_clock_mhz) cannot be set here; run.json records it as not applied.")] = False,
    power_buffer: PowerBufferOption = True,
) -> None:
    """Train SPEC with the built-in reference trainer and leave a complete run directory.

    The configuration is checked first: a broken rule (world size ≠ product of the degrees, heads
    not divisible by tp, fewer layers than stages, …) is reported with a fix and nothing starts.
    --check stops there, after the options too (node options, --rate, --backends, --out); only what
    needs this node's devices (their count and model, device controls) is left to the launch.
    Then torchrun starts hardware.devices_per_node ranks (CPU + gloo, or CUDA + NCCL when GPUs
    are present) under the telemetry sampler. The run directory gets run.json (resolved spec,
    status, rank map with dp/tp/pp/cp/ep coordinates), telemetry/, events/rank-<r>.parquet (step,
    forward, backward, optimizer, communication intervals with warm-up/measured windows, tokens,
    loss), logs/rank-<r>.log and, when asked, profiles/.

    Several nodes (hardware.nodes > 1): start the same command once on every node with the same
    --out, on a filesystem every node shares. Node 0 owns run.json; every node runs its own
    sampler (telemetry/<host>.parquet) and its devices_per_node ranks (global rank = node ×
    devices_per_node + local rank). Under `srun --ntasks-per-node=1` the node options come from
    Slurm; elsewhere pass --nnodes, --node-rank, --master-addr and --master-port on each node. A
    one-node spec runs torchrun --standalone, which picks its own address and port: these options
    are refused there.

    Examples:

      powertrain run examples/run-llama-dp2.yaml --out runs/dp2

      powertrain run examples/run-gpt-tp2-sp.yaml --check

    Device controls (knobs.power_limit_w, knobs.sm_clock_mhz, knobs.mem_clock_mhz) are set on
    every device of the node before warm-up, read back into run.json (requested / in effect) and
    put back when the run ends, however it ends; a run killed with -9 is restored by the next
    start or by `powertrain restore`. Setting them needs root: without it the run is refused with
    one line, or runs with --allow-unapplied and records them as not applied.

      powertrain run examples/run-llama-1gpu.yaml --out runs/cap   # with knobs: {power_limit_w: 500}

    A sweep spec (base + grid) is run with `powertrain sweep`, not `run`; so is a run spec that sets protocol.repeats,
    cooldown_s, cooldown_until_temp_c or idle_baseline_s, which only a sweep applies. A knob that changes
    nothing for the layout (async TP at TP=1, FSDP or DP knobs without them, a pipeline schedule at PP=1) is refused.
    """
    cfg = _checked_config(spec)
    try:
        # the same checks with and without --check: only what needs this node's devices is left to the launch
        nodes = _checked_options(cfg, out, rate, backends, nnodes, node_rank, master_addr, master_port)
        _check_names(spec, cfg, out, host)
    except ValueError as exc:
        err.print(f"[red]error:[/] {shown_text(exc)}")
        raise typer.Exit(2) from None
    if check_only:
        task = f", {cfg.task.label()}" if cfg.task.is_lora else ""
        err.print(f"[green]ok:[/] {escape(shown(spec))} is valid ({shown_text(cfg.model.name)}, "
                  f"{cfg.layout.resolve(cfg.world).label()}, world {cfg.world}{shown_text(task)})")
        return
    from powertrain.launch.local import launch_local

    out = out if out is not None else Path("runs") / f"{cfg.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"  # _check_names: one component
    try:
        res = launch_local(cfg, out, rate_hz=rate, backends=backends if backends == "auto" else backends.split(","),
                           echo=not quiet, timeout_s=timeout, host=host, nnodes=nodes.nnodes,
                           node_rank=nodes.node_rank, master_addr=nodes.master_addr, master_port=nodes.master_port,
                           allow_unapplied=allow_unapplied, power_buffer=power_buffer)
    except (MonitorError, ValueError) as exc:
        err.print(f"[red]error:[/] {shown_text(exc)}")
        raise typer.Exit(2) from None
    _report(res, nodes.node_rank)


def _checked_config(spec: Path) -> RunConfig:
    """SPEC loaded and validated; a sweep spec, an unreadable spec, a broken rule, a protocol setting
    only a sweep applies or a knob that changes nothing for the layout ends the command (exit 2) with
    the problems and their fixes."""
    sweep_error = _sweep_spec_error(spec) if spec.is_file() else None
    if sweep_error:
        fail(sweep_error)
    try:
        cfg = load_run_config(spec)
    except ValidationError as exc:
        fail(f"{shown(spec)}: {pydantic_message(exc)}")
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    violations = validate(cfg)
    if violations:  # exit 2, nothing valid remains: one line, every broken rule with its fix
        fail(f"{shown(spec)} cannot run, nothing was started ({len(violations)} problem(s)): "
             + "; ".join(str(v) for v in violations))
    by_sweep = sweep_protocol(cfg)
    if by_sweep:  # the sweep runner applies these around its runs; one run alone would ignore them
        fail(f"{shown(spec)}: {', '.join('protocol.' + k for k in by_sweep)} "
             f"{'is' if len(by_sweep) == 1 else 'are'} applied by `powertrain sweep`, "
             f"not `run`; nothing was started — fix: run `powertrain sweep {shown(spec)}` (a run spec is a sweep "
             "of one), or drop them")
    unused = unused_knobs(cfg)
    if unused:  # a sweep merges such runs and warns; a run spec asks for exactly this one configuration
        fail(f"{shown(spec)}: {', '.join(unused)} change{'s' if len(unused) == 1 else ''} nothing for layout "
             f"{cfg.layout.resolve(cfg.world).label()}; nothing was started — fix: drop them, or choose a layout "
             "they apply to")
    return cfg


@dataclass(frozen=True)
class _Nodes:
    """This node's place in the run: the command line's node options, else Slurm's."""

    nnodes: int
    node_rank: int
    master_addr: str | None
    master_port: int | None


def _checked_options(cfg: RunConfig, out: Path | None, rate: float, backends: str, nnodes: int | None,
                     node_rank: int | None, master_addr: str | None, master_port: int | None) -> _Nodes:
    """This node's place in the run, after refusing (ValueError, one line) the options a launch would
    refuse before or just after it starts: node options that do not fit the spec, a sampling rate or
    backend the sampler refuses, a missing --out for several nodes, an --out that already holds a run."""
    from powertrain.core.sampling import check_rate_hz
    from powertrain.launch.local import check_node_options
    from powertrain.telemetry.discover import BACKEND_NAMES, unknown_backends

    nodes = _node_options(cfg, nnodes, node_rank, master_addr, master_port)
    check_node_options(cfg, nodes.nnodes, nodes.node_rank, nodes.master_addr, nodes.master_port,
                       node_rank_given=node_rank is not None)
    check_rate_hz(rate, "--rate")
    if backends != "auto" and unknown_backends(backends.split(",")):
        raise ValueError(f"--backends {backends!r}: give auto, or a comma list of {', '.join(BACKEND_NAMES)}")
    if out is None and nodes.nnodes > 1:
        raise ValueError("several nodes need one shared run directory: pass --out DIR (the same on every node)")
    if out is not None and nodes.node_rank == 0 and (out / "run.json").exists():
        raise ValueError(f"{out} already holds a run (run.json exists); choose a new --out folder or delete the old run")
    return nodes


def _check_names(spec: Path, cfg: RunConfig, out: Path | None, host: str | None) -> None:
    """Names that become paths: the spec's ``name`` where it names the default run directory
    (``runs/<name>-<time>``: ``/abs/x`` or ``sub/dir`` would put the run elsewhere), ``--host`` (the
    telemetry file's name), and an ``--out`` that is a sweep folder or a sweep's or run's own files."""
    from powertrain.core.names import check_name
    from powertrain.store.targets import check_new_run_dir

    if out is None:
        try:
            check_name(cfg.name, f"{shown(spec)}: name")
        except ValueError as exc:
            raise ValueError(f"{exc} (the spec's name names the run directory runs/<name>-<time>; or pass --out)") \
                from None
    else:
        check_new_run_dir(out, "--out")
    if host is not None:
        check_name(host, "--host")


def _node_options(cfg: RunConfig, nnodes: int | None, node_rank: int | None, master_addr: str | None,
                  master_port: int | None) -> _Nodes:
    from powertrain.launch.local import slurm_nodes

    # Slurm's view of the job only matters to a multi-node spec: a one-node spec runs here alone.
    slurm = (slurm_nodes() if cfg.hardware.nodes > 1 else None) or {}
    return _Nodes(nnodes=nnodes or slurm.get("nnodes", 1),
                  node_rank=node_rank if node_rank is not None else slurm.get("node_rank", 0),
                  master_addr=master_addr or slurm.get("master_addr"),
                  master_port=master_port or slurm.get("master_port"))


def _report(res: RunResult, node_rank: int) -> NoReturn:
    """How the run (node 0) or this node's share (other nodes) ended; exits 0 when ok, else 1."""
    if node_rank != 0:  # node 0 reports the run; this node only its own share
        colour = "green" if res.status == "ok" else "red"
        err.print(f"[bold]node {node_rank}[/] of run {shown_text(res.run_dir)}  [{colour}]{res.status}[/]"
                  + (f" — {shown_text(res.reason)}" if res.reason else ""))
        raise typer.Exit(0 if res.status == "ok" else 1)
    colour = "green" if res.status == "ok" else "red"
    err.print(f"[bold]run[/] {shown_text(res.run_dir)}  [{colour}]{res.status}[/]"
              + (f" — {shown_text(res.reason)}" if res.reason else ""))
    summary = _step_summary(res.run_dir)
    if summary:
        err.print(summary)
    if res.status != "ok" and res.info.get("error_tail"):
        # the failing rank's last lines, as lines: what they hold besides is escaped, not obeyed
        err.print("\n".join(map(printable, str(res.info["error_tail"]).splitlines())), markup=False, highlight=False)
    raise typer.Exit(0 if res.status == "ok" else 1)
