"""Measure anything: a region of Python code, or a whole command, under the per-node sampler.

::

    with powertrain.Monitor(out="runs/try1") as m:
        for i, batch in enumerate(loader):
            with powertrain.step(i, tokens=batch.numel()):
                train_step(batch)
    print(m.run_dir)

``Monitor`` creates the run directory, starts the sampler process
(:mod:`powertrain.sampler_process`), sends this process's step / phase markers
(:mod:`powertrain.hooks`) to ``events/rank-<r>.parquet`` of the run, and on exit closes the events
file, stops the sampler, compacts what it wrote and records in ``run.json`` how the run ended. :func:`run_command` does the same around a child process (what
``powertrain monitor -- CMD`` calls), passing its output through to the terminal and into
``logs/``, forwarding Ctrl-C / SIGTERM once, and returning its exit code.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from powertrain import hooks
from powertrain.schema import TELEMETRY_FIELDS
from powertrain.store.rundir import RunDir, default_host, read_json, write_json_atomic
from powertrain.store.tables import finalize_run_streams
from powertrain.telemetry.clock import DEFAULT_RATE_HZ, clock_info

# Quantities people look for, and the telemetry fields that carry them.
QUANTITIES: dict[str, tuple[str, ...]] = {
    "power": ("power_w", "power_avg_w"),
    "energy": ("energy_j",),
    "temperature": ("temp_c", "temp_hotspot_c", "temp_mem_c"),
    "clocks": ("clock_sm_mhz",),
    "throttle reasons": ("throttle",),
    "interconnect bytes": ("link_tx_bytes", "pcie_tx_bytes"),
}

SAMPLER_START_TIMEOUT_S = 60.0
SAMPLER_STOP_TIMEOUT_S = 15.0


class MonitorError(RuntimeError):
    """The monitor could not start (bad output folder, sampler failed to come up)."""


def wait_for_shared_file(path: Path, timeout_s: float, what: str) -> None:
    """Wait for a file another process (possibly on another node) writes into the run directory."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise MonitorError(f"{path}: {what} did not appear within {timeout_s:.0f} s "
                               "(shared filesystem assumed: is --out on a folder every node sees?)")
        time.sleep(0.05)


