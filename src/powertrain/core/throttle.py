"""Why a device runs below its maximum clock: the vendor-neutral :class:`Throttle` bit set, and the
NVML reason map onto it — shared by the live NVIDIA backend and the nvidia-smi / study importers, so a
recorded mask and a sampled one mean the same bits. (:mod:`powertrain.schema` re-exports
:class:`Throttle` as the vocabulary of its ``throttle`` column.)
"""

from __future__ import annotations

import enum


class Throttle(enum.IntFlag):
    """Vendor-neutral reasons a device runs below its maximum clock (a bit set per sample).

    Vendor backends map their own reason masks onto these bits; ``OTHER`` collects reasons that have
    no neutral equivalent, so no set vendor bit is ever silently dropped.
    """

    POWER_CAP = 1 << 0  # software power capping (NVIDIA SW power cap, AMD PPT)
    THERMAL_SW = 1 << 1  # software thermal slowdown (driver lowers clocks near the limit)
    THERMAL_HW = 1 << 2  # hardware thermal slowdown (PROCHOT-like)
    HW_SLOWDOWN = 1 << 3  # generic hardware slowdown (external signal, VR fault)
    POWER_BRAKE = 1 << 4  # external power brake asserted
    IDLE = 1 << 5  # nothing to do: clocks parked, not a performance limit
    APP_CLOCKS = 1 << 6  # clocks pinned by application / user setting
    SYNC_BOOST = 1 << 7  # held back to stay in sync with other devices
    CURRENT = 1 << 8  # electrical current (EDC/TDC) limit
    OTHER = 1 << 15  # a vendor reason without a neutral equivalent

    @classmethod
    def names_of(cls, mask: int | None) -> list[str]:
        """Lower-case names of the bits set in ``mask`` (``[]`` for 0, ``None`` stays unknown)."""
        if mask is None:
            return []
        return [m.name.lower() for m in cls if m.value & mask and m.name]


# NVML clock-event (a.k.a. clocks-throttle) reason bits → vendor-neutral bits. Set bits not listed
# here (display clock setting, board limit, reliability, and any future reason) become OTHER.
NVML_REASONS: dict[int, Throttle] = {
    0x001: Throttle.IDLE,  # GpuIdle
    0x002: Throttle.APP_CLOCKS,  # ApplicationsClocksSetting
    0x004: Throttle.POWER_CAP,  # SwPowerCap
    0x008: Throttle.HW_SLOWDOWN,  # HwSlowdown
    0x010: Throttle.SYNC_BOOST,  # SyncBoost
    0x020: Throttle.THERMAL_SW,  # SwThermalSlowdown
    0x040: Throttle.THERMAL_HW,  # HwThermalSlowdown
    0x080: Throttle.POWER_BRAKE,  # HwPowerBrakeSlowdown
}


def throttle_from_nvml(mask: int) -> int:
    """Map an NVML clock-event reason mask onto :class:`Throttle` bits."""
    out = Throttle(0)
    rest = int(mask)
    for bit, neutral in NVML_REASONS.items():
        if rest & bit:
            out |= neutral
            rest &= ~bit
    if rest:
        out |= Throttle.OTHER
    return int(out)
