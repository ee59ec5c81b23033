"""Process supervision — the one supervisor of powertrain: run a command to its end, copy its output,
forward signals, reap it, and describe how it ended; stop it when the supervisor itself dies.

:func:`supervise` is what :func:`powertrain.monitor.run_command`, the Slurm tasks
(:mod:`powertrain.slurm_tasks`) and the launcher of ``powertrain run`` (:mod:`powertrain.launch.local`,
torchrun) run their command with. What it promises:

- **Output never blocks the command.** Each pipe is drained by its own thread into
  ``logs/<name>.stdout``/``.stderr`` (or one merged file). When the log cannot be written (a full
  disk, an I/O error) the thread keeps draining the pipe, stops writing that log and counts what was
  lost: :attr:`Supervised.log_loss` (file, bytes lost, first error) goes to ``run.json``.
- **Signals.** SIGINT, SIGTERM and SIGHUP are forwarded once to the command's process group; if the
  command has not ended :data:`KILL_AFTER_SIGNAL_S` later, its whole tree is killed.
- **A tree, not only a group.** The command gets ``$POWERTRAIN_SUPERVISOR`` (a token unique to this
  run of it), inherited by everything it starts, including processes in other sessions (torchrun's
  ranks). Tear-downs signal the command's process group *and* every process carrying the token.
  Processes the command leaves behind when it exits are stopped too.
- **Its own death.** The direct child gets ``PR_SET_PDEATHSIG`` (SIGTERM when the supervisor dies,
  even by SIGKILL), and ``logs/<name>.supervisor.json`` records the group and token while the command
  runs, so the sampler (the watchdog, :func:`stop_orphans`) can stop the whole tree and mark the run
  ``failed: supervisor killed`` (:func:`powertrain.monitor.close_orphaned_run`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import psutil  # type: ignore[import-untyped]  # psutil ships no type information

from powertrain.store.rundir import RunDir, default_host, read_json, write_json_atomic

log = logging.getLogger(__name__)

KILL_AFTER_SIGNAL_S = 10.0  # a forwarded signal (or a time limit) is followed by SIGKILL this much later
LEFTOVER_GRACE_S = 5.0  # processes the command left behind get SIGTERM, then SIGKILL this much later
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SUPERVISOR_ENV = "POWERTRAIN_SUPERVISOR"
RECORD_SUFFIX = ".supervisor.json"


# The variables that choose which GPUs a process sees (its cuda:i is the i-th GPU they leave; ROCm
# applies ROCR's, then HIP's indexes into what is left). A command inherits them from the supervisor.
VISIBLE_DEVICES_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def inherited_visible_devices(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``run.json`` ``visible_devices``: each of :data:`VISIBLE_DEVICES_VARS` as this process has it
    (``environ``, default ``os.environ``), ``None`` when unset and ``""`` only when set empty (which
    hides every GPU). The samplers number GPUs by the vendor library's index whatever these say, so
    without them a rank's ``cuda:0`` cannot be told apart from the sampler's ``gpu0``."""
    env = os.environ if environ is None else environ
    return {var: env.get(var) for var in VISIBLE_DEVICES_VARS}


def signal_reason(code: int) -> str:
    """``killed by SIGTERM`` for a negative exit code (a signal), else ``exited with code N``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def outcome(code: int, received: list[int]) -> tuple[str, str | None]:
    """The run's (status, reason) from the command's exit code and the signals forwarded to it."""
    if received:
        return "failed", f"interrupted ({signal.Signals(received[0]).name}); command {signal_reason(code)}"
    if code != 0:
        return "failed", f"command {signal_reason(code)}"
    return "ok", None


@dataclass
class Supervised:
    """How a supervised command ended."""

    code: int  # its exit code; negative: the signal that ended it
    received: list[int]  # signals this process received and forwarded to it
    timed_out: bool = False  # the time limit stopped it
    torn_down: str | None = None  # why the supervisor killed it (a crash's bounded tear-down)
    log_loss: list[dict[str, Any]] = field(default_factory=list)  # logs that could not be written
    leftovers: int = 0  # processes the command left running when it exited, stopped by the supervisor
    t_start_ns: int = 0
    t_end_ns: int = 0

    def outcome(self) -> tuple[str, str | None]:
        """(status, reason) of the run from how the command ended."""
        if self.timed_out:
            return "failed", f"timed out; command {signal_reason(self.code)}"
        return outcome(self.code, self.received)


class LogCopy:
    """Appends a stream's bytes to a log file; a file that cannot be written never stops the copy.

    On the first failed write (ENOSPC, EIO, …) the file is closed and every later byte is counted as
    lost, so the pipe keeps being drained and the command never blocks on its output.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bytes_lost = 0
        self.first_error: str | None = None
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError as exc:
            self._fail(exc)

    def write(self, chunk: bytes) -> None:
        if self._fd is None:
            self.bytes_lost += len(chunk)
            return
        view = memoryview(chunk)
        while view:
            try:
                n = os.write(self._fd, view)
            except OSError as exc:
                self.bytes_lost += len(view)
                self._fail(exc)
                return
            view = view[n:]

    def _fail(self, exc: OSError) -> None:
        if self.first_error is None:
            self.first_error = str(exc)
            log.warning("powertrain: cannot write %s (%s); its output is no longer kept (the command goes on)",
                        self.path, exc)
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def loss(self) -> dict[str, Any] | None:
        """``{"file", "bytes_lost", "first_error"}`` when something could not be written."""
        if self.first_error is None:
            return None
        return {"file": f"{self.path.parent.name}/{self.path.name}", "bytes_lost": self.bytes_lost,
                "first_error": self.first_error}


