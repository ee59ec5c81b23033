"""What does reading the driver's power buffer cost the sampler? CPU time per sample, with and without.

Two samplers at 20 Hz, each over 8 stand-in NVIDIA GPUs (``tests/standins``: the fake of nvidia-ml-py
with a known-truth power sensor, 25 ms of every 100 ms, and a driver buffer of 10 ms samples — the
busiest buffer a driver plausibly keeps), one with ``power_buffer=True`` and one without, are driven
tick by tick in alternating blocks on one fake clock (50 ms per tick), so drift of the machine hits both
alike. What is timed is CPU time (``time.process_time``), not wall time: the sampler's work per
sample (every device read, the rows and the driver's samples appended, the Parquet segment rewritten
once a simulated second as the sampler does), not the sleep between ticks. The stores' flush and
segment schedule run on the fake clock too (their ``time.monotonic`` is pointed at it), so a
simulated second costs what a real one would. The true waveform is evaluated before timing (it is the
stand-in's work, not the sampler's); the stand-in's emulation of each NVML call (Python objects where
the real library makes C calls) is inside the figures, which makes them an upper bound.

Prints the median CPU ms per sample of each, their ratio, and the projected share of one core at
20 Hz (target <= 2 % with the buffer on).

    .venv/bin/python benchmarks/sampler_buffer_cost.py [--blocks 6] [--samples 200] [--gpus 8] [--buffer-ms 10]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from powertrain.store import tables
from powertrain.telemetry.nvidia import NvidiaBackend
from powertrain.telemetry.sampler import BUFFER_READ_S, Sampler
from standins.fake_nvml import FakeClock, FakeGpu, FakeNvml, PowerSensor, training_swing

RATE_HZ = 20.0


def _sampler(run: Path, clock: FakeClock, gpus: int, power_buffer: bool, seconds: float, buffer_s: float
             ) -> tuple[Sampler, list[PowerSensor]]:
    sensors = [clock.sensor(training_swing(), phase_s=0.013 * i, buffer_period_s=buffer_s, buffer_window_s=buffer_s)
               for i in range(gpus)]
    backend = NvidiaBackend(nvml=FakeNvml([FakeGpu(uuid=f"GPU-{i}", sensor=s) for i, s in enumerate(sensors)]),
                            clock_ns=clock.time_ns, sleep=clock.sleep)
    sampler = Sampler(run, backends=[backend], host="bench", rate_hz=RATE_HZ,
                      clocks=(clock.time_ns, clock.monotonic_ns), power_buffer=power_buffer)
    for s in sensors:  # the truth, evaluated up front: the stand-in's cost, not the sampler's
        s._extend(round((s.now_s() + seconds + 2) * 1000))
    return sampler, sensors


def _block(sampler: Sampler, clock: FakeClock, n: int) -> float:
    """CPU seconds per sample over ``n`` ticks of ``sampler`` (the clock moves 1/20 s per tick)."""
    c0 = time.process_time()
    for _ in range(n):
        sampler._sample_once()
        sampler._flush_sinks()
        clock.advance(1 / RATE_HZ)
    return (time.process_time() - c0) / n


def _standin_block(sampler: Sampler, clock: FakeClock, n: int) -> float:
    """CPU seconds per tick of the stand-in's own side of the same NVML calls (what the real library
    would do in C): the batched field read, each plain read, and the buffer read where used, on the
    sampler's schedule for it."""
    backend = sampler.backends[0]
    assert isinstance(backend, NvidiaBackend)
    nvml, gpus = backend._nvml, backend._gpus
    ids = {g.index: [(s.field_id, s.scope) for s in g.slots] for g in gpus}
    seen = {g.index: clock.time_ns() // 1000 for g in gpus}
    use_buffer = sampler.power_file is not None
    assert all(g.buffer is not None and g.buffer.period_us for g in gpus)
    due = 0  # the buffer read on the sampler's own schedule (telemetry.sampler.BUFFER_READ_S)
    c0 = time.process_time()
    for _ in range(n):
        read_now = use_buffer and clock.mono >= due
        if read_now:
            due = clock.mono + round(BUFFER_READ_S * 1e9)
        for g in gpus:
            nvml.nvmlDeviceGetFieldValues(g.handle, ids[g.index])
            for r in g.readers:
                assert r.fn is not None
                r.fn(g.handle)
            if read_now and clock.time_ns() // 1000 - seen[g.index] >= g.buffer.period_us:  # as the backend skips
                try:
                    _, got = nvml.nvmlDeviceGetSamples(g.handle, nvml.NVML_TOTAL_POWER_SAMPLES, seen[g.index])
                except nvml.NVMLError:
                    continue
                seen[g.index] = got[-1].timeStamp
        clock.advance(1 / RATE_HZ)
    return (time.process_time() - c0) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--samples", type=int, default=200, help="ticks per block (10 simulated s at 20 Hz)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--buffer-ms", type=float, default=10.0,
                   help="the driver's sample spacing (10: the busiest plausible; 100: as the A100/H100 field)")
    a = p.parse_args()
    logging.disable(logging.WARNING)
    clock = FakeClock()
    tables.time = SimpleNamespace(monotonic=lambda: clock.mono / 1e9)  # the stores' schedule on the fake clock
    seconds = (2 * a.blocks + 8) * a.samples / RATE_HZ  # the timed blocks, the warm-up and the stand-in blocks
    with tempfile.TemporaryDirectory() as tmp:
        off, _ = _sampler(Path(tmp) / "off", clock, a.gpus, False, seconds, a.buffer_ms / 1e3)
        on, _ = _sampler(Path(tmp) / "on", clock, a.gpus, True, seconds, a.buffer_ms / 1e3)
        assert off.power_file is None and on.power_file is not None
        _block(off, clock, a.samples // 4), _block(on, clock, a.samples // 4)  # warm-up: first flush, imports
        t_off, t_on = [], []
        for _ in range(a.blocks):
            t_off.append(_block(off, clock, a.samples))
            t_on.append(_block(on, clock, a.samples))
        rows = on.power_rows
        off._close_sinks()
        on._close_sinks()
        # after the timed blocks (it moves the clock under both samplers): the stand-in's own share
        s_off = statistics.median(_standin_block(off, clock, a.samples) for _ in range(3))
        s_on = statistics.median(_standin_block(on, clock, a.samples) for _ in range(3))
    m_off, m_on = statistics.median(t_off), statistics.median(t_on)
    print(f"{a.gpus} stand-in GPUs, {RATE_HZ:g} Hz, {a.blocks} blocks of {a.samples} samples each way "
          f"({rows} driver samples, one every {a.buffer_ms:g} ms per GPU, streamed with the buffer on)")
    print(f"CPU per sample without the buffer: {m_off * 1e3:.3f} ms   with: {m_on * 1e3:.3f} ms   "
          f"ratio {m_on / m_off:.3f}")
    print(f"projected share of one core at {RATE_HZ:g} Hz: {m_off * RATE_HZ * 100:.2f} % without, "
          f"{m_on * RATE_HZ * 100:.2f} % with the buffer (target <= 2 %)")
    n_off, n_on = m_off - s_off, m_on - s_on
    print(f"of which the stand-in's emulation of NVML: {s_off * 1e3:.3f} / {s_on * 1e3:.3f} ms; the sampler's "
          f"own: {n_off * 1e3:.3f} / {n_on * 1e3:.3f} ms per sample, ratio {n_on / n_off:.3f}, "
          f"{n_off * RATE_HZ * 100:.2f} % / {n_on * RATE_HZ * 100:.2f} % of a core")


if __name__ == "__main__":
    main()
