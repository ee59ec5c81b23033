"""STAND-IN for AMD SMI's Python package (``amdsmi``), for tests only — not AMD's library.

``FakeAmdSmi`` is a module-like object with the names, enum values, exception classes and return
shapes of amdsmi 7.0.x (read from the package's ``amdsmi_interface.py``): functions take a processor
handle and, where the real one does, an enum member (a plain int is refused with
``AmdSmiParameterException``, as the real binding does); dicts use the real keys; values the
hardware does not report are the string ``"N/A"``, or the call raises
``AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)``; ``throttle_status`` comes back as a bool,
as the real binding reduces it.

Each ``FakeAmdGpu`` holds scripted readings a test changes between samples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

# -- status codes (amdsmi_wrapper.AMDSMI_STATUS_*) -------------------------------------------------
AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_DRM_ERROR = 6
AMDSMI_STATUS_NO_PERM = 10
AMDSMI_STATUS_IO = 12
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34

_ERROR_INFO = {
    AMDSMI_STATUS_INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    AMDSMI_STATUS_DRM_ERROR: "AMDSMI_STATUS_DRM_ERROR - Error when called libdrm",
    AMDSMI_STATUS_NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    AMDSMI_STATUS_IO: "AMDSMI_STATUS_IO - I/O Error",
    AMDSMI_STATUS_INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    AMDSMI_STATUS_NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    AMDSMI_STATUS_NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    AMDSMI_STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}


# -- exceptions (amdsmi_exception.py) -----------------------------------------------------------------
class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _ERROR_INFO.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self, detailed: bool = True) -> str:
        return self.err_info if detailed else str(self.err_info).split(" - ")[0]

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, receivedValue: Any, expectedType: Any, msg: str | None = None) -> None:
        super().__init__(msg)
        self.err_code = None
        self.err_info = f"Invalid parameter: expected {expectedType}, got {type(receivedValue)}"

    def __str__(self) -> str:
        return self.err_info


# -- enums (amdsmi_interface.py; values from amdsmi_wrapper) -------------------------------------------
class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_AMD_APUS = 3
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6
    PLX = 7


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2
    MAX_HYST = 3
    MIN_HYST = 4
    CRITICAL = 5
    CRITICAL_HYST = 6
    EMERGENCY = 7
    EMERGENCY_HYST = 8
    CRIT_MIN = 9
    CRIT_MIN_HYST = 10
    OFFSET = 11
    LOWEST = 12
    HIGHEST = 13


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4
    PCIE = 5
    VCLK0 = 6
    VCLK1 = 7
    DCLK0 = 8
    DCLK1 = 9


class AmdSmiDevPerfLevel(IntEnum):
    AUTO = 0
    LOW = 1
    HIGH = 2
    MANUAL = 3
    STABLE_STD = 4
    STABLE_PEAK = 5
    STABLE_MIN_MCLK = 6
    STABLE_MIN_SCLK = 7
    DETERMINISM = 8
    UNKNOWN = 0x100


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


NA = "N/A"
_VIOLATION_KEYS = ("active_prochot_thrm", "active_ppt_pwr", "active_socket_thrm", "active_vr_thrm",
                   "active_hbm_thrm", "active_gfx_clk_below_host_limit")


@dataclass
class FakeAmdGpu:
    """Scripted readings of one stand-in AMD GPU, in amdsmi's units (W, µJ ticks, °C, MHz, µW, KB)."""

    market_name: str = "AMD Instinct MI300X (stand-in)"
    uuid: str = "01ff74a1-0000-1000-80f5-35b6c1b2a6e0"
    bdf: str = "0000:0c:00.0"
    current_socket_power: Any = 150  # W, or "N/A" (pre-MI300 parts)
    average_socket_power: Any = NA  # W, or "N/A" (MI300 reports current instead)
    energy_accumulator: int = 1_000_000  # ticks of counter_resolution µJ
    counter_resolution: float = 15.3
    temps: dict[str, Any] = field(default_factory=lambda: {"EDGE": None, "HOTSPOT": 45, "VRAM": 40})
    temp_hotspot_critical: int = 105
    gfx_clk: int = 2100
    mem_clk: int = 1300
    gfx_max: int = 2100
    mem_max: int = 1300
    gfx_activity: Any = 0
    umc_activity: Any = 0
    vram_used: int = 300 * 2**20  # bytes
    vram_total: int = 192 * 2**30
    power_cap_uw: int = 750_000_000
    default_power_cap_uw: int = 750_000_000
    violation: dict[str, Any] | None = field(default_factory=lambda: dict.fromkeys(_VIOLATION_KEYS, False))
    low_utilization: list[Any] = field(default_factory=lambda: [False] + [NA] * 7)
    throttle_status: Any = False
    xgmi_read_kb: list[Any] = field(default_factory=lambda: [0] * 7 + [NA])
    xgmi_write_kb: list[Any] = field(default_factory=lambda: [0] * 7 + [NA])
    fan_speed: int | None = None  # 0..255; None: no fan (passively cooled), NOT_SUPPORTED
    unsupported: set[str] = field(default_factory=set)  # function names that raise NOT_SUPPORTED
    failing: int | None = None  # every call raises AmdSmiLibraryException(code)
    # Controls: set calls need this (as amdsmi needs root); a clock range is (min, max) MHz or None.
    can_set: bool = True
    gfx_range: tuple[int, int] | None = None
    mem_range: tuple[int, int] | None = None
    perf_level: str = "AUTO"

    def advance(self, seconds: float, watts: float | None = None) -> None:
        """Let time pass: the energy accumulator grows by power × time."""
        w = watts if watts is not None else float(self.current_socket_power)
        self.energy_accumulator += round(w * seconds * 1e6 / self.counter_resolution)


