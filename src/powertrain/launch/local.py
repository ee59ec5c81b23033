"""Launch one run: validate, then ``torchrun`` this node's ranks under the node's sampler.

:func:`launch_local` checks the configuration first (:mod:`powertrain.spec.validate`; nothing
starts when a rule is broken), creates the run directory through :class:`powertrain.Monitor`
(telemetry sampler running), writes the resolved spec and the rank map to ``run.json``, then starts
``torchrun --standalone --nproc_per_node=N -m powertrain.workload.train``. The protocol's repeats,
cool-down gate and idle baseline are applied by the sweep runner (:mod:`powertrain.launch.sweep`), not
here: ``powertrain run`` refuses a spec that sets them (``powertrain sweep`` takes a run spec as a sweep
of one).

Several nodes (``hardware.nodes > 1``): the same call runs once per node (``powertrain run`` under
``srun --ntasks-per-node=1``, or by hand with ``--nnodes/--node-rank/--master-addr/--master-port``)
on a run directory that every node sees (**shared filesystem assumed**). Node 0 owns the run: it
creates it, writes ``run.json`` and closes it. Every other node joins it with
:meth:`Monitor.attach` (only its own sampler, so one sampler per node) and never writes
``run.json``. torchrun uses a static rendezvous at ``master_addr:master_port``; global rank =
node_rank × devices_per_node + local rank, and every rank writes ``events/rank-<r>.parquet`` into the
shared run directory. Each node leaves ``logs/node-<r>.json`` (its host) when it starts and
``logs/node-<r>.exit.json`` (its outcome) when its torchrun ends; the owner waits a bounded time for
those, fills the hosts into the rank map and fails the run when any node failed.

Failure handling: a rank that raises writes ``logs/rank-<r>.error.json`` and exits; torchrun then
stops the other ranks. The launcher waits at most ``crash_grace_s`` after the first error report
(from any node) before killing the whole process group, so a crash ends the run within a bounded
time. The run is marked ``failed`` with the rank that caused it and its error tail; telemetry and
events written up to the crash stay in the run directory.

Which rank caused a failure is decided from recorded facts, never from which process happened to
end first (:func:`attribute_failure`): a rank killed by a signal torchrun did not send comes first
(it cannot say when it died, and its peers' errors are echoes of it); otherwise the rank whose
error report has the earliest ``t_ns``. The ranks torchrun stopped in its tear-down ("Sending
process P closing signal S" in its log) and the ranks that failed after the cause are listed in
``run.json`` ``consequences``; ``failure_cause`` says how the cause was found.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powertrain.hardware import is_cpu_name, record_host_probe
from powertrain.launch.controls import (
    check_node_device,
    node_controls,
    restore_left_over,
    visible_devices_env,
)
from powertrain.monitor import Monitor, wait_for_shared_file
from powertrain.shared_fs import wait_node_samplers
from powertrain.spec.run import RunConfig
from powertrain.spec.validate import check
from powertrain.store.rundir import RunDir, default_host, read_json, write_json_atomic
from powertrain.supervise import inherited_visible_devices, supervise

CRASH_GRACE_S = 20.0
STOP_GRACE_S = 10.0
ERROR_TAIL_LINES = 30
NODE_WAIT_S = 120.0  # how long the owner waits for the other nodes' exit records
# what a node tells the owner about its failing rank (node 0 keeps them in run.json)
_CAUSE_KEYS = ("failed_rank", "error", "error_tail", "failure_cause", "consequences")


@dataclass
class RunResult:
    run_dir: Path
    status: str  # ok | failed
    reason: str | None
    exit_code: int | None
    info: dict[str, Any]


def accelerator() -> tuple[str, int]:
    """(device type, device count) of this node, without touching torch.cuda on a CPU-only node."""
    try:
        import torch
    except ImportError:
        return "cpu", 0
    if torch.accelerator.is_available():
        acc = torch.accelerator.current_accelerator()
        return (acc.type if acc is not None else "cpu"), torch.accelerator.device_count()
    return "cpu", 0


def rank_map(cfg: RunConfig, hosts: str | list[str | None], device_type: str) -> list[dict[str, Any]]:
    """rank → node, host, local rank, device and mesh coordinates {dp, tp, pp, cp, ep}.

    Global rank = node × devices_per_node + local rank (torchrun's order). ``hosts`` is one host for
    every node, or each node's host (``None`` while a node's host is not known yet).
    """
    lay = cfg.layout.resolve(cfg.world)
    per_node = cfg.hardware.devices_per_node
    node_hosts = [hosts] * cfg.hardware.nodes if isinstance(hosts, str) else hosts
    out = []
    for r in range(cfg.world):
        local = r % per_node
        out.append({"rank": r, "node": r // per_node, "host": node_hosts[r // per_node], "local_rank": local,
                    "device": device_type if device_type == "cpu" else f"{device_type}:{local}",
                    "coords": lay.coords(r)})
    return out


def first_error(run_dir: Path) -> dict[str, Any] | None:
    """The earliest ``rank-<r>.error.json`` written by a failing rank (by the ``t_ns`` it recorded), if any.

    A report without ``t_ns`` sorts last (its time is unknown, not early); equal times go to the lower rank.
    """
    errors = rank_errors(run_dir)
    return min(errors.values(), key=_error_order) if errors else None


def rank_errors(run_dir: Path) -> dict[int, dict[str, Any]]:
    """rank → its ``rank-<r>.error.json`` (the ranks that raised), unreadable files skipped."""
    errors: dict[int, dict[str, Any]] = {}
    for p in (run_dir / "logs").glob("rank-*.error.json"):
        try:
            e = read_json(p)
            errors[int(e["rank"])] = e
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return errors


def _error_order(e: Mapping[str, Any]) -> tuple[bool, int, int]:
    t = e.get("t_ns")
    return (t is None, t if t is not None else 0, int(e["rank"]))


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
# torchrun's tear-down (torch.distributed.elastic.multiprocessing.api): one line per rank that was
# still running when it stopped the group, with the signal it sent (SIGTERM, later SIGKILL).
_CLOSING = re.compile(r"Sending process (\d+) closing signal (SIG[A-Z]+)")


def torchrun_failures(log: Path) -> dict[int, int]:
    """rank → exit code of every failed rank in torchrun's failure report."""
    return {r: code for r, (code, _pid) in _torchrun_report(log).items()}


