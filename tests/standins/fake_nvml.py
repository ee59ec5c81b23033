"""STAND-IN for nvidia-ml-py (``pynvml``), for tests only — not NVIDIA's library.

``FakeNvml`` is a module-like object: it carries the names the NVIDIA backend uses with the same
spelling, constant values, exception classes (``NVMLError`` and one ``NVMLError_<Name>`` subclass per
``NVML_ERROR_*`` code, built by the same naming rule as pynvml) and return shapes (structures with
``.gpu``/``.memory``, ``.total``/``.free``/``.used``, ``.busId``; field values with ``fieldId``,
``scopeId``, ``valueType``, ``nvmlReturn`` and a ``value`` union whose only readable member is the one
``valueType`` names). ``tests/test_nvidia_backend.py`` checks the names and constants against the
real pynvml installed in the venv.

Each ``FakeGpu`` holds scripted values that a test changes between samples: set power, advance the
energy counter, wrap a 32-bit counter, mark reads unsupported, or lose the GPU.
"""

from __future__ import annotations

import string
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# -- constants (values as in pynvml 13.x) ----------------------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_NVLINK_MAX_LINKS = 36
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_FI_DEV_POWER_CURRENT_LIMIT = 190
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198

nvmlClocksEventReasonGpuIdle = 0x001
nvmlClocksEventReasonApplicationsClocksSetting = 0x002
nvmlClocksEventReasonSwPowerCap = 0x004
nvmlClocksEventReasonHwSlowdown = 0x008
nvmlClocksEventReasonSyncBoost = 0x010
nvmlClocksEventReasonSwThermalSlowdown = 0x020
nvmlClocksEventReasonHwThermalSlowdown = 0x040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x080
nvmlClocksEventReasonDisplayClockSetting = 0x100
nvmlClocksThrottleReasonBoardLimit = 0x200
nvmlClocksThrottleReasonReliability = 0x400

CONSTANTS = {k: v for k, v in dict(globals()).items() if k.startswith(("NVML_", "nvmlClocks"))}

_ERROR_TEXT = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


# -- exceptions: NVMLError(code) becomes the matching subclass, as in pynvml ---------------------------
class NVMLError(Exception):
    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - mirrors pynvml

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


