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

The run's ``start_ns`` is the wall clock when it started; its ``end_ns`` is ``start_ns`` plus the
*monotonic* time elapsed since (``duration_s`` the same), so a step of the system clock while it runs (an
NTP step back of 60 s during a 15 s run once recorded −45 s) changes neither; the step is said in
``run.json`` ``clock.wall_clock_step_s`` and a ``data_quality`` note. The sampler stamps its rows the same
way (:mod:`powertrain.telemetry.sampler`).

Around the lifecycle: :mod:`powertrain.supervise` runs the command (output, signals, exit code),
:mod:`powertrain.slurm_tasks` coordinates the tasks of an ``srun`` step, and
:mod:`powertrain.shared_fs` waits for files other nodes write into the run.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from powertrain import hooks
from powertrain.schema import EVENTS_SCHEMA, TELEMETRY_FIELDS, TELEMETRY_SCHEMA
from powertrain.shared_fs import wait_for_file
from powertrain.store.reserve import RUN_RESERVE_BYTES, hold_space, release_space, reserve_path
from powertrain.store.rundir import RunDir, default_host, read_json, set_file_mode
from powertrain.store.tables import finalize, finalize_power_samples
from powertrain.supervise import inherited_visible_devices, signal_reason, stop_orphans, supervise
from powertrain.telemetry.clock import DEFAULT_RATE_HZ, clock_info
from powertrain.telemetry.sampler import WRITE_FAILED

log = logging.getLogger(__name__)

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
# The sampler takes a last sample and compacts its segments when told to stop; on a loaded host that
# can take tens of seconds, and killing it mid-compaction fails a healthy run, so the bound is generous.
SAMPLER_STOP_TIMEOUT_S = 60.0
# A wall clock that moved this much more (or less) than the monotonic clock during a run was stepped.
WALL_STEP_NOTE_S = 1.0

# The clocks a run's start, end and duration are read from (tests replace them: no sleeping).
_wall_ns = time.time_ns
_mono_ns = time.monotonic_ns


class MonitorError(RuntimeError):
    """The monitor could not start (bad output folder, sampler failed to come up)."""


def wait_for_shared_file(path: Path, timeout_s: float, what: str) -> None:
    """Wait for a file another process (possibly on another node) writes into the run directory."""
    if not wait_for_file(path, timeout_s):
        raise MonitorError(f"{path}: {what} did not appear within {timeout_s:.0f} s "
                           "(shared filesystem assumed: is --out on a folder every node sees?)")


