"""The Prometheus exporter's bounds (issue 14, item 7) and the importers' size cap (item 5).

Exporter: a non-loopback bind needs an explicit permission (``--prometheus-public``) and logs a
warning; an idle connection is closed after the read timeout; more than N connections at once take
the longest-waiting one's place, without a handler thread each. Importers: a source over the cap ends with one line naming the file
and the cap; ``/dev/zero``, which would never end, is refused before it is read. Waits poll a condition under a
generous deadline; nothing depends on timing beyond that.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.importers.common import SourceTooLarge, byte_cap, open_text, read_text, sha256_of
from powertrain.live import prometheus as prom
from powertrain.live.prometheus import PrometheusExporter, check_public, is_loopback

runner = CliRunner()


def _wait(cond, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, "condition not met before the deadline"
        time.sleep(0.05)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as r:
        return r.read().decode()


def test_loopback_and_public_addresses(monkeypatch) -> None:
    monkeypatch.delenv(prom.PUBLIC_ENV, raising=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::")
    assert check_public("127.0.0.1") is False
    with pytest.raises(ValueError, match="--prometheus-public"):
        check_public("0.0.0.0")
    assert check_public("0.0.0.0", public=True) is True
    monkeypatch.setenv(prom.PUBLIC_ENV, "1")
    assert check_public("0.0.0.0") is True


def test_public_bind_refused_without_permission_and_warned_with_it(monkeypatch, caplog) -> None:
    monkeypatch.delenv(prom.PUBLIC_ENV, raising=False)
    with pytest.raises(ValueError, match="not a loopback address"):
        PrometheusExporter("0.0.0.0:0")
    with caplog.at_level(logging.WARNING, logger="powertrain.live.prometheus"):
        exp = PrometheusExporter("0.0.0.0:0", public=True)
    try:
        assert any("reachable from the network" in r.getMessage() for r in caplog.records)
        assert "powertrain_sampler_samples" in _scrape(exp.port)
    finally:
        exp.close()


def test_monitor_cli_refuses_a_public_bind_without_the_option(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(prom.PUBLIC_ENV, raising=False)
    res = runner.invoke(app, ["monitor", "--out", str(tmp_path / "r"), "--prometheus", "0.0.0.0:0", "--", "true"])
    assert res.exit_code == 2 and "--prometheus-public" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "r").exists()


def test_idle_connections_time_out_and_extra_ones_take_the_oldest_place() -> None:
    """Connections are bounded without a thread each; beyond the bound the longest-waiting one is closed,
    not the newcomer (tests/test_exporter_slowloris.py holds the slow-client cases)."""
    exp = PrometheusExporter("127.0.0.1:0", max_connections=2, read_timeout_s=1.0)
    idle: list[socket.socket] = []
    try:
        exp.write([{"host": "h", "device": "gpu0", "t_ns": time.time_ns(), "power_w": 100.0}])
        server = exp._server
        for _ in range(2):  # two idle clients fill the bound
            idle.append(socket.create_connection(("127.0.0.1", exp.port), timeout=20))
            _wait(lambda n=len(idle): len(server._waiting) + server.evicted >= n)
        extra = socket.create_connection(("127.0.0.1", exp.port), timeout=20)
        _wait(lambda: server.evicted >= 1)
        idle[0].settimeout(20)
        assert idle[0].recv(1) == b""  # the oldest made room
        for s in (idle[1], extra):  # the read timeout closes each idle connection
            s.settimeout(20)
            assert s.recv(1) == b""
        _wait(lambda: not server._waiting and server.expired >= 2)
        assert server.refused == 0
        assert "DCGM_FI_DEV_POWER_USAGE" in _scrape(exp.port)  # and it still serves
        extra.close()
    finally:
        for s in idle:
            s.close()
        exp.close()


# ---------------------------------------------------------------------------------------------
# importers' size cap


def test_dev_zero_is_refused_before_it_is_read_with_one_line(tmp_path: Path) -> None:
    for kind in ("nvsmi", "kineto", "zeus"):
        res = runner.invoke(app, ["import", kind, "/dev/zero", "--out", str(tmp_path / "z"), "--max-bytes", "1MiB"])
        assert res.exit_code == 2, (kind, res.output)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "/dev/zero" in lines[0], res.output
        assert "is a character device" in lines[0], res.output
        assert not (tmp_path / "z").exists() and list(tmp_path.iterdir()) == []


def test_cap_counts_decompressed_bytes_and_the_file_is_unchanged(tmp_path: Path) -> None:
    bomb = tmp_path / "gpu.csv.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(b"timestamp, index, power.draw [W]\n" + b"2024/05/01 10:00:00.000, 0, 100.0\n" * 100_000)
    digest = hashlib.sha256(bomb.read_bytes()).hexdigest()
    assert bomb.stat().st_size < 1_000_000  # small on disk, 3.4 MB inside
    with byte_cap(1_000_000), pytest.raises(SourceTooLarge, match=r"import size cap of 976\.6 KiB"):
        read_text(bomb)
    with byte_cap(10_000_000):
        assert read_text(bomb).count("\n") == 100_001
    res = runner.invoke(app, ["import", "nvsmi", str(bomb), "--tz", "UTC", "--out", str(tmp_path / "r"),
                              "--max-bytes", "1000000"])
    assert res.exit_code == 2 and "import size cap" in res.output, res.output
    assert hashlib.sha256(bomb.read_bytes()).hexdigest() == digest and not (tmp_path / "r").exists()


def test_cap_applies_to_the_sha256_and_to_long_lines(tmp_path: Path, monkeypatch) -> None:
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * 5000 + b"\n")
    with byte_cap(4096), pytest.raises(SourceTooLarge):
        sha256_of(big)
    monkeypatch.setattr("powertrain.importers.common.MAX_LINE_CHARS", 1000)
    with open_text(big) as f, pytest.raises(SourceTooLarge, match=r"big\.log:1: a line longer than"):
        list(f)
    small = tmp_path / "ok.log"
    small.write_text("a\nb\n")
    with open_text(small) as f:
        assert list(f) == ["a\n", "b\n"]


@pytest.mark.parametrize("bad", ["0", "-5", "lots", "1XB"])
def test_max_bytes_option_is_checked(bad: str, tmp_path: Path) -> None:
    res = runner.invoke(app, ["import", "nvsmi", "/dev/null", "--out", str(tmp_path / "r"), "--max-bytes", bad])
    assert res.exit_code == 2 and "--max-bytes" in res.output, res.output
