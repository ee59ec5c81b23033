"""One rank's event recorder: step and phase intervals streamed to ``<run>/events/rank-<r>.parquet``.

:class:`Recorder` writes the rows (see :mod:`powertrain.hooks` for the process-wide markers built on
it); rows follow :data:`powertrain.schema.EVENTS_SCHEMA`, times are ``CLOCK_REALTIME`` ns.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powertrain.schema import EVENT_KINDS, EVENTS_SCHEMA
from powertrain.store.tables import StreamingTableWriter

log = logging.getLogger(__name__)

WINDOWS = ("warmup", "measured", None)


@dataclass
class StepHandle:
    """What a ``with hooks.step(...)`` block may fill in before it ends."""

    step: int
    tokens: int | None = None
    samples: int | None = None
    loss: float | None = None
    mem_peak_bytes: int | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    t_start_ns: int = 0


class Recorder:
    """Writes one rank's events; ``run_dir=None`` makes every method a no-op.

    ``sync`` (e.g. ``torch.accelerator.synchronize``) is called before each timestamp so that
    intervals on an asynchronous device cover the device work, not just its launch.

    ``warmup_steps`` (an int ≥ 0) turns on automatic windows: while no window has been set
    explicitly (:meth:`set_window`, :meth:`in_window`), the first ``warmup_steps`` steps of this
    recorder are marked ``warmup`` and later ones ``measured``. ``None`` (the default) leaves the
    window as set, null until then.

    ``lazy`` opens the events file only when the first row is written, so a recorder that records
    nothing leaves no file (a ``Monitor`` whose own process does not train, e.g. under
    ``powertrain monitor -- CMD`` where the command's rank 0 writes ``rank-0``).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None, rank: int = 0, *,
                 sync: Callable[[], None] | None = None, flush_s: float = 1.0,
                 warmup_steps: int | None = None, lazy: bool = False) -> None:
        if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                         or warmup_steps < 0):
            raise ValueError(f"warmup_steps must be a whole number >= 0 (or None), got {warmup_steps!r}")
        self.rank = rank
        self.sync = sync
        self.window: str | None = None
        self.warmup_steps = warmup_steps
        # True once the caller chose a window; automatic windows (warmup_steps) stop applying then.
        self._explicit_window = False
        self._steps_begun = 0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._flush_s = flush_s
        self._closed = self.run_dir is None
        self._writer: StreamingTableWriter | None = None
        if self.run_dir is not None and not lazy:
            self._open_writer()
        self._step: StepHandle | None = None
        self._open: list[tuple[str, str | None, int | None, int, dict[str, Any]]] = []

    @property
    def enabled(self) -> bool:
        return not self._closed

    @property
    def closed(self) -> bool:
        """True after :meth:`close` of a recorder that had a run directory."""
        return self._closed and self.run_dir is not None

    def _open_writer(self) -> StreamingTableWriter:
        if self._writer is None:
            assert self.run_dir is not None
            self._writer = StreamingTableWriter(self.run_dir / "events" / f"rank-{self.rank}", EVENTS_SCHEMA,
                                                flush_s=self._flush_s)
        return self._writer

    def _now(self) -> int:
        if self.sync is not None:
            self.sync()
        return time.time_ns()

    def set_window(self, window: str | None) -> None:
        """``warmup``, ``measured`` or ``None`` (outside the protocol) for the rows that follow."""
        if window not in WINDOWS:
            raise ValueError(f"window must be one of {WINDOWS}, got {window!r}")
        self.window = window
        self._explicit_window = True

    @contextmanager
    def in_window(self, window: str | None) -> Iterator[None]:
        """Rows written inside the block get ``window``; the window in force before comes back after
        it (automatic windows included)."""
        before = (self.window, self._explicit_window)
        self.set_window(window)
        try:
            yield
        finally:
            self.window, self._explicit_window = before

    def _next_step_window(self) -> None:
        """Called as each step begins: apply the automatic window rule, count the step."""
        if self.warmup_steps is not None and not self._explicit_window:
            self.window = "warmup" if self._steps_begun < self.warmup_steps else "measured"
        self._steps_begun += 1

    # -- steps -----------------------------------------------------------------------------------
    def begin_step(self, step: int, *, tokens: int | None = None, samples: int | None = None) -> StepHandle:
        handle = StepHandle(step, tokens, samples)
        if self.enabled:
            if self._step is not None:
                raise RuntimeError(f"step {self._step.step} is still open: call end_step() before begin_step()")
            self._next_step_window()
            handle.t_start_ns = self._now()
            self._step = handle
        return handle

    def end_step(self, *, loss: float | None = None, mem_peak_bytes: int | None = None,
                 **attrs: Any) -> None:
        if not self.enabled:
            return
        h = self._step
        if h is None:
            raise RuntimeError("end_step() without begin_step()")
        t_end = self._now()
        self._step = None
        h.attrs.update(attrs)
        self._append(kind="step", name=None, step=h.step, t_start_ns=h.t_start_ns, t_end_ns=t_end,
                     tokens=h.tokens, samples=h.samples,
                     loss=loss if loss is not None else h.loss,
                     mem_peak_bytes=mem_peak_bytes if mem_peak_bytes is not None else h.mem_peak_bytes,
                     attrs=h.attrs)
        writer = self._open_writer()
        if writer.rows_written == 0:  # first step: put something on disk at once
            writer.flush()
        else:
            writer.maybe_flush()

    @contextmanager
    def step(self, step: int, *, tokens: int | None = None, samples: int | None = None) -> Iterator[StepHandle]:
        handle = self.begin_step(step, tokens=tokens, samples=samples)
        try:
            yield handle
        except BaseException:
            if self.enabled:
                self.end_step(failed=True)
            raise
        if self.enabled:
            self.end_step()

    # -- phases ----------------------------------------------------------------------------------
    def begin(self, kind: str, name: str | None = None, *, microbatch: int | None = None, **attrs: Any) -> None:
        """Open an interval of ``kind`` (forward, backward, optimizer, comm, data, phase, …)."""
        if not self.enabled:
            return
        if kind not in EVENT_KINDS:
            raise ValueError(f"event kind must be one of {EVENT_KINDS}, got {kind!r}")
        self._open.append((kind, name, microbatch, self._now(), attrs))

    def end(self, **fields: Any) -> None:
        """Close the innermost open interval (``fields``: tokens, samples, loss, or extra attrs)."""
        if not self.enabled:
            return
        kind, name, mb, t0, attrs = self._open.pop()
        cols = {k: fields.pop(k) for k in ("tokens", "samples", "loss", "mem_peak_bytes") if k in fields}
        attrs.update(fields)
        self._append(kind=kind, name=name, step=self._step.step if self._step else None, t_start_ns=t0,
                     t_end_ns=self._now(), microbatch=mb, attrs=attrs, **cols)

    @contextmanager
    def phase(self, kind: str, name: str | None = None, *, microbatch: int | None = None,
              **attrs: Any) -> Iterator[None]:
        self.begin(kind, name, microbatch=microbatch, **attrs)
        try:
            yield
        finally:
            self.end()

    def record(self, kind: str, t_start_ns: int, t_end_ns: int, **fields: Any) -> None:
        """Add an interval measured elsewhere (e.g. a communication timed by the caller)."""
        if not self.enabled:
            return
        if kind == "step":
            self._next_step_window()
        attrs = fields.pop("attrs", {})
        self._append(kind=kind, step=fields.pop("step", self._step.step if self._step else None),
                     t_start_ns=t_start_ns, t_end_ns=t_end_ns, attrs=attrs, **fields)

    def _append(self, *, kind: str, t_start_ns: int, t_end_ns: int, attrs: dict[str, Any] | None = None,
                **cols: Any) -> None:
        writer = self._open_writer()
        row = {"rank": self.rank, "kind": kind, "t_start_ns": t_start_ns, "t_end_ns": t_end_ns,
               "window": self.window, "attrs": json.dumps(attrs, default=str) if attrs else None}
        row.update(cols)
        writer.append([row])

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> Path | None:
        """Flush and compact this rank's events file (idempotent); ``None`` when nothing was written.

        A step still open (``begin_step`` without ``end_step``) has no end, so it is not written (a
        cut-short duration would enter the step-time metrics); a notice names it.
        """
        if self._closed:
            return None
        if self._step is not None:
            log.warning("powertrain.hooks: step %s was still open when recording stopped and is not recorded "
                        "(close it with end_step() or use `with powertrain.step(i):`)", self._step.step)
            self._step = None
        self._closed = True
        if self._writer is None:
            return None
        writer, self._writer = self._writer, None
        return writer.close()
