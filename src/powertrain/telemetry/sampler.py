"""The per-node sampler: one process per node that reads every local device at a fixed rate.

Rows stream to ``<run>/telemetry/<host>.parquet`` through
:class:`powertrain.store.tables.StreamingTableWriter`, so a ``kill -9`` of the sampler, the training
ranks or the launcher loses at most about one flush interval (1 s) of samples. What the sampler found
(devices, supported fields, notes, incidents, achieved rate) goes to ``<host>.meta.json``.

Run it directly as ``python -m powertrain.telemetry.sampler RUN_DIR [--rate HZ]``; normally
:class:`powertrain.monitor.Monitor` starts and stops it. It exits cleanly on SIGTERM / SIGINT and by
itself when the process that started it disappears (so an orphaned sampler never runs forever).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from powertrain.schema import TELEMETRY_SCHEMA, empty_telemetry_row
from powertrain.store.rundir import RunDir, default_host, write_json_atomic
from powertrain.store.tables import StreamingTableWriter
from powertrain.telemetry.backend import Backend, BackendUnavailable
from powertrain.telemetry.clock import DEFAULT_RATE_HZ, clock_info
from powertrain.telemetry.discover import open_backends

log = logging.getLogger("powertrain.sampler")

MAX_RATE_HZ = 1000.0


class Sampler:
    """Samples the given backends into a run directory until :meth:`stop` is called."""

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
        exporter: Any = None,
    ) -> None:
        if not 0 < rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"sampling rate must be in (0, {MAX_RATE_HZ:g}] Hz, got {rate_hz:g}")
        self.rundir = RunDir(run_dir).create()
        self.host = host or default_host()
        self.backends = backends
        self.notes = list(notes)
        self.rate_hz = rate_hz
        self.period = 1.0 / rate_hz
        self.writer = StreamingTableWriter(
            self.rundir.telemetry_dir / self.host, TELEMETRY_SCHEMA, flush_s=flush_s
        )
        self.exporter = exporter  # a powertrain.live.prometheus.PrometheusExporter, or None
        self._stop = threading.Event()
        self._parent = watch_pid  # stop when our parent is no longer this process
        self.samples = 0
        self.missed = 0
        self.stop_reason = "stopped"
        self.t_first_ns: int | None = None
        self.t_last_ns: int | None = None

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
            "clock": clock_info(),
            "incidents": [i.to_dict() for b in self.backends for i in b.incidents],
            "finished": final,
            "stop_reason": self.stop_reason if final else None,
            "prometheus": ({"addr": self.exporter.addr, "port": self.exporter.port}
                           if self.exporter is not None else None),
        }

    def _sample_once(self) -> None:
        rows: list[dict[str, Any]] = []
        for backend in self.backends:
            try:
                rows.extend(backend.sample(self.host))
            except Exception as exc:  # a backend bug must not end the measurement of the others
                backend.incident("*", f"{backend.name} sample failed: {exc!r}")
                log.warning("%s backend failed to sample: %r", backend.name, exc)
        if rows:
            t = rows[0]["t_ns"]
            self.t_first_ns = self.t_first_ns or t
            self.t_last_ns = t
        self.writer.append(rows)
        if self.exporter is not None:
            self.exporter.update(rows)
        self.samples += 1

    def run(self) -> None:
        """The sampling loop; returns after :meth:`stop` or when the parent process is gone."""
        _warm_up_writer()
        write_json_atomic(self.rundir.telemetry_meta(self.host), self.meta(final=False))
        log.info("sampling %d device(s) at %g Hz: %s", sum(len(b.devices()) for b in self.backends),
                 self.rate_hz, ", ".join(d.device for b in self.backends for d in b.devices()))
        for note in self.notes:
            log.info("%s", note)
        next_t = time.monotonic()
        seen_incidents = 0
        try:
            while not self._stop.is_set():
                self._sample_once()
                if self.writer.maybe_flush():
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
            self._sample_once()  # the state at the moment of stopping, so the window ends measured
        finally:
            self.writer.close()
            for b in self.backends:
                b.close()
            if self.exporter is not None:
                self.exporter.close()
            write_json_atomic(self.rundir.telemetry_meta(self.host), self.meta(final=True))
            log.info("stopped (%s) after %d samples", self.stop_reason, self.samples)


def _warm_up_writer() -> None:
    """Pay pyarrow's lazy imports (it pulls in pandas when installed: ~1 s) before the first tick,
    not at the first flush, where they would stall sampling."""
    import io

    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([empty_telemetry_row(0, "warm-up", "cpu")], schema=TELEMETRY_SCHEMA)
    pq.write_table(table, io.BytesIO(), compression="zstd")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m powertrain.telemetry.sampler", description=__doc__)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rate", type=float, default=DEFAULT_RATE_HZ, help="samples per second (default 20)")
    p.add_argument("--backends", default="auto", help="auto, or a comma list of nvidia,amd,host")
    p.add_argument("--host", default=None, help="host label (default: short host name)")
    p.add_argument("--flush", type=float, default=1.0, help="seconds between crash-safe flushes")
    p.add_argument("--watch-pid", type=int, default=None,
                   help="the starting process's pid: stop when it is no longer our parent (it died)")
    p.add_argument("--prometheus", default=None, metavar="[HOST:]PORT",
                   help="serve the latest readings for Prometheus (HOST defaults to 127.0.0.1)")
    args = p.parse_args(argv)

    host = args.host or default_host()
    run = RunDir(args.run_dir).create()
    logging.basicConfig(
        filename=run.logs_dir / f"sampler-{host}.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    requested = "auto" if args.backends == "auto" else args.backends.split(",")
    try:
        backends, notes = open_backends(requested)
    except BackendUnavailable as exc:
        print(f"telemetry backend unavailable: {exc}", file=sys.stderr)  # the monitor shows this line
        return 2
    exporter = None
    if args.prometheus:
        from powertrain.live.prometheus import PrometheusExporter

        exporter = PrometheusExporter(args.prometheus)
        log.info("serving Prometheus metrics on http://%s:%d/metrics", exporter.addr, exporter.port)
    sampler = Sampler(run.path, backends=backends, notes=notes, host=host, rate_hz=args.rate,
                      flush_s=args.flush, watch_pid=args.watch_pid, exporter=exporter)

    def on_signal(signum: int, _frame: object) -> None:
        sampler.stop(f"received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sampler.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
