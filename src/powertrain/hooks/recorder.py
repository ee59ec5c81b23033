"""One rank's event recorder: step and phase intervals streamed to ``<run>/events/rank-<r>.parquet``.

:class:`Recorder` writes the rows (see :mod:`powertrain.hooks` for the process-wide markers built on
it); rows follow :data:`powertrain.schema.EVENTS_SCHEMA`, times are ``CLOCK_REALTIME`` ns.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powertrain.core.clock import AnchoredClock
from powertrain.schema import EVENT_KINDS, EVENTS_SCHEMA
from powertrain.store.tables import StreamingTableWriter

log = logging.getLogger(__name__)

WINDOWS = ("warmup", "measured", None)

# Columns a caller fills. They are checked when given, not when the row is written: a row is written
# up to a second later, inside whatever flushes, and a bad value there fails far from its cause (the
# error once surfaced at the Monitor's exit and left the run `running`).
COUNT_COLUMNS = ("tokens", "samples", "mem_peak_bytes")


def _show(value: Any) -> str:
    """``value`` for a one-line message: its repr's first line, cut short, and its type."""
    text = (repr(value).splitlines() or [""])[0]
    text = text if len(text) <= 60 else text[:57] + "..."
    cls = type(value)
    kind = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{text} ({kind})"


def _fix(name: str, value: Any, default: str) -> str:
    """The fix for the usual mistakes: a framework scalar (torch / jax / numpy array) passed as is."""
    if hasattr(value, "item") and hasattr(value, "shape"):
        return f"call .item() on it to pass a Python number ({name}=x.item())"
    return default


def check_count(name: str, value: Any) -> int | None:
    """``tokens`` / ``samples`` / ``mem_peak_bytes``: ``None`` (unknown) or a whole number >= 0.

    A whole float (``4096.0``, e.g. from a division) is taken as that int; a fractional one is refused
    rather than truncated (4096.9 tokens means the caller computed something else), and so is NaN:
    an unknown count is ``None``.
    """
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and math.isnan(value):
            fix = "pass None when the count is unknown"
        elif isinstance(value, float):
            fix = f"a count is whole: pass round({name}) or int({name}) if that is what is meant"
        else:
            fix = _fix(name, value, f"pass an int, e.g. int({name})")
        raise ValueError(f"{name} must be a whole number >= 0, or None when unknown; got {_show(value)}: {fix}")
    if value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, or None when unknown; got {value}: "
                         "a count or a size cannot be negative, check how it is computed")
    return int(value)


def check_loss(value: Any) -> float | None:
    """``loss``: ``None`` or a real number. NaN and inf are kept: a diverged loss is what was measured."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fix = _fix("loss", value, "pass float(loss)")
        raise ValueError(f"loss must be a number, or None when unknown; got {_show(value)}: {fix}")
    return float(value)


def check_int(name: str, value: Any) -> int | None:
    """``step`` / ``microbatch``: ``None`` or a whole number (an int, not a string or a float)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number; got {_show(value)}: "
                         f"{_fix(name, value, f'pass an int, e.g. int({name})')}")
    return int(value)


