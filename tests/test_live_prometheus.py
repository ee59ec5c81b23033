"""The sampler's live Prometheus endpoint: dcgm-exporter names, host/device labels, loopback only."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from powertrain.live.prometheus import PrometheusExporter, metric_name, parse_listen
from powertrain.telemetry.host import HostBackend
from powertrain.telemetry.nvidia import NvidiaBackend
from powertrain.telemetry.sampler import Sampler, TelemetryFile
from standins.fake_nvml import FakeGpu, FakeNvml  # stand-in for nvidia-ml-py, injected at the backend


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(host: str, port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples, name, **labels):
    hits = [v for (n, lab), v in samples.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    return hits[0] if hits else None


def test_listen_spec():
    assert parse_listen("9400") == ("127.0.0.1", 9400)
    assert parse_listen(":9400") == ("127.0.0.1", 9400)
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    with pytest.raises(ValueError, match=r"\[HOST:\]PORT"):
        parse_listen("localhost:http")
    assert metric_name("power_w") == "DCGM_FI_DEV_POWER_USAGE" and metric_name("throttle") == "powertrain_throttle"


def test_scrape_during_sampling_has_dcgm_names_and_labels(tmp_path):
    gpu = FakeGpu(power_mw=312_500, temp_c=61, clock_sm_mhz=1755, mem_used=3 * 2**30, energy_mj=7_000_000)
    exporter = PrometheusExporter("127.0.0.1:0")
    sampler = Sampler(tmp_path / "run", backends=[NvidiaBackend(nvml=FakeNvml([gpu])), HostBackend()],
                      host="node7", rate_hz=20, sinks=[TelemetryFile(tmp_path / "run", "node7"), exporter])
    t = threading.Thread(target=sampler.run)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while sampler.samples < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        m = _scrape("127.0.0.1", exporter.port)
        # the host's CPU utilisation is a delta between two samples: one taken within a kernel tick of the
        # last (a starved sampler catching up) has none, and the exporter serves only the latest sample
        while _value(m, "powertrain_cpu_util_pct", device="cpu") is None and time.monotonic() < deadline:
            time.sleep(0.05)
            m = _scrape("127.0.0.1", exporter.port)
    finally:
        sampler.stop()
        t.join()
    assert _value(m, "DCGM_FI_DEV_POWER_USAGE", host="node7", device="gpu0") == pytest.approx(312.5)
    assert _value(m, "DCGM_FI_DEV_GPU_TEMP", host="node7", device="gpu0") == 61
    assert _value(m, "DCGM_FI_DEV_SM_CLOCK", host="node7", device="gpu0") == 1755
    assert _value(m, "DCGM_FI_DEV_FB_USED", host="node7", device="gpu0") == 3 * 1024  # MiB, as DCGM
    assert _value(m, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", device="gpu0") == pytest.approx(7_000_000)  # mJ
    assert _value(m, "powertrain_cpu_util_pct", host="node7", device="cpu") is not None
    # the host has no power sensor: its power is absent, not 0
    assert _value(m, "DCGM_FI_DEV_POWER_USAGE", device="cpu") is None
    assert _value(m, "powertrain_sampler_samples_total", host="node7") >= 3
    with pytest.raises(OSError):  # the endpoint goes away with the sampler
        _scrape("127.0.0.1", exporter.port)


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


@pytest.mark.slow
def _wait_for_file(path) -> str:
    """A command that exits once ``path`` exists (or after 120 s, so a failed test leaves nothing running)."""
    return (f"import os,time\nt=time.monotonic()\n"
            f"while not os.path.exists({str(path)!r}) and time.monotonic()-t<120: time.sleep(0.05)\n")


def test_monitor_prometheus_answers_while_running_and_only_on_loopback(tmp_path):
    port = _free_port()
    out = tmp_path / "m"
    done = tmp_path / "done"  # the command lives until the test has scraped, however slow the machine
    proc = subprocess.Popen([sys.executable, "-m", "powertrain.cli.__main__", "monitor", "--out", str(out), "-q",
                             "--prometheus", f":{port}", "--", sys.executable, "-c", _wait_for_file(done)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        m: dict | None = None
        # the exporter answers as soon as it listens; the first sample may come a tick later
        while m is None or _value(m, "powertrain_cpu_util_pct", device="cpu") is None:
            try:
                m = _scrape("127.0.0.1", port)
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
            if m is None or _value(m, "powertrain_cpu_util_pct", device="cpu") is None:
                assert time.monotonic() < deadline and proc.poll() is None, f"no sample served: {m}"
                time.sleep(0.1)
        assert _value(m, "powertrain_cpu_util_pct", device="cpu") is not None
        assert _value(m, "powertrain_sample_timestamp_seconds") == pytest.approx(time.time(), abs=10)
        meta = json.loads(next((out / "telemetry").glob("*.meta.json")).read_text())
        assert meta["prometheus"] == {"addr": "127.0.0.1", "port": port}
        other = _non_loopback_ipv4()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        done.touch()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    if _non_loopback_ipv4() is None:
        pytest.skip("no non-loopback IPv4 address on this machine: only the bound address was checked")


def test_grafana_dashboard_queries_only_metrics_the_exporter_serves():
    import re
    from pathlib import Path

    from powertrain.schema import TELEMETRY_FIELDS

    dash = json.loads((Path(__file__).parents[1] / "examples" / "grafana-dashboard.json").read_text())
    served = {metric_name(f) for f in TELEMETRY_FIELDS} | {"powertrain_sampler_samples_total",
                                                           "powertrain_sample_timestamp_seconds"}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    used = {m for e in exprs for m in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\{", e)}
    assert used and used <= served, used - served
