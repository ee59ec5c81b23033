"""What each NVIDIA power reading is, as published: its kind, its averaging window, and the citation.

The backend records, per device and telemetry column, ``DeviceInfo.properties["sensors"][column]``:

``source``
    ``instant`` (a short-window reading), ``average`` (a moving average), ``energy_counter`` (a
    cumulative counter: the integral, no window), ``driver_buffer`` (the driver's buffered samples,
    ``nvmlDeviceGetSamples``), or ``unknown`` (which one depends on a generation we could not tell).
``nvml``
    the NVML field constant or function the column is read from.
``update_period_s``, ``period_from``
    how often the value changes, measured on this device when the backend opened (``probe``: the
    median time between changes while polling; ``probe_limit``: it changed at every poll of the probe,
    so the period is at most this; ``buffer_timestamps``: the spacing of the driver's samples; null:
    no change seen in the probe).
``averaging_window_s``, ``published_update_period_s``, ``window_source``, ``note``
    what is *published* for this GPU generation, with the citation key of :data:`CITATIONS`; null
    where nothing is published. Only the cited sources' own statements are used: a generation they
    did not measure (H200, B200, L40S, …) gets no instantaneous window, not the nearest one's.
``path``
    ``polled`` (read at each sample tick) or ``buffer`` (read from the driver's buffer between ticks).

:func:`describe` composes one entry; the published figures are in :func:`published`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CITATIONS: dict[str, str] = {
    "yang-sc24": (
        "Z. Yang, K. Adamek, W. Armour, \"Accurate and Convenient Energy Measurements for GPUs: A Detailed "
        "Study of NVIDIA GPU's Built-In Power Sensor\", SC'24 (preprint arXiv:2312.02741, \"Part-time Power "
        "Measurements: nvidia-smi's Lack of Attention\"); measured against an external power meter"
    ),
    "nvml-api": (
        "NVIDIA NVML API Reference: nvmlDeviceGetPowerUsage (\"On Ampere (except GA100) or newer GPUs, the API "
        "returns power averaged over 1 sec interval. On GA100 and older architectures, instantaneous power is "
        "returned\") and nvml.h NVML_FI_DEV_POWER_AVERAGE (\"averaged over 1 sec interval, supported on Ampere "
        "(except GA100) or newer\")"
    ),
}

SOURCES = ("instant", "average", "energy_counter", "driver_buffer", "unknown")
BUFFER_KEY = "power_samples"  # the sensors entry of the driver's buffered samples (not a telemetry column)


@dataclass(frozen=True)
class Published:
    """What a cited source says of one reading on one GPU generation (None: it says nothing)."""

    source: str  # one of SOURCES
    averaging_window_s: float | None = None
    update_period_s: float | None = None
    citation: str | None = None
    note: str | None = None


def family(name: str | None) -> str | None:
    """The measured product family a device name belongs to ("a100", "a100-pcie", "h100", "v100"), or None."""
    upper = (name or "").upper()
    for fam in ("A100", "H100", "V100"):
        if fam in upper:
            return "a100-pcie" if fam == "A100" and "PCIE" in upper else fam.lower()
    return None


def _averages_1s(compute_capability: str | None) -> bool | None:
    """Whether nvmlDeviceGetPowerUsage is the 1 s average on this architecture (NVML: Ampere except GA100,
    and newer); None when the compute capability is unknown."""
    if not compute_capability:
        return None
    try:
        major, minor = (int(x) for x in compute_capability.split(".")[:2])
    except ValueError:
        return None
    return major >= 8 and (major, minor) != (8, 0)  # 8.0 is GA100 (A100, A30)


def _instant(fam: str | None) -> Published:
    """An instantaneous reading: the windows the external-meter study measured."""
    if fam in ("a100", "a100-pcie", "h100"):
        note = "A100-PCIe reads ~5.5 % low at steady state [yang-sc24]" if fam == "a100-pcie" else None
        return Published("instant", 0.025, 0.1, "yang-sc24", note)
    if fam == "v100":
        return Published("instant", 0.010, 0.020, "yang-sc24")
    return Published("instant")


def published(nvml: str, name: str | None, compute_capability: str | None) -> Published:
    """What is published about the reading ``nvml`` (a field constant or function name) on this GPU."""
    fam = family(name)
    if nvml == "NVML_FI_DEV_POWER_INSTANT":
        return _instant(fam)
    if nvml in ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "nvmlDeviceGetTotalEnergyConsumption"):
        return Published("energy_counter")
    if nvml.startswith("nvmlDeviceGetSamples"):
        return Published("driver_buffer")
    averages = _averages_1s(compute_capability)
    if nvml == "nvmlDeviceGetPowerUsage" and averages is False:
        return _instant(fam)  # GA100 and older: NVML documents it as the instantaneous reading
    if nvml in ("NVML_FI_DEV_POWER_AVERAGE", "nvmlDeviceGetPowerUsage"):
        if fam == "h100" and nvml == "nvmlDeviceGetPowerUsage":
            return Published("average", 1.0, None, "yang-sc24")  # H100's default power.draw, measured
        if averages:
            return Published("average", 1.0, None, "nvml-api")
        return Published("average" if nvml == "NVML_FI_DEV_POWER_AVERAGE" else "unknown")
    return Published("unknown")


def describe(nvml: str, name: str | None, compute_capability: str | None, *, path: str,
             update_period_s: float | None, period_from: str | None) -> dict[str, Any]:
    """One ``properties["sensors"]`` entry (module doc)."""
    pub = published(nvml, name, compute_capability)
    return {
        "source": pub.source,
        "nvml": nvml,
        "update_period_s": update_period_s,
        "period_from": period_from,
        "averaging_window_s": pub.averaging_window_s,
        "published_update_period_s": pub.update_period_s,
        "window_source": pub.citation,
        "note": pub.note,
        "path": path,
    }