def check_warmup_steps(value: Any) -> int:
    """Leading steps marked ``warmup``: a whole number >= 0 (an int, not a bool), checked where it is given,
    before training starts rather than at the first step."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"warmup_steps must be a whole number >= 0, got {value!r}")
    return value


def check_flush_s(value: Any, name: str = "flush_s", *, allow_zero: bool = True, fix: str = "") -> float:
    """Seconds between crash-safe rewrites: finite, > 0 (or >= 0 with ``allow_zero``: every row).

    NaN must be refused: the writer flushes when ``elapsed >= flush_s``, never true for NaN, so a NaN
    would silently turn off the crash-safe writes.
    """
    low = ">= 0" if allow_zero else "> 0"
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{name}={value!r} is not a number of seconds {low} (seconds between crash-safe writes, "
                         f"e.g. 1 or 0.5; default 1){fix}")
    return seconds


def check_columns(cols: dict[str, Any]) -> dict[str, Any]:
    """``cols`` with the caller-filled columns it holds checked (and numpy scalars made Python ones)."""
    out = dict(cols)
    for name in COUNT_COLUMNS:
        if name in out:
            out[name] = check_count(name, out[name])
    for name in ("step", "microbatch"):
        if name in out:
            out[name] = check_int(name, out[name])
    if "loss" in out:
        out["loss"] = check_loss(out["loss"])
    if out.get("name") is not None and not isinstance(out["name"], str):
        raise ValueError(f"name must be a string or None; got {_show(out['name'])}: pass str(name)")
    return out


@dataclass
class StepHandle:
    """What a ``with hooks.step(...)`` block may fill in before it ends.

    Every field is checked as it is set (``s.loss = loss`` with a tensor is refused on that line,
    naming ``.item()``), so the row written at the end of the step cannot fail.
    """

    step: int
    tokens: int | None = None
    samples: int | None = None
    loss: float | None = None
    mem_peak_bytes: int | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    t_start_ns: int = 0

    def __setattr__(self, name: str, value: Any) -> None:
        if name in COUNT_COLUMNS:
            value = check_count(name, value)
        elif name == "loss":
            value = check_loss(value)
        elif name == "step":
            value = check_int("step", value)
            if value is None:
                raise ValueError("step must be a whole number (the step's index), got None")
        super().__setattr__(name, value)


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
        if warmup_steps is not None:
            check_warmup_steps(warmup_steps)
        self.rank = rank
        self.sync = sync
        self.window: str | None = None
        self.warmup_steps = warmup_steps
        # True once the caller chose a window; automatic windows (warmup_steps) stop applying then.
        self._explicit_window = False
        self._steps_begun = 0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        # anchored per recorder (per run), not at import: a process that outlived a suspend would lag
        self._clock = AnchoredClock()
        self._flush_s = check_flush_s(flush_s)
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
        return self._clock.now_ns()  # not time.time_ns(): a clock step would move events off the telemetry

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
                 tokens: int | None = None, samples: int | None = None, **attrs: Any) -> None:
        """Close the open step. ``loss``, ``mem_peak_bytes``, ``tokens`` and ``samples`` fill the step's
        columns (given here, they replace what ``begin_step`` or the handle set); the rest of
        ``attrs`` is stored as JSON."""
        # checked first, even when disabled: a bad value is the caller's bug whether or not a run records it
        cols = check_columns({"loss": loss, "mem_peak_bytes": mem_peak_bytes, "tokens": tokens, "samples": samples})
        if not self.enabled:
            return
        h = self._step
        if h is None:
            raise RuntimeError("end_step() without begin_step()")
        t_end = self._now()
        self._step = None
        h.attrs.update(attrs)
        given = {k: v for k, v in cols.items() if v is not None}
        self._append(kind="step", name=None, step=h.step, t_start_ns=h.t_start_ns, t_end_ns=t_end,
                     **{"tokens": h.tokens, "samples": h.samples, "loss": h.loss, "mem_peak_bytes": h.mem_peak_bytes,
                        **given},
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
        checked = check_columns({"name": name, "microbatch": microbatch})
        self._open.append((kind, name, checked["microbatch"], self._now(), attrs))

    def end(self, **fields: Any) -> None:
        """Close the innermost open interval (``fields``: tokens, samples, loss, or extra attrs)."""
        if not self.enabled:
            return
        cols = check_columns({k: fields.pop(k) for k in ("tokens", "samples", "loss", "mem_peak_bytes")
                              if k in fields})
        kind, name, mb, t0, attrs = self._open.pop()
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
        if kind not in EVENT_KINDS:  # as begin() refuses it: an unknown kind is stored and read by nothing
            raise ValueError(f"event kind must be one of {EVENT_KINDS}, got {kind!r}")
        fields = check_columns(fields)
        for name, t in (("t_start_ns", t_start_ns), ("t_end_ns", t_end_ns)):
            if check_int(name, t) is None:
                raise ValueError(f"{name} must be a whole number of nanoseconds (time.time_ns()), got None")
        if t_end_ns < t_start_ns:
            raise ValueError(f"t_end_ns {t_end_ns} is before t_start_ns {t_start_ns}: give the interval's start first")
        if kind == "step":
            self._next_step_window()
        attrs = fields.pop("attrs", {})
        self._append(kind=kind, step=fields.pop("step", self._step.step if self._step else None),
                     t_start_ns=int(t_start_ns), t_end_ns=int(t_end_ns), attrs=attrs, **fields)

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
