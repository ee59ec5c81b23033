"""AMD device controls through AMD SMI (the ``amdsmi`` Python package).

The calls, in amdsmi's units (µW, MHz): ``amdsmi_get_power_cap_info`` / ``amdsmi_set_power_cap``
(sensor 0) for the power cap; ``amdsmi_set_gpu_clk_range`` with ``AmdSmiClkType.GFX`` / ``MEM`` for
a clock range, and ``amdsmi_set_gpu_perf_level(AUTO)`` to undo it (the driver's automatic clock
management again); ``amdsmi_get_clock_info`` for the top of the range. Setting anything needs root
(amdsmi answers ``AMDSMI_STATUS_NO_PERM``); a part without the feature answers ``NOT_SUPPORTED``.

The binding is injected as ``amdsmi`` (tests pass a stand-in, the one place one is injected).
"""

from __future__ import annotations

import contextlib
from typing import Any

from powertrain.control.interface import ControlRefused, DeviceControls, DeviceId, as_number

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NO_PERM = 10  # amdsmi_wrapper.AMDSMI_STATUS_NO_PERM
_ROOT = "root on this node (amdsmi refuses power and clock settings to other users)"
_SETTING = {"sm": "the graphics clock range", "mem": "the memory clock range"}


def _import_amdsmi() -> Any:
    try:
        import amdsmi
    except ImportError:
        raise ControlRefused("AMD", "device controls", "the amdsmi package is not installed",
                             "amdsmi from ROCm on AMD GPU nodes") from None
    return amdsmi


class AmdControls(DeviceControls):
    """Power cap and clock ranges of every AMD GPU of this node (amdsmi handle order, ``gpu<i>``)."""

    vendor = "amd"

    def __init__(self, amdsmi: Any | None = None) -> None:
        self.smi = amdsmi if amdsmi is not None else _import_amdsmi()
        try:
            self.smi.amdsmi_init(self.smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            self._handles = list(self.smi.amdsmi_get_processor_handles())
        except self.smi.AmdSmiException as exc:
            raise ControlRefused("AMD", "device controls", f"amdsmi did not start ({exc})",
                                 "the amdgpu driver loaded on this node") from None

    def _call(self, index: int, setting: str, fn: str, *args: Any) -> Any:
        label = f"gpu{index}"
        func = getattr(self.smi, fn, None)
        if func is None:
            raise ControlRefused(label, setting, f"this amdsmi has no {fn}", "a newer amdsmi")
        try:
            return func(self._handles[index], *args)
        except self.smi.AmdSmiLibraryException as exc:
            code = exc.get_error_code()
            why = f"amdsmi: {exc.get_error_info()}" if hasattr(exc, "get_error_info") else f"amdsmi: {exc}"
            if code == AMDSMI_STATUS_NO_PERM:
                raise ControlRefused(label, setting, why, _ROOT) from None
            if code == AMDSMI_STATUS_NOT_SUPPORTED:
                raise ControlRefused(label, setting, why, f"a GPU and driver that support {setting}") from None
            raise ControlRefused(label, setting, why, "a working GPU and driver") from None
        except self.smi.AmdSmiException as exc:
            raise ControlRefused(label, setting, f"amdsmi: {exc}", "a working amdsmi") from None

    def devices(self) -> list[DeviceId]:
        out = []
        for i in range(len(self._handles)):
            try:
                uuid: str | None = str(self._call(i, "identity", "amdsmi_get_gpu_device_uuid"))
            except ControlRefused:
                uuid = None
            try:
                bus: str | None = str(self._call(i, "identity", "amdsmi_get_gpu_device_bdf"))
            except ControlRefused:
                bus = None
            out.append(DeviceId(f"gpu{i}", i, uuid, bus))
        return out

    def _cap_info(self, index: int) -> dict[str, Any] | None:
        try:
            info = self._call(index, "the power cap", "amdsmi_get_power_cap_info")
        except ControlRefused:
            return None
        return info if isinstance(info, dict) else None

    def power_limit_w(self, index: int) -> float | None:
        info = self._cap_info(index)
        cap = as_number(info.get("power_cap")) if info else None
        return cap / 1e6 if cap is not None else None

    def power_limit_range_w(self, index: int) -> tuple[float, float] | None:
        info = self._cap_info(index)
        lo = as_number(info.get("min_power_cap")) if info else None
        hi = as_number(info.get("max_power_cap")) if info else None
        return (lo / 1e6, hi / 1e6) if lo is not None and hi is not None else None

    def set_power_limit_w(self, index: int, watts: float) -> None:
        self._call(index, "the power cap", "amdsmi_set_power_cap", 0, round(watts * 1e6))

    def max_clock_mhz(self, index: int, kind: str) -> int | None:
        clk = self.smi.AmdSmiClkType.GFX if kind == "sm" else self.smi.AmdSmiClkType.MEM
        try:
            info = self._call(index, _SETTING[kind], "amdsmi_get_clock_info", clk)
        except ControlRefused:
            return None
        top = as_number(info.get("max_clk")) if isinstance(info, dict) else None
        return int(top) if top is not None else None

    def lock_clock_mhz(self, index: int, kind: str, lo: int, hi: int) -> str:
        clk = self.smi.AmdSmiClkType.GFX if kind == "sm" else self.smi.AmdSmiClkType.MEM
        self._call(index, _SETTING[kind], "amdsmi_set_gpu_clk_range", int(lo), int(hi), clk)
        return "clock range (performance level manual)"

    def reset_clock(self, index: int, kind: str) -> None:
        level = getattr(self.smi, "AmdSmiDevPerfLevel", None)
        if level is None:
            raise ControlRefused(f"gpu{index}", _SETTING[kind], "this amdsmi has no AmdSmiDevPerfLevel",
                                 "a newer amdsmi")
        self._call(index, _SETTING[kind], "amdsmi_set_gpu_perf_level", level.AUTO)

    def close(self) -> None:
        with contextlib.suppress(self.smi.AmdSmiException):
            self.smi.amdsmi_shut_down()