def _torchrun_report(log: Path) -> dict[int, tuple[int, int | None]]:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return {int(r): (int(c), int(pid) if pid else None) for r, c, pid in _FAILURE.findall(text)}


def torchrun_stopped(log: Path) -> dict[int, str]:
    """rank → signal name, for every rank torchrun itself stopped in its tear-down after a failure.

    torchrun names the pid of each rank it still found running ("Sending process P closing signal
    S"); the failure report maps pids to ranks. A rank that died before the tear-down is not here.
    """
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    sent: dict[int, str] = {}
    for pid, sig in _CLOSING.findall(text):
        sent.setdefault(int(pid), sig)  # the first signal sent (SIGTERM); SIGKILL only follows it
    return {r: sent[pid] for r, (_code, pid) in _torchrun_report(log).items() if pid is not None and pid in sent}


def attribute_failure(errors: Mapping[int, Mapping[str, Any]], failures: Mapping[int, int],
                      stopped: Mapping[int, str], *, stopped_from_outside: bool = False
                      ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the failing rank that caused the run to fail, the other failed ranks as its consequences).

    ``errors``: rank → its error report (``rank-<r>.error.json``); ``failures``: rank → exit code from
    torchrun's report; ``stopped``: rank → signal of the ranks torchrun stopped in its tear-down;
    ``stopped_from_outside``: powertrain itself stopped the ranks (interrupt, time limit).

    Precedence, from recorded facts only (never from which process happened to finish first):

    1. A rank killed by a signal that torchrun did not send (SIGKILL, OOM killer, segfault), without
       an error report, is the cause: it could not record a time, and its peers' errors
       ("connection closed by peer") are echoes of its death. Not when powertrain stopped the ranks.
    2. Otherwise the rank whose error report carries the earliest ``t_ns`` (the first that raised).
    3. Every other failed rank is a consequence: stopped by torchrun's tear-down, or failed after it.

    The cause is ``{"rank", "how": "killed"|"error", "error", "t_ns"}``; each consequence
    ``{"rank", "how", "exit_code", "error"}``.
    """
    killed = sorted(r for r, c in failures.items()
                    if c < 0 and r not in stopped and r not in errors and not stopped_from_outside)
    cause: dict[str, Any] | None = None
    if killed:
        # A rank killed by something other than SIGTERM is preferred: torchrun's own SIGTERM is the
        # likelier one when its tear-down line was not in the log (an older torch that did not say it).
        r = next((k for k in killed if failures[k] != -signal.SIGTERM), killed[0])
        cause = {"rank": r, "how": "killed", "error": f"killed by {_signal_name(failures[r])}", "t_ns": None}
    elif errors:
        e = min(errors.values(), key=_error_order)
        cause = {"rank": int(e["rank"]), "how": "error", "error": e.get("error"), "t_ns": e.get("t_ns")}
    if cause is None:
        return None, []
    consequences = []
    for r in sorted({*failures, *errors} - {cause["rank"]}):
        code = failures.get(r)
        err = errors.get(r, {}).get("error")
        if r in stopped:
            how = f"stopped by torchrun ({stopped[r]}) after rank {cause['rank']} failed"
        elif code is not None and code < 0 and stopped_from_outside:
            how = f"stopped by powertrain ({_signal_name(code)})"
        elif code is not None and code < 0 and r not in errors:
            how = f"killed by {_signal_name(code)}"
        else:
            how = f"failed after rank {cause['rank']}"
        consequences.append({"rank": r, "how": how, "exit_code": code, "error": err})
    return cause, consequences


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ProgressEcho:
    """Fed torchrun's output chunk by chunk: echoes rank 0's progress lines (``powertrain: …``) to the
    terminal."""

    def __init__(self) -> None:
        self._partial = b""

    def __call__(self, chunk: bytes, _stream: str) -> None:
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"powertrain:"):
                sys.stderr.buffer.write(line + b"\n")
                sys.stderr.flush()


def torchrun_command(cfg: RunConfig, spec_path: Path, *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str | None = None, master_port: int | None = None) -> list[str]:
    """torchrun for this node: ``--standalone`` on one node, a static rendezvous on several."""
    if nnodes == 1:
        where = ["--standalone"]
    else:
        where = [f"--nnodes={nnodes}", f"--node_rank={node_rank}", f"--master_addr={master_addr}",
                 f"--master_port={master_port}"]
    return [sys.executable, "-m", "powertrain.launch.torchrun", *where,
            f"--nproc_per_node={cfg.hardware.devices_per_node}", "--monitor-interval=0.2",
            "-m", "powertrain.workload.train", "--spec", str(spec_path)]


def _node_record(run: RunDir, node_rank: int, kind: str = "") -> Path:
    return run.logs_dir / f"node-{node_rank}{kind}.json"


def _wait_nodes(run: RunDir, nnodes: int, timeout_s: float) -> dict[int, dict[str, Any]]:
    """Exit records of nodes 1…nnodes-1, waiting up to ``timeout_s`` for the missing ones."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = {r: read_json(_node_record(run, r, ".exit")) for r in range(1, nnodes)
                if _node_record(run, r, ".exit").is_file()}
        if len(done) == nnodes - 1 or time.monotonic() > deadline:
            return done
        time.sleep(0.1)