def pump(src: IO[bytes] | None, dest: LogCopy, echo: IO[bytes] | None,
         on_output: Callable[[bytes, str], None] | None = None, stream: str = "stdout") -> None:
    """Copy ``src`` chunk by chunk to ``dest``, to ``on_output`` and to ``echo`` until it ends; a
    failing ``on_output`` or ``echo`` is dropped, and a failing log only counts its loss: the pipe is
    always drained."""
    if src is None:
        return
    reader = cast(io.BufferedReader, src)  # Popen's pipes are buffered readers (bufsize -1)
    for chunk in iter(lambda: reader.read1(65536), b""):
        dest.write(chunk)
        if on_output is not None:
            try:
                on_output(chunk, stream)
            except Exception as exc:  # a parser bug must not stall the user's command
                log.error("powertrain: output parser failed (%r); parsing stops", exc)
                on_output = None
        if echo is not None:
            try:
                echo.write(chunk)
                echo.flush()
            except (OSError, ValueError):
                echo = None


def supervise(argv: Sequence[str], run: RunDir, log_name: str, *, echo: bool,
              on_output: Callable[[bytes, str], None] | None, env: Mapping[str, str] | None,
              on_tick: Callable[[], None] | None = None, merge_output: bool = False,
              timeout_s: float | None = None, tear_down: Callable[[], float | None] | None = None,
              kill_after_s: float = KILL_AFTER_SIGNAL_S) -> Supervised:
    """Run ``argv`` to its end; returns how it ended (:class:`Supervised`). Raises ``OSError`` when it
    cannot be started (nothing is left running then).

    Output goes to ``logs/<log_name>.stdout`` / ``.stderr``, or with ``merge_output`` both to
    ``logs/<log_name>``; also to this process's stdout / stderr when ``echo``, and to
    ``on_output(chunk, "stdout"|"stderr")``. The command runs in its own process group with
    ``$POWERTRAIN_RUN_DIR`` set to the run plus ``env``. ``on_tick()`` is called about every 0.2 s
    while it runs (e.g. to watch the sampler); when ``tear_down()`` returns a number of seconds, the
    command is killed if it has not ended that much later (a crash's bounded tear-down).
    ``timeout_s`` stops it with SIGTERM after that long (SIGKILL ``kill_after_s`` later).
    """
    t_start = time.time_ns()
    token = f"{default_host()}:{os.getpid()}:{t_start}"
    child_env = {**os.environ, "POWERTRAIN_RUN_DIR": str(run.path.resolve()), **(env or {}), SUPERVISOR_ENV: token}
    logs = run.logs_dir
    copies = [LogCopy(logs / log_name)] if merge_output else \
        [LogCopy(logs / f"{log_name}.stdout"), LogCopy(logs / f"{log_name}.stderr")]
    try:
        child = subprocess.Popen(list(argv), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
                                 process_group=0, env=child_env, preexec_fn=_death_signal())
    except BaseException:
        for c in copies:
            c.close()
        raise
    record = logs / f"{log_name}{RECORD_SUFFIX}"
    _write_record(record, argv, child.pid, token, t_start)
    outs = [(child.stdout, sys.stdout.buffer if echo else None, "stdout")]
    if not merge_output:
        outs.append((child.stderr, sys.stderr.buffer if echo else None, "stderr"))
    pumps = [threading.Thread(target=pump, args=(src, copy, dest, on_output, name), daemon=True)
             for (src, dest, name), copy in zip(outs, copies, strict=True)]
    for t in pumps:
        t.start()

    result = Supervised(code=0, received=[], t_start_ns=t_start)
    try:
        result.code = _wait(child, token, result, on_tick, timeout_s, tear_down, kill_after_s)
    except BaseException:
        # an exception in this process (a bug, KeyboardInterrupt outside the main thread): nothing is left running
        stop_tree(child.pid, token, grace_s=kill_after_s)
        child.wait()
        raise
    result.leftovers = stop_tree(child.pid, token, grace_s=LEFTOVER_GRACE_S)
    if result.leftovers:
        log.warning("powertrain: the command left %d process(es) running when it ended; they were stopped",
                    result.leftovers)
    for t, c in zip(pumps, copies, strict=True):
        t.join(timeout=5)
        if not t.is_alive():  # a pipe still held open (should not happen: leftovers were stopped) keeps its copy
            c.close()
    record.unlink(missing_ok=True)
    result.log_loss = [loss for c in copies if (loss := c.loss()) is not None]
    result.t_end_ns = time.time_ns()
    return result


