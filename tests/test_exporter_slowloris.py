"""Slow clients cannot starve the Prometheus exporter's scrapes (issue 29, item 6).

Slow-loris clients are raw sockets that send part of a request line and hold the connection. Every
assertion is on what was answered or closed; waits poll a condition under a generous deadline, and the
exporter's read timeouts are configured short only so the test is quick."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from powertrain.live.prometheus import PrometheusExporter


def _wait(cond, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, "condition not met before the deadline"
        time.sleep(0.02)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return r.read().decode()


def _slow_clients(port: int, n: int) -> list[socket.socket]:
    clients = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET /metr")  # part of a request line, never finished
        clients.append(s)
    return clients


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(30)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def exporter(request) -> Iterator[PrometheusExporter]:
    exp = PrometheusExporter("127.0.0.1:0", **getattr(request, "param", {}))
    exp.write([{"host": "h", "device": "gpu0", "t_ns": time.time_ns(), "power_w": 100.0}])
    yield exp
    exp.close()


@pytest.mark.parametrize("exporter", [{"read_timeout_s": 60.0, "request_timeout_s": 120.0}], indirect=True)
def test_a_scrape_is_answered_while_eight_slow_clients_hold_connections(exporter) -> None:
    server = exporter._server
    slow = _slow_clients(exporter.port, 8)
    try:
        _wait(lambda: len(server._waiting) == 8)
        for _ in range(3):
            assert "DCGM_FI_DEV_POWER_USAGE" in _scrape(exporter.port)
        assert len(server._waiting) == 8 and server.evicted == server.refused == 0  # all still held, none cut
    finally:
        for s in slow:
            s.close()


@pytest.mark.parametrize("exporter", [{"max_connections": 3, "read_timeout_s": 60.0, "request_timeout_s": 120.0}],
                         indirect=True)
def test_beyond_the_bound_the_longest_waiting_client_loses_its_place(exporter) -> None:
    server = exporter._server
    slow = _slow_clients(exporter.port, 8)
    try:
        _wait(lambda: server.evicted >= 5)
        assert len(server._waiting) <= 3
        assert _closed_by_server(slow[0])  # the first one came, the first one went
        assert "DCGM_FI_DEV_POWER_USAGE" in _scrape(exporter.port)
        assert server.refused == 0
    finally:
        for s in slow:
            s.close()


@pytest.mark.parametrize("exporter", [{"read_timeout_s": 0.3, "request_timeout_s": 60.0}], indirect=True)
def test_a_silent_client_is_closed_after_the_read_timeout(exporter) -> None:
    silent = socket.create_connection(("127.0.0.1", exporter.port), timeout=30)
    try:
        silent.sendall(b"GET")
        assert _closed_by_server(silent)
        _wait(lambda: exporter._server.expired >= 1)
    finally:
        silent.close()


@pytest.mark.parametrize("exporter", [{"read_timeout_s": 60.0, "request_timeout_s": 0.5}], indirect=True)
def test_a_client_that_trickles_its_head_is_closed_after_the_request_timeout(exporter) -> None:
    """Each byte resets a per-read timeout; the whole head has its own bound."""
    drip = socket.create_connection(("127.0.0.1", exporter.port), timeout=30)
    try:
        drip.sendall(b"GET /metrics HTTP/1.1\r\n")
        end = time.monotonic() + 30
        while exporter._server.expired == 0 and time.monotonic() < end:
            try:
                drip.sendall(b"X")
            except OSError:  # closed by the server: what is asserted below
                break
            time.sleep(0.05)
        _wait(lambda: exporter._server.expired >= 1)
        assert _closed_by_server(drip)
        assert "DCGM_FI_DEV_POWER_USAGE" in _scrape(exporter.port)
    finally:
        drip.close()


@pytest.mark.parametrize("exporter", [{"max_connections": 1}], indirect=True)
def test_a_head_over_the_size_bound_is_closed(exporter) -> None:
    big = socket.create_connection(("127.0.0.1", exporter.port), timeout=30)
    try:
        with contextlib.suppress(OSError):  # the server may close it mid-send
            big.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 64 * 1024)
        assert _closed_by_server(big)
        assert "DCGM_FI_DEV_POWER_USAGE" in _scrape(exporter.port)
    finally:
        big.close()