def _make_errors() -> dict[str, type[NVMLError]]:
    made: dict[str, type[NVMLError]] = {}
    for const, code in CONSTANTS.items():
        if not const.startswith("NVML_ERROR_"):
            continue
        name = "NVMLError_" + string.capwords(const.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def new(cls, *args, _code=code):
            return NVMLError.__new__(cls, _code)

        def init(self, *args, _code=code):
            Exception.__init__(self, _code)
            self.value = _code

        cls = type(name, (NVMLError,), {"__new__": new, "__init__": init})
        NVMLError._valClassMapping[code] = cls
        made[name] = cls
    return made


ERRORS = _make_errors()
globals().update(ERRORS)


# -- scripted devices --------------------------------------------------------------------------------
@dataclass
class FakeGpu:
    """Scripted readings of one stand-in GPU, in NVML's raw units (mW, mJ, °C, MHz, bytes, KiB)."""

    name: str = "NVIDIA H100 80GB HBM3 (stand-in)"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:18:00.0"
    power_mw: int = 100_000
    power_avg_mw: int = 98_000
    energy_mj: int = 1_000_000
    temp_c: int = 35
    mem_temp_c: int = 40
    clock_sm_mhz: int = 1980
    clock_mem_mhz: int = 2619
    clock_sm_max_mhz: int = 1980
    clock_mem_max_mhz: int = 2619
    util_gpu: int = 0
    util_mem: int = 0
    mem_total: int = 80 * 2**30
    mem_used: int = 512 * 2**20
    power_limit_mw: int = 700_000
    power_default_mw: int = 700_000
    power_min_mw: int = 200_000
    power_max_mw: int = 700_000
    temp_slowdown_c: int = 87
    temp_shutdown_c: int = 92
    reasons: int = nvmlClocksEventReasonGpuIdle
    fan_pct: int = 30
    pcie_tx: int = 0  # bytes, returned as a 32-bit value (wraps at 2**32)
    pcie_rx: int = 0
    nvlink_tx_kib: list[int] = field(default_factory=lambda: [0] * 18)
    nvlink_rx_kib: list[int] = field(default_factory=lambda: [0] * 18)
    # Names of functions (e.g. "nvmlDeviceGetFanSpeed") or field constants (e.g.
    # "NVML_FI_DEV_MEMORY_TEMP") this GPU answers with NOT_SUPPORTED.
    unsupported: set[str] = field(default_factory=set)
    # Field constant → another NVML error code its field value returns (e.g. NVML_ERROR_UNKNOWN).
    field_errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False  # every call on this GPU raises NVMLError_GpuIsLost
    failing: int | None = None  # every call raises NVMLError(code), e.g. NVML_ERROR_UNKNOWN
    # Controls: set calls need this (as NVML needs root); a lock is (min, max) MHz or None.
    can_set: bool = True
    sm_lock: tuple[int, int] | None = None
    mem_lock: tuple[int, int] | None = None
    app_clocks: tuple[int, int] | None = None  # (memory, graphics) MHz set as application clocks
    history: list[str] = field(default_factory=list)  # every set call, in order ("power 500000", "sm 1200-1500")

    def advance(self, seconds: float) -> None:
        """Let time pass at the current power: the energy counter grows by power × time."""
        self.energy_mj += round(self.power_mw * seconds)


@dataclass
class _Handle:
    index: int


class _Union:
    """A c_nvmlValue_t look-alike: only the member named by the value type can be read."""

    def __init__(self, member: str, value: Any) -> None:
        for m in ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal"):
            setattr(self, m, value if m == member else None)


_MEMBER = {
    NVML_VALUE_TYPE_DOUBLE: "dVal", NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class FakeNvml:
    """A module-like stand-in for ``pynvml`` over a list of :class:`FakeGpu`.

    Args:
        gpus: the scripted GPUs (NVML indices 0..n-1).
        library_found: False → ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` like a driverless host.
        init_error: another NVML error code for ``nvmlInit`` to raise (e.g. DRIVER_NOT_LOADED).
    """

    def __init__(self, gpus: list[FakeGpu] | None = None, *, library_found: bool = True,
                 init_error: int | None = None, driver: str = "550.54.15") -> None:
        self.__dict__.update(CONSTANTS)
        self.__dict__.update(ERRORS)
        self.NVMLError = NVMLError
        self.gpus = list(gpus if gpus is not None else [FakeGpu()])
        self.library_found = library_found
        self.init_error = init_error
        self.driver = driver
        self.initialized = False
        self.calls: Counter[str] = Counter()  # function name → number of calls

    # -- helpers -------------------------------------------------------------------------------
    def _gpu(self, fn: str, handle: _Handle) -> FakeGpu:
        self.calls[fn] += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if gpu.failing is not None:
            raise NVMLError(gpu.failing)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- library -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if not self.library_found:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12." + self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # -- static device facts ---------------------------------------------------------------------
    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._gpu("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> SimpleNamespace:
        g = self._gpu("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=g.bus_id, busIdLegacy=g.bus_id[4:], domain=0, bus=0x18, device=0)

    def nvmlDeviceGetMaxClockInfo(self, h: _Handle, clock: int) -> int:
        g = self._gpu("nvmlDeviceGetMaxClockInfo", h)
        return {NVML_CLOCK_SM: g.clock_sm_max_mhz, NVML_CLOCK_MEM: g.clock_mem_max_mhz}[clock]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementDefaultLimit", h).power_default_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: _Handle) -> list[int]:
        g = self._gpu("nvmlDeviceGetPowerManagementLimitConstraints", h)
        return [g.power_min_mw, g.power_max_mw]

    def nvmlDeviceGetTemperatureThreshold(self, h: _Handle, threshold: int) -> int:
        g = self._gpu("nvmlDeviceGetTemperatureThreshold", h)
        return g.temp_slowdown_c if threshold == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else g.temp_shutdown_c

    def nvmlDeviceGetCudaComputeCapability(self, h: _Handle) -> tuple[int, int]:
        self._gpu("nvmlDeviceGetCudaComputeCapability", h)
        return (9, 0)

    # -- per-sample reads --------------------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", h).temp_c

    def nvmlDeviceGetTemperatureV(self, h: _Handle, sensor: int, version: int = 0x100000C) -> int:
        return self._gpu("nvmlDeviceGetTemperatureV", h).temp_c

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        g = self._gpu("nvmlDeviceGetClockInfo", h)
        return {NVML_CLOCK_SM: g.clock_sm_mhz, NVML_CLOCK_MEM: g.clock_mem_mhz}[clock]

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        g = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> SimpleNamespace:
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=g.mem_total, free=g.mem_total - g.mem_used, used=g.mem_used)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    # -- controls (power limit, locked clocks) -----------------------------------------------------
    def _settable(self, fn: str, h: _Handle) -> FakeGpu:
        g = self._gpu(fn, h)
        if not g.can_set:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        return g

    def nvmlDeviceGetPowerManagementLimit(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", h).power_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, h: _Handle, limit: int) -> None:
        g = self._settable("nvmlDeviceSetPowerManagementLimit", h)
        if not g.power_min_mw <= limit <= g.power_max_mw:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g.power_limit_mw = int(limit)
        g.history.append(f"power {int(limit)}")

    def _lock(self, fn: str, h: _Handle, which: str, lo: int | None, hi: int | None) -> None:
        g = self._settable(fn, h)
        if lo is not None and hi is not None and not 0 < lo <= hi:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        top = g.clock_sm_max_mhz if which == "sm" else g.clock_mem_max_mhz
        lock = None if lo is None or hi is None else (int(lo), int(hi))
        setattr(g, f"{which}_lock", lock)
        # what the clock then runs at: the top of the lock (clamped to the device's maximum), else the maximum
        setattr(g, f"clock_{which}_mhz", min(lock[1], top) if lock else top)
        g.history.append(f"{which} {lo}-{hi}" if lock else f"{which} reset")

    def nvmlDeviceSetGpuLockedClocks(self, h: _Handle, minGpuClockMHz: int, maxGpuClockMHz: int) -> None:
        self._lock("nvmlDeviceSetGpuLockedClocks", h, "sm", minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, h: _Handle) -> None:
        self._lock("nvmlDeviceResetGpuLockedClocks", h, "sm", None, None)

    def nvmlDeviceSetMemoryLockedClocks(self, h: _Handle, minMemClockMHz: int, maxMemClockMHz: int) -> None:
        self._lock("nvmlDeviceSetMemoryLockedClocks", h, "mem", minMemClockMHz, maxMemClockMHz)

    def nvmlDeviceResetMemoryLockedClocks(self, h: _Handle) -> None:
        self._lock("nvmlDeviceResetMemoryLockedClocks", h, "mem", None, None)

    def nvmlDeviceSetApplicationsClocks(self, h: _Handle, maxMemClockMHz: int, maxGraphicsClockMHz: int) -> None:
        g = self._settable("nvmlDeviceSetApplicationsClocks", h)
        if maxMemClockMHz > g.clock_mem_max_mhz or maxGraphicsClockMHz > g.clock_sm_max_mhz:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g.app_clocks = (int(maxMemClockMHz), int(maxGraphicsClockMHz))
        g.clock_sm_mhz = int(maxGraphicsClockMHz)
        g.history.append(f"app {maxMemClockMHz}/{maxGraphicsClockMHz}")

    def nvmlDeviceResetApplicationsClocks(self, h: _Handle) -> None:
        g = self._settable("nvmlDeviceResetApplicationsClocks", h)
        g.app_clocks, g.clock_sm_mhz = None, g.clock_sm_max_mhz
        g.history.append("app reset")

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h).power_avg_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetFanSpeed(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetFanSpeed", h).fan_pct

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        """Blocks for NVML's 20 ms sampling window, like the real call; the backend must not use it."""
        self._gpu("nvmlDeviceGetPcieThroughput", h)
        time.sleep(0.02)
        return 0

    def nvmlDeviceGetFieldValues(self, h: _Handle, fieldIds: list[Any]) -> list[SimpleNamespace]:
        g = self._gpu("nvmlDeviceGetFieldValues", h)
        now_us = time.time_ns() // 1000
        out = []
        for item in fieldIds:
            fid, scope = item if isinstance(item, tuple) else (item, 0)  # a bare id means scopeId 0
            ret, vtype, value = self._field(g, fid, scope)
            out.append(SimpleNamespace(
                fieldId=fid, scopeId=scope, timestamp=now_us, latencyUsec=0, valueType=vtype,
                nvmlReturn=ret, value=_Union(_MEMBER[vtype], value if ret == NVML_SUCCESS else None)))
        return out

    def _field(self, g: FakeGpu, fid: int, scope: int) -> tuple[int, int, Any]:
        const = next((k for k, v in CONSTANTS.items() if k.startswith("NVML_FI_") and v == fid), None)
        if const is None:
            return NVML_ERROR_INVALID_ARGUMENT, NVML_VALUE_TYPE_UNSIGNED_INT, None
        if const in g.unsupported:
            return NVML_ERROR_NOT_SUPPORTED, NVML_VALUE_TYPE_UNSIGNED_INT, None
        if const in g.field_errors:
            return g.field_errors[const], NVML_VALUE_TYPE_UNSIGNED_INT, None
        u32, u64 = NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        if fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            links = g.nvlink_tx_kib if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else g.nvlink_rx_kib
            if scope >= len(links):
                return NVML_ERROR_INVALID_ARGUMENT, u64, None
            return NVML_SUCCESS, u64, links[scope]
        if fid in (NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_POWER_AVERAGE) and scope != 0:
            return NVML_ERROR_NOT_SUPPORTED, u32, None  # only the GPU scope on a discrete GPU
        values = {
            NVML_FI_DEV_POWER_INSTANT: (u32, g.power_mw),
            NVML_FI_DEV_POWER_AVERAGE: (u32, g.power_avg_mw),
            NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (u64, g.energy_mj),
            NVML_FI_DEV_MEMORY_TEMP: (u32, g.mem_temp_c),
            NVML_FI_DEV_POWER_CURRENT_LIMIT: (u32, g.power_limit_mw),
            NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (u32, g.pcie_tx % 2**32),
            NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (u32, g.pcie_rx % 2**32),
        }
        vtype, value = values[fid]
        return NVML_SUCCESS, vtype, value