def check_prometheus(spec: str) -> None:
    """Refuse (``ValueError``) a bad ``Monitor(prometheus=…)``, in the Python API's words.

    The sampler would refuse it too, but only once started, and with the CLI's fix
    (``--prometheus-public``), which a ``Monitor`` has no way to take.
    """
    from powertrain.live.prometheus import PUBLIC_ENV, check_public, parse_listen

    try:
        addr, _ = parse_listen(spec)
    except ValueError as exc:
        raise ValueError(f"prometheus={spec!r}: {str(exc).removeprefix('--prometheus: ')}") from None
    try:
        check_public(addr)
    except ValueError:
        raise ValueError(f"prometheus={spec!r}: {addr} is not a loopback address, so telemetry would be served to "
                         f"the network; to allow it set {PUBLIC_ENV}=1 in the environment (os.environ"
                         f"[{PUBLIC_ENV!r}] = '1' before the Monitor or trainer callback starts), or serve on 127.0.0.1:PORT") from None


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
        host: the host label of this node's telemetry (default: the short host name).
        power_buffer: read the drivers' buffered power samples (NVML ``nvmlDeviceGetSamples``) between
            polls where a GPU has them, into ``telemetry/power-samples/`` (default True); each device
            records in ``run.json`` whether it was used and why not.
        flush_s: seconds between crash-safe writes, a finite number > 0: a ``kill -9`` loses at
            most about this much of the telemetry and of the steps this process marks. Default
            (``None``): 1 s for the telemetry, ``$POWERTRAIN_EVENTS_FLUSH_S`` (else 1 s) for the steps.
            The block's other processes (a command under ``powertrain monitor``) use
            ``$POWERTRAIN_EVENTS_FLUSH_S``.
        prometheus: ``[HOST:]PORT`` on which the sampler serves live readings for Prometheus
            (loopback only unless ``$POWERTRAIN_PROMETHEUS_PUBLIC=1`` is in the environment when the
            ``Monitor`` is created; see ``docs/user-guide.md``).

    A block that ends with an exception still ends the run: ``run.json`` gets ``status: failed`` and
    the exception as ``reason``, and the sampler is stopped.
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
        flush_s: float | None = None,
        prometheus: str | None = None,
        warmup_steps: int = 0,
        power_buffer: bool = True,
    ) -> None:
        hooks.check_warmup_steps(warmup_steps)
        if flush_s is not None:  # > 0: the sampler would rewrite its segment at every sample with 0
            flush_s = hooks.check_flush_s(flush_s, "flush_s", allow_zero=False)
        if prometheus:
            check_prometheus(prometheus)
        self.warmup_steps = warmup_steps
        self.run = RunDir(out)
        self.prometheus = prometheus
        self.rate_hz = rate_hz
        self.power_buffer = power_buffer  # read the drivers' buffered power samples where they have them
        self.backends = backends if isinstance(backends, str) else ",".join(backends)
        self.name = name or self.run.path.name
        if isinstance(command, str):  # list("python x.py") would record one argument per character
            raise ValueError("command: give the command as a list of arguments (e.g. sys.argv or "
                             "shlex.split('python train.py')), not one string")
        self.command = list(command) if command else None
        self.host = host or default_host()
        self.flush_s = flush_s
        self.sampler: subprocess.Popen[bytes] | None = None
        self.log_loss: list[dict[str, Any]] = []  # command logs that could not be written (supervise)
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
        # The environment the markers read ($RANK, $POWERTRAIN_EVENTS_FLUSH_S) is refused before anything
        # starts: a ValueError after the sampler started would leave it running and the run `running`.
        events_flush_s = self.flush_s if self.flush_s is not None else hooks.env_flush_s()
        rank = hooks.env_rank()
        made = [d for d in (self.run.path, self.run.telemetry_dir, self.run.events_dir, self.run.logs_dir)
                if not d.exists()]
        try:
            self.run.create()
            hold_space(reserve_path(self.run.path), RUN_RESERVE_BYTES)
            self._write_start()
            self._start_sampler()
            # This process's markers go to this run (the events file appears with the first step); a
            # command run under the monitor gets the run directory through $POWERTRAIN_RUN_DIR instead.
            self._hooks = hooks.bind(self.run.path, rank=rank, warmup_steps=self.warmup_steps,
                                     flush_s=events_flush_s)
        except BaseException as exc:  # Ctrl-C while the sampler comes up included: nothing is left running
            self._undo_start(made)
            if isinstance(exc, OSError):
                raise MonitorError(f"{self.run.path}: cannot start the run ({exc}); nothing was left behind") from None
            raise
        return self

    def _undo_start(self, made: list[Path]) -> None:
        """A failed start leaves nothing behind: the sampler is stopped, what this start created removed."""
        if self.sampler is not None and self.sampler.poll() is None:
            self.sampler.kill()
            self.sampler.wait()
        if self._log:
            self._log.close()
            self._log = None
        if getattr(self, "_attached", False):
            return
        self.run.run_json.unlink(missing_ok=True)
        release_space(reserve_path(self.run.path))
        for d in reversed(made):
            shutil.rmtree(d, ignore_errors=True)

    def _write_start(self) -> None:
        t0 = _wall_ns()
        self._t0_mono = _mono_ns()
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
            # the run's end is start_ns + monotonic time since monotonic_start_ns (module doc)
            "clock": {"start": clock_info(), "monotonic_start_ns": self._t0_mono,
                      "run_times": "start_ns: wall clock at the start; end_ns = start_ns + monotonic time elapsed"},
            "sampler": {"rate_hz": self.rate_hz, "backends": self.backends, "power_buffer": self.power_buffer},
            # leading steps per rank that are warm-up, for steps recorded without a window
            "warmup_steps": self.warmup_steps,
            "visible_devices": inherited_visible_devices(),
        }
        self.run.write(self.info)

    def _start_sampler(self) -> None:
        meta = self.run.telemetry_meta(self.host)
        meta.unlink(missing_ok=True)
        log_path = self.run.logs_dir / f"sampler-{self.host}.stderr"
        self._log = open(log_path, "ab")  # noqa: SIM115
        set_file_mode(log_path)  # the run directory's mode policy (docs/reliability.md)
        cmd = [
            sys.executable, "-m", "powertrain.sampler_process", str(self.run.path),
            "--rate", str(self.rate_hz), "--backends", self.backends, "--host", self.host,
            "--flush", str(self.flush_s if self.flush_s is not None else 1.0), "--watch-pid", str(os.getpid()),
        ]
        if self.prometheus:
            cmd += ["--prometheus", self.prometheus]
        if not self.power_buffer:
            cmd += ["--no-power-buffer"]
        # Own process group: a terminal Ctrl-C reaches us, and we stop the sampler in order.
        self.sampler = subprocess.Popen(cmd, stdout=self._log, stderr=self._log, process_group=0)
        deadline = time.monotonic() + SAMPLER_START_TIMEOUT_S
        while not meta.is_file():
            if self.sampler.poll() is not None:
                try:
                    tail = (self.run.logs_dir / f"sampler-{self.host}.stderr").read_text(errors="replace")[-2000:]
                except OSError as exc:
                    tail = f"(its log cannot be read: {exc})"
                raise MonitorError(f"the telemetry sampler failed to start: {tail.strip()}")
            if time.monotonic() > deadline:
                raise MonitorError("the telemetry sampler did not start within 60 s")
            time.sleep(0.02)

    def attach(self, timeout_s: float = SAMPLER_START_TIMEOUT_S) -> Monitor:
        """Join a run that another process created (``run.json`` exists or appears within
        ``timeout_s``): start only this host's sampler, write no ``run.json``. For the first process of
        every other node of a multi-node job; the run's owner collects every host's sampler meta."""
        wait_for_shared_file(self.run.run_json, timeout_s, "the run's run.json (its first process did not start)")
        self.info = read_json(self.run.run_json)
        self._attached = True
        try:
            self._start_sampler()
        except MonitorError:
            self._undo_start([])  # the run is the owner's: only this host's sampler is stopped
            raise
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
            stopped = self._sampler_stop_reason()
            self.sampler_death = (f"telemetry sampling stopped early: {stopped}" if stopped
                                  else f"telemetry sampler (pid {self.sampler.pid}) {signal_reason(code)}")
        return False

    def _sampler_stop_reason(self) -> str | None:
        """The sampler's own reason when it stopped because it could not write (its final meta)."""
        try:
            reason = read_json(self.run.telemetry_meta(self.host)).get("stop_reason")
        except (OSError, ValueError, AttributeError):
            return None
        return reason if isinstance(reason, str) and reason.startswith(WRITE_FAILED) else None

    def warn_if_sampler_died(self) -> None:
        """While a command runs: say once that the sampler died (the command keeps going; the run is
        marked failed when it ends)."""
        if self.sampler_death is None and not self.check_sampler():
            log.warning("powertrain: %s; the command keeps running", self.sampler_death)

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
                self.sampler_death = f"telemetry sampler did not stop within {SAMPLER_STOP_TIMEOUT_S:g} s and was killed"
        if self._log:
            self._log.close()
            self._log = None

    def stop(self, status: str = "ok", reason: str | None = None, exit_code: int | None = None) -> dict[str, Any]:
        """Stop sampling and record how the run ended; a dead sampler turns ``ok`` into ``failed``.

        If this process's events file cannot be closed, the sampler is still stopped and ``run.json``
        still finished (``failed``, with the error), then the error is raised.
        """
        error: BaseException | None = None
        try:
            self._unbind_hooks()
        except BaseException as exc:  # the run must still end with a status and a stopped sampler
            error = exc
            note = f"this process's step events could not be closed: {type(exc).__name__}: {exc}"
            reason = f"{reason}; {note}" if reason else note
            status = "failed"
        self._stop_sampler()
        if self.sampler_death is None and (stopped := self._sampler_stop_reason()):
            self.sampler_death = f"telemetry sampling stopped early: {stopped}"
        if self.sampler_death:
            last = self._last_sample_note()
            death = f"{self.sampler_death}; telemetry kept up to {last}"
            reason = f"{reason}; {death}" if reason else death
            status = "failed"
        info = self._finish(status, reason, exit_code)
        if error is not None:
            raise error
        return info

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
            import duckdb

            from powertrain.store.tables import telemetry_files

            files = [str(f) for f in telemetry_files(self.run.path)]
            # one aggregate over the files: the telemetry of a long run is never loaded whole
            rows = duckdb.connect().execute("SELECT max(t_ns) FROM read_parquet(?)", [files]).fetchall() \
                if files else []
            t_last = rows[0][0] if rows else None
        return _iso(t_last) or "the start (no sample was written)"

    def _finish(self, status: str, reason: str | None, exit_code: int | None = None) -> dict[str, Any]:
        if getattr(self, "_attached", False):
            raise MonitorError("cannot finish a run this process only attached to (call detach())")
        release_space(reserve_path(self.run.path))  # the space held for these last writes on a full disk
        notes = compact_streams(self.run)
        t1, step_note = run_end(self.info)
        if step_note:
            notes.append(step_note)
        self.info.update(status=status, reason=reason, exit_code=exit_code, end_ns=t1, end=_iso(t1))
        self.info["clock"]["end"] = clock_info()
        self.info.update(collect_devices(self.run))
        self.info["hosts"] = sorted({*self.info.get("hosts", []), *self.info.get("sampler_hosts", {})})
        add_quality_notes(self.info, notes, self.log_loss)
        try:
            self.run.write(self.info)
        except OSError as exc:  # nothing else can record it: say it once, keep the command's outcome
            log.error("powertrain: cannot write %s (%s); the run ended %s%s", self.run.run_json, exc, status,
                      f" ({reason})" if reason else "")
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


