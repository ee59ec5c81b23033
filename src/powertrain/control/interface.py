"""The one interface every vendor's device controls offer: power limit, SM clock lock, memory clock lock.

A :class:`DeviceControls` (NVIDIA through nvidia-ml-py, AMD through amdsmi) lists the node's devices
and, per device, reads and sets the three settings the run knobs name (``knobs.power_limit_w``,
``knobs.sm_clock_mhz``, ``knobs.mem_clock_mhz``). A setting the device, the driver or the caller's
rights refuse raises :class:`ControlRefused` with one line naming the device, the setting and what
is needed; nothing else escapes from a vendor binding.

What can be read back differs by setting, and is said so rather than guessed: the power limit is
read back exactly (the device may clamp it); neither NVML nor amdsmi reports an existing clock
*lock*, so a lock's "in effect" is the range the driver accepted, clamped to the device's maximum
clock, and what a device had before is "unknown, reset to the driver default" on restore.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

KNOBS = ("power_limit_w", "sm_clock_mhz", "mem_clock_mhz")


class ControlRefused(Exception):
    """A setting that cannot be applied here; ``str()`` is one line: device, setting, what is needed.

    ``need`` says what would make it work ("root", "a driver that supports locked memory clocks").
    """

    def __init__(self, device: str, setting: str, why: str, need: str) -> None:
        super().__init__(f"{device}: cannot set {setting}: {why}; needs {need}")
        self.device, self.setting, self.why, self.need = device, setting, why, need


@dataclass(frozen=True)
class DeviceId:
    """One device of this node: its label in telemetry (``gpu<i>``), index and stable identity."""

    label: str
    index: int
    uuid: str | None
    bus_id: str | None


class DeviceControls(ABC):
    """The settings of every device of one vendor on this node.

    Raises :class:`ControlRefused` for anything that cannot be done; ``close`` releases the library.
    """

    vendor: str = "?"

    @abstractmethod
    def devices(self) -> list[DeviceId]:
        """This node's devices of this vendor, in the vendor library's index order."""

    @abstractmethod
    def power_limit_w(self, index: int) -> float | None:
        """The power limit in effect now (W), None when the device does not report one."""

    @abstractmethod
    def power_limit_range_w(self, index: int) -> tuple[float, float] | None:
        """(min, max) power limit the device accepts (W), None when not reported."""

    @abstractmethod
    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Set the power limit (W)."""

    @abstractmethod
    def max_clock_mhz(self, index: int, kind: str) -> int | None:
        """The highest clock of ``kind`` (``sm`` or ``mem``) the device runs, None when not reported."""

    @abstractmethod
    def lock_clock_mhz(self, index: int, kind: str, lo: int, hi: int) -> str:
        """Lock the ``sm`` or ``mem`` clock to [lo, hi] MHz; returns how (e.g. "locked clocks")."""

    @abstractmethod
    def reset_clock(self, index: int, kind: str) -> None:
        """Undo a lock of the ``sm`` or ``mem`` clock: the driver's default behaviour again."""

    def close(self) -> None:  # noqa: B027 - optional for a backend without a session
        """Release the vendor library (nothing is changed on the devices)."""


def as_number(value: Any) -> float | None:
    """A reading as a float, None for a vendor's "N/A" or anything that is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None
