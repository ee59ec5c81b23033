"""One rank's link to a run, whatever trainer drives it (see :mod:`powertrain.integrations`):
rank 0 owns the run, local rank 0 of every other node its node's sampler, every rank its events."""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from powertrain import hooks
from powertrain.monitor import Monitor
from powertrain.telemetry.clock import DEFAULT_RATE_HZ

log = logging.getLogger(__name__)

# The sampler settings a supervising `powertrain monitor` / `powertrain run` owns: each argument's default,
# and where that command takes it instead.
RUN_SETTINGS: dict[str, tuple[Any, str]] = {
    "out": (None, "--out"),
    "rate_hz": (DEFAULT_RATE_HZ, "--rate"),
    "backends": ("auto", "--backends"),
    "name": (None, "--out (a run is named after its folder)"),
    "prometheus": (None, "--prometheus (powertrain monitor)"),
}


def device_sync() -> Callable[[], None] | None:
    """``torch.accelerator.synchronize`` when a GPU-like device is present (so step intervals cover
    the device's work, not its launch), else ``None``."""
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        return acc.synchronize
    return None


def default_out(prefix: str) -> Path:
    """``runs/<prefix>-<YYYYmmdd-HHMMSS>`` (chosen by rank 0 and shared with the other ranks)."""
    return Path("runs") / f"{prefix}-{dt.datetime.now():%Y%m%d-%H%M%S}"


