"""powertrain's stable public API: what ``import powertrain`` gives a training script or a notebook.

Measure::

    import powertrain

    with powertrain.Monitor(out="runs/try1", warmup_steps=2):   # sampler + step markers → runs/try1
        for i, batch in enumerate(loader):
            with powertrain.step(i, tokens=batch.numel(), samples=len(batch)) as s:
                with powertrain.phase("forward"):
                    loss = model(batch)
                ...
                s.loss = loss.item()

Inside the ``Monitor`` block the steps are recorded into its run: the first ``warmup_steps`` (default
0) are warm-up, the rest measured, unless the loop chooses itself with ``with powertrain.window(...)``
or :func:`set_window`. Under ``powertrain monitor -- CMD`` the run directory is already set: only the
markers are needed, and steps without a window count as measured (less ``--warmup-steps``). With
neither, every marker is a cheap no-op (one notice says so).

Look at what was measured::

    run = powertrain.load("runs/try1")
    run.telemetry            # pyarrow.Table, one row per device per sample
    run.events               # pyarrow.Table, one row per step / phase per rank
    tel, ev = run.to_pandas()
    powertrain.summary("runs/try1")["metrics"]   # the run's derived metrics (summary.json)

Everything here is kept stable across releases; modules under ``powertrain.*`` may change.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from powertrain import hooks
from powertrain.hooks import StepHandle, phase, step
from powertrain.monitor import Monitor
from powertrain.store.rundir import RunDir
from powertrain.store.tables import read_events, read_telemetry


def begin_step(i: int, *, tokens: int | None = None, samples: int | None = None) -> StepHandle:
    """Open step ``i`` of this rank (where a ``with powertrain.step(i):`` block does not fit).

    ``tokens`` / ``samples``: what this rank processes in the step, whole numbers >= 0 (``None``:
    unknown; a bad value raises ``ValueError`` here). Close it with :func:`end_step`.
    """
    return hooks.begin_step(i, tokens=tokens, samples=samples)


def end_step(*, loss: float | None = None, mem_peak_bytes: int | None = None, tokens: int | None = None,
             samples: int | None = None, **attrs: Any) -> None:
    """Close the open step, with its loss (a number: ``loss.item()``), peak memory in bytes, and any
    extra attributes (stored as JSON). ``tokens`` / ``samples`` given here are the step's counts (they
    replace those given to :func:`begin_step`), as in ``powertrain.step(i, tokens=…)``."""
    hooks.end_step(loss=loss, mem_peak_bytes=mem_peak_bytes, tokens=tokens, samples=samples, **attrs)


def set_window(window: str | None) -> None:
    """Mark the steps that follow ``"warmup"`` or ``"measured"`` (metrics use measured steps only),
    or ``None`` (outside the measurement protocol). From then on this replaces a ``Monitor``'s
    automatic ``warmup_steps`` windows; ``with powertrain.window(...)`` limits it to a block."""
    hooks.set_window(window)


def window(name: str | None) -> AbstractContextManager[None]:
    """``with powertrain.window("warmup"): ...`` — steps (and their phases) inside the block get that
    window: ``"warmup"`` (left out of the metrics), ``"measured"``, or ``None`` (outside the
    measurement protocol). The window in force before, a ``Monitor``'s automatic one included, comes
    back after the block."""
    return hooks.window(name)


@dataclass
class Run:
    """A run directory, loaded lazily: tables are read on first access.

    Attributes:
        path: the run directory.
        info: its ``run.json`` (command, status, times, hosts, devices, fields supported, …).
    """

    path: Path
    info: dict[str, Any] = field(repr=False)

    @cached_property
    def telemetry(self) -> pa.Table:
        """Telemetry rows of every host (:data:`powertrain.schema.TELEMETRY_SCHEMA`), by time."""
        return read_telemetry(self.path)

    @cached_property
    def events(self) -> pa.Table:
        """Event rows of every rank (:data:`powertrain.schema.EVENTS_SCHEMA`), by rank then start."""
        return read_events(self.path)

    @property
    def steps(self) -> pa.Table:
        """Only the ``step`` events (one row per step per rank)."""
        ev = self.events
        return ev.filter(pc.equal(ev["kind"], "step"))

    @property
    def status(self) -> str | None:
        """``ok``, ``failed`` or ``running`` as recorded in ``run.json``."""
        return self.info.get("status")

    def summary(self, refresh: bool = False) -> dict[str, Any]:
        """The run's derived metrics; see :func:`summary`."""
        return summary(self.path, refresh=refresh)

    def to_pandas(self) -> tuple[Any, Any]:
        """``(telemetry, events)`` as pandas DataFrames (needs ``pip install pandas``)."""
        try:
            import pandas  # noqa: F401
        except ImportError:
            raise ImportError("Run.to_pandas() needs pandas: pip install pandas "
                              "(or use run.telemetry / run.events, which are pyarrow tables)") from None
        return self.telemetry.to_pandas(), self.events.to_pandas()


def load(run_dir: str | os.PathLike[str]) -> Run:
    """Open a run directory written by ``powertrain monitor`` / ``run`` / ``import`` or a callback.

    Raises ``FileNotFoundError`` (saying what to pass instead) when ``run_dir`` holds no ``run.json``.
    """
    run = RunDir(run_dir)
    if not run.exists():
        raise FileNotFoundError(f"{run.path} is not a powertrain run directory (no run.json); pass the folder "
                                "given to --out / Monitor(out=...), e.g. runs/monitor-20250101-120000")
    return Run(run.path, run.read())


def summary(run_dir: str | os.PathLike[str], *, refresh: bool = False) -> dict[str, Any]:
    """The run's derived metrics (step time, throughput, energy, power, thermal, clocks, balance).

    Every energy, power and time figure is over the run's one window, named in ``summary["window"]``
    (``{"t0_ns", "t1_ns", "source", "seconds"}``: an import's declared window such as MLPerf
    run_start → run_stop, else the measured steps); ``import``, ``summarize``, ``report`` and
    ``compare`` use the same one. Read from ``summary.json``, computed and written first when missing, older than ``run.json``, or
    when ``refresh``. Definitions: :mod:`powertrain.analyze` and ``docs/metrics.md``.
    """
    from powertrain.analyze import load_summary

    load(run_dir)  # the same clear error for a folder that is not a run
    return load_summary(Path(run_dir), refresh=refresh)


__all__ = ["Monitor", "Run", "begin_step", "end_step", "load", "phase", "set_window", "step", "summary",
           "window"]