def run_end(info: dict[str, Any]) -> tuple[int, str | None]:
    """The run's end on its own clock (``start_ns`` + monotonic time since ``clock.monotonic_start_ns``,
    read on this host: the monotonic clock is the host's, shared by its processes), sets ``duration_s``
    and, when the wall clock moved differently, ``clock.wall_clock_step_s``; returns the end and a note
    for ``data_quality`` (None: no step). A run without a monotonic start (an older one) ends on the
    wall clock."""
    wall = _wall_ns()
    start, mono0 = info.get("start_ns"), (info.get("clock") or {}).get("monotonic_start_ns")
    if not isinstance(start, int) or not isinstance(mono0, int):
        return wall, None
    t1 = start + (_mono_ns() - mono0)
    info["duration_s"] = (t1 - start) / 1e9
    step = (wall - t1) / 1e9
    if abs(step) < WALL_STEP_NOTE_S:
        return t1, None
    info.setdefault("clock", {})["wall_clock_step_s"] = step
    return t1, (f"the system clock was stepped {'back' if step < 0 else 'forward'} by {abs(step):.1f} s while the run "
                f"ran: its end and duration ({info['duration_s']:.1f} s) are on the monotonic clock, not the wall clock")


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
        stop = meta.get("stop_reason")
        if isinstance(stop, str) and stop.startswith(WRITE_FAILED):
            kept = _iso(meta.get("t_last_ns")) or "the start (no sample was written)"
            notes.append(f"{host}: sampling stopped early, {stop} (telemetry kept up to {kept})")
        software.update(meta.get("software", {}))
        sampler[host] = {k: meta.get(k) for k in (
            "backends", "rate_hz_requested", "rate_hz_achieved", "samples", "missed_ticks",
            "t_first_ns", "t_last_ns", "finished", "stop_reason", "clock", "power_samples", "power_repeat")}
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


