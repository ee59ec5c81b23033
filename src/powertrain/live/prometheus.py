"""Live Prometheus endpoint of the per-node sampler (``powertrain monitor --prometheus [HOST:]PORT``).

The sampler hands each sample's rows to :class:`PrometheusExporter`, one of its sinks (one
reference assignment, so the sampling loop is not slowed); metrics are built from the latest rows
only when Prometheus scrapes. Every metric carries ``host`` and ``device`` labels (``gpu0``,
``cpu``). Names follow NVIDIA dcgm-exporter where DCGM has the same quantity (in DCGM's unit), so
existing dashboards and alerts work; the rest are ``powertrain_<field>``:

======================  ==========================================  ===========================
telemetry field         metric                                      unit
======================  ==========================================  ===========================
power_w                 DCGM_FI_DEV_POWER_USAGE                     W
energy_j                DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION        mJ (since an arbitrary origin)
temp_c                  DCGM_FI_DEV_GPU_TEMP                        °C
temp_mem_c              DCGM_FI_DEV_MEMORY_TEMP                     °C
clock_sm_mhz            DCGM_FI_DEV_SM_CLOCK                        MHz
clock_mem_mhz           DCGM_FI_DEV_MEM_CLOCK                       MHz
util_pct                DCGM_FI_DEV_GPU_UTIL                        %
util_mem_pct            DCGM_FI_DEV_MEM_COPY_UTIL                   %
mem_used_bytes          DCGM_FI_DEV_FB_USED                         MiB
power_limit_w           DCGM_FI_DEV_POWER_MGMT_LIMIT                W
fan_pct                 DCGM_FI_DEV_FAN_SPEED                       %
anything else           powertrain_<field> (e.g. powertrain_throttle, powertrain_link_tx_bytes)
======================  ==========================================  ===========================

``throttle`` is powertrain's vendor-neutral bit set (:class:`powertrain.schema.Throttle`), not
DCGM's, hence its own name. A field a device does not report is absent (never 0). Plus
``powertrain_sampler_samples_total`` and ``powertrain_sample_timestamp_seconds`` per host.

The endpoint binds to 127.0.0.1 unless an address is given: telemetry is not published to the
network by accident. A non-loopback address (``0.0.0.0:9400``, a host name or interface address) is
refused unless it is explicitly allowed (``powertrain monitor --prometheus-public``, which sets
``POWERTRAIN_PROMETHEUS_PUBLIC=1`` for the sampler it starts, or ``public=True``), and then a warning
is logged.

The server is bounded, and slow clients cannot starve scrapes (a slow-loris client opens a connection
and sends its request a byte at a time, or never finishes it). One loop accepts connections and reads
their request heads without blocking, and only a complete head reaches one of :data:`MAX_HANDLERS`
handler threads, which answers from memory. A connection silent for :data:`READ_TIMEOUT_S` (per read)
or whose head is not complete after :data:`REQUEST_TIMEOUT_S` (however it trickles) is closed; at most
:data:`MAX_CONNECTIONS` are open at once, and one more takes the place of the connection that has
waited longest for its head — a scraper, which sends its request at once, always gets in. Only when
every open connection is being answered is a new one closed at once (the scraper retries).
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import logging
import os
import queue
import selectors
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from powertrain.schema import FLAG_FIELDS, TELEMETRY_FIELDS

DEFAULT_ADDR = "127.0.0.1"
PUBLIC_ENV = "POWERTRAIN_PROMETHEUS_PUBLIC"
READ_TIMEOUT_S = 5.0  # a connection silent this long while sending its request is closed
REQUEST_TIMEOUT_S = 10.0  # a request head not complete after this is closed, however it trickles in
CONNECTION_TIMEOUT_S = READ_TIMEOUT_S  # each write of an answer
MAX_CONNECTIONS = 64  # open at once, waiting or being answered
MAX_HANDLERS = 8  # requests answered at once
MAX_HEAD_BYTES = 16 * 1024  # a scrape's request head is a few hundred bytes
log = logging.getLogger(__name__)

# field -> (metric name, help, scale from the field's unit to the metric's)
DCGM_NAMES: dict[str, tuple[str, str, float]] = {
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 1.0),
    "energy_j": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Energy counter (in mJ), arbitrary origin.", 1e3),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP", "Die temperature (in C).", 1.0),
    "temp_mem_c": ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", 1.0),
    "clock_sm_mhz": ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1.0),
    "clock_mem_mhz": ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 1.0),
    "util_pct": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 1.0),
    "util_mem_pct": ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 1.0),
    "mem_used_bytes": ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 1.0 / 2**20),
    "power_limit_w": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Enforced power limit (in W).", 1.0),
    "fan_pct": ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", 1.0),
}


def metric_name(field: str) -> str:
    """The exported name of a telemetry field."""
    return DCGM_NAMES[field][0] if field in DCGM_NAMES else f"powertrain_{field}"


def parse_listen(spec: str) -> tuple[str, int]:
    """``PORT``, ``:PORT`` or ``HOST:PORT`` → (address, port); the address defaults to 127.0.0.1."""
    host, _, port = spec.rpartition(":")
    try:
        port_n = int(port)
    except ValueError:
        raise ValueError(f"--prometheus: expected [HOST:]PORT, e.g. :9400 or 0.0.0.0:9400, got {spec!r}") from None
    if not 0 <= port_n <= 65535:
        raise ValueError(f"--prometheus: port must be 0..65535, got {port_n}")
    return (host.strip("[]") or DEFAULT_ADDR), port_n


def is_loopback(addr: str) -> bool:
    """Whether every address ``addr`` resolves to is a loopback one (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def check_public(addr: str, public: bool | None = None) -> bool:
    """Refuse (``ValueError``) a non-loopback ``addr`` unless ``public`` (``None``: the environment's
    ``POWERTRAIN_PROMETHEUS_PUBLIC=1``); returns whether the address is public."""
    if is_loopback(addr):
        return False
    allowed = os.environ.get(PUBLIC_ENV) == "1" if public is None else public
    if not allowed:
        raise ValueError(f"--prometheus {addr}: not a loopback address, so telemetry would be served to the "
                         "network; add --prometheus-public to allow it")
    return True


class _Handler(WSGIRequestHandler):
    """One scrape, whose request head the server has already read (:class:`BoundedServer`); the answer is
    written under a timeout of :data:`CONNECTION_TIMEOUT_S`; no access log."""

    timeout = CONNECTION_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        # the head was read by the server's own loop: the handler reads it from memory, never waits on the client
        self.rfile.close()
        self.rfile = io.BytesIO(self.server.take_head(self.request))  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


@dataclass
class _Waiting:
    """A connection whose request head is still arriving."""

    addr: Any
    opened: float
    last: float
    head: bytearray = dc_field(default_factory=bytearray)


class BoundedServer(WSGIServer):
    """Request heads read by one loop, requests answered by ``max_handlers`` threads; see the module doc.

    Counters: ``refused`` (closed at once, every connection being answered), ``evicted`` (a waiting
    connection closed to make room for a new one), ``expired`` (closed for silence or a slow head)."""

    max_handlers = MAX_HANDLERS
    max_connections = MAX_CONNECTIONS
    read_timeout_s = READ_TIMEOUT_S
    request_timeout_s = REQUEST_TIMEOUT_S

    def server_activate(self) -> None:
        super().server_activate()
        self.socket.setblocking(False)
        self.refused = self.evicted = self.expired = 0
        self._waiting: dict[socket.socket, _Waiting] = {}  # insertion order: the longest waiting first
        self._heads: dict[socket.socket, bytes] = {}
        self._ready: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        self._busy = 0  # connections handed to the handlers and not yet closed
        self._busy_lock = threading.Lock()
        self._stop, self._stopped = threading.Event(), threading.Event()
        self._workers = [threading.Thread(target=self._work, name=f"prometheus-handler-{i}", daemon=True)
                         for i in range(self.max_handlers)]
        for w in self._workers:
            w.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or hung up: one debug line, not a traceback on the sampler's stderr."""
        log.debug("Prometheus endpoint: connection from %s ended: %s", client_address, sys.exc_info()[1])

    def take_head(self, conn: socket.socket) -> bytes:
        return self._heads.pop(conn, b"")

    def serve_forever(self, poll_interval: float = 0.2) -> None:
        """Accept, read request heads and expire slow ones in one loop (no thread per waiting client)."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.socket, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    for key, _ in sel.select(poll_interval):
                        if key.fileobj is self.socket:
                            self._accept(sel)
                        else:
                            self._receive(sel, key.fileobj)  # type: ignore[arg-type]
                    self._expire(sel, time.monotonic())
            finally:
                for conn in list(self._waiting):
                    self._drop(sel, conn)
                self._stopped.set()

    def shutdown(self) -> None:
        """Stop the loop (closing waiting connections) and the handler threads."""
        self._stop.set()
        self._stopped.wait(10)
        for _ in self._workers:
            self._ready.put(None)

    def _drop(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        self._waiting.pop(conn, None)
        conn.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            conn, addr = self.socket.accept()
        except OSError:  # the client left before it was accepted
            return
        if len(self._waiting) + self._busy >= self.max_connections:
            if not self._waiting:  # every connection is being answered: this one retries at its next scrape
                self.refused += 1
                conn.close()
                return
            # the longest-waiting head loses its place, not the newcomer: slow clients cannot starve scrapes
            self._drop(sel, next(iter(self._waiting)))
            self.evicted += 1
        conn.setblocking(False)
        now = time.monotonic()
        self._waiting[conn] = _Waiting(addr, now, now)
        sel.register(conn, selectors.EVENT_READ)

    def _receive(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        waiting = self._waiting.get(conn)
        if waiting is None:
            return
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        waiting.head += data
        if not data or len(waiting.head) > MAX_HEAD_BYTES:  # hung up, or no scrape's head
            self._drop(sel, conn)
            return
        waiting.last = time.monotonic()
        if b"\r\n\r\n" in waiting.head or b"\n\n" in waiting.head:
            sel.unregister(conn)
            del self._waiting[conn]
            self._heads[conn] = bytes(waiting.head)
            with self._busy_lock:
                self._busy += 1
            self._ready.put((conn, waiting.addr))

    def _expire(self, sel: selectors.BaseSelector, now: float) -> None:
        for conn, w in list(self._waiting.items()):
            if now - w.last > self.read_timeout_s or now - w.opened > self.request_timeout_s:
                self._drop(sel, conn)
                self.expired += 1

    def _work(self) -> None:
        while (item := self._ready.get()) is not None:
            conn, addr = item
            try:
                conn.setblocking(True)
                self.finish_request(conn, addr)
            except Exception:
                self.handle_error(conn, addr)
            finally:
                self._heads.pop(conn, None)
                self.shutdown_request(conn)
                with self._busy_lock:
                    self._busy -= 1


def serve(port: int, addr: str, registry: Any, max_handlers: int = MAX_HANDLERS, *,
          max_connections: int = MAX_CONNECTIONS, read_timeout_s: float = READ_TIMEOUT_S,
          request_timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[BoundedServer, threading.Thread]:
    """Serve ``registry`` at ``addr:port`` from a daemon thread with the bounds above."""
    from prometheus_client import make_wsgi_app

    infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    server_class = type("_Server", (BoundedServer,), {
        "address_family": family, "max_handlers": max_handlers, "max_connections": max(max_connections, 1),
        "read_timeout_s": read_timeout_s, "request_timeout_s": request_timeout_s})
    httpd = server_class((sockaddr[0], port), _Handler)
    httpd.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=httpd.serve_forever, name="prometheus-exporter", daemon=True)
    thread.start()
    return httpd, thread


class PrometheusExporter:
    """Serves the latest telemetry rows of one sampler over HTTP in the Prometheus text format.

    Args:
        listen: ``[HOST:]PORT`` (HOST defaults to 127.0.0.1; port 0 picks a free port).
        labels: extra constant labels on every metric (e.g. ``{"run": "try1"}``).
        public: allow a non-loopback HOST (``None``: only with ``POWERTRAIN_PROMETHEUS_PUBLIC=1``).
        max_handlers: requests answered at once (more wait for a handler, their heads read).
        max_connections: connections open at once (one more takes the longest-waiting one's place).
        read_timeout_s: silence after which a connection still sending its request is closed.
        request_timeout_s: time after which a request head not yet complete is closed.
    """

    def __init__(self, listen: str, labels: Mapping[str, str] | None = None, *, public: bool | None = None,
                 max_handlers: int = MAX_HANDLERS, max_connections: int = MAX_CONNECTIONS,
                 read_timeout_s: float = READ_TIMEOUT_S, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        from prometheus_client import CollectorRegistry

        self.addr, port = parse_listen(listen)
        if check_public(self.addr, public):
            log.warning("Prometheus endpoint on %s:%s is reachable from the network (--prometheus-public): "
                        "anyone who can reach this host can read its telemetry", self.addr, port)
        self.labels = dict(labels or {})
        self._rows: list[dict[str, Any]] = []
        self._samples: dict[str, int] = {}
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server, self._thread = serve(port, self.addr, self.registry, max_handlers,
                                           max_connections=max_connections, read_timeout_s=read_timeout_s,
                                           request_timeout_s=request_timeout_s)
        self.port: int = self._server.server_port

    # -- called by the sampler (a powertrain.telemetry.sampler.SampleSink) ------------------------
    def write(self, rows: list[dict[str, Any]]) -> None:
        """Remember one sample's rows (cheap: the work is done at scrape time)."""
        if not rows:
            return
        with self._lock:
            self._rows = rows
            host = rows[0].get("host", "")
            self._samples[host] = self._samples.get(host, 0) + 1

    def maybe_flush(self) -> bool:
        """Nothing to make durable: the endpoint serves the latest sample only."""
        return False

    def meta(self) -> dict[str, Any]:
        """Where it listens, for the sampler's ``<host>.meta.json``."""
        return {"addr": self.addr, "port": self.port}

    # -- called by prometheus_client at scrape time ----------------------------------------------
    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            rows, samples = list(self._rows), dict(self._samples)
        extra = list(self.labels)
        names = ["host", "device", *extra]
        families: dict[str, GaugeMetricFamily] = {}
        for row in rows:
            values = [str(row.get("host", "")), str(row.get("device", "")), *self.labels.values()]
            for field in TELEMETRY_FIELDS:
                v = row.get(field)
                if v is None or field in FLAG_FIELDS:
                    continue  # unknown stays absent, never 0; a flag about a reading is no gauge
                name, doc, scale = DCGM_NAMES.get(field, (metric_name(field), f"powertrain telemetry field {field}.", 1.0))
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = GaugeMetricFamily(name, doc, labels=names)
                fam.add_metric(values, float(v) * scale)
        yield from families.values()
        hosts = {str(r.get("host", "")): r.get("t_ns") for r in rows}
        count = CounterMetricFamily("powertrain_sampler_samples", "Samples taken by this node's sampler.",
                                    labels=["host", *extra])
        stamp = GaugeMetricFamily("powertrain_sample_timestamp_seconds", "Time of the latest sample (Unix s).",
                                  labels=["host", *extra])
        for host, t_ns in hosts.items():
            count.add_metric([host, *self.labels.values()], samples.get(host, 0))
            if t_ns is not None:
                stamp.add_metric([host, *self.labels.values()], t_ns / 1e9)
        yield count
        yield stamp

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._thread.join(10)
        self._server.server_close()