def _iso(t_ns: int | None) -> str | None:
    if t_ns is None:
        return None
    return dt.datetime.fromtimestamp(t_ns / 1e9, tz=dt.UTC).isoformat()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("powertrain", "torch", "numpy", "pyarrow", "nvidia-ml-py", "amdsmi"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _signal_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Monitor:
    """Sample this node's devices into a run directory for the duration of a ``with`` block.

    Args:
        out: the run directory to create (it must not already hold a run).
        rate_hz: samples per second per device (default 20).
        backends: ``"auto"`` or a list of ``nvidia``, ``amd``, ``host``.
        name: a label stored in ``run.json``.
        command: the command being measured, if any (recorded, not run).
        warmup_steps: the first this many steps marked inside the block (``powertrain.step``) are
            warm-up and left out of the metrics; later ones are measured (default 0: all of them).
            A window the loop sets itself (``powertrain.window`` / ``set_window``) takes precedence.
            Stored in ``run.json`` as ``warmup_steps``; it also applies to steps that the run's other
            processes record without a window (see ``docs/metrics.md``, "Window").
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        rate_hz: float = DEFAULT_RATE_HZ,
        backends: Sequence[str] | str = "auto",
        name: str | None = None,
        command: Sequence[str] | None = None,
        host: str | None = None,
        flush_s: float = 1.0,
        prometheus: str | None = None,
        warmup_steps: int = 0,
    ) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a whole number >= 0, got {warmup_steps!r}")
        self.warmup_steps = warmup_steps
        self.run = RunDir(out)
        self.prometheus = prometheus
        self.rate_hz = rate_hz
        self.backends = backends if isinstance(backends, str) else ",".join(backends)
        self.name = name or self.run.path.name
        self.command = list(command) if command else None
        self.host = host or default_host()
        self.flush_s = flush_s
        self.sampler: subprocess.Popen[bytes] | None = None
        self.sampler_death: str | None = None
        self.info: dict[str, Any] = {}
        self._log: IO[bytes] | None = None
        self._hooks: hooks.Binding | None = None

    @property
    def run_dir(self) -> Path:
        return self.run.path

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Monitor:
        if self.run.exists():
            raise MonitorError(
                f"{self.run.path} already holds a run (run.json exists); choose a new --out folder "
                "or delete the old run"
            )
        self.run.create()
        t0 = time.time_ns()
        self.info = {
            "schema": "powertrain.run/1",
            "kind": "monitor",
            "name": self.name,
            "status": "running",
            "reason": None,
            "command": self.command,
            "exit_code": None,
            "start_ns": t0,
            "start": _iso(t0),
            "end_ns": None,
            "end": None,
            "hosts": [self.host],
            "owner": {"host": self.host, "pid": os.getpid()},
            "platform": {"os": platform.platform(), "machine": platform.machine()},
            "software": _versions(),
            "clock": {"start": clock_info()},
            "sampler": {"rate_hz": self.rate_hz, "backends": self.backends},
            # leading steps per rank that are warm-up, for steps recorded without a window
            "warmup_steps": self.warmup_steps,
        }
        self.run.write(self.info)
        self._start_sampler()
        # This process's markers go to this run (the events file appears with the first step); a
        # command run under the monitor gets the run directory through $POWERTRAIN_RUN_DIR instead.
        self._hooks = hooks.bind(self.run.path, warmup_steps=self.warmup_steps)
        return self

    def _start_sampler(self) -> None:
        meta = self.run.telemetry_meta(self.host)
        meta.unlink(missing_ok=True)
        self._log = open(self.run.logs_dir / f"sampler-{self.host}.stderr", "ab")  # noqa: SIM115
        cmd = [
            sys.executable, "-m", "powertrain.sampler_process", str(self.run.path),
            "--rate", str(self.rate_hz), "--backends", self.backends, "--host", self.host,
            "--flush", str(self.flush_s), "--watch-pid", str(os.getpid()),
        ]
        if self.prometheus:
            cmd += ["--prometheus", self.prometheus]
        # Own process group: a terminal Ctrl-C reaches us, and we stop the sampler in order.
        self.sampler = subprocess.Popen(cmd, stdout=self._log, stderr=self._log, process_group=0)
        deadline = time.monotonic() + SAMPLER_START_TIMEOUT_S
        while not meta.is_file():
            if self.sampler.poll() is not None:
                tail = (self.run.logs_dir / f"sampler-{self.host}.stderr").read_text(errors="replace")[-2000:]
                self._finish("failed", f"telemetry sampler failed to start: {tail.strip()}")
                raise MonitorError(f"the telemetry sampler failed to start:\n{tail}")
            if time.monotonic() > deadline:
                self.sampler.kill()
                self._finish("failed", "telemetry sampler did not start within 60 s")
                raise MonitorError("the telemetry sampler did not start within 60 s")
            time.sleep(0.02)

    def attach(self, timeout_s: float = SAMPLER_START_TIMEOUT_S) -> Monitor:
        """Join a run that another process created (``run.json`` exists or appears within
        ``timeout_s``): start only this host's sampler, write no ``run.json``. For the first process of
        every other node of a multi-node job; the run's owner collects every host's sampler meta."""
        wait_for_shared_file(self.run.run_json, timeout_s, "the run's run.json (its first process did not start)")
        self.info = read_json(self.run.run_json)
        self._attached = True
        self._start_sampler()
        return self

    def detach(self) -> None:
        """Stop the sampler started by :meth:`attach` (``run.json`` stays the owner's)."""
        self._stop_sampler()

    def check_sampler(self) -> bool:
        """True while the sampler runs; records how it died otherwise."""
        if self.sampler is None:
            return False
        code = self.sampler.poll()
        if code is None:
            return True
        if self.sampler_death is None:
            self.sampler_death = f"telemetry sampler (pid {self.sampler.pid}) {_signal_reason(code)}"
        return False

    def _stop_sampler(self) -> None:
        if self.sampler is None:
            return
        if self.check_sampler():
            self.sampler.send_signal(signal.SIGTERM)
            try:
                self.sampler.wait(SAMPLER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.sampler.kill()
                self.sampler.wait()
                self.sampler_death = "telemetry sampler did not stop within 15 s and was killed"
        if self._log:
            self._log.close()

    def stop(self, status: str = "ok", reason: str | None = None, exit_code: int | None = None) -> dict[str, Any]:
        """Stop sampling and record how the run ended; a dead sampler turns ``ok`` into ``failed``."""
        self._unbind_hooks()
        self._stop_sampler()
        if self.sampler_death:
            last = self._last_sample_note()
            death = f"{self.sampler_death}; telemetry kept up to {last}"
            reason = f"{reason}; {death}" if reason else death
            status = "failed"
        return self._finish(status, reason, exit_code)

    def _unbind_hooks(self) -> None:
        """Close this process's events file (so ``load`` / ``summary`` right after the block see every
        step) and give the markers back to what they wrote to before."""
        if self._hooks is not None:
            binding, self._hooks = self._hooks, None
            hooks.unbind(binding)

    def _last_sample_note(self) -> str:
        meta = self.run.telemetry_meta(self.host)
        try:
            t_last = read_json(meta).get("t_last_ns")
        except (OSError, ValueError):
            t_last = None
        if t_last is None:
            from powertrain.store.tables import read_telemetry

            tel = read_telemetry(self.run.path)
            t_last = tel.column("t_ns")[-1].as_py() if tel.num_rows else None
        return _iso(t_last) or "the start (no sample was written)"

    def _finish(self, status: str, reason: str | None, exit_code: int | None = None) -> dict[str, Any]:
        if getattr(self, "_attached", False):
            raise MonitorError("cannot finish a run this process only attached to (call detach())")
        finalize_run_streams(self.run.path)
        t1 = time.time_ns()
        self.info.update(status=status, reason=reason, exit_code=exit_code, end_ns=t1, end=_iso(t1))
        self.info["clock"]["end"] = clock_info()
        self.info.update(collect_devices(self.run))
        self.info["hosts"] = sorted({*self.info.get("hosts", []), *self.info.get("sampler_hosts", {})})
        self.run.write(self.info)
        return self.info

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.stop("ok")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.stop("failed", "interrupted (KeyboardInterrupt)")
        else:
            self.stop("failed", f"{exc_type.__name__}: {exc}")


def collect_devices(run: RunDir) -> dict[str, Any]:
    """Devices, supported fields and what was *not* measured, from every host's sampler meta."""
    devices: list[dict[str, Any]] = []
    notes: list[str] = []
    incidents: list[dict[str, Any]] = []
    sampler: dict[str, Any] = {}
    software: dict[str, str] = {}
    for meta_path in sorted(run.telemetry_dir.glob("*.meta.json")):
        meta = read_json(meta_path)
        host = meta.get("host")
        devices += [{"host": host, **d} for d in meta.get("devices", [])]
        notes += meta.get("notes", [])
        incidents += [{"host": host, **i} for i in meta.get("incidents", [])]
        software.update(meta.get("software", {}))
        sampler[host] = {k: meta.get(k) for k in (
            "backends", "rate_hz_requested", "rate_hz_achieved", "samples", "missed_ticks",
            "t_first_ns", "t_last_ns", "finished", "stop_reason", "clock")}
    supported = sorted({f for d in devices for f in d.get("supported", [])})
    gpu_supported = {f for d in devices if d.get("kind") == "gpu" for f in d.get("supported", [])}
    not_measured = [q for q, fields in QUANTITIES.items() if not gpu_supported.intersection(fields)]
    if any(d.get("kind") == "cpu" and "energy_j" in d.get("supported", []) for d in devices):
        not_measured = [q for q in not_measured if q != "energy"]
    return {
        "devices": devices,
        "fields_supported": [f for f in TELEMETRY_FIELDS if f in supported],
        "not_measured": not_measured,
        "telemetry_notes": notes,
        "incidents": incidents,
        "sampler_hosts": sampler,
        "device_software": software,
    }


def run_command(
    argv: Sequence[str],
    out: str | os.PathLike[str],
    *,
    rate_hz: float = DEFAULT_RATE_HZ,
    backends: Sequence[str] | str = "auto",
    echo: bool = True,
    on_output: Callable[[bytes, str], None] | None = None,
    prometheus: str | None = None,
    env: Mapping[str, str] | None = None,
    on_exit: Callable[[], None] | None = None,
    warmup_steps: int = 0,
) -> tuple[int, dict[str, Any]]:
    """Run ``argv`` under the sampler; returns (the command's exit code, the final ``run.json``).

    The command's stdout/stderr go to the terminal (when ``echo``) and to ``logs/command.stdout`` /
    ``logs/command.stderr``. SIGINT and SIGTERM are forwarded once to the command's process group;
    if it has not exited 10 s later it is killed.

    The command sees ``$POWERTRAIN_RUN_DIR`` (so :mod:`powertrain.hooks` markers land in this run)
    plus ``env``. ``on_output(chunk, "stdout"|"stderr")`` is called with every chunk of its output
    as it arrives (``powertrain monitor --parse``); ``on_exit()`` runs once the command's output is
    drained, before the run's streams are compacted (close what ``on_output`` writes there);
    ``prometheus`` (``[HOST:]PORT``) serves the sampler's readings live. ``warmup_steps``: leading
    steps of each rank that are warm-up when the command marks steps without a window.
    """
    if not argv:
        raise MonitorError("no command given: put it after `--`, e.g. powertrain monitor -- python train.py")
    mon = Monitor(out, rate_hz=rate_hz, backends=backends, command=list(argv), prometheus=prometheus,
                  warmup_steps=warmup_steps)
    mon.start()
    try:
        code, received = _supervise(argv, mon.run, mon, "command", echo=echo, on_output=on_output, env=env)
    except OSError as exc:
        mon.stop("failed", f"could not start the command: {exc}", exit_code=127)
        return 127, mon.info
    if on_exit is not None:
        on_exit()
    status, reason = _outcome(code, received)
    info = mon.stop(status, reason, exit_code=code)
    return code, info


def _supervise(argv: Sequence[str], run: RunDir, mon: Monitor | None, log_name: str, *, echo: bool,
               on_output: Callable[[bytes, str], None] | None, env: Mapping[str, str] | None
               ) -> tuple[int, list[int]]:
    """Run ``argv`` to its end with output pumped to ``logs/<log_name>.std{out,err}``; returns its exit
    code and the signals forwarded to it. Raises ``OSError`` when it cannot be started."""
    logs = run.logs_dir
    child_env = {**os.environ, "POWERTRAIN_RUN_DIR": str(run.path.resolve()), **(env or {})}
    child = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0,
                             env=child_env)
    pumps = [
        threading.Thread(target=_pump, args=(child.stdout, logs / f"{log_name}.stdout",
                                             sys.stdout.buffer if echo else None, on_output, "stdout"),
                         daemon=True),
        threading.Thread(target=_pump, args=(child.stderr, logs / f"{log_name}.stderr",
                                             sys.stderr.buffer if echo else None, on_output, "stderr"),
                         daemon=True),
    ]
    for t in pumps:
        t.start()

    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not received:
            received.append(signum)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        kill_at: float | None = None
        while True:
            try:
                code = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if mon is not None and mon.sampler_death is None and not mon.check_sampler():
                # Keep the user's job going; the run is marked failed at the end.
                print(f"powertrain: {mon.sampler_death}; the command keeps running", file=sys.stderr)
            if received and kill_at is None:
                kill_at = time.monotonic() + 10.0
            if kill_at is not None and time.monotonic() > kill_at:
                os.killpg(child.pid, signal.SIGKILL)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for t in pumps:
        t.join(timeout=5)
    return code, received


def _outcome(code: int, received: list[int]) -> tuple[str, str | None]:
    if received:
        return "failed", f"interrupted ({signal.Signals(received[0]).name}); command {_signal_reason(code)}"
    if code != 0:
        return "failed", f"command {_signal_reason(code)}"
    return "ok", None


# -- several tasks per node (srun -n N powertrain monitor ...) ------------------------------------
TASK_WAIT_S = 300.0


def slurm_task(environ: Mapping[str, str] | None = None) -> dict[str, int] | None:
    """This process's place in a Slurm job step with more than one task, or ``None``.

    Read from ``SLURM_STEP_NUM_TASKS`` (set by ``srun`` for its tasks, not in a batch script),
    ``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_STEP_NUM_NODES``.
    """
    e = os.environ if environ is None else environ
    try:
        ntasks = int(e["SLURM_STEP_NUM_TASKS"])
        task = {"ntasks": ntasks, "procid": int(e["SLURM_PROCID"]), "localid": int(e["SLURM_LOCALID"]),
                "nnodes": int(e.get("SLURM_STEP_NUM_NODES") or e.get("SLURM_NNODES") or 1)}
    except (KeyError, ValueError):
        return None
    return task if ntasks > 1 else None


def _task_marker(run: RunDir, procid: int) -> Path:
    return run.logs_dir / f"task-{procid}.exit.json"


def _wait_tasks(run: RunDir, ntasks: int, timeout_s: float) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Exit records of every task (shared filesystem), waiting up to ``timeout_s``; and the missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = {i: read_json(_task_marker(run, i)) for i in range(ntasks) if _task_marker(run, i).is_file()}
        missing = [i for i in range(ntasks) if i not in done]
        if not missing or time.monotonic() > deadline:
            return done, missing
        time.sleep(0.1)


def _wait_node_samplers(run: RunDir, nnodes: int, timeout_s: float = 30.0) -> None:
    """Give the other nodes' samplers time to write their final meta before the run is closed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metas = [read_json(m) for m in run.telemetry_dir.glob("*.meta.json")]
        if sum(1 for m in metas if m.get("finished")) >= nnodes - 1:
            return
        time.sleep(0.1)


def run_task_command(
    argv: Sequence[str],
    out: str | os.PathLike[str],
    task: Mapping[str, int],
    *,
    rate_hz: float = DEFAULT_RATE_HZ,
    backends: Sequence[str] | str = "auto",
    echo: bool = True,
    on_output: Callable[[bytes, str], None] | None = None,
    prometheus: str | None = None,
    task_wait_s: float = TASK_WAIT_S,
    on_exit: Callable[[], None] | None = None,
    warmup_steps: int = 0,
) -> tuple[int, dict[str, Any]]:
    """One task of ``srun -n N powertrain monitor --out DIR -- CMD``: one run, one sampler per node.

    Task 0 (``SLURM_PROCID=0``) creates the run and samples its node; the first task of every other
    node (``SLURM_LOCALID=0``) only starts its node's sampler (:meth:`Monitor.attach`); the remaining
    tasks only run the command. Every task runs ``CMD`` with ``$POWERTRAIN_RUN_DIR`` and, where
    unset, ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` from Slurm, logs to ``logs/task-<i>.std*``
    and leaves ``logs/task-<i>.exit.json``; samplers run until every task has ended. DIR must be on
    a filesystem every node shares. Returns this task's exit code and (task 0) the final ``run.json``.
    ``warmup_steps`` is recorded by task 0 (see :func:`run_command`).
    """
    if not argv:
        raise MonitorError("no command given: put it after `--`, e.g. powertrain monitor -- python train.py")
    procid, localid, ntasks = task["procid"], task["localid"], task["ntasks"]
    env = {k: str(v) for k, v in (("RANK", procid), ("LOCAL_RANK", localid), ("WORLD_SIZE", ntasks))
           if k not in os.environ}
    mon: Monitor | None = None
    run = RunDir(out)
    if procid == 0:
        mon = Monitor(out, rate_hz=rate_hz, backends=backends, command=list(argv), prometheus=prometheus,
                      warmup_steps=warmup_steps)
        mon.start()
        mon.info["slurm"] = {"tasks": ntasks, "nodes": task.get("nnodes", 1),
                             "job_id": os.environ.get("SLURM_JOB_ID")}
        mon.run.write(mon.info)
    elif localid == 0:
        mon = Monitor(out, rate_hz=rate_hz, backends=backends, prometheus=prometheus).attach(task_wait_s)
    else:
        wait_for_shared_file(run.run_json, task_wait_s, "the run.json of task 0")
    try:
        code, received = _supervise(argv, run, mon, f"task-{procid}", echo=echo, on_output=on_output, env=env)
    except OSError as exc:
        print(f"powertrain: task {procid} could not start the command: {exc}", file=sys.stderr)
        code, received = 127, []
    if on_exit is not None:
        on_exit()
    write_json_atomic(_task_marker(run, procid), {"procid": procid, "localid": localid, "host": default_host(),
                                                  "exit_code": code, "end_ns": time.time_ns()})
    if mon is None:
        return code, {}
    done, missing = _wait_tasks(run, ntasks, task_wait_s)
    if procid != 0:
        mon.detach()
        return code, {}
    if task.get("nnodes", 1) > 1:
        _wait_node_samplers(run, task["nnodes"])
    status, reason = _outcome(code, received)
    failed = [f"task {i} exited with code {d.get('exit_code')}" for i, d in sorted(done.items())
              if d.get("exit_code") not in (0, None) and i != 0]
    if missing:
        failed.append(f"tasks {missing} left no exit record within {task_wait_s:.0f} s")
    if failed:
        status, reason = "failed", "; ".join(filter(None, [reason, *failed]))
    return code, mon.stop(status, reason, exit_code=code)


def _pump(src: IO[bytes] | None, dest: Path, echo: IO[bytes] | None,
          on_output: Callable[[bytes, str], None] | None = None, stream: str = "stdout") -> None:
    if src is None:
        return
    with open(dest, "ab") as f:
        for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
            f.write(chunk)
            f.flush()
            if on_output is not None:
                try:
                    on_output(chunk, stream)
                except Exception as exc:  # a parser bug must not stall the user's command
                    print(f"powertrain: output parser failed ({exc!r}); parsing stops", file=sys.stderr)
                    on_output = None
            if echo is not None:
                try:
                    echo.write(chunk)
                    echo.flush()
                except (OSError, ValueError):
                    echo = None