def _wait(child: subprocess.Popen[bytes], token: str, result: Supervised, on_tick: Callable[[], None] | None,
          timeout_s: float | None, tear_down: Callable[[], float | None] | None, kill_after_s: float) -> int:
    """Wait for the command, forwarding signals, applying the time limit and the tear-down; its exit code."""
    received = result.received

    def forward(signum: int, _frame: object) -> None:
        if not received:
            received.append(signum)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    in_main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, forward) for s in FORWARDED} if in_main else {}
    try:
        kill_at: float | None = None
        while True:
            try:
                return child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if on_tick is not None:
                on_tick()
            if received and kill_at is None:
                kill_at = now + kill_after_s
            if tear_down is not None and kill_at is None and (grace := tear_down()) is not None:
                kill_at = now + grace
                result.torn_down = f"killed {grace:g} s after the first failure"
            if timeout_s is not None and not result.timed_out and (time.time_ns() - result.t_start_ns) / 1e9 > timeout_s:
                result.timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
                kill_at = now + kill_after_s
            if kill_at is not None and now > kill_at:
                signal_tree(child.pid, token, signal.SIGKILL)
                kill_at = now + 3600.0  # sent; the wait above reaps it
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _write_record(path: Path, argv: Sequence[str], pid: int, token: str, t_start: int) -> None:
    """``logs/<name>.supervisor.json``: what the watchdog needs to stop the command if we die."""
    try:
        write_json_atomic(path, {"host": default_host(), "supervisor_pid": os.getpid(), "pid": pid, "pgid": pid,
                                 "token": token, "argv": list(argv), "t_start_ns": t_start})
    except OSError as exc:  # the command runs on; only PR_SET_PDEATHSIG guards it if we die
        log.warning("powertrain: cannot write %s (%s); if this process is killed, only the command's "
                    "first process is stopped", path, exc)


_prctl: Any = None


def _death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` giving the child SIGTERM when this process dies, even by SIGKILL (Linux
    ``PR_SET_PDEATHSIG``); ``None`` where there is no ``prctl``. The C function is looked up here, in
    the parent, so the forked child only calls it."""
    global _prctl
    if _prctl is None:
        try:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):  # not Linux: the watchdog (the sampler) is the only guard
            _prctl = False
    if not _prctl:
        return None
    parent = os.getpid()
    prctl = _prctl

    def preexec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the supervisor died before the death signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def tree(pgid: int, token: str) -> list[psutil.Process]:
    """Live processes of the command: its process group and whatever carries its token (zombies and
    this process excluded)."""
    out = []
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(p.pid) == pgid or p.environ().get(SUPERVISOR_ENV) == token:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def signal_tree(pgid: int, token: str, sig: int) -> int:
    """Send ``sig`` to the command's group and every process carrying its token; how many got it."""
    sent = 0
    for p in tree(pgid, token):
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(sig)
            sent += 1
    return sent


def stop_tree(pgid: int, token: str, grace_s: float) -> int:
    """Stop every process of the command: SIGTERM, SIGKILL to what is left ``grace_s`` later; returns
    how many there were. Bounded: returns after at most ``grace_s`` + 5 s."""
    first = 0
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        procs = tree(pgid, token)
        if not procs:
            break
        first = first or len(procs)
        for p in procs:
            with contextlib.suppress(psutil.Error, OSError):
                p.send_signal(sig)
        deadline = time.monotonic() + wait_s
        while any(_alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
    return first


def _alive(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running()) and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_orphans(run: RunDir, supervisor_pid: int, grace_s: float = KILL_AFTER_SIGNAL_S) -> list[str]:
    """The watchdog: stop every command that the (dead) process ``supervisor_pid`` of this host was
    supervising in ``run``; one line per command saying what was stopped."""
    notes = []
    for path in sorted(run.logs_dir.glob(f"*{RECORD_SUFFIX}")):
        try:
            rec = read_json(path)
            if rec.get("supervisor_pid") != supervisor_pid or rec.get("host") != default_host():
                continue
            pgid, token = int(rec["pgid"]), str(rec["token"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        n = stop_tree(pgid, token, grace_s)
        name = path.name.removesuffix(RECORD_SUFFIX)
        notes.append(f"{name}: {n} process(es) stopped by the sampler" if n else f"{name}: had already ended")
        log.error("the supervisor (pid %d) is gone; %s", supervisor_pid, notes[-1])
        path.unlink(missing_ok=True)
    return notes
