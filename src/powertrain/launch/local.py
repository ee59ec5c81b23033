"""Launch one run on this machine: validate, then ``torchrun`` the ranks under the node's sampler.

:func:`launch_local` checks the configuration first (:mod:`powertrain.spec.validate`; nothing
starts when a rule is broken), creates the run directory through :class:`powertrain.Monitor`
(telemetry sampler running), writes the resolved spec and the rank map to ``run.json``, then starts
``torchrun --standalone --nproc_per_node=N -m powertrain.workload.train``. The protocol's cool-down
gate and idle baseline are applied by the sweep runner (:mod:`powertrain.launch.sweep`), not here.

Failure handling: a rank that raises writes ``logs/rank-<r>.error.json`` and exits; torchrun then
stops the other ranks. The launcher waits at most ``crash_grace_s`` after the first error report
before killing the whole process group, so a crash ends the run within a bounded time. The run is
marked ``failed`` with the first failing rank and its error tail; telemetry and events written up
to the crash stay in the run directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from powertrain import hooks
from powertrain.monitor import Monitor
from powertrain.spec.run import RunConfig
from powertrain.spec.validate import check
from powertrain.store.rundir import default_host, read_json

CRASH_GRACE_S = 20.0
STOP_GRACE_S = 10.0
ERROR_TAIL_LINES = 30


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


def rank_map(cfg: RunConfig, host: str, device_type: str) -> list[dict[str, Any]]:
    """rank → host, local rank, device and mesh coordinates {dp, tp, pp, cp, ep}."""
    lay = cfg.layout.resolve(cfg.world)
    per_node = cfg.hardware.devices_per_node
    out = []
    for r in range(cfg.world):
        local = r % per_node
        out.append({"rank": r, "host": host, "local_rank": local,
                    "device": device_type if device_type == "cpu" else f"{device_type}:{local}",
                    "coords": lay.coords(r)})
    return out


def first_error(run_dir: Path) -> dict[str, Any] | None:
    """The earliest ``rank-<r>.error.json`` written by a failing rank, if any."""
    errors = []
    for p in (run_dir / "logs").glob("rank-*.error.json"):
        try:
            errors.append(read_json(p))
        except (OSError, ValueError):
            continue
    return min(errors, key=lambda e: e.get("t_ns", 0)) if errors else None


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_failures(log: Path) -> dict[int, int]:
    """rank → exit code of every failed rank in torchrun's failure report."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return {int(r): int(c) for r, c in _FAILURE.findall(text)}


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


def _pump(src: IO[bytes], dest: Path, echo: bool) -> None:
    """Copy torchrun's output into ``dest``; echo rank 0's progress lines to the terminal."""
    with open(dest, "ab") as f:
        for line in iter(src.readline, b""):
            f.write(line)
            f.flush()
            if echo and line.startswith(b"powertrain:"):
                sys.stderr.buffer.write(line)
                sys.stderr.flush()


def torchrun_command(cfg: RunConfig, spec_path: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={cfg.hardware.devices_per_node}", "--monitor-interval=0.2",
            "-m", "powertrain.workload.train", "--spec", str(spec_path)]


def launch_local(cfg: RunConfig, out: str | os.PathLike[str], *, rate_hz: float = 20.0,
                 backends: str | list[str] = "auto", echo: bool = True, timeout_s: float | None = None,
                 env: Mapping[str, str] | None = None) -> RunResult:
    """Run ``cfg`` on this node; returns how it ended (the run directory holds the rest).

    Raises :class:`powertrain.spec.validate.ConfigError` before anything starts when the
    configuration breaks a rule, and ``ValueError`` when it needs more nodes or devices than here.
    """
    check(cfg)
    if cfg.hardware.nodes != 1:
        raise ValueError(f"local launch runs one node, the spec asks for {cfg.hardware.nodes}; "
                         "set hardware.nodes: 1 or launch through Slurm")
    dev, count = accelerator()
    if dev != "cpu" and cfg.world > count:
        raise ValueError(f"the spec needs {cfg.world} ranks but this node has {count} {dev} devices; "
                         f"set hardware.devices_per_node ≤ {count}")
    out = Path(out)
    spec_path = out / "spec.json"
    cmd = torchrun_command(cfg, spec_path)
    host = default_host()
    mon = Monitor(out, rate_hz=rate_hz, backends=backends, name=cfg.name, command=cmd)
    mon.start()
    try:
        status, reason, code = _supervise(cfg, mon, cmd, spec_path, host, dev, echo, timeout_s, env)
    except BaseException as exc:
        mon.stop("failed", f"launcher error: {type(exc).__name__}: {exc}")
        raise
    info = mon.stop(status, reason, exit_code=code)
    return RunResult(mon.run.path, info["status"], info["reason"], code, info)