def slurm_nodes(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Node options of this process inside a Slurm job step (``srun``): nnodes, node_rank,
    master_addr (the step's first host, from ``scontrol show hostnames``) and a master_port derived
    from the job id (the same on every node, in 29500–39499); ``None`` outside Slurm.

    The step's ``SLURM_STEP_NUM_NODES`` / ``SLURM_STEP_NODELIST`` win over the job's
    ``SLURM_NNODES`` / ``SLURM_JOB_NODELIST`` (a step may use part of the allocation).
    """
    e = os.environ if environ is None else environ
    try:
        nnodes = int(e.get("SLURM_STEP_NUM_NODES") or e["SLURM_NNODES"])
        node_rank, job = int(e["SLURM_NODEID"]), int(e["SLURM_JOB_ID"])
        nodelist = e.get("SLURM_STEP_NODELIST") or e["SLURM_JOB_NODELIST"]
    except (KeyError, ValueError):
        return None
    if "[" in nodelist:  # a compressed list (node[01-04]): only scontrol expands it reliably
        try:
            res = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=30, check=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ValueError(f"cannot expand SLURM_JOB_NODELIST={nodelist!r} with scontrol ({exc}); "
                             "pass --master-addr") from None
        first = res.stdout.split()[0]
    else:
        first = nodelist.split(",")[0]
    return {"nnodes": nnodes, "node_rank": node_rank, "master_addr": first, "master_port": 29500 + job % 10000}


def launch_local(cfg: RunConfig, out: str | os.PathLike[str], *, rate_hz: float = 20.0,
                 backends: str | list[str] = "auto", echo: bool = True, timeout_s: float | None = None,
                 env: Mapping[str, str] | None = None, nnodes: int = 1, node_rank: int = 0,
                 master_addr: str | None = None, master_port: int | None = None,
                 host: str | None = None, allow_unapplied: bool = False,
                 controls_binding: Any | None = None, power_buffer: bool = True) -> RunResult:  # long function: node 0's and the other nodes' launch read top to bottom, each with its own clean-up
    """Run this node's share of ``cfg``; returns how it ended (the run directory holds the rest).

    One node (``nnodes=1``): the whole run. Several: call it once on every node with the same
    ``out`` (a folder all nodes share), ``nnodes`` = ``hardware.nodes``, this node's ``node_rank``
    and node 0's ``master_addr``/``master_port``; node 0 returns the run's outcome, the others their
    node's. ``host`` labels this node's telemetry (default: the host name).

    Raises :class:`powertrain.spec.validate.ConfigError` before anything starts when the
    configuration breaks a rule, and ``ValueError`` as :func:`_check_node` and
    :func:`powertrain.launch.controls.node_controls` say (``allow_unapplied``: a device control
    that cannot be set is recorded as not applied; ``controls_binding`` injects its vendor library;
    ``power_buffer``: the sampler reads the drivers' buffered power samples, see :class:`Monitor`).
    """
    dev = _check_node(cfg, nnodes, node_rank, master_addr, master_port)
    stand_in = check_node_device(cfg, dev, _gpu_name() if dev != "cpu" else None)
    restored = restore_left_over(controls_binding)  # what a run killed with -9 left on this node
    env = {**(env or {}), **visible_devices_env(cfg, dev)}
    out = Path(out)
    spec_path = out / "spec.json"
    cmd = torchrun_command(cfg, spec_path, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                           master_port=master_port)
    host = host or default_host()
    log_name = "torchrun.log" if nnodes == 1 else f"torchrun-node-{node_rank}.log"
    mon = Monitor(out, rate_hz=rate_hz, backends=backends, name=cfg.name, command=cmd, host=host,
                  power_buffer=power_buffer)
    code: int | None  # the exit code of torchrun on this node; None when it was never reached
    if node_rank == 0:
        mon.start()
        try:
            # the resolved spec: dp filled in from the world size
            cfg = cfg.model_copy(update={"layout": cfg.layout.resolve(cfg.world)})
            write_json_atomic(spec_path, cfg.model_dump(mode="json"))
            if nnodes > 1:
                write_json_atomic(_node_record(mon.run, 0), {"node_rank": 0, "host": host, "pid": os.getpid()})
            mon.info.update(kind="run", config=cfg.model_dump(mode="json"), layout_label=cfg.layout.label(),
                            world=cfg.world, rank_map=rank_map(cfg, [host] + [None] * (nnodes - 1), dev),
                            backend="nccl" if dev == "cuda" else "gloo")
            if nnodes > 1:
                mon.info["nodes"] = {"count": nnodes, "master": f"{master_addr}:{master_port}"}
            _note_placement(mon.info, cfg, stand_in, restored, env)
            with node_controls(cfg, str(mon.run.path), allow_unapplied=allow_unapplied,
                               binding=controls_binding) as controls:
                if controls is not None:  # restore() completes this same record before run.json's last write
                    mon.info["controls"] = controls
                mon.run.write(mon.info)
                status, reason, code = _supervise(mon, cmd, echo, timeout_s, env, log_name)
            if nnodes > 1:
                status, reason = _join_nodes(mon, cfg, nnodes, status, reason, dev)
        except BaseException as exc:
            mon.stop("failed", f"launcher error: {type(exc).__name__}: {exc}")
            raise
        info = mon.stop(status, reason, exit_code=code)
        return RunResult(mon.run.path, info["status"], info["reason"], code, info)

    mon.attach()
    record: dict[str, Any] = {"node_rank": node_rank, "host": host, "exit_code": None,
                              "visible_devices": inherited_visible_devices()}  # this node's, for the rank map
    try:
        write_json_atomic(_node_record(mon.run, node_rank), {"node_rank": node_rank, "host": host, "pid": os.getpid()})
        wait_for_shared_file(spec_path, 60.0, "node 0's spec.json")
        with node_controls(cfg, str(mon.run.path), allow_unapplied=allow_unapplied,
                           binding=controls_binding) as controls:
            if controls is not None:  # this node's settings reach run.json through its exit record
                record["controls"] = controls
            status, reason, code = _supervise(mon, cmd, echo, timeout_s, env, log_name)
        record.update(status=status, reason=reason, exit_code=code,
                      **{k: mon.info[k] for k in _CAUSE_KEYS if k in mon.info})
    except BaseException as exc:
        status, reason, code = "failed", f"launcher error: {type(exc).__name__}: {exc}", None
        record.update(status=status, reason=reason)
        raise
    finally:
        mon.detach()  # this node's sampler has written its final meta before the owner is told
        if mon.sampler_death:
            record.update(status="failed", reason="; ".join(filter(None, [record.get("reason"), mon.sampler_death])))
        write_json_atomic(_node_record(mon.run, node_rank, ".exit"), {**record, "end_ns": time.time_ns()})
    return RunResult(mon.run.path, record["status"], record["reason"], code, record)


def check_node_options(cfg: RunConfig, nnodes: int, node_rank: int, master_addr: str | None,
                       master_port: int | None, *, node_rank_given: bool = False) -> None:
    """Refuse (ValueError, one line) node options that do not fit the spec; touches no device, so
    ``powertrain run --check`` runs it as a launch does. ``node_rank_given``: the caller named a node
    rank (the command line's --node-rank), which a one-node launch has no use for either."""
    if nnodes != cfg.hardware.nodes:
        how = ("set hardware.nodes: 1 or launch on every node (srun, or --nnodes/--node-rank/--master-addr/"
               "--master-port)") if nnodes == 1 else f"pass --nnodes {cfg.hardware.nodes}"
        raise ValueError(f"the spec asks for {cfg.hardware.nodes} node(s) but this launch has {nnodes}; {how}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank {node_rank} outside 0…{nnodes - 1}; give each node its own --node-rank")
    if nnodes == 1:
        # torchrun --standalone picks its own address and port: these would be dropped without a word
        unused = [flag for flag, given in (("--node-rank", node_rank_given), ("--master-addr", master_addr is not None),
                                           ("--master-port", master_port is not None)) if given]
        if unused:
            raise ValueError(f"{', '.join(unused)} appl{'ies' if len(unused) == 1 else 'y'} to a run of several "
                             f"nodes (hardware.nodes > 1) and this spec runs on one node; drop "
                             f"{'it' if len(unused) == 1 else 'them'}")
    if nnodes > 1 and (not master_addr or not master_port):
        raise ValueError("several nodes need node 0's address and a free port: --master-addr A --master-port P")


def _check_node(cfg: RunConfig, nnodes: int, node_rank: int, master_addr: str | None,
                master_port: int | None) -> str:
    """This node's device type, after refusing (ValueError, one line) node options that do not fit the
    spec (:func:`check_node_options`), more ranks than this node has devices, and a
    ``launch.device_order`` naming a missing GPU."""
    check(cfg)
    check_node_options(cfg, nnodes, node_rank, master_addr, master_port)
    dev, count = accelerator()
    if is_cpu_name(cfg.hardware.device):  # its ranks see no GPU (visible_devices_env): a CPU run, as named
        return "cpu"
    if dev != "cpu" and cfg.hardware.devices_per_node > count:
        raise ValueError(f"the spec needs {cfg.hardware.devices_per_node} ranks per node but this node has "
                         f"{count} {dev} devices; set hardware.devices_per_node ≤ {count}")
    order = cfg.launch.device_order
    if dev != "cpu" and order is not None and max(order) >= count:
        raise ValueError(f"launch.device_order {order} names GPU {max(order)} but this node has {count} {dev} "
                         f"devices (0…{count - 1}); list indices below {count}")
    return dev


def _gpu_name() -> str | None:
    """The name this node's first GPU gives itself (CUDA and ROCm builds of torch alike), None if unreadable."""
    try:
        import torch

        return str(torch.cuda.get_device_name(0))
    except (ImportError, RuntimeError, AssertionError):
        return None


def _note_placement(info: dict[str, Any], cfg: RunConfig, stand_in: dict[str, Any] | None,
                    restored: list[dict[str, Any]], env: Mapping[str, str]) -> None:
    """run.json: the host probe of a CPU run, the stand-in, the rank → GPU order, the visible-devices
    variables this launch inherited, and what a killed run's left-overs needed restoring at this start."""
    if is_cpu_name(cfg.hardware.device) or stand_in:  # CPU speed as the ranks see it, for predict/analyze
        info["host_probe"] = record_host_probe(cfg.hardware.devices_per_node, {**os.environ, **env})
    if stand_in is not None:
        info["stand_in"] = stand_in
    # run.json's visible_devices (Monitor records what this process inherited): without launch.device_order
    # the ranks keep them, so their cuda:i is the i-th GPU listed there, not the sampler's gpu<i> (analysis
    # maps them through it); with an order they are replaced.
    if cfg.launch.device_order is not None:
        info["device_order"] = list(cfg.launch.device_order)
    _place_ranks(info.get("rank_map", []), cfg)
    if restored:
        info["restored_at_start"] = restored


def _place_ranks(entries: list[dict[str, Any]], cfg: RunConfig) -> None:
    """Each rank's GPU index (``local_device``) where ``launch.device_order`` placed it."""
    if cfg.launch.device_order is not None:
        for r in entries:
            r["local_device"] = cfg.launch.device_order[r["local_rank"]]


def _join_nodes(mon: Monitor, cfg: RunConfig, nnodes: int, status: str, reason: str | None,
                dev: str) -> tuple[str, str | None]:
    """Owner: wait for the other nodes' exit records, fill in their hosts, fail the run if one failed."""
    run = mon.run
    done = _wait_nodes(run, nnodes, NODE_WAIT_S)
    wait_node_samplers(run, nnodes)
    hosts: list[str | None] = []
    for r in range(nnodes):
        try:
            hosts.append(read_json(_node_record(run, r)).get("host"))
        except (OSError, ValueError):
            hosts.append(None)
    mon.info["rank_map"] = rank_map(cfg, hosts, dev)
    _place_ranks(mon.info["rank_map"], cfg)  # the rebuilt map keeps the placement node 0 recorded
    mon.info["hosts"] = sorted({*mon.info.get("hosts", []), *(h for h in hosts if h)})
    mon.info["nodes"]["exits"] = {str(r): {k: d.get(k) for k in ("host", "status", "reason", "exit_code", "controls",
                                                                 "visible_devices")}
                                  if (d := done.get(r)) else None for r in range(1, nnodes)}
    bad = {r: d for r, d in sorted(done.items()) if d.get("status") != "ok"}
    missing = [r for r in range(1, nnodes) if r not in done]
    if not bad and not missing:
        return status, reason
    # Every node sees every rank's error report (shared folder), but only the node of a killed rank
    # knows it was killed: the causes of all nodes are ranked by the same precedence as one node's.
    own = {k: mon.info[k] for k in _CAUSE_KEYS if k in mon.info}
    records = [(0, reason, own), *((r, d.get("reason"), d) for r, d in bad.items())]
    with_cause = [rec for rec in records if rec[2].get("failure_cause")]
    if with_cause:
        node, _, chosen = min(with_cause, key=lambda rec: _cause_order(rec[2]["failure_cause"], rec[0]))
        cause = chosen["failure_cause"]
        mon.info.update({k: chosen[k] for k in ("failed_rank", "error", "error_tail", "failure_cause") if k in chosen},
                        consequences=_merge_consequences(cause, [rec[2] for rec in with_cause]))
        records.sort(key=lambda rec: rec[0] != node)  # the cause's node speaks first
    # a rank's error file is seen by every node: do not repeat a reason another node already gives
    notes: list[str] = []
    told: set[str | None] = set()
    for r, why, _ in records:
        if r == 0:
            if why:
                notes.append(why)
        elif why not in told:
            notes.append(f"node {r} ({done[r].get('host')}): {why or 'failed'}")
        if why:
            told.add(why)
    notes += [f"node {r} left no exit record within {NODE_WAIT_S:.0f} s" for r in missing]
    return "failed", "; ".join(notes) or "a node failed"


def _cause_order(cause: Mapping[str, Any], node: int) -> tuple[bool, bool, int, int]:
    """A killed rank before any error report, then the earliest report; node and rank break ties."""
    t = cause.get("t_ns")
    return (cause.get("how") != "killed", t is None, t if t is not None else 0, node)


def _merge_consequences(cause: Mapping[str, Any], infos: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """All nodes' consequences of ``cause``, one per rank; a node's own knowledge (its tear-down, a
    kill) wins over what any node reads from the shared error reports."""
    out: dict[int, dict[str, Any]] = {}
    for info in infos:
        other = info["failure_cause"]
        entries = list(info.get("consequences") or [])
        if other["rank"] != cause["rank"]:
            how = other["error"] if other["how"] == "killed" else f"failed after rank {cause['rank']}"
            entries.append({"rank": other["rank"], "how": how, "exit_code": None,
                            "error": None if other["how"] == "killed" else other["error"]})
        for e in entries:
            if e["rank"] == cause["rank"]:
                continue
            known = out.get(e["rank"])
            if known is None or (known["how"].startswith("failed after") and not e["how"].startswith("failed after")):
                out[e["rank"]] = dict(e)
    return [out[r] for r in sorted(out)]


def _supervise(mon: Monitor, cmd: list[str], echo: bool, timeout_s: float | None, env: Mapping[str, str] | None,
               log_name: str) -> tuple[str, str | None, int]:
    """Run torchrun under the supervisor (:func:`powertrain.supervise.supervise`: output copied without
    ever blocking it, signals forwarded, the whole tree stopped on a crash, a time limit, an interrupt
    or this launcher's death); (status, reason, exit code).

    Its output goes to ``logs/<log_name>``; what went wrong is also put in ``mon.info`` (failed_rank,
    error, error_tail, launch), which only the run's owner writes to ``run.json``.
    """
    run = mon.run
    log = run.logs_dir / log_name
    res = supervise(cmd, run, log_name, echo=False, on_output=ProgressEcho() if echo else None,
                    env={**(env or {}), "PYTHONUNBUFFERED": "1"}, merge_output=True, timeout_s=timeout_s,
                    tear_down=lambda: CRASH_GRACE_S if first_error(run.path) is not None else None,
                    kill_after_s=STOP_GRACE_S, on_tick=mon.warn_if_sampler_died)
    code, interrupted, timed_out = res.code, res.received, res.timed_out
    mon.info["launch"] = {"t_start_ns": res.t_start_ns, "t_end_ns": res.t_end_ns, "exit_code": code}
    mon.log_loss = res.log_loss

    status, reason = "ok", None
    failures = torchrun_failures(log) if code != 0 else {}
    cause, consequences = attribute_failure(rank_errors(run.path), failures, torchrun_stopped(log) if failures else {},
                                            stopped_from_outside=bool(interrupted or timed_out))
    if cause is not None:
        r = cause["rank"]
        tail = _tail(run.logs_dir / f"rank-{r}.log")
        mon.info.update(failed_rank=r, error=cause["error"], error_tail=tail, failure_cause=cause,
                        consequences=consequences)
        status = "failed"
        reason = f"rank {r} {cause['error']}" if cause["how"] == "killed" else f"rank {r} failed: {cause['error']}"
    elif code != 0 or timed_out or interrupted:
        tail = _tail(log)
        mon.info["error_tail"] = tail
        status = "failed"
        if timed_out:
            reason = f"timed out after {timeout_s:g} s"
        elif interrupted:
            reason = f"interrupted ({signal.Signals(interrupted[0]).name})"
        else:
            reason = f"torchrun exited with code {code}: {tail.splitlines()[-1] if tail else 'no output'}"
    return status, reason, code