def compact_streams(run: RunDir) -> list[str]:
    """Compact every unfinished telemetry and events stream; a stream that cannot be compacted (a full
    disk) stays as its segments, which every reader reads, and gives one note."""
    notes = []
    for sub, schema in (("telemetry", TELEMETRY_SCHEMA), ("events", EVENTS_SCHEMA)):
        for parts in sorted((run.path / sub).glob("*.parts")):
            try:
                finalize(parts.with_name(parts.name.removesuffix(".parts")), schema)
            except OSError as exc:
                notes.append(f"{sub}/{parts.name}: left as segments, not compacted ({exc})")
                log.warning("powertrain: %s", notes[-1])
    try:  # the driver's buffered power samples (telemetry/power-samples/), when the sampler read them
        finalize_power_samples(run.path)
    except OSError as exc:
        notes.append(f"telemetry/power-samples: left as segments, not compacted ({exc})")
        log.warning("powertrain: %s", notes[-1])
    return notes


def add_quality_notes(info: dict[str, Any], notes: Sequence[str], log_loss: Sequence[Mapping[str, Any]]) -> None:
    """Record in ``run.json`` ``data_quality`` what a full disk (or another write error) cost: streams
    left uncompacted, telemetry that stopped early, command output that could not be logged."""
    dq_notes = [*notes, *(n for n in info.get("telemetry_notes", []) if WRITE_FAILED in n)]
    dq_notes += [f"{x['file']}: {x['bytes_lost']} byte(s) of the command's output not kept ({x['first_error']})"
                 for x in log_loss]
    if not dq_notes and not log_loss:
        return
    dq = dict(info.get("data_quality") or {})
    dq["notes"] = [*dq.get("notes", []), *dq_notes]
    if log_loss:
        dq["logs_lost"] = [dict(x) for x in log_loss]
    info["data_quality"] = dq