def _supervise(cfg: RunConfig, mon: Monitor, cmd: list[str], spec_path: Path, host: str, dev: str, echo: bool,
               timeout_s: float | None, env: Mapping[str, str] | None) -> tuple[str, str | None, int]:
    """Start torchrun, wait for it (stopping it on a crash, timeout or signal); (status, reason, exit code)."""
    run = mon.run
    lay = cfg.layout.resolve(cfg.world)
    cfg = cfg.model_copy(update={"layout": lay})  # the resolved spec: dp filled in from the world size
    spec_path.write_text(cfg.model_dump_json(indent=2))
    mon.info.update(kind="run", config=cfg.model_dump(mode="json"), layout_label=lay.label(), world=cfg.world,
                    rank_map=rank_map(cfg, host, dev), backend="nccl" if dev == "cuda" else "gloo")
    run.write(mon.info)

    child_env = {**os.environ, **(env or {}), hooks.RUN_DIR_ENV: str(run.path.resolve()), "PYTHONUNBUFFERED": "1"}
    t_launch = time.time_ns()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env, process_group=0,
                             preexec_fn=_term_with_parent)
    assert child.stdout is not None
    pump = threading.Thread(target=_pump, args=(child.stdout, run.logs_dir / "torchrun.log", echo), daemon=True)
    pump.start()

    interrupted: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not interrupted:
            interrupted.append(signum)
            _killpg(child.pid, signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    kill_at: float | None = None
    timed_out = False
    try:
        while True:
            try:
                code = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if kill_at is None and (interrupted or first_error(run.path) is not None):
                kill_at = now + (STOP_GRACE_S if interrupted else CRASH_GRACE_S)
            if timeout_s is not None and not timed_out and (time.time_ns() - t_launch) / 1e9 > timeout_s:
                timed_out = True
                _killpg(child.pid, signal.SIGTERM)
                kill_at = now + STOP_GRACE_S
            if kill_at is not None and now > kill_at:
                _killpg(child.pid, signal.SIGKILL)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    pump.join(timeout=5)
    t_end = time.time_ns()
    mon.info["launch"] = {"t_start_ns": t_launch, "t_end_ns": t_end, "exit_code": code}

    status, reason = "ok", None
    err = first_error(run.path)
    failures = torchrun_failures(run.logs_dir / "torchrun.log") if code != 0 else {}
    # A rank killed without a word (SIGKILL, OOM killer, segfault) is the origin: its peers' errors
    # ("connection closed by peer") are only echoes of it.
    killed = sorted(r for r, c in failures.items() if c < 0 and not (run.logs_dir / f"rank-{r}.error.json").exists()
                    and not (interrupted or timed_out))
    if killed:
        # torchrun stops the survivors with SIGTERM: a rank killed by anything else came first.
        r = next((k for k in killed if failures[k] != -signal.SIGTERM), killed[0])
        tail = _tail(run.logs_dir / f"rank-{r}.log")
        error = f"killed by {_signal_name(failures[r])}"
        mon.info.update(failed_rank=r, error=error, error_tail=tail)
        status, reason = "failed", f"rank {r} {error}"
    elif err is not None:
        r = err["rank"]
        tail = _tail(run.logs_dir / f"rank-{r}.log")
        mon.info.update(failed_rank=r, error=err["error"], error_tail=tail)
        status, reason = "failed", f"rank {r} failed: {err['error']}"
    elif code != 0 or timed_out or interrupted:
        tail = _tail(run.logs_dir / "torchrun.log")
        mon.info["error_tail"] = tail
        status = "failed"
        if timed_out:
            reason = f"timed out after {timeout_s:g} s"
        elif interrupted:
            reason = f"interrupted ({signal.Signals(interrupted[0]).name})"
        else:
            reason = f"torchrun exited with code {code}: {tail.splitlines()[-1] if tail else 'no output'}"
    return status, reason, code


def _term_with_parent() -> None:
    """In torchrun's process: get SIGTERM if this launcher dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
