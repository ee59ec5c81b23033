"""The one interface every telemetry source implements (host, NVIDIA, AMD).

A backend owns a set of devices on this node. ``sample()`` reads every device once and returns one
telemetry row per device (keys: ``powertrain.schema.TELEMETRY_SCHEMA``), stamped with the host clock
at the moment that device was read. Fields a device cannot report stay ``None``.

Vendor errors never escape a backend: opening fails with :class:`BackendUnavailable` (which says what
was found and what is used instead), and a device that disappears mid-run yields null rows plus an
incident, not an exception.

A backend whose driver keeps its own buffer of power samples (NVIDIA's ``nvmlDeviceGetSamples``)
also answers :meth:`Backend.power_samples`, which the sampler calls once per tick; every other
backend has none (the defaults here).
"""

from __future__ import annotations

import abc
import time
from dataclasses import asdict, dataclass, field
from typing import Any


class BackendUnavailable(RuntimeError):
    """This backend cannot run on this node; the message is one line a user can act on."""


@dataclass
class DeviceInfo:
    """Static facts about one device, recorded once per run in ``run.json``."""

    device: str  # row label in telemetry: "gpu0", "cpu"
    kind: str  # "gpu" | "cpu"
    vendor: str  # "nvidia" | "amd" | "host"
    name: str | None = None
    index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    # fields of TELEMETRY_SCHEMA this device reports (others are always null on its rows)
    supported: list[str] = field(default_factory=list)
    # static properties with units in their names, e.g. clock_sm_max_mhz, power_limit_default_w
    properties: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Incident:
    """Something that went wrong while sampling (device lost, read error) — logged, not fatal."""

    t_ns: int
    device: str
    what: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend(abc.ABC):
    """A source of telemetry rows for some of this node's devices."""

    name: str = "?"

    def __init__(self) -> None:
        self.incidents: list[Incident] = []
        self.software: dict[str, str] = {}  # e.g. {"nvidia_driver": "550.54.15"}

    @abc.abstractmethod
    def devices(self) -> list[DeviceInfo]:
        """The devices this backend samples, in row order (must still answer after close())."""

    @abc.abstractmethod
    def sample(self, host: str) -> list[dict[str, Any]]:
        """Read every device once; one row per device, unknown fields ``None``."""

    def set_power_buffer(self, enabled: bool) -> bool:
        """Read the driver's buffered power samples between polls (where offered) or not; whether any
        device of this backend will. Recorded per device in ``properties["power_buffer"]``."""
        return False

    def power_samples(self, host: str) -> list[dict[str, Any]]:
        """The driver's power samples since the previous call (``POWER_SAMPLES_SCHEMA`` rows, stamped on
        the system clock like :meth:`sample`'s rows); none where the driver keeps no buffer."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release vendor handles."""

    def incident(self, device: str, what: str) -> None:
        self.incidents.append(Incident(time.time_ns(), device, what))
