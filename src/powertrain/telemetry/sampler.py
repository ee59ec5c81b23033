"""The per-node sampling loop: reads every local device at a fixed rate and hands each sample's rows
to its sinks.

The sinks are injected (:class:`SampleSink`): :class:`TelemetryFile` streams the rows to
``<run>/telemetry/<host>.parquet`` through :class:`powertrain.store.tables.StreamingTableWriter`, so a
``kill -9`` of the sampler, the training ranks or the launcher loses at most about one flush interval
(1 s) of samples; the process entry point (:mod:`powertrain.sampler_process`) adds the live
Prometheus endpoint when asked. What the sampler found (devices, supported fields, notes, incidents,
achieved rate) goes to ``<host>.meta.json``.

Timestamps never go backwards: each row keeps the offset its backend stamped it at (``time.time_ns()``
when the device was read) from the wall clock read at the start of its sample, but that wall clock is
the sampler's own — ``CLOCK_REALTIME`` read once at its start plus ``CLOCK_MONOTONIC`` elapsed since.
A step of the system clock (an NTP step, a manual ``date``) therefore moves no row: sorted by time the
telemetry stays one time line, and energy integrates what was measured (a 3 s step back read a counter
as 24 × the energy). Each sample whose wall clock reads earlier than the previous sample's is counted
(``meta.json`` ``clock.steps_back``, ``stepped_back_s``), and ``wall_minus_sampler_ns`` says how far the
system clock ended from the sampler's (NTP slews both clocks alike, so only steps show there).

Where a backend's driver keeps its own buffer of power samples (NVIDIA: ``nvmlDeviceGetSamples``), the
sampler reads it every :data:`BUFFER_READ_S` at most, and at the last sample (:meth:`Backend.power_samples`:
each driver sample once, whenever it is read; a ring the reads fall behind is counted as samples lost), and
streams those samples to a second
file per host, ``<run>/telemetry/power-samples/<host>.parquet`` (:class:`PowerSamplesFile`,
``POWER_SAMPLES_SCHEMA``), their stamps moved onto the sampler's clock as the rows' are. ``power_buffer=
False`` turns that path off (recorded per device in ``properties["power_buffer"]``). ``meta.json``
``power_repeat`` counts, per device, the fresh and repeated ``power_w`` readings (``power_repeat``,
telemetry.nvidia module doc) and the effective rate of fresh ones, which is what a rate above the
driver's update period really achieved.

The loop stops on :meth:`Sampler.stop` and by itself when the process that started it disappears
(so an orphaned sampler never runs forever). When a sink cannot write (a full disk, an I/O error) the
sampler stops sampling with the reason (``stop_reason`` starting with :data:`WRITE_FAILED`) rather than
crash; a small reserve of space (:mod:`powertrain.store.reserve`) lets it still write its final meta.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

from powertrain.core.clock import AnchoredClock
from powertrain.core.sampling import check_rate_hz
from powertrain.schema import POWER_SAMPLES_SCHEMA, TELEMETRY_SCHEMA, empty_telemetry_row
from powertrain.store.reserve import SAMPLER_RESERVE_BYTES, hold_space, release_space, reserve_path
from powertrain.store.rundir import RunDir, default_host, make_dir, write_json_atomic
from powertrain.store.tables import StreamingTableWriter, power_samples_base
from powertrain.telemetry.backend import Backend
from powertrain.telemetry.clock import DEFAULT_RATE_HZ, clock_info

log = logging.getLogger(__name__)

WRITE_FAILED = "telemetry write failed"  # how a stop_reason begins when a sink could not write
STEP_TOLERANCE_NS = 1_000_000  # system and sampler clocks this close: no step, rows keep their stamps
# How often the drivers' own power-sample buffers are read: every 0.1 s they still hold every sample since the
# last read (the stand-in's ring, after NVML's: 120 samples, 1.2 s at a 10 ms spacing; an overrun is counted and
# logged), and a read on every 20 Hz tick cost about as much again (benchmarks/sampler_buffer_cost.py).
BUFFER_READ_S = 0.1


class SampleSink(Protocol):
    """Where each sample's rows go. Every call comes from the sampling loop, so each must be cheap."""

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Take the rows of one sample (all devices of this host)."""

    def maybe_flush(self) -> bool:
        """Make what was written durable if it is time to; whether it did (the sampler's periodic
        checks run after a flush)."""

    def close(self) -> None:
        """Sampling ended: flush and release what the sink holds."""


class _StreamSink:
    """A sink that streams rows to one crash-safe Parquet stream (``self.writer``)."""

    writer: StreamingTableWriter

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writer.append(rows)

    def maybe_flush(self) -> bool:
        return self.writer.maybe_flush()

    def close(self) -> None:
        self.writer.close()


class TelemetryFile(_StreamSink):
    """The run directory's telemetry of one host, ``<run>/telemetry/<host>.parquet`` (crash-safe)."""

    def __init__(self, run_dir: str | os.PathLike[str], host: str, flush_s: float = 1.0) -> None:
        self.writer = StreamingTableWriter(RunDir(run_dir).telemetry_file(host).with_suffix(""), TELEMETRY_SCHEMA,
                                           flush_s=flush_s)  # telemetry_file: the host is checked as a name


