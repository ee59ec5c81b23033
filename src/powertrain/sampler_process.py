"""The per-node sampler process: ``python -m powertrain.sampler_process RUN_DIR [--rate HZ] ...``.

:class:`powertrain.monitor.Monitor` starts one per node and stops it with SIGTERM; it can also be run
by hand. This entry point composes the parts: the telemetry backends found on this host
(:func:`powertrain.telemetry.discover.open_backends`), the sampling loop
(:class:`powertrain.telemetry.sampler.Sampler`) and its sinks — the run directory's
``telemetry/<host>.parquet`` always, and the live Prometheus endpoint
(:class:`powertrain.live.prometheus.PrometheusExporter`) with ``--prometheus``. The sampling loop
itself knows neither the endpoint nor this process.

It logs to ``<run>/logs/sampler-<host>.log``; errors also go to stderr, which the monitor keeps in
``logs/sampler-<host>.stderr`` and shows when the sampler fails to start. It exits cleanly on SIGTERM
/ SIGINT and by itself when the process that started it (``--watch-pid``) disappears. Then it is the
run's **watchdog**: it stops the commands that process supervised (:func:`powertrain.supervise.stop_orphans`)
and, when that process owned the run and left it ``running``, marks it ``failed: supervisor killed``
(:func:`powertrain.monitor.close_orphaned_run`). A disk that fills while sampling stops sampling with
the reason in ``<host>.meta.json``; one that is full at start is one error line and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from powertrain.diagnostics import show_on_stderr
from powertrain.hooks.recorder import check_flush_s
from powertrain.store.rundir import RunDir, default_host, set_file_mode
from powertrain.telemetry.backend import BackendUnavailable
from powertrain.telemetry.clock import DEFAULT_RATE_HZ
from powertrain.telemetry.discover import open_backends
from powertrain.telemetry.sampler import Sampler, SampleSink, TelemetryFile

# named, not __name__: run with -m, this module is __main__, outside the powertrain logger tree
log = logging.getLogger("powertrain.sampler_process")


def _seconds(text: str) -> float:
    """``--flush``: finite and > 0 (NaN would never flush: the telemetry would reach disk only at stop)."""
    try:
        return check_flush_s(text, "--flush", allow_zero=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m powertrain.sampler_process", description=__doc__)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rate", type=float, default=DEFAULT_RATE_HZ, help="samples per second (default 20)")
    p.add_argument("--backends", default="auto", help="auto, or a comma list of nvidia,amd,host")
    p.add_argument("--no-power-buffer", dest="power_buffer", action="store_false",
                   help="do not read the drivers' buffered power samples (NVML) between polls")
    p.add_argument("--host", default=None, help="host label (default: short host name)")
    p.add_argument("--flush", type=_seconds, default=1.0, help="seconds between crash-safe flushes (> 0)")
    p.add_argument("--watch-pid", type=int, default=None,
                   help="the starting process's pid: stop when it is no longer our parent (it died)")
    p.add_argument("--prometheus", default=None, metavar="[HOST:]PORT",
                   help="serve the latest readings for Prometheus (HOST defaults to 127.0.0.1)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    host = args.host or default_host()
    run = RunDir(args.run_dir).create()
    log_path = run.logs_dir / f"sampler-{host}.log"
    log_path.touch()
    set_file_mode(log_path)  # the run directory's mode policy (docs/reliability.md)
    logging.basicConfig(
        filename=log_path,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    show_on_stderr(logging.ERROR)  # the monitor shows this process's stderr when it fails to start
    requested = "auto" if args.backends == "auto" else args.backends.split(",")
    try:
        backends, notes = open_backends(requested)
    except BackendUnavailable as exc:
        log.error("telemetry backend unavailable: %s", exc)
        return 2
    sinks: list[SampleSink] = [TelemetryFile(run.path, host, args.flush)]
    prometheus = None
    if args.prometheus:
        from powertrain.live.prometheus import PrometheusExporter

        exporter = PrometheusExporter(args.prometheus)
        log.info("serving Prometheus metrics on http://%s:%d/metrics", exporter.addr, exporter.port)
        sinks.append(exporter)
        prometheus = exporter.meta()
    sampler = Sampler(run.path, backends=backends, notes=notes, host=host, rate_hz=args.rate,
                      flush_s=args.flush, watch_pid=args.watch_pid, sinks=sinks,
                      meta={"prometheus": prometheus}, power_buffer=args.power_buffer)

    def on_signal(signum: int, _frame: object) -> None:
        sampler.stop(f"received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sampler.run()
    except OSError as exc:  # could not start writing (a full disk): one line, the monitor shows it
        log.error("cannot write telemetry into %s: %s", run.path, exc)
        return 2
    if args.watch_pid is not None and os.getppid() != args.watch_pid:
        from powertrain.monitor import close_orphaned_run  # the watchdog: only when the starter died

        close_orphaned_run(run, args.watch_pid, host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
