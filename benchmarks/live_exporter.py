"""Does the Prometheus endpoint slow the sampling loop? And what does a scrape cost?

Times ``Sampler._sample_once`` (one sample of every device, rows appended to the streaming writer)
without and with a :class:`powertrain.live.prometheus.PrometheusExporter`, alternating blocks so
machine drift hits both sides, on the host backend plus 8 stand-in NVIDIA GPUs (the
``tests/standins`` fake of nvidia-ml-py: no GPU here). Prints the median per-sample time of each and
their ratio (target ≤ 1.05), and the time of one scrape while sampling (rendered at scrape time,
in the HTTP thread, not in the loop).

    .venv/bin/python benchmarks/live_exporter.py [--blocks 6] [--samples 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from powertrain.live.prometheus import PrometheusExporter
from powertrain.telemetry.host import HostBackend
from powertrain.telemetry.nvidia import NvidiaBackend
from powertrain.telemetry.sampler import Sampler, TelemetryFile
from standins.fake_nvml import FakeGpu, FakeNvml


def per_sample_s(sampler: Sampler, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        sampler._sample_once()
        sampler._flush_sinks()
    return (time.perf_counter() - t) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--samples", type=int, default=300)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        backends = [NvidiaBackend(nvml=FakeNvml([FakeGpu() for _ in range(8)])), HostBackend()]
        exporter = PrometheusExporter("127.0.0.1:0")
        plain = Sampler(Path(tmp) / "a", backends=backends, host="bench")
        live = Sampler(Path(tmp) / "b", backends=backends, host="bench",
                       sinks=[TelemetryFile(Path(tmp) / "b", "bench"), exporter])
        per_sample_s(plain, 20), per_sample_s(live, 20)  # warm-up (first flush, imports)
        off, on = [], []
        for _ in range(a.blocks):
            off.append(per_sample_s(plain, a.samples))
            on.append(per_sample_s(live, a.samples))
        t = time.perf_counter()
        body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics").read()
        scrape_s = time.perf_counter() - t
        exporter.close()
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"per sample without exporter: {m_off * 1e3:.3f} ms   with exporter: {m_on * 1e3:.3f} ms   "
          f"ratio {m_on / m_off:.3f} (target <= 1.05)")
    print(f"one scrape of 9 devices: {scrape_s * 1e3:.1f} ms, {len(body)} bytes")


if __name__ == "__main__":
    main()
