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

A ``FakeGpu`` may instead carry a :class:`PowerSensor`: a known true power waveform (evaluated at
1 kHz) read through a sensor that behaves as published for A100/H100 (Yang, Adamek, Armour, SC'24):
the instantaneous field refreshed every 100 ms and averaging only the last 25 ms, the 1 s average
(``NVML_FI_DEV_POWER_AVERAGE``, and ``nvmlDeviceGetPowerUsage`` as on H100) refreshed every 100 ms,
the energy counter the exact integral, and ``nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)`` a ring
buffer of the driver's samples. Its clock is injected (:class:`FakeClock`), so a test advances time
instead of waiting for it.
"""

from __future__ import annotations

import json
import math
import os
import string
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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
NVML_TOTAL_POWER_SAMPLES = 0  # nvmlSamplingType_t

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
_FIELD_NAMES = {v: k for k, v in CONSTANTS.items() if k.startswith("NVML_FI_")}  # field id → its constant's name

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


# -- a clock the test advances, and a power sensor over a known truth -------------------------------
class FakeClock:
    """STAND-IN time: a wall clock (``CLOCK_REALTIME``-like, ns since the epoch) and a monotonic clock
    that move together only when the test says so (``advance``, or ``sleep`` as the code under test
    calls it). Pass ``time_ns``/``monotonic_ns``/``sleep`` where the real ``time`` functions go."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self.wall = int(start_s * 1e9)
        self.mono = 5_000_000_000

    def time_ns(self) -> int:
        return self.wall

    def monotonic_ns(self) -> int:
        return self.mono

    def advance(self, seconds: float) -> None:
        step = round(seconds * 1e9)
        self.wall += step
        self.mono += step

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def sensor(self, truth_w: Callable[[float], float], **kw: Any) -> PowerSensor:
        """A :class:`PowerSensor` on this clock: its time line monotonic, its stamps the wall clock."""
        return PowerSensor(truth_w, clock_ns=self.monotonic_ns, stamp_ns=self.time_ns, **kw)