class PowerSamplesFile(_StreamSink):
    """The driver's buffered power samples of one host, ``<run>/telemetry/power-samples/<host>.parquet``
    (crash-safe like :class:`TelemetryFile`)."""

    # A driver may keep a sample every 10 ms: 800 rows a second from 8 GPUs, 4 × the telemetry rows. Each
    # flush rewrites the current segment, so its segments are kept shorter (5 s, not 15 s) to keep that
    # rewrite small: at 15 s it was most of what the buffer path cost (benchmarks/sampler_buffer_cost.py).
    SEGMENT_S = 5.0

    def __init__(self, run_dir: str | os.PathLike[str], host: str, flush_s: float = 1.0) -> None:
        base = power_samples_base(run_dir, host)
        make_dir(base.parent)  # the folder gets the run directory's mode policy
        self.path = base.with_name(base.name + ".parquet")
        self.writer = StreamingTableWriter(base, POWER_SAMPLES_SCHEMA, flush_s=flush_s, segment_s=self.SEGMENT_S)


class Sampler:
    """Samples the given backends into its sinks until :meth:`stop` is called.

    ``sinks`` default to the run directory's :class:`TelemetryFile` of ``host``; ``meta`` entries are
    added to ``<host>.meta.json`` (what the composing entry point wants recorded about its sinks).
    ``power_buffer``: read the drivers' buffered power samples into :class:`PowerSamplesFile` where a
    backend offers them (module doc).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        backends: list[Backend],
        notes: Sequence[str] = (),
        host: str | None = None,
        rate_hz: float = DEFAULT_RATE_HZ,
        flush_s: float = 1.0,
        watch_pid: int | None = None,
        sinks: Sequence[SampleSink] | None = None,
        meta: Mapping[str, Any] | None = None,
        clocks: tuple[Callable[[], int], Callable[[], int]] = (time.time_ns, time.monotonic_ns),
        power_buffer: bool = True,
    ) -> None:
        check_rate_hz(rate_hz)
        self.rundir = RunDir(run_dir).create()
        self.host = host or default_host()
        self.backends = backends
        self.notes = list(notes)
        self.rate_hz = rate_hz
        self.period = 1.0 / rate_hz
        self.sinks: list[SampleSink] = (list(sinks) if sinks is not None
                                        else [TelemetryFile(self.rundir.path, self.host, flush_s)])
        self.extra_meta = dict(meta or {})
        self._stop = threading.Event()
        self._parent = watch_pid  # stop when our parent is no longer this process
        self.samples = 0
        self.missed = 0
        self.stop_reason = "stopped"
        self.t_first_ns: int | None = None
        self.t_last_ns: int | None = None
        self.write_error: OSError | None = None
        self._t_flushed_ns: int | None = None  # the last sample known to be on disk
        # (wall, monotonic) clock functions, ns: injected by tests; rows are stamped on the wall clock
        # read once here plus monotonic time since (module doc)
        self._wall_ns = clocks[0]
        self._clock = AnchoredClock(*clocks)
        self._last_wall: int | None = None
        self.steps_back = 0
        self.stepped_back_ns = 0
        self.wall_offset_ns = 0  # system wall clock minus the sampler's, at the last sample
        # a backend that predates the buffer API (a test's own) has none
        used = [getattr(b, "set_power_buffer", lambda _on: False)(power_buffer) for b in backends]
        self.power_file = PowerSamplesFile(self.rundir.path, self.host, flush_s) if any(used) else None
        self.power_rows = 0
        self._buffer_due_ns = 0  # the sampler's clock at which the drivers' buffers are next read
        self._fresh: dict[str, list[int]] = {}  # device → [fresh, repeat, unknown] power_w readings

    def stop(self, reason: str = "stopped") -> None:
        self.stop_reason = reason
        self._stop.set()

    def meta(self, final: bool) -> dict[str, Any]:
        duration = (
            (self.t_last_ns - self.t_first_ns) / 1e9
            if self.t_first_ns is not None and self.t_last_ns is not None
            else None
        )
        devices = [d.to_dict() for b in self.backends for d in b.devices()]
        return {
            "host": self.host,
            "pid": os.getpid(),
            "backends": [b.name for b in self.backends],
            "software": {k: v for b in self.backends for k, v in b.software.items()},
            "devices": devices,
            "notes": self.notes,
            "rate_hz_requested": self.rate_hz,
            "rate_hz_achieved": (self.samples - 1) / duration if duration else None,
            "samples": self.samples,
            "missed_ticks": self.missed,
            "t_first_ns": self.t_first_ns,
            "t_last_ns": self.t_last_ns,
            "clock": {**clock_info(), "timestamps": "CLOCK_REALTIME at the sampler's start + CLOCK_MONOTONIC since",
                      "steps_back": self.steps_back, "stepped_back_s": self.stepped_back_ns / 1e9,
                      "wall_minus_sampler_ns": self.wall_offset_ns},
            "incidents": [i.to_dict() for b in self.backends for i in b.incidents],
            "power_samples": ({"stream": str(self.power_file.path.relative_to(self.rundir.path)),
                               "rows": self.power_rows} if self.power_file is not None else None),
            "power_repeat": self._fresh_meta(duration),
            "finished": final,
            "stop_reason": self.stop_reason if final else None,
            **self.extra_meta,
        }

    def _fresh_meta(self, duration_s: float | None) -> dict[str, Any]:
        """Per device: fresh, repeated and unclassified power_w readings, and the effective rate of fresh
        ones (null unless every reading was classified)."""
        out = {}
        for dev, (fresh, repeat, unknown) in self._fresh.items():
            rate = fresh / duration_s if duration_s and not unknown else None
            out[dev] = {"fresh": fresh, "repeat": repeat, "unknown": unknown, "rate_hz_effective": rate}
        return out

    def _count_fresh(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if r.get("power_w") is None:
                continue
            counts = self._fresh.setdefault(r["device"], [0, 0, 0])
            rep = r.get("power_repeat")
            counts[0 if rep is False else 1 if rep is True else 2] += 1

    def _power_samples(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for backend in self.backends:
            try:
                rows.extend(backend.power_samples(self.host))
            except Exception as exc:  # as for sample(): one backend's bug stops nothing else
                backend.incident("*", f"{backend.name} power samples failed: {exc!r}")
                log.warning("%s backend failed to read its power samples: %r", backend.name, exc)
        return rows

    def _sampler_now(self) -> tuple[int, int]:
        """(the system wall clock, the sampler's own: its start's wall clock + monotonic time since) now;
        counts a step back of the system clock since the previous sample."""
        wall, own = self._wall_ns(), self._clock.now_ns()
        if self._last_wall is not None and wall < self._last_wall:
            self.steps_back += 1
            self.stepped_back_ns += self._last_wall - wall
            log.warning("the system clock stepped back %.3f s; telemetry stays on the sampler's own clock "
                        "(start + monotonic time)", (self._last_wall - wall) / 1e9)
        self._last_wall = wall
        self.wall_offset_ns = wall - own
        return wall, own

    def _sample_once(self, last: bool = False) -> None:
        rows: list[dict[str, Any]] = []
        wall, own = self._sampler_now()
        for backend in self.backends:
            try:
                rows.extend(backend.sample(self.host))
            except Exception as exc:  # a backend bug must not end the measurement of the others
                backend.incident("*", f"{backend.name} sample failed: {exc!r}")
                log.warning("%s backend failed to sample: %r", backend.name, exc)
        power: list[dict[str, Any]] = []
        if self.power_file is not None and (last or own >= self._buffer_due_ns):
            power = self._power_samples()
            self._buffer_due_ns = own + round(BUFFER_READ_S * 1e9)
        # the backends stamp on the system clock: move each row onto the sampler's own. Under 1 ms the two
        # differ only by the time between reading them (no step happened): the rows keep their stamps,
        # which are then the ranks' clock exactly (a sample period is far longer, so nothing reorders)
        shift = own - wall
        if abs(shift) >= STEP_TOLERANCE_NS:
            for r in (*rows, *power):
                if r.get("t_ns") is not None:
                    r["t_ns"] = int(r["t_ns"]) + shift
        if rows:
            t = rows[0]["t_ns"]
            self.t_first_ns = self.t_first_ns or t
            self.t_last_ns = t
        self._count_fresh(rows)
        for sink in self.sinks:
            sink.write(rows)
        if power and self.power_file is not None:
            self.power_file.write(power)
            self.power_rows += len(power)
        self.samples += 1

    def run(self) -> None:
        """The sampling loop; returns after :meth:`stop`, when the parent process is gone, or when a sink
        cannot write. Raises ``OSError`` only when it cannot start (no space for its reserve or meta)."""
        _warm_up_writer()
        reserve = reserve_path(self.rundir.telemetry_dir, self.host)
        hold_space(reserve, SAMPLER_RESERVE_BYTES)
        try:
            write_json_atomic(self.rundir.telemetry_meta(self.host), self.meta(final=False))
        except OSError:
            release_space(reserve)
            raise
        log.info("sampling %d device(s) at %g Hz: %s", sum(len(b.devices()) for b in self.backends),
                 self.rate_hz, ", ".join(d.device for b in self.backends for d in b.devices()))
        for note in self.notes:
            log.info("%s", note)
        next_t = time.monotonic()
        seen_incidents = 0
        try:
            while not self._stop.is_set():
                self._sample_once()
                try:
                    flushed = self._flush_sinks()
                except OSError as exc:
                    self._write_failed(exc)
                    break
                if flushed:
                    self._t_flushed_ns = self.t_last_ns
                    n = sum(len(b.incidents) for b in self.backends)
                    if n != seen_incidents:
                        for inc in [i for b in self.backends for i in b.incidents][seen_incidents:]:
                            log.warning("incident on %s: %s", inc.device, inc.what)
                        seen_incidents = n
                    if self._parent is not None and os.getppid() != self._parent:
                        self.stop_reason = "parent process disappeared"
                        log.error("the process that started the sampler is gone; stopping")
                        break
                next_t += self.period
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind (slow device read, CPU starvation): skip, don't burst
                    self.missed += math.ceil(-delay / self.period)
                    next_t = time.monotonic()
                else:
                    self._stop.wait(delay)
            if self.write_error is None:
                self._sample_once(last=True)  # the state at the moment of stopping, so the window ends measured
        finally:
            self._close_sinks()
            for b in self.backends:
                b.close()
            release_space(reserve)  # the final meta must be written even on a full disk
            try:
                write_json_atomic(self.rundir.telemetry_meta(self.host), self.meta(final=True))
            except OSError as exc:
                log.error("cannot write the final meta (%s); stopped (%s)", exc, self.stop_reason)
            log.info("stopped (%s) after %d samples", self.stop_reason, self.samples)

    def _write_failed(self, exc: OSError) -> None:
        """A sink could not write: sampling stops, and says why (not a crash: the command goes on)."""
        self.write_error = exc
        self.stop_reason = f"{WRITE_FAILED}: {exc}"
        self.t_last_ns = self._t_flushed_ns  # what was sampled after the last flush is not on disk
        log.error("%s; sampling stops (telemetry kept up to the last flush)", self.stop_reason)

    def _close_sinks(self) -> None:
        for sink in [*self.sinks, *([self.power_file] if self.power_file is not None else [])]:
            try:
                sink.close()
            except OSError as exc:  # e.g. the compaction on a full disk: the segments stay readable
                if self.write_error is None:
                    self._write_failed(exc)
                log.error("closing %s failed: %s", type(sink).__name__, exc)


    def _flush_sinks(self) -> bool:
        """Let every sink flush if due; whether any did."""
        flushed = [sink.maybe_flush() for sink in self.sinks]
        if self.power_file is not None:
            self.power_file.maybe_flush()  # its own schedule; the periodic checks follow the rows' flush
        return any(flushed)


def _warm_up_writer() -> None:
    """Pay pyarrow's lazy imports (it pulls in pandas when installed: ~1 s) before the first tick,
    not at the first flush, where they would stall sampling."""
    import io

    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([empty_telemetry_row(0, "warm-up", "cpu")], schema=TELEMETRY_SCHEMA)
    pq.write_table(table, io.BytesIO(), compression="zstd")