def close_orphaned_run(run: RunDir, supervisor_pid: int, host: str) -> None:
    """The watchdog, run by the sampler when the process that started it (``powertrain monitor`` or the
    ``powertrain run`` launcher) is gone: stop the commands it supervised, and when it owned the run and
    left it ``running``, mark it ``failed: supervisor killed`` with what is known."""
    stopped = stop_orphans(run, supervisor_pid)
    try:
        info = read_json(run.run_json)
    except (OSError, ValueError):
        return
    if not isinstance(info, dict) or info.get("status") != "running":
        return
    owner = info.get("owner") or {}
    if owner.get("pid") != supervisor_pid or owner.get("host") != host:
        return
    release_space(reserve_path(run.path))
    notes = compact_streams(run)
    t1, step_note = run_end(info)  # this is the owner's host (checked above): its monotonic clock
    if step_note:
        notes.append(step_note)
    what = "; ".join(stopped) if stopped else "no command was running"
    info.update(status="failed", end_ns=t1, end=_iso(t1), exit_code=None,
                reason=f"supervisor killed: the process that ran the command (pid {supervisor_pid}) died "
                       f"without recording how the run ended; {what}",
                exit_code_why_null="the supervising process died before the command ended; it was stopped")
    info.setdefault("clock", {})["end"] = clock_info()
    info.update(collect_devices(run))
    add_quality_notes(info, notes, [])
    try:
        run.write(info)
    except OSError as exc:
        log.error("cannot mark %s failed (%s)", run.run_json, exc)


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
    power_buffer: bool = True,
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
    steps of each rank that are warm-up when the command marks steps without a window. ``power_buffer``:
    read the drivers' buffered power samples (NVML) between polls where the device has them.
    """
    if not argv:
        raise MonitorError("no command given: put it after `--`, e.g. powertrain monitor -- python train.py")
    mon = Monitor(out, rate_hz=rate_hz, backends=backends, command=list(argv), prometheus=prometheus,
                  warmup_steps=warmup_steps, power_buffer=power_buffer)
    mon.start()
    try:
        res = supervise(argv, mon.run, "command", echo=echo, on_output=on_output, env=env,
                        on_tick=mon.warn_if_sampler_died)
    except OSError as exc:
        mon.stop("failed", f"could not start the command: {exc}", exit_code=127)
        return 127, mon.info
    except BaseException as exc:  # our own bug or an interrupt outside the main thread: still say how it ended
        mon.stop("failed", f"supervisor error: {type(exc).__name__}: {exc}")
        raise
    if on_exit is not None:
        on_exit()
    mon.log_loss = res.log_loss
    status, reason = res.outcome()
    info = mon.stop(status, reason, exit_code=res.code)
    return res.code, info
