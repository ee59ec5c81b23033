"""The process-wide recorder behind ``powertrain.step`` / ``phase`` / ``set_window``: which run
directory and rank this process's markers go to (:func:`bind` by a ``Monitor`` block, else
``$POWERTRAIN_RUN_DIR`` and ``$RANK``), and the module-level marker functions."""

from __future__ import annotations

import atexit
import json
import logging
import numbers
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powertrain.hooks.recorder import Recorder, StepHandle, check_flush_s

log = logging.getLogger(__name__)

RUN_DIR_ENV = "POWERTRAIN_RUN_DIR"
FLUSH_ENV = "POWERTRAIN_EVENTS_FLUSH_S"

_recorder: Recorder | None = None


def env_flush_s() -> float:
    """``$POWERTRAIN_EVENTS_FLUSH_S``: seconds between crash-safe rewrites of the events file, a finite
    number >= 0 (0: after every row); unset or empty: 1."""
    text = os.environ.get(FLUSH_ENV, "").strip()
    if not text:
        return 1.0
    return check_flush_s(text, FLUSH_ENV, fix="; fix or unset it")


def env_rank() -> int:
    """``$RANK`` (set by torchrun, srun wrappers, ``powertrain run``): a whole number >= 0; unset or empty: 0."""
    text = os.environ.get("RANK", "").strip()
    if not text:
        return 0
    # the rank names this process's events file (events/rank-<r>.parquet): a bad one must not be guessed
    if not (text.isascii() and text.isdecimal()):
        raise ValueError(f"RANK={text!r} is not a rank (a whole number >= 0, as torchrun sets it); fix or unset it")
    return int(text)


def check_rank(rank: Any) -> int:
    """``rank``: a whole number >= 0 (an int, not a bool); it names ``events/rank-<r>.parquet``."""
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 0:
        raise ValueError(f"rank must be a whole number >= 0 (this process's rank, as torchrun's $RANK), "
                         f"got {rank!r}: pass an int, or leave it out to use $RANK")
    return int(rank)


def _run_state(run_dir: Path) -> str | None:
    """Why ``run_dir`` is not a running run (no run.json, its status, a damaged file); ``None`` if it is."""
    try:
        with open(run_dir / "run.json") as f:
            info = json.load(f)
    except FileNotFoundError:
        return "no run.json there"
    except (OSError, ValueError) as exc:
        return f"its run.json cannot be read: {type(exc).__name__}: {exc}"
    status = info.get("status") if isinstance(info, dict) else None
    return None if status == "running" else f"its run.json status is {status!r}, not 'running'"


def env_run_dir() -> Path | None:
    """``$POWERTRAIN_RUN_DIR``: the run that ``powertrain monitor`` / ``powertrain run`` started for this
    process (unset or empty: ``None``). Refused (``ValueError``) unless its ``run.json`` says ``running``.

    Both commands write ``run.json`` (status ``running``) before they start the command and finish it
    only after the command has ended, so a folder without one, or a finished run, is a variable left
    over from elsewhere: its markers would be added to a run that is over, or make a folder look like one.
    """
    text = os.environ.get(RUN_DIR_ENV) or None
    if text is None:
        return None
    path = Path(text)
    why = _run_state(path)
    if why is not None:
        raise ValueError(f"${RUN_DIR_ENV}={text} is not a running run ({why}), so step markers cannot go "
                         f"there: unset {RUN_DIR_ENV}, or run this under powertrain monitor / powertrain run")
    return path


def configure(run_dir: str | os.PathLike[str] | None = None, rank: int | None = None, *,
              sync: Callable[[], None] | None = None, flush_s: float | None = None) -> Recorder:
    """(Re)create the process-wide recorder; defaults come from ``$POWERTRAIN_RUN_DIR``, ``$RANK``
    and ``$POWERTRAIN_EVENTS_FLUSH_S`` (seconds between crash-safe rewrites, default 1).

    A run directory taken from ``$POWERTRAIN_RUN_DIR`` must be a running run (:func:`env_run_dir`);
    one given here is used as it is (a folder of events only, without ``run.json``, is allowed).
    """
    global _recorder
    # the environment is read (and refused) before the recorder in place is closed
    flush_s = env_flush_s() if flush_s is None else flush_s
    rank = check_rank(rank) if rank is not None else env_rank()
    run_dir = run_dir if run_dir is not None else env_run_dir()
    if _recorder is not None:
        _recorder.close()
    _recorder = Recorder(run_dir, rank, sync=sync, flush_s=flush_s)
    if run_dir is None:
        log.warning("powertrain.hooks: $%s is not set, step markers are not recorded "
                    "(mark steps inside a `with powertrain.Monitor(out=...)` block, run under `powertrain monitor` "
                    "or `powertrain run`, or call hooks.configure(run_dir))", RUN_DIR_ENV)
    return _recorder