class RankAttachment:
    """One rank's link to a run: its event recorder and, on the first rank of a node, the sampler.

    Args:
        out: the run directory; ``None``: :func:`default_out` as chosen by rank 0.
        warmup_steps: leading steps marked ``warmup``, a whole number >= 0.
        rate_hz, backends: the sampler's settings (see :class:`powertrain.Monitor`).
        name: a label for ``run.json``.
        prometheus: ``[HOST:]PORT`` for each node's sampler to serve live readings on (see
            :mod:`powertrain.live.prometheus`; HOST defaults to 127.0.0.1).
        caller: the class named in messages (the trainer callback built on this attachment).

    Under ``powertrain monitor`` / ``powertrain run`` (``$POWERTRAIN_RUN_DIR`` is set) the run and its
    sampler are that command's: ``out``, ``rate_hz``, ``backends``, ``name`` and ``prometheus`` are
    ignored, and one warning names those given.
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, *, warmup_steps: int = 1,
                 rate_hz: float = DEFAULT_RATE_HZ, backends: str | list[str] = "auto",
                 name: str | None = None, prefix: str = "train",
                 sync: Callable[[], None] | None = None, prometheus: str | None = None,
                 caller: str = "RankAttachment") -> None:
        hooks.check_warmup_steps(warmup_steps)
        self.caller = caller
        self.out = Path(out) if out is not None else None
        self.warmup_steps = warmup_steps
        self.rate_hz = rate_hz
        self.backends = backends
        self.name = name
        self.prefix = prefix
        self.sync = sync
        self.prometheus = prometheus
        self.run_dir: Path | None = None
        self.monitor: Monitor | None = None
        self.owner = False
        self.recorder: hooks.Recorder | None = None
        self.rank = 0
        self.steps = 0
        self._barrier: Callable[[], None] | None = None
        self._open = False

    @property
    def active(self) -> bool:
        return self.recorder is not None

    def start(self, *, rank: int, local_rank: int, world_size: int,
              barrier: Callable[[], None] | None = None,
              broadcast: Callable[[Any], Any] | None = None) -> Path:
        """Join (or create) the run; ``barrier`` / ``broadcast`` (rank 0's value to all) come from
        the trainer's distributed backend and are needed when ``world_size > 1``."""
        self.rank = rank
        self._barrier = barrier if world_size > 1 else None
        env_dir = hooks.env_run_dir()  # refused unless it is a running run
        if env_dir is not None:
            self.run_dir = env_dir
            self._warn_ignored(env_dir)
        else:
            out = self.out if self.out is not None else default_out(self.prefix)
            if broadcast is not None and world_size > 1:
                out = Path(broadcast(str(out)))
            self.run_dir = out
            if rank == 0:
                self.monitor = Monitor(out, rate_hz=self.rate_hz, backends=self.backends,
                                       name=self.name, command=sys.argv, prometheus=self.prometheus).start()
                self.owner = True
            if self._barrier is not None:
                self._barrier()  # run.json exists before anyone else writes into the run
            if rank != 0 and local_rank == 0:
                self.monitor = Monitor(out, rate_hz=self.rate_hz, backends=self.backends,
                                       prometheus=self.prometheus).attach()
        self.recorder = hooks.configure(self.run_dir, rank, sync=self.sync)
        atexit.register(self._at_exit)
        return self.run_dir

    def ignored_settings(self) -> list[str]:
        """The run settings given a value other than their default (ignored under a supervising command)."""
        given = {"out": self.out, "rate_hz": self.rate_hz, "backends": self.backends, "name": self.name,
                 "prometheus": self.prometheus}
        return [k for k, (default, _) in RUN_SETTINGS.items() if given[k] != default]

    def _warn_ignored(self, run_dir: Path) -> None:
        ignored = self.ignored_settings()
        if ignored:
            where = ", ".join(f"{k}: {RUN_SETTINGS[k][1]}" for k in ignored)
            log.warning("powertrain: running under powertrain monitor / powertrain run ($%s=%s): %s of %s %s "
                        "ignored, the run and its sampler are that command's; set them on that command (%s)",
                        hooks.RUN_DIR_ENV, run_dir, ", ".join(ignored), self.caller,
                        "is" if len(ignored) == 1 else "are", where)

    def now(self) -> int:
        """``CLOCK_REALTIME`` ns after the device's queued work (the sampler's clock)."""
        if self.sync is not None:
            self.sync()
        return time.time_ns()

    def _at_exit(self) -> None:
        if self.recorder is not None:  # the trainer never reached its end (exception, sys.exit)
            self.stop("failed", "the training process exited before the trainer finished")

    # -- steps -------------------------------------------------------------------------------------
    def begin_step(self, step: int, *, tokens: int | None = None, samples: int | None = None
                   ) -> hooks.StepHandle | None:
        """Open a step; the returned handle's ``tokens`` / ``samples`` may be added to until it ends."""
        if self.recorder is None:
            return None
        if self._open:  # a step the trainer never closed (e.g. skipped): close it, flagged
            self.end_step(unfinished=True)
        self.recorder.set_window("warmup" if self.steps < self.warmup_steps else "measured")
        handle = self.recorder.begin_step(step, tokens=tokens, samples=samples)
        self._open = True
        return handle

    def end_step(self, *, loss: float | None = None, **attrs: Any) -> None:
        if self.recorder is None or not self._open:
            return
        self.recorder.end_step(loss=loss, **attrs)
        self._open = False
        self.steps += 1

    def record_step(self, step: int, t_start_ns: int, t_end_ns: int, **fields: Any) -> None:
        """Write one finished step measured by the caller (tokens, samples, loss, attrs)."""
        if self.recorder is None:
            return
        self.recorder.set_window("warmup" if self.steps < self.warmup_steps else "measured")
        self.recorder.record("step", t_start_ns, t_end_ns, step=step, **fields)
        self.steps += 1

    # -- end ---------------------------------------------------------------------------------------
    def stop(self, status: str = "ok", reason: str | None = None) -> None:
        """Close this rank's events; the node's sampler stops after every rank is done, and rank 0
        closes the run (status ``ok`` or ``failed`` with ``reason``)."""
        if self.recorder is None:
            return
        if self._open:
            self.end_step(unfinished=True)
        self.recorder.close()  # later powertrain.step() calls in this process are no-ops
        self.recorder = None
        if self._barrier is not None and status == "ok":
            self._barrier()  # every rank's events are closed
        if self.monitor is not None and not self.owner:
            self.monitor.detach()
        if self._barrier is not None and status == "ok":
            self._barrier()  # every node's sampler has written its final meta
        if self.monitor is not None and self.owner:
            self.monitor.stop(status, reason)