def training_swing(mean_w: float = 650.0, swing_w: float = 89.0, freq_hz: float = 1.1, burst_w: float = 200.0,
                   burst_s: float = 0.040, burst_every_s: float = 0.437) -> Callable[[float], float]:
    """A training step's power as a known truth: a square swing of ±``swing_w`` around ``mean_w`` at
    ``freq_hz`` (the H200 run's 1.1 Hz ±89 W), plus ``burst_s`` bursts of +``burst_w`` every
    ``burst_every_s`` (a period sharing no small multiple with a 100 ms sensor, so bursts fall at every
    phase of its windows)."""

    def truth(t: float) -> float:
        p = mean_w + (swing_w if math.sin(2 * math.pi * freq_hz * t) >= 0 else -swing_w)
        if t % burst_every_s < burst_s:
            p += burst_w
        return p

    return truth


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (Linux /proc: clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_load(idle_w: float = 80.0, busy_w: float = 650.0, pid: int | str = "parent", every_s: float = 0.1,
             saturate: float = 0.1) -> Callable[[float], float]:
    """Power that follows a process's CPU load: ``idle_w`` + (``busy_w`` − ``idle_w``) × min(1, its CPU
    use ÷ ``saturate``) over the last ``every_s`` or more of wall time (CPU use: one core = 1). As a GPU
    runs at full power while its host keeps kernels queued, however slow the host, any use above
    ``saturate`` (10 % of a core) is full load: on a busy machine the waveform is still idle or busy,
    not the scheduler's noise. ``pid="parent"``: the
    parent of the process reading the sensor (the sampler's parent: the program under test), so a
    load the program runs on this CPU in place of a GPU kernel (``gpu_check --cpu``) is seen by the
    stand-in as device load, as a real GPU sees its kernels. The truth is known only as time passes:
    each call reads the load since the previous reading, so the waveform between two readings is
    their mean (a step, never a guess of the future)."""
    state: dict[str, float] = {}

    def truth(t: float) -> float:
        now = time.monotonic()
        if "wall" not in state or now - state["wall"] >= every_s:
            target = os.getppid() if pid == "parent" else int(pid)
            try:
                cpu = _cpu_seconds(target)
            except (OSError, IndexError, ValueError):  # the process is gone: nothing loads the device
                cpu = state.get("cpu", 0.0)
            if "wall" in state:
                use = (cpu - state["cpu"]) / (now - state["wall"])
                state["use"] = min(1.0, max(0.0, use / saturate))
            state["wall"], state["cpu"] = now, cpu
        return idle_w + (busy_w - idle_w) * state.get("use", 0.0)

    return truth


WAVEFORMS: dict[str, Callable[..., Callable[[float], float]]] = {"training_swing": training_swing,
                                                                 "cpu_load": cpu_load}

_MS = 1_000_000  # ns


@dataclass
class PowerSensor:
    """STAND-IN power sensor of one GPU over a known true waveform (see the module doc).

    ``truth_w(t)`` is the true power in W at ``t`` seconds after the sensor's start (its first read) on
    ``clock_ns`` (a monotonic clock: the device's own time never steps), evaluated at 1 kHz: the power
    is ``truth_w(k / 1000)`` throughout millisecond ``k``; ``k`` starts before 0 (by the longest window
    plus a full buffer) so the first readings have a full history. Readings refresh at
    ``phase_s + n * update_s``; each holds the mean true power over the window ending at its refresh.
    The driver's buffer keeps the last ``buffer_depth`` samples taken every ``buffer_period_s``
    (default: ``update_s``) over ``buffer_window_s`` (default: the instant window), each stamped in µs
    of ``stamp_ns`` (the CPU wall clock) as it read when the sample was taken: a step of that clock
    (seen at the next read) moves the stamps of the samples after it only.
    """

    truth_w: Callable[[float], float]
    clock_ns: Callable[[], int] = time.monotonic_ns
    stamp_ns: Callable[[], int] = time.time_ns
    update_s: float = 0.1
    instant_window_s: float = 0.025
    average_window_s: float = 1.0
    buffer_depth: int = 120
    buffer_period_s: float | None = None
    buffer_window_s: float | None = None
    phase_s: float = 0.0
    energy_mj0: int = 1_000_000
    # The sensor's own jitter, added to every reading (not to the truth or the counter): up to ±noise_w,
    # fixed by the reading's time. A real sensor's value differs at mW resolution from one refresh to
    # the next even under a constant load; without it a flat truth reads the same across refreshes and
    # no probe that watches for changes could see them.
    noise_w: float = 0.05

    def __post_init__(self) -> None:
        self.start_ns: int | None = None  # on clock_ns
        self.start_stamp_ns: int | None = None  # stamp_ns at the same moment
        self._offsets: list[tuple[float, int]] = []  # (from sensor second, stamp_ns − clock_ns), in order
        longest = max(self.average_window_s, self.instant_window_s, self._bwin)
        self._k0 = -math.ceil((longest + max(self.update_s, self._bper) * (self.buffer_depth + 2)) * 1000)
        self._cum = array("d", [0.0])  # energy (J) from the start of ms k0 to the start of ms k0 + i
        self._p = array("d")  # power (W) during ms k0 + i

    @property
    def _bper(self) -> float:
        return self.buffer_period_s if self.buffer_period_s is not None else self.update_s

    @property
    def _bwin(self) -> float:
        return self.buffer_window_s if self.buffer_window_s is not None else self.instant_window_s

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> PowerSensor:
        """A sensor on the real clock from a JSON-able spec: ``{"waveform": name, "args": {...}, <field>: ...}``
        (what a process-shared stand-in state can hold: :mod:`standins.nvml_state`)."""
        spec = dict(spec)
        truth = WAVEFORMS[spec.pop("waveform", "training_swing")](**spec.pop("args", {}))
        return cls(truth, **spec)

    # -- the truth ---------------------------------------------------------------------------------
    def now_s(self) -> float:
        """Seconds since the sensor's start on its clock (the start is the first call)."""
        now, stamp = self.clock_ns(), self.stamp_ns()
        if self.start_ns is None:
            self.start_ns, self.start_stamp_ns = now, stamp
        t = (now - self.start_ns) / 1e9
        if not self._offsets or self._offsets[-1][1] != stamp - now:
            self._offsets.append((t if self._offsets else -math.inf, stamp - now))
        return t

    def stamp_us(self, t_s: float) -> int:
        """The CPU-clock µs stamp of a sample taken at sensor second ``t_s``."""
        assert self.start_ns is not None
        offset = next(off for since, off in reversed(self._offsets) if since <= t_s)
        return (self.start_ns + round(t_s * 1e9) + offset) // 1000

    def _extend(self, k: int) -> None:
        """Evaluate the truth up to millisecond ``k`` (inclusive)."""
        while self._k0 + len(self._p) <= k:
            p = float(self.truth_w((self._k0 + len(self._p)) / 1000.0))
            self._p.append(p)
            self._cum.append(self._cum[-1] + p * 1e-3)

    def energy_j(self, t_s: float) -> float:
        """The exact true energy from the start of the history to ``t_s`` (J)."""
        t_ms = t_s * 1000.0
        k = math.floor(t_ms)
        self._extend(k)
        i = k - self._k0
        return self._cum[i] + self._p[i] * (t_ms - k) * 1e-3

    def true_energy_j(self, t0_s: float, t1_s: float) -> float:
        return self.energy_j(t1_s) - self.energy_j(t0_s)

    def true_peak_w(self, t0_s: float, t1_s: float) -> float:
        """The highest 1 kHz true power in [t0_s, t1_s)."""
        k0, k1 = math.floor(t0_s * 1000), math.ceil(t1_s * 1000)
        self._extend(k1)
        return max(self._p[k0 - self._k0:k1 - self._k0])

    def mean_w(self, t_end_s: float, window_s: float) -> float:
        return (self.energy_j(t_end_s) - self.energy_j(t_end_s - window_s)) / window_s

    # -- what NVML reads -----------------------------------------------------------------------------
    def _refresh(self, t_s: float, period: float) -> float:
        """The latest refresh time at or before ``t_s``."""
        return self.phase_s + math.floor((t_s - self.phase_s) / period + 1e-9) * period

    def noise(self, t_s: float) -> float:
        """The jitter (W) of a reading taken at sensor second ``t_s``: a fixed hash of its µs, in ±noise_w."""
        h = (round(t_s * 1e6) * 2654435761) % 2**32
        return self.noise_w * (2.0 * h / 2**32 - 1.0)

    def reading_w(self, t_s: float, window_s: float) -> float:
        """What the sensor reads for a window ending at ``t_s``: the truth's mean over it, and its jitter."""
        return self.mean_w(t_s, window_s) + self.noise(t_s)

    def instant_mw(self) -> int:
        return round(self.reading_w(self._refresh(self.now_s(), self.update_s), self.instant_window_s) * 1000)

    def average_mw(self) -> int:
        return round(self.reading_w(self._refresh(self.now_s(), self.update_s), self.average_window_s) * 1000)

    def energy_mj(self) -> int:
        return self.energy_mj0 + round(self.true_energy_j(0.0, self.now_s()) * 1000)

    def buffered(self, last_seen_us: int) -> list[tuple[int, int]]:
        """(µs timestamp, mW) of the ring's samples newer than ``last_seen_us``, oldest first."""
        t = self.now_s()
        per = self._bper
        newest = math.floor((t - self.phase_s) / per + 1e-9)
        first = newest - self.buffer_depth + 1
        if last_seen_us > 0 and len(self._offsets) == 1:  # skip, unvisited, what the caller has seen
            seen = ((last_seen_us - self.stamp_us(0.0)) / 1e6 - self.phase_s) / per
            first = max(first, math.floor(seen))  # one below, for rounding
        out = []
        for m in range(first, newest + 1):
            tb = self.phase_s + m * per
            ts_us = self.stamp_us(tb)
            if ts_us > last_seen_us:
                out.append((ts_us, round(self.reading_w(tb, self._bwin) * 1000)))
        return out


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
    # A known-truth power sensor: instant, average and energy reads and the driver's sample buffer come
    # from it, not from power_mw/power_avg_mw/energy_mj. `sensor` is an object (this process only);
    # `sensor_spec` a JSON-able PowerSensor.from_spec description a process-shared state can hold.
    # Without either, nvmlDeviceGetSamples answers NOT_SUPPORTED (a scripted GPU has no buffer).
    sensor: PowerSensor | None = None
    sensor_spec: dict[str, Any] | None = None
    # With a sensor: temperatures and the SM clock that follow its power (otherwise they are the fixed
    # temp_c, mem_temp_c, clock_sm_mhz above). Both temperatures rise by temp_c_per_w °C per W of the
    # sensor's true mean power over the last thermal_s above power_mw (the idle power); the SM clock
    # reads clock_sm_idle_mhz, with the GPU-idle clock-event reason, while the last 100 ms average
    # within 50 W of idle, clock_sm_mhz with no reason otherwise. A first-order stand-in for a GPU
    # heating and clocking up under load, enough for a check that temperatures and clocks move.
    temp_c_per_w: float = 0.0
    thermal_s: float = 2.0
    clock_sm_idle_mhz: int | None = None

    def advance(self, seconds: float) -> None:
        """Let time pass at the current power: the energy counter grows by power × time."""
        self.energy_mj += round(self.power_mw * seconds)


@dataclass
class _Handle:
    index: int


class _Sample:
    """A c_nvmlSample_t look-alike: ``timeStamp`` (µs) and the ``sampleValue`` union."""

    def __init__(self, ts_us: int, member: str, value: Any) -> None:
        self.timeStamp = ts_us
        self.sampleValue = _Union(member, value)


class _Union:
    """A c_nvmlValue_t look-alike: only the member named by the value type can be read (the others
    read None, from the class: one attribute set per value keeps a stand-in read cheap)."""

    dVal = uiVal = ulVal = ullVal = sllVal = siVal = usVal = None
    MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

    def __init__(self, member: str, value: Any) -> None:
        setattr(self, member, value)


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
        self._sensors: dict[tuple[int, str], PowerSensor] = {}  # built from sensor_spec, kept across calls

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

    def _sensor(self, handle: _Handle, g: FakeGpu) -> PowerSensor | None:
        if g.sensor is not None:
            return g.sensor
        if g.sensor_spec is None:
            return None
        key = (handle.index, json.dumps(g.sensor_spec, sort_keys=True))
        if key not in self._sensors:
            self._sensors[key] = PowerSensor.from_spec(g.sensor_spec)
        return self._sensors[key]

    def _now_us(self, handle: _Handle, g: FakeGpu) -> int:
        sensor = self._sensor(handle, g)
        return (sensor.stamp_ns() if sensor is not None else time.time_ns()) // 1000

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
    def _heat_c(self, h: _Handle, g: FakeGpu) -> int:
        """°C above the scripted temperatures (FakeGpu.temp_c_per_w)."""
        sensor = self._sensor(h, g)
        if sensor is None or not g.temp_c_per_w:
            return 0
        t = sensor.now_s()
        above_w = sensor.mean_w(t, g.thermal_s) - g.power_mw / 1000
        return round(g.temp_c_per_w * max(0.0, above_w))

    def _busy(self, h: _Handle, g: FakeGpu) -> bool | None:
        """Whether the sensor's last 100 ms are above idle (FakeGpu.clock_sm_idle_mhz); None: not modelled."""
        sensor = self._sensor(h, g)
        if sensor is None or g.clock_sm_idle_mhz is None:
            return None
        return sensor.mean_w(sensor.now_s(), 0.1) > g.power_mw / 1000 + 50

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        g = self._gpu("nvmlDeviceGetTemperature", h)
        return g.temp_c + self._heat_c(h, g)

    def nvmlDeviceGetTemperatureV(self, h: _Handle, sensor: int, version: int = 0x100000C) -> int:
        g = self._gpu("nvmlDeviceGetTemperatureV", h)
        return g.temp_c + self._heat_c(h, g)

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        g = self._gpu("nvmlDeviceGetClockInfo", h)
        sm = g.clock_sm_idle_mhz if self._busy(h, g) is False else g.clock_sm_mhz
        return {NVML_CLOCK_SM: sm, NVML_CLOCK_MEM: g.clock_mem_mhz}[clock]

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
        g = self._gpu("nvmlDeviceGetPowerUsage", h)
        sensor = self._sensor(h, g)
        return sensor.average_mw() if sensor is not None else g.power_avg_mw  # H100: the 1 s average

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        g = self._gpu("nvmlDeviceGetTotalEnergyConsumption", h)
        sensor = self._sensor(h, g)
        return sensor.energy_mj() if sensor is not None else g.energy_mj

    def nvmlDeviceGetSamples(self, device: _Handle, sampling_type: int, timeStamp: int) -> tuple[int, list[_Sample]]:
        """The driver's buffered samples newer than ``timeStamp`` (µs), as pynvml returns them:
        (value type, [c_nvmlSample_t]); NOT_FOUND when there is none, as NVML."""
        g = self._gpu("nvmlDeviceGetSamples", device)
        sensor = self._sensor(device, g)
        if sensor is None or sampling_type != NVML_TOTAL_POWER_SAMPLES:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        got = sensor.buffered(int(timeStamp))
        if not got:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        member = _MEMBER[NVML_VALUE_TYPE_UNSIGNED_INT]
        return NVML_VALUE_TYPE_UNSIGNED_INT, [_Sample(ts, member, mw) for ts, mw in got]

    def _reasons(self, h: _Handle, g: FakeGpu) -> int:
        busy = self._busy(h, g)
        if busy is None:
            return g.reasons
        return 0 if busy else nvmlClocksEventReasonGpuIdle

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._reasons(h, self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: _Handle) -> int:
        return self._reasons(h, self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", h))

    def nvmlDeviceGetFanSpeed(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetFanSpeed", h).fan_pct

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        """Blocks for NVML's 20 ms sampling window, like the real call; the backend must not use it."""
        self._gpu("nvmlDeviceGetPcieThroughput", h)
        time.sleep(0.02)
        return 0

    def nvmlDeviceGetFieldValues(self, h: _Handle, fieldIds: list[Any]) -> list[SimpleNamespace]:
        g = self._gpu("nvmlDeviceGetFieldValues", h)
        now_us = self._now_us(h, g)
        sensor = self._sensor(h, g)
        heat_c = self._heat_c(h, g)
        out = []
        for item in fieldIds:
            fid, scope = item if isinstance(item, tuple) else (item, 0)  # a bare id means scopeId 0
            ret, vtype, value = self._field(g, fid, scope, sensor, heat_c)
            out.append(SimpleNamespace(
                fieldId=fid, scopeId=scope, timestamp=now_us, latencyUsec=0, valueType=vtype,
                nvmlReturn=ret, value=_Union(_MEMBER[vtype], value if ret == NVML_SUCCESS else None)))
        return out

    def _field(self, g: FakeGpu, fid: int, scope: int, sensor: PowerSensor | None = None, heat_c: int = 0
               ) -> tuple[int, int, Any]:
        const = _FIELD_NAMES.get(fid)
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
        if sensor is not None and fid == NVML_FI_DEV_POWER_INSTANT:
            return NVML_SUCCESS, u32, sensor.instant_mw()
        if sensor is not None and fid == NVML_FI_DEV_POWER_AVERAGE:
            return NVML_SUCCESS, u32, sensor.average_mw()
        if sensor is not None and fid == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            return NVML_SUCCESS, u64, sensor.energy_mj()
        values = {
            NVML_FI_DEV_POWER_INSTANT: (u32, g.power_mw),
            NVML_FI_DEV_POWER_AVERAGE: (u32, g.power_avg_mw),
            NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (u64, g.energy_mj),
            NVML_FI_DEV_MEMORY_TEMP: (u32, g.mem_temp_c + heat_c),
            NVML_FI_DEV_POWER_CURRENT_LIMIT: (u32, g.power_limit_mw),
            NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (u32, g.pcie_tx % 2**32),
            NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (u32, g.pcie_rx % 2**32),
        }
        vtype, value = values[fid]
        return NVML_SUCCESS, vtype, value
