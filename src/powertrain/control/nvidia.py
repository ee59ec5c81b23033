"""NVIDIA device controls through NVML (``nvidia-ml-py``, imported as ``pynvml``).

The calls, all in NVML's units (mW, MHz): ``nvmlDeviceGetPowerManagementLimit`` /
``nvmlDeviceSetPowerManagementLimit`` and ``…LimitConstraints`` for the power limit;
``nvmlDeviceSetGpuLockedClocks`` / ``nvmlDeviceResetGpuLockedClocks`` for the SM (graphics) clock
range; ``nvmlDeviceSetMemoryLockedClocks`` / ``nvmlDeviceResetMemoryLockedClocks`` for the memory
clock; ``nvmlDeviceGetMaxClockInfo`` for the top of the range. Where a GPU has no locked clocks
(before Volta) the SM clock is set through the application clocks
(``nvmlDeviceSetApplicationsClocks`` / ``…ResetApplicationsClocks``), and the record says so. Setting anything needs root (NVML
answers "Insufficient Permissions" otherwise); clock locks need Volta or newer (memory locks Ampere
or newer) and answer "Not Supported" elsewhere.

The binding is injected as ``nvml`` (tests pass a stand-in, the one place one is injected).
"""

from __future__ import annotations

import contextlib
from typing import Any

from powertrain.control.interface import ControlRefused, DeviceControls, DeviceId

_ROOT = "root on this node (NVML refuses power and clock settings to other users)"
_SETTING = {"sm": "the SM clock lock", "mem": "the memory clock lock"}


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise ControlRefused("NVIDIA", "device controls", "nvidia-ml-py is not installed",
                             "pip install nvidia-ml-py on GPU nodes") from None
    return pynvml


class NvidiaControls(DeviceControls):
    """Power limit and clock locks of every NVIDIA GPU of this node (NVML index order, labelled ``gpu<i>``)."""

    vendor = "nvidia"

    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml = nvml if nvml is not None else _import_pynvml()
        try:
            self.nvml.nvmlInit()
            count = int(self.nvml.nvmlDeviceGetCount())
            self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self.nvml.NVMLError as exc:
            raise ControlRefused("NVIDIA", "device controls", f"NVML did not start ({exc})",
                                 "the NVIDIA driver loaded on this node") from None

    def _call(self, index: int, setting: str, fn: str, *args: Any) -> Any:
        """``nvml.<fn>(handle, *args)``; NVML's refusals become one :class:`ControlRefused` line."""
        label = f"gpu{index}"
        func = getattr(self.nvml, fn, None)
        if func is None:
            raise ControlRefused(label, setting, f"this nvidia-ml-py has no {fn}", "a newer nvidia-ml-py")
        try:
            return func(self._handles[index], *args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == self.nvml.NVML_ERROR_NO_PERMISSION:
                raise ControlRefused(label, setting, f"NVML: {exc}", _ROOT) from None
            if code in (self.nvml.NVML_ERROR_NOT_SUPPORTED, self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                raise ControlRefused(label, setting, f"NVML: {exc}",
                                     f"a GPU and driver that support {setting}") from None
            if code == self.nvml.NVML_ERROR_INVALID_ARGUMENT:
                raise ControlRefused(label, setting, f"NVML: {exc} (value out of the device's range)",
                                     "a value inside the device's supported range") from None
            raise ControlRefused(label, setting, f"NVML: {exc}", "a working GPU and driver") from None

    def devices(self) -> list[DeviceId]:
        out = []
        for i in range(len(self._handles)):
            ids: list[str | None] = []
            for fn in ("nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo"):
                try:
                    v = self._call(i, "identity", fn)
                except ControlRefused:
                    v = None
                ids.append(getattr(v, "busId", v) if v is not None else None)
            uuid, bus = (x.decode() if isinstance(x, bytes) else x for x in ids)
            out.append(DeviceId(f"gpu{i}", i, uuid, bus))
        return out

    def power_limit_w(self, index: int) -> float | None:
        try:
            return float(self._call(index, "the power limit", "nvmlDeviceGetPowerManagementLimit")) / 1000.0
        except ControlRefused:
            return None

    def power_limit_range_w(self, index: int) -> tuple[float, float] | None:
        try:
            lo, hi = self._call(index, "the power limit", "nvmlDeviceGetPowerManagementLimitConstraints")
        except ControlRefused:
            return None
        return float(lo) / 1000.0, float(hi) / 1000.0

    def set_power_limit_w(self, index: int, watts: float) -> None:
        self._call(index, "the power limit", "nvmlDeviceSetPowerManagementLimit", round(watts * 1000))

    def max_clock_mhz(self, index: int, kind: str) -> int | None:
        clock = self.nvml.NVML_CLOCK_SM if kind == "sm" else self.nvml.NVML_CLOCK_MEM
        try:
            return int(self._call(index, _SETTING[kind], "nvmlDeviceGetMaxClockInfo", clock))
        except ControlRefused:
            return None

    def lock_clock_mhz(self, index: int, kind: str, lo: int, hi: int) -> str:
        fn = "nvmlDeviceSetGpuLockedClocks" if kind == "sm" else "nvmlDeviceSetMemoryLockedClocks"
        try:
            self._call(index, _SETTING[kind], fn, int(lo), int(hi))
            return "locked clocks"
        except ControlRefused as exc:
            if kind != "sm" or "Not Supported" not in exc.why:
                raise
        # A GPU without locked clocks (before Volta): the application clocks set the SM clock it runs
        # at (the top of the range), with the memory clock at its maximum.
        mem = self.max_clock_mhz(index, "mem")
        if mem is None:
            raise ControlRefused(f"gpu{index}", _SETTING[kind], "neither locked nor application clocks are "
                                 "available (no memory clock reported)", "a GPU that supports either")
        self._call(index, "the application clocks", "nvmlDeviceSetApplicationsClocks", mem, int(hi))
        return f"application clocks (SM {hi} MHz, memory {mem} MHz): this GPU has no locked clocks"

    def reset_clock(self, index: int, kind: str) -> None:
        fn = "nvmlDeviceResetGpuLockedClocks" if kind == "sm" else "nvmlDeviceResetMemoryLockedClocks"
        try:
            self._call(index, _SETTING[kind], fn)
        except ControlRefused as exc:
            if kind != "sm" or "Not Supported" not in exc.why:
                raise
            self._call(index, "the application clocks", "nvmlDeviceResetApplicationsClocks")

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()
