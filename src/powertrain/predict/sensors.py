"""What a power reading averages, how often it changes, and the peak a sampler would record from it.

A GPU does not report instantaneous power. Measured against an external meter (Yang, Adamek, Armour,
"Accurate and Convenient Energy Measurements for GPUs: A Detailed Study of NVIDIA GPU's Built-In Power
Sensor", SC'24 — the "part-time power measurements" paper): on A100 and H100 the instantaneous field
is refreshed every ~100 ms and averages only the last ~25 ms of it; H100's default ``power.draw``
(``nvmlDeviceGetPowerUsage``, what nvidia-smi and most monitors read) is a 1 s moving average; V100
averages 10 ms out of every 20 ms. NVML's own documentation says the same of Ampere (except GA100) and
newer: ``nvmlDeviceGetPowerUsage`` is averaged over 1 s, the instantaneous reading a separate field
(``NVML_FI_DEV_POWER_INSTANT``). A peak is therefore only meaningful together with the field and the
sampler it came from: :func:`seen_peak` gives the highest value a sampler at ``rate_hz`` would record
from a :class:`Sensor` over a measured window, on a :class:`~powertrain.predict.timeline.StageTimeline`.

Where a vendor publishes nothing (AMD's amdsmi socket power, newer NVIDIA parts' windows), the table
says so (``source``) and uses the nearest known generation's figures, an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from powertrain.hardware import DeviceSpec
from powertrain.predict.timeline import StageTimeline

_YANG = ("Yang, Adamek, Armour, SC'24 (external-meter study of NVML on A100/H100/V100): instantaneous power "
         "averages ~25 ms, refreshed every ~100 ms on A100/H100; 10 ms of every 20 ms on V100")


@dataclass(frozen=True, slots=True)
class Sensor:
    """One power field: what it averages and how often it changes."""

    name: str
    field: str  # the telemetry column the sampler writes it to
    window_s: float  # the field averages the device's power over this window
    update_s: float  # a new value every this many seconds (reads in between repeat it)
    source: str

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "field": self.field, "window_s": self.window_s, "update_s": self.update_s,
                "source": self.source}


_INSTANT_HOPPER = Sensor("NVML instantaneous power", "power_w", 0.025, 0.1, _YANG + " (Hopper H200 and Blackwell "
                         "assumed alike: no published measurement)")
_AVERAGE_HOPPER = Sensor("NVML power usage (1 s average)", "power_avg_w", 1.0, 0.1,
                         "NVML nvmlDeviceGetPowerUsage documentation (Ampere except GA100, and newer: a 1 s average); "
                         + _YANG)
_INSTANT_VOLTA = Sensor("NVML power", "power_w", 0.010, 0.020, _YANG)
_AMD = Sensor("amdsmi socket power", "power_w", 0.001, 0.001,
              "AMD publishes no averaging window for amdsmi's socket power: taken as a 1 ms reading (an estimate)")
# the 1 ms truth the model itself resolves (no sensor: what an external meter at 1 kHz would see)
TRUE_1MS = Sensor("power at 1 ms (the model's own resolution, no sensor)", "", 0.001, 0.001, "the model")


def _generation(dev: DeviceSpec) -> str:
    name = dev.name.lower()
    if dev.vendor == "amd":
        return "amd"
    if name.startswith(("v100", "p100", "t4")):
        return "volta"
    return "hopper"


def sensors_of(dev: DeviceSpec) -> dict[str, Sensor]:
    """The power fields of ``dev`` by role: ``instant`` (what ``power_w`` holds) and ``average``
    (``power_avg_w``; the same field where the device has one reading)."""
    gen = _generation(dev)
    if gen == "amd":
        return {"instant": _AMD, "average": _AMD}
    if gen == "volta":
        return {"instant": _INSTANT_VOLTA, "average": _INSTANT_VOLTA}
    return {"instant": _INSTANT_HOPPER, "average": _AVERAGE_HOPPER}


@dataclass(slots=True)
class SeenPeak:
    """The highest reading a sampler records, and what it is of."""

    power_w: float
    sensor: Sensor
    rate_hz: float
    window_s: float  # the measured window the sampler reads over
    reads: float  # distinct values read in it
    level: str  # where the highest window sits (timeline levels: kernels, cycles, step)

    def label(self) -> str:
        return f"{self.sensor.name}, {self.rate_hz:g} Hz sampler"

    def to_dict(self) -> dict[str, object]:
        return {"power_w": self.power_w, "sensor": self.sensor.name, "field": self.sensor.field,
                "sensor_window_s": self.sensor.window_s, "update_s": self.sensor.update_s, "rate_hz": self.rate_hz,
                "measured_window_s": self.window_s, "distinct_reads": self.reads, "where": self.level}


def seen_peak(tl: StageTimeline, sensor: Sensor, rate_hz: float, window_s: float) -> SeenPeak:
    """The expected highest reading of ``sensor`` a sampler at ``rate_hz`` records over ``window_s`` seconds of
    steady steps.

    The field holds the mean power over its window, a new value every ``update_s``; the sampler sees
    ``window_s × min(rate, 1/update_s)`` distinct values, at phases of the step that drift (the step and the
    update period share no clock). Each lands in the highest-power part of the step (the winning window's
    share of the step, :meth:`~powertrain.predict.timeline.StageTimeline.window_peak`) with that share's
    probability, so the recorded peak is ``mean + (highest window − mean) · (1 − (1 − share)^reads)``."""
    top = tl.window_peak(sensor.window_s)
    mean = tl.mean_w
    reads = max(1.0, window_s * min(rate_hz, 1.0 / sensor.update_s))
    share = min(1.0, max(0.0, top.share))
    caught = 1.0 - (1.0 - share) ** reads
    return SeenPeak(power_w=max(mean, mean + (top.power_w - mean) * caught), sensor=sensor, rate_hz=rate_hz,
                    window_s=window_s, reads=reads, level=top.level)
