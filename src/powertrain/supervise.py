"""Process supervision: run a command to its end, copy its output, forward signals, reap it, and
describe how it ended.

:func:`supervise` is what :func:`powertrain.monitor.run_command` and the Slurm tasks
(:mod:`powertrain.slurm_tasks`) run their command with. (``powertrain.launch.local`` still has its
own for torchrun; the hardening issue makes this one the only supervisor.)
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
from pathlib import Path
from typing import IO, cast

from powertrain.store.rundir import RunDir

log = logging.getLogger(__name__)

KILL_AFTER_SIGNAL_S = 10.0  # a forwarded SIGINT/SIGTERM is followed by SIGKILL this much later


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


def supervise(argv: Sequence[str], run: RunDir, log_name: str, *, echo: bool,
              on_output: Callable[[bytes, str], None] | None, env: Mapping[str, str] | None,
              on_tick: Callable[[], None] | None = None) -> tuple[int, list[int]]:
    """Run ``argv`` to its end with output pumped to ``logs/<log_name>.std{out,err}``; returns its exit
    code and the signals forwarded to it. Raises ``OSError`` when it cannot be started.

    The command runs in its own process group with ``$POWERTRAIN_RUN_DIR`` set to the run plus
    ``env``; its output is also copied to this process's stdout / stderr when ``echo``, and handed to
    ``on_output(chunk, "stdout"|"stderr")``. SIGINT and SIGTERM are forwarded once to its group; if
    it has not exited :data:`KILL_AFTER_SIGNAL_S` later it is killed. ``on_tick()`` is called about
    every 0.2 s while it runs (e.g. to watch the sampler).
    """
    logs = run.logs_dir
    child_env = {**os.environ, "POWERTRAIN_RUN_DIR": str(run.path.resolve()), **(env or {})}
    child = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0,
                             env=child_env)
    pumps = [
        threading.Thread(target=pump, args=(child.stdout, logs / f"{log_name}.stdout",
                                            sys.stdout.buffer if echo else None, on_output, "stdout"),
                         daemon=True),
        threading.Thread(target=pump, args=(child.stderr, logs / f"{log_name}.stderr",
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
            if on_tick is not None:
                on_tick()
            if received and kill_at is None:
                kill_at = time.monotonic() + KILL_AFTER_SIGNAL_S
            if kill_at is not None and time.monotonic() > kill_at:
                os.killpg(child.pid, signal.SIGKILL)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for t in pumps:
        t.join(timeout=5)
    return code, received


def pump(src: IO[bytes] | None, dest: Path, echo: IO[bytes] | None,
         on_output: Callable[[bytes, str], None] | None = None, stream: str = "stdout") -> None:
    """Copy ``src`` chunk by chunk to the file ``dest`` (appending, flushed at once), to ``on_output``
    and to ``echo``; a failing ``on_output`` or ``echo`` is dropped, the copy to ``dest`` goes on."""
    if src is None:
        return
    reader = cast(io.BufferedReader, src)  # Popen's pipes are buffered readers (bufsize -1)
    with open(dest, "ab") as f:
        for chunk in iter(lambda: reader.read1(65536), b""):
            f.write(chunk)
            f.flush()
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