def sync_device_in_use() -> None:
    """Wait for the GPU work this process queued, if it uses a GPU through torch (else do nothing).

    Timestamps taken without it would close a step when its kernels are launched, not done. It never
    imports torch nor creates a GPU context: a CPU-only loop (or one without torch) pays a dict lookup.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # ROCm builds use the torch.cuda API too
        torch.cuda.synchronize()


@dataclass
class Binding:
    """What :func:`bind` replaced, so that :func:`unbind` can put it back."""

    recorder: Recorder
    previous: Recorder | None


def bind(run_dir: str | os.PathLike[str], *, rank: int | None = None, warmup_steps: int = 0,
         sync: Callable[[], None] | None = sync_device_in_use, flush_s: float | None = None) -> Binding:
    """Send this process's markers to ``run_dir`` until :func:`unbind` (what ``Monitor`` does).

    Steps get automatic windows (the first ``warmup_steps`` ``warmup``, then ``measured``) unless the
    loop sets one; the events file is opened on the first row only, so a process that marks nothing
    leaves none. ``rank`` defaults to ``$RANK`` (else 0), ``flush_s`` (seconds between crash-safe
    rewrites of the events file) to ``$POWERTRAIN_EVENTS_FLUSH_S`` (else 1).
    """
    global _recorder
    flush_s = env_flush_s() if flush_s is None else flush_s
    rank = check_rank(rank) if rank is not None else env_rank()
    rec = Recorder(run_dir, rank, sync=sync, flush_s=flush_s, warmup_steps=warmup_steps, lazy=True)
    binding = Binding(rec, _recorder)
    _recorder = rec
    return binding


def unbind(binding: Binding) -> Path | None:
    """Close the recorder of ``binding`` (flushing and compacting its events file, returned; ``None``
    if it wrote nothing) and give the process back the recorder it replaced.

    If something replaced the bound recorder meanwhile (e.g. a trainer callback's
    :func:`configure`), that one stays in place.
    """
    global _recorder
    try:
        return binding.recorder.close()
    finally:
        # even when closing failed (a full disk): later markers must not go to the closed recorder
        if _recorder is binding.recorder:
            previous = binding.previous
            # a recorder closed meanwhile (nested binds ended out of order) would drop markers silently
            _recorder = previous if previous is not None and not previous.closed else None


def get() -> Recorder:
    """The process-wide recorder, created from the environment on first use."""
    return _recorder if _recorder is not None else configure()


def step(i: int, *, tokens: int | None = None, samples: int | None = None) -> Any:
    """``with hooks.step(i, tokens=…, samples=…) as s: …`` — one training step (set ``s.loss``).

    ``tokens`` / ``samples`` (and ``s.mem_peak_bytes``) are whole numbers >= 0 or ``None`` (unknown);
    ``s.loss`` a number (``loss.item()``, not a tensor). A bad value raises ``ValueError`` at once."""
    return get().step(i, tokens=tokens, samples=samples)


def begin_step(i: int, *, tokens: int | None = None, samples: int | None = None) -> StepHandle:
    return get().begin_step(i, tokens=tokens, samples=samples)


def end_step(*, loss: float | None = None, mem_peak_bytes: int | None = None, tokens: int | None = None,
             samples: int | None = None, **attrs: Any) -> None:
    get().end_step(loss=loss, mem_peak_bytes=mem_peak_bytes, tokens=tokens, samples=samples, **attrs)


def phase(kind: str, name: str | None = None, *, microbatch: int | None = None, **attrs: Any) -> Any:
    """``with hooks.phase("forward"): …`` — one interval inside the current step."""
    return get().phase(kind, name, microbatch=microbatch, **attrs)


def set_window(window: str | None) -> None:
    """``warmup``, ``measured`` or ``None`` (outside the protocol) for the rows that follow."""
    get().set_window(window)


def window(name: str | None) -> AbstractContextManager[None]:
    """``with hooks.window("warmup"): …`` — rows inside the block get that window; the one before
    comes back after it."""
    return get().in_window(name)


def close() -> None:
    if _recorder is not None:
        _recorder.close()


atexit.register(close)