class _Handle:
    """Stands for amdsmi_wrapper.amdsmi_processor_handle."""

    def __init__(self, index: int) -> None:
        self.index = index


class FakeAmdSmi:
    """A module-like stand-in for ``amdsmi`` over a list of :class:`FakeAmdGpu`."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiParameterException = AmdSmiParameterException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiClkType = AmdSmiClkType
    AmdSmiMemoryType = AmdSmiMemoryType
    AmdSmiDevPerfLevel = AmdSmiDevPerfLevel

    def __init__(self, gpus: list[FakeAmdGpu] | None = None, *, init_error: int | None = None) -> None:
        self.gpus = list(gpus if gpus is not None else [FakeAmdGpu()])
        self.init_error = init_error
        self.initialized = False
        self.calls: Counter[str] = Counter()

    def _gpu(self, fn: str, h: Any) -> FakeAmdGpu:
        self.calls[fn] += 1
        if not isinstance(h, _Handle):
            raise AmdSmiParameterException(h, "amdsmi_processor_handle")
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        g = self.gpus[h.index]
        if g.failing is not None:
            raise AmdSmiLibraryException(g.failing)
        if fn in g.unsupported:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return g

    @staticmethod
    def _enum(value: Any, cls: type[IntEnum]) -> None:
        if not isinstance(value, cls):
            raise AmdSmiParameterException(value, cls)

    # -- library ---------------------------------------------------------------------------------
    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        self._enum(flag, AmdSmiInitFlags)
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.initialized = True

    def amdsmi_shut_down(self) -> None:
        self.initialized = False

    def amdsmi_get_processor_handles(self) -> list[_Handle]:
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        return [_Handle(i) for i in range(len(self.gpus))]

    def amdsmi_get_lib_version(self) -> dict[str, Any]:
        return {"major": 25, "minor": 5, "release": 1, "build": "stand-in"}

    def amdsmi_get_rocm_version(self) -> tuple[bool, str]:
        return True, "7.0.2"

    def amdsmi_get_gpu_driver_info(self, h: Any) -> dict[str, str]:
        self._gpu("amdsmi_get_gpu_driver_info", h)
        return {"driver_name": "amdgpu", "driver_version": "6.12.12", "driver_date": "2015/01/01 00:00"}

    # -- static facts ------------------------------------------------------------------------------
    def amdsmi_get_gpu_asic_info(self, h: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_gpu_asic_info", h)
        return {"market_name": g.market_name, "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc.",
                "subvendor_id": "0x1002", "device_id": "0x74a1", "rev_id": "0x00", "asic_serial": "0x0",
                "oam_id": 0, "num_compute_units": 304, "target_graphics_version": "gfx942",
                "subsystem_id": "0x74a1"}

    def amdsmi_get_gpu_device_uuid(self, h: Any) -> str:
        return self._gpu("amdsmi_get_gpu_device_uuid", h).uuid

    def amdsmi_get_gpu_device_bdf(self, h: Any) -> str:
        return self._gpu("amdsmi_get_gpu_device_bdf", h).bdf

    def amdsmi_get_gpu_memory_total(self, h: Any, mem_type: AmdSmiMemoryType) -> int:
        self._enum(mem_type, AmdSmiMemoryType)
        return self._gpu("amdsmi_get_gpu_memory_total", h).vram_total

    def amdsmi_get_gpu_fan_speed_max(self, h: Any, sensor_idx: int) -> int:
        g = self._gpu("amdsmi_get_gpu_fan_speed_max", h)
        if g.fan_speed is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return 255

    # -- per-sample reads ------------------------------------------------------------------------
    def amdsmi_get_power_info(self, h: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_power_info", h)
        cur, avg = g.current_socket_power, g.average_socket_power
        return {"socket_power": cur if cur != NA else avg, "current_socket_power": cur,
                "average_socket_power": avg, "gfx_voltage": NA, "soc_voltage": NA, "mem_voltage": NA,
                "power_limit": g.power_cap_uw // 1_000_000}

    def amdsmi_get_energy_count(self, h: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_energy_count", h)
        return {"energy_accumulator": g.energy_accumulator, "counter_resolution": g.counter_resolution,
                "timestamp": 0}

    def amdsmi_get_temp_metric(self, h: Any, sensor_type: AmdSmiTemperatureType,
                               metric: AmdSmiTemperatureMetric) -> int:
        self._enum(sensor_type, AmdSmiTemperatureType)
        self._enum(metric, AmdSmiTemperatureMetric)
        g = self._gpu("amdsmi_get_temp_metric", h)
        if metric == AmdSmiTemperatureMetric.CRITICAL and sensor_type == AmdSmiTemperatureType.HOTSPOT:
            return g.temp_hotspot_critical
        value = g.temps.get(sensor_type.name) if metric == AmdSmiTemperatureMetric.CURRENT else None
        if value is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return value

    def amdsmi_get_clock_info(self, h: Any, clock_type: AmdSmiClkType) -> dict[str, Any]:
        self._enum(clock_type, AmdSmiClkType)
        g = self._gpu("amdsmi_get_clock_info", h)
        if clock_type == AmdSmiClkType.GFX:
            clk, mx = g.gfx_clk, g.gfx_max
        elif clock_type == AmdSmiClkType.MEM:
            clk, mx = g.mem_clk, g.mem_max
        else:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return {"clk": clk, "min_clk": 500, "max_clk": mx, "clk_locked": False, "clk_deep_sleep": NA}

    def amdsmi_get_gpu_activity(self, h: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_gpu_activity", h)
        return {"gfx_activity": g.gfx_activity, "umc_activity": g.umc_activity, "mm_activity": NA}

    def amdsmi_get_gpu_memory_usage(self, h: Any, mem_type: AmdSmiMemoryType) -> int:
        self._enum(mem_type, AmdSmiMemoryType)
        return self._gpu("amdsmi_get_gpu_memory_usage", h).vram_used

    def amdsmi_get_gpu_vram_usage(self, h: Any) -> dict[str, int]:
        g = self._gpu("amdsmi_get_gpu_vram_usage", h)
        return {"vram_total": g.vram_total // 2**20, "vram_used": g.vram_used // 2**20}

    # -- controls ----------------------------------------------------------------------------------
    def _settable(self, fn: str, h: Any) -> FakeAmdGpu:
        g = self._gpu(fn, h)
        if not g.can_set:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NO_PERM)
        return g

    def amdsmi_set_power_cap(self, h: Any, sensor_ind: int, cap: int) -> None:
        if not isinstance(sensor_ind, int) or not isinstance(cap, int):
            raise AmdSmiParameterException(cap, int)
        g = self._settable("amdsmi_set_power_cap", h)
        if not 0 <= cap <= g.default_power_cap_uw:
            raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
        g.power_cap_uw = cap

    def amdsmi_set_gpu_clk_range(self, h: Any, min_clk_value: int, max_clk_value: int,
                                 clk_type: AmdSmiClkType) -> None:
        self._enum(clk_type, AmdSmiClkType)
        g = self._settable("amdsmi_set_gpu_clk_range", h)
        if clk_type == AmdSmiClkType.GFX:
            g.gfx_range, g.gfx_clk = (min_clk_value, max_clk_value), min(max_clk_value, g.gfx_max)
        elif clk_type == AmdSmiClkType.MEM:
            g.mem_range, g.mem_clk = (min_clk_value, max_clk_value), min(max_clk_value, g.mem_max)
        else:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        g.perf_level = "MANUAL"

    def amdsmi_set_gpu_perf_level(self, h: Any, perf_level: AmdSmiDevPerfLevel) -> None:
        self._enum(perf_level, AmdSmiDevPerfLevel)
        g = self._settable("amdsmi_set_gpu_perf_level", h)
        g.perf_level = perf_level.name
        if perf_level == AmdSmiDevPerfLevel.AUTO:
            g.gfx_range = g.mem_range = None
            g.gfx_clk, g.mem_clk = g.gfx_max, g.mem_max

    def amdsmi_get_power_cap_info(self, h: Any) -> dict[str, int]:
        g = self._gpu("amdsmi_get_power_cap_info", h)
        return {"power_cap": g.power_cap_uw, "default_power_cap": g.default_power_cap_uw, "dpm_cap": 2100,
                "min_power_cap": 0, "max_power_cap": g.default_power_cap_uw}

    def amdsmi_get_violation_status(self, h: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_violation_status", h)
        if g.violation is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        out: dict[str, Any] = {"reference_timestamp": 0, "violation_timestamp": 0, "acc_counter": 0}
        for key in ("prochot_thrm", "ppt_pwr", "socket_thrm", "vr_thrm", "hbm_thrm", "gfx_clk_below_host_limit"):
            out[f"acc_{key}"] = 0
            out[f"per_{key}"] = 0
        out.update(g.violation)
        # per XCP, per XCC (a list of lists, as the real binding returns it)
        out["active_low_utilization"] = [list(g.low_utilization)] + [[NA] * 8 for _ in range(7)]
        return out

    def amdsmi_get_gpu_metrics_info(self, h: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_gpu_metrics_info", h)
        return {
            "temperature_edge": g.temps.get("EDGE") or NA, "temperature_hotspot": g.temps.get("HOTSPOT") or NA,
            "temperature_mem": g.temps.get("VRAM") or NA, "average_socket_power": g.average_socket_power,
            "current_socket_power": g.current_socket_power, "energy_accumulator": g.energy_accumulator,
            "average_gfx_activity": g.gfx_activity, "average_umc_activity": g.umc_activity,
            "current_gfxclk": g.gfx_clk, "current_uclk": g.mem_clk, "throttle_status": g.throttle_status,
            "indep_throttle_status": g.throttle_status, "current_fan_speed": NA, "pcie_link_width": 16,
            "pcie_link_speed": 320, "pcie_bandwidth_acc": 123456, "pcie_bandwidth_inst": 12,
            "xgmi_link_width": 16, "xgmi_link_speed": 32, "xgmi_read_data_acc": list(g.xgmi_read_kb),
            "xgmi_write_data_acc": list(g.xgmi_write_kb),
        }

    def amdsmi_get_gpu_fan_speed(self, h: Any, sensor_idx: int) -> int:
        g = self._gpu("amdsmi_get_gpu_fan_speed", h)
        if g.fan_speed is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return g.fan_speed

    def amdsmi_get_gpu_pci_throughput(self, h: Any) -> dict[str, int]:
        """Blocks for one second in the real library; the backend must never call it."""
        self._gpu("amdsmi_get_gpu_pci_throughput", h)
        raise AssertionError("amdsmi_get_gpu_pci_throughput blocks for 1 s and must not be sampled")
