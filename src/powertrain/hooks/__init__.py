"""Step and phase markers any training loop can call; rows go to ``<run>/events/rank-<r>.parquet``.

::

    from powertrain import hooks

    for i, batch in enumerate(loader):
        with hooks.step(i, tokens=batch.numel(), samples=len(batch)) as s:
            with hooks.phase("forward"):
                loss = model(batch)
            with hooks.phase("backward"):
                loss.backward()
            with hooks.phase("optimizer"):
                opt.step()
            s.loss = loss.item()

or ``hooks.begin_step(i, tokens=…)`` … ``hooks.end_step(loss=…)`` where a ``with`` block does not fit.

The run directory comes from ``$POWERTRAIN_RUN_DIR`` (set by ``powertrain run`` / ``monitor``) and
the rank from ``$RANK``; without a run directory every call is a cheap no-op and a single notice
says so. Rows follow :data:`powertrain.schema.EVENTS_SCHEMA` (times are ``CLOCK_REALTIME`` ns, the
sampler's clock) and are streamed crash-safely: a killed rank keeps everything up to about one
second before the kill. ``window`` (``warmup`` / ``measured``) marks the measurement protocol's
windows; set it with :func:`set_window`.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powertrain.schema import EVENT_KINDS, EVENTS_SCHEMA
from powertrain.store.tables import StreamingTableWriter

RUN_DIR_ENV = "POWERTRAIN_RUN_DIR"
FLUSH_ENV = "POWERTRAIN_EVENTS_FLUSH_S"
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
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None, rank: int = 0, *,
                 sync: Callable[[], None] | None = None, flush_s: float = 1.0) -> None:
        self.rank = rank
        self.sync = sync
        self.window: str | None = None
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._writer: StreamingTableWriter | None = None
        if self.run_dir is not None:
            self._writer = StreamingTableWriter(self.run_dir / "events" / f"rank-{rank}", EVENTS_SCHEMA,
                                                flush_s=flush_s)
        self._step: StepHandle | None = None
        self._open: list[tuple[str, str | None, int | None, int, dict[str, Any]]] = []

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def _now(self) -> int:
        if self.sync is not None:
            self.sync()
        return time.time_ns()

    def set_window(self, window: str | None) -> None:
        """``warmup``, ``measured`` or ``None`` (outside the protocol) for the rows that follow."""
        if window not in WINDOWS:
            raise ValueError(f"window must be one of {WINDOWS}, got {window!r}")
        self.window = window

    # -- steps -----------------------------------------------------------------------------------
    def begin_step(self, step: int, *, tokens: int | None = None, samples: int | None = None) -> StepHandle:
        handle = StepHandle(step, tokens, samples)
        if self._writer is not None:
            if self._step is not None:
                raise RuntimeError(f"step {self._step.step} is still open: call end_step() before begin_step()")
            handle.t_start_ns = self._now()
            self._step = handle
        return handle

    def end_step(self, *, loss: float | None = None, mem_peak_bytes: int | None = None,
                 **attrs: Any) -> None:
        if self._writer is None:
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
        if self._writer.rows_written == 0:  # first step: put something on disk at once
            self._writer.flush()
        else:
            self._writer.maybe_flush()

    @contextmanager
    def step(self, step: int, *, tokens: int | None = None, samples: int | None = None) -> Iterator[StepHandle]:
        handle = self.begin_step(step, tokens=tokens, samples=samples)
        try:
            yield handle
        except BaseException:
            if self._writer is not None:
                self.end_step(failed=True)
            raise
        if self._writer is not None:
            self.end_step()

    # -- phases ----------------------------------------------------------------------------------
    def begin(self, kind: str, name: str | None = None, *, microbatch: int | None = None, **attrs: Any) -> None:
        """Open an interval of ``kind`` (forward, backward, optimizer, comm, data, phase, …)."""
        if self._writer is None:
            return
        if kind not in EVENT_KINDS:
            raise ValueError(f"event kind must be one of {EVENT_KINDS}, got {kind!r}")
        self._open.append((kind, name, microbatch, self._now(), attrs))

    def end(self, **fields: Any) -> None:
        """Close the innermost open interval (``fields``: tokens, samples, loss, or extra attrs)."""
        if self._writer is None:
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
        if self._writer is None:
            return
        attrs = fields.pop("attrs", {})
        self._append(kind=kind, step=fields.pop("step", self._step.step if self._step else None),
                     t_start_ns=t_start_ns, t_end_ns=t_end_ns, attrs=attrs, **fields)

    def _append(self, *, kind: str, t_start_ns: int, t_end_ns: int, attrs: dict[str, Any] | None = None,
                **cols: Any) -> None:
        assert self._writer is not None
        row = {"rank": self.rank, "kind": kind, "t_start_ns": t_start_ns, "t_end_ns": t_end_ns,
               "window": self.window, "attrs": json.dumps(attrs, default=str) if attrs else None}
        row.update(cols)
        self._writer.append([row])

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> Path | None:
        """Flush and compact this rank's events file (idempotent)."""
        if self._writer is None:
            return None
        writer, self._writer = self._writer, None
        return writer.close()


_recorder: Recorder | None = None


def configure(run_dir: str | os.PathLike[str] | None = None, rank: int | None = None, *,
              sync: Callable[[], None] | None = None, flush_s: float | None = None) -> Recorder:
    """(Re)create the process-wide recorder; defaults come from ``$POWERTRAIN_RUN_DIR``, ``$RANK``
    and ``$POWERTRAIN_EVENTS_FLUSH_S`` (seconds between crash-safe rewrites, default 1)."""
    global _recorder
    if flush_s is None:
        flush_s = float(os.environ.get(FLUSH_ENV, "1.0"))
    if _recorder is not None:
        _recorder.close()
    run_dir = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV) or None
    rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
    _recorder = Recorder(run_dir, rank, sync=sync, flush_s=flush_s)
    if run_dir is None:
        print(f"powertrain.hooks: ${RUN_DIR_ENV} is not set, step markers are not recorded "
              "(run under `powertrain run` or `powertrain monitor`, or call hooks.configure(run_dir))",
              file=sys.stderr)
    return _recorder


def get() -> Recorder:
    """The process-wide recorder, created from the environment on first use."""
    return _recorder if _recorder is not None else configure()


def step(i: int, *, tokens: int | None = None, samples: int | None = None) -> Any:
    """``with hooks.step(i, tokens=…, samples=…) as s: …`` — one training step (set ``s.loss``)."""
    return get().step(i, tokens=tokens, samples=samples)


def begin_step(i: int, *, tokens: int | None = None, samples: int | None = None) -> StepHandle:
    return get().begin_step(i, tokens=tokens, samples=samples)


def end_step(*, loss: float | None = None, mem_peak_bytes: int | None = None, **attrs: Any) -> None:
    get().end_step(loss=loss, mem_peak_bytes=mem_peak_bytes, **attrs)


def phase(kind: str, name: str | None = None, *, microbatch: int | None = None, **attrs: Any) -> Any:
    """``with hooks.phase("forward"): …`` — one interval inside the current step."""
    return get().phase(kind, name, microbatch=microbatch, **attrs)


def set_window(window: str | None) -> None:
    get().set_window(window)


def close() -> None:
    if _recorder is not None:
        _recorder.close()


atexit.register(close)

__all__ = ["RUN_DIR_ENV", "Recorder", "StepHandle", "begin_step", "close", "configure", "end_step", "get",
           "phase", "set_window", "step"]
