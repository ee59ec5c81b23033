"""NVIDIA GPU telemetry through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

One row per GPU per sample, labelled ``gpu<i>`` with ``i`` the NVML index (PCI bus order, which is
not necessarily the CUDA order; ``run.json`` keeps each device's UUID and bus id to match them).

What a sample reads, and why this way:

* one batched ``nvmlDeviceGetFieldValues`` call per GPU for everything NVML offers as a field:
  instantaneous and 1 s average power (mW, GPU scope), the total-energy counter (mJ since driver
  load), memory temperature, the enforced power limit, the PCIe TX/RX byte counters and the NVLink
  TX/RX data counters of every link (KiB, one field per link selected by ``scopeId``, summed here);
  each field's own ``nvmlReturn`` is checked, so one unsupported field is a null, not a failed row;
* a few plain calls for what has no field: GPU temperature, SM and memory clocks, utilisation,
  memory used, clock-event (throttle) reasons and fan speed.

Nothing in the loop blocks for its own sampling window (``nvmlDeviceGetPcieThroughput`` waits
20 ms per call and is never used). Every read is probed once when the backend opens; a read that
does not return a value then (not supported on this GPU or driver) is dropped from the loop and
its field is absent from the device's ``supported`` list, so its column stays null.

Counters are held as 64-bit cumulative values. A counter NVML returns as a 32-bit value is
un-wrapped at 2**32; for a 64-bit one a drop can only be a reset (driver reload), and the total
continues from where it was (:class:`powertrain.core.counters.Unwrapper`).

Errors never escape: opening fails with :class:`BackendUnavailable` and one line saying what was
found; a GPU that stops answering mid-run (``GPU is lost`` or every read failing) gets null rows
and one :class:`Incident`, and sampling of the other GPUs goes on.

**Each field says what it is.** A GPU's power readings are not instantaneous: each averages some
window and changes only when the driver refreshes it. At open the backend polls the power columns
(``power_w``, ``power_avg_w``, ``energy_j``) every 5 ms for at most ``probe_s`` (0.5 s by default;
it stops early once every column changed 4 times) and takes each one's update period as the median
time between changes, of the shortest ones (a refresh that reads the same value again makes a longer
gap). ``DeviceInfo.properties["sensors"]`` then holds, per column, the NVML source and kind, the
probed period and the published averaging window with its citation
(:mod:`powertrain.telemetry.sensor_facts`). A reading that does not change during the probe (a
flat load read exactly) has no measured period; a real sensor's value differs at mW resolution.

**No invented resolution: ``power_repeat``.** Sampling faster than the driver refreshes reads the
same value again. A row's ``power_repeat`` is True when its ``power_w`` equals the previous poll's
raw value exactly *and* less than one probed update period of ``power_w`` has passed since the poll
that first showed that value: the driver has not been due for a refresh, so the row adds no new
reading. It is False on a fresh value: the first, one that differs from the previous poll's, or an
equal one a full period or more after it was first seen (the driver refreshed at least once since,
and read the same value again; that poll then counts as the value's first sighting). It is null when
``power_w`` is null, and on an equal value when the probe measured no period (we cannot tell).

**The driver's buffer.** Where ``nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)`` works, the
sampler calls :meth:`NvidiaBackend.power_samples` once per tick: it asks for the samples newer than
the newest one it has (``lastSeenTimeStamp``), so each driver sample is returned once, and they go to
their own stream (``telemetry/power-samples/<host>.parquet``). NVML stamps them in "CPU time" µs;
when the newest stamp at the first read is within [-1 s, +5 s] of ``CLOCK_REALTIME`` (the clock the
rows are stamped with) the stamps are taken as that clock (``t_ns = stamp × 1000``); otherwise they
are on another clock and are shifted by the difference seen at that first read (an error of at most
one buffer period), said in ``properties["power_buffer"]["timestamps"]``. The sampler then moves
them onto its own clock exactly as it moves the rows. A gap between reads longer than the ring holds
is counted (``samples_lost``) and logged once. A step back of ``CLOCK_REALTIME`` would hide the samples
after it (NVML returns only stamps above ``lastSeenTimeStamp``): when the clock reads more than 1 s
before the last stamp read, the whole ring is asked for and the samples stamped up to now are kept
(those the driver took between the last read and the step, stamped ahead, are lost: under one tick).
A tick less than one buffer period after the last sample read makes no call (none can be due).
``properties["power_buffer"]`` says whether the buffer was used, the most samples one call returned
(``depth``: the ring size where a call saw it full), the samples' spacing, and why not where it was not.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powertrain.core.counters import Unwrapper
from powertrain.core.throttle import throttle_from_nvml
from powertrain.schema import TELEMETRY_FIELDS, empty_telemetry_row
from powertrain.telemetry import sensor_facts
from powertrain.telemetry.backend import Backend, BackendUnavailable, DeviceInfo

log = logging.getLogger(__name__)

_INSTEAD = "GPU power/temperature/clocks not measured — using host counters only"

# NVML field value types → the member of the c_nvmlValue_t union that holds the value, and the
# modulus at which such a counter wraps (None: 64-bit, a drop is a reset, not a wrap).
_VALUE_MEMBER: dict[int, tuple[str, int | None]] = {
    0: ("dVal", None),  # NVML_VALUE_TYPE_DOUBLE
    1: ("uiVal", 2**32),  # NVML_VALUE_TYPE_UNSIGNED_INT
    2: ("ulVal", None),  # NVML_VALUE_TYPE_UNSIGNED_LONG (64-bit on Linux)
    3: ("ullVal", None),  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    4: ("sllVal", None),  # NVML_VALUE_TYPE_SIGNED_LONG_LONG
    5: ("siVal", None),  # NVML_VALUE_TYPE_SIGNED_INT
    6: ("usVal", 2**16),  # NVML_VALUE_TYPE_UNSIGNED_SHORT
}


@dataclass(frozen=True)
class _FieldSpec:
    """One telemetry column fed by NVML field values (several slots when summed over links)."""

    column: str
    const: str  # name of the NVML_FI_* constant on the nvml module
    scale: float  # raw unit → column unit
    counter: bool = False  # cumulative: un-wrap before scaling
    scope: int = 0  # scopeId (0 = GPU scope for the power fields)
    per_link: bool = False  # one slot per NVLink, scopeId = link index, values summed


_FIELDS: tuple[_FieldSpec, ...] = (
    _FieldSpec("power_w", "NVML_FI_DEV_POWER_INSTANT", 1e-3),  # mW
    _FieldSpec("power_avg_w", "NVML_FI_DEV_POWER_AVERAGE", 1e-3),  # mW, 1 s average
    _FieldSpec("energy_j", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3, counter=True),  # mJ
    _FieldSpec("temp_mem_c", "NVML_FI_DEV_MEMORY_TEMP", 1.0),
    _FieldSpec("power_limit_w", "NVML_FI_DEV_POWER_CURRENT_LIMIT", 1e-3),  # mW, enforced limit
    _FieldSpec("pcie_tx_bytes", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 1.0, counter=True),
    _FieldSpec("pcie_rx_bytes", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 1.0, counter=True),
    _FieldSpec("link_tx_bytes", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 1024.0, counter=True, per_link=True),
    _FieldSpec("link_rx_bytes", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 1024.0, counter=True, per_link=True),
)

_INT_COLUMNS = {name for name, typ in TELEMETRY_FIELDS.items() if str(typ) == "int64"}

POWER_COLUMNS = ("power_w", "power_avg_w", "energy_j")  # the readings whose update period is probed
PROBE_S = 0.5  # the longest the update-period probe polls at open
_PROBE_POLL_S = 0.005
_PROBE_CHANGES = 4  # changes of every column after which the probe stops (3 intervals for a median)
_BUFFER_AGE_US = (-1_000_000, 5_000_000)  # newest driver sample's age at a read, if on CLOCK_REALTIME


@dataclass
class _Slot:
    """One (fieldId, scopeId) request of the batched read, and where its value goes."""

    spec: _FieldSpec
    field_id: int
    scope: int
    unwrap: Unwrapper | None = None
    # The value's union member for the last valueType seen: the type of a field does not change
    # between reads, and looking it up once per slot instead of once per read is most of the
    # batched read's Python cost (benchmarks/sampler_buffer_cost.py).
    vtype: int | None = None
    member: str = ""
    # the spec's facts the read loop needs, copied once (attribute chains per value per read add up)
    column: str = field(init=False)
    scale: float = field(init=False)
    counter: bool = field(init=False)
    per_link: bool = field(init=False)

    def __post_init__(self) -> None:
        self.column, self.scale = self.spec.column, self.spec.scale
        self.counter, self.per_link = self.spec.counter, self.spec.per_link


@dataclass
class _Reader:
    """A plain NVML call feeding some columns; the first candidate that works at open is kept."""

    label: str
    candidates: list[Callable[[Any], dict[str, Any]]]
    fn: Callable[[Any], dict[str, Any]] | None = None
    nvml: str = ""  # the NVML function it calls, for what a power column is read from


@dataclass
class _Buffer:
    """The driver's buffered power samples of one GPU, as read so far."""

    last_seen_us: int = 0  # the newest driver stamp returned (NVML's lastSeenTimeStamp)
    offset_us: int = 0  # driver stamp + offset = CLOCK_REALTIME µs
    timestamps: str | None = None  # how the stamps were mapped (module doc); None before any sample
    depth: int | None = None  # the most samples one call returned
    period_us: float | None = None  # the spacing of the driver's samples
    lost: int = 0  # samples the ring overwrote before they were read (estimated from the gap)
    used: bool = True
    why_not: str | None = None


@dataclass
class _Gpu:
    index: int
    handle: Any
    info: DeviceInfo
    slots: list[_Slot] = field(default_factory=list)
    field_ids: list[tuple[int, int]] = field(default_factory=list)  # the slots' (fieldId, scopeId), once
    readers: list[_Reader] = field(default_factory=list)
    lost: bool = False  # NVML said "GPU is lost": no more calls on this handle
    failing: bool = False  # the last sample had no successful read at all
    logged: set[str] = field(default_factory=set)  # reads whose error was already recorded
    periods: dict[str, tuple[float | None, str | None]] = field(default_factory=dict)  # column → probed
    power_prev: float | None = None  # the previous poll's power_w
    power_seen_ns: int | None = None  # the poll that first showed the current power_w value
    power_period_ns: int | None = None  # power_w's probed update period
    buffer: _Buffer | None = None  # None: the driver's buffer is not offered


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise BackendUnavailable(
            f"NVIDIA: nvidia-ml-py is not installed ({exc.__class__.__name__}); {_INSTEAD} "
            "(pip install nvidia-ml-py on GPU nodes)"
        ) from None
    except Exception as exc:  # a broken install must not stop the host measurement
        raise BackendUnavailable(f"NVIDIA: importing nvidia-ml-py failed ({exc!r}); {_INSTEAD}") from None
    return pynvml


class NvidiaBackend(Backend):
    """Telemetry of every NVIDIA GPU on this node.

    Args:
        nvml: the NVML binding to use; by default the real ``pynvml`` module of nvidia-ml-py.
            Tests pass a stand-in with the same names here, the one place one is injected.
        probe_s: the longest the update-period probe at open polls (0: no probe, periods unknown).
        clock_ns, sleep: the wall clock rows are stamped with and the probe's sleep; a test with a
            stand-in on a fake clock passes that clock's, so nothing waits for real time.
    """

    name = "nvidia"

    def __init__(self, nvml: Any | None = None, *, probe_s: float = PROBE_S,
                 clock_ns: Callable[[], int] = time.time_ns, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self.notes: list[str] = []
        self._clock_ns, self._sleep = clock_ns, sleep
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._error = getattr(self._nvml, "NVMLError", Exception)
        self._init()
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self._shutdown()
            raise BackendUnavailable(f"NVIDIA: NVML could not count GPUs ({_err(exc)}); {_INSTEAD}") from None
        self._read_software()
        if count == 0:
            self._shutdown()
            driver = self.software.get("nvidia_driver")
            raise BackendUnavailable(
                f"NVIDIA: driver {driver or '(version unknown)'} found but no NVIDIA GPU is visible; {_INSTEAD}"
            )
        self._gpus: list[_Gpu] = []
        for i in range(count):
            try:
                self._gpus.append(self._open_gpu(i))
            except Exception as exc:
                self.notes.append(f"NVIDIA: gpu{i} could not be opened ({_err(exc)}); it is not sampled")
        if not self._gpus:
            self._shutdown()
            raise BackendUnavailable(f"NVIDIA: none of the {count} GPU(s) could be opened; {_INSTEAD}")
        self._probe_periods(probe_s)
        for gpu in self._gpus:
            self._open_buffer(gpu)
            self._describe_sensors(gpu)
        self._closed = False

    # -- opening ------------------------------------------------------------------------------
    def _init(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            cls = exc.__class__.__name__
            if cls == "NVMLError_LibraryNotFound":
                what = "no NVIDIA driver was found (NVML library not found)"
            elif cls == "NVMLError_DriverNotLoaded":
                what = "the NVIDIA driver is not loaded"
            elif cls == "NVMLError_NoPermission":
                what = "NVML refused access (insufficient permissions)"
            elif cls == "NVMLError_LibRmVersionMismatch":
                what = "the NVML library and the kernel driver versions differ (reboot or reload the driver)"
            else:
                what = f"NVML failed to initialise ({_err(exc)})"
            raise BackendUnavailable(f"NVIDIA: nvidia-ml-py is installed but {what}; {_INSTEAD}") from None

    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()

    def _read_software(self) -> None:
        nvml = self._nvml
        for key, fn in (
            ("nvidia_driver", "nvmlSystemGetDriverVersion"),
            ("nvml_version", "nvmlSystemGetNVMLVersion"),
            ("cuda_driver", "nvmlSystemGetCudaDriverVersion"),
        ):
            try:
                value = getattr(nvml, fn)()
            except Exception:
                continue
            if key == "cuda_driver" and isinstance(value, int):
                value = f"{value // 1000}.{value % 1000 // 10}"  # 12040 → "12.4"
            self.software[key] = _text(value)

    def _open_gpu(self, i: int) -> _Gpu:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        info = DeviceInfo(device=f"gpu{i}", kind="gpu", vendor="nvidia", index=i)
        info.name = _try(lambda: _text(nvml.nvmlDeviceGetName(handle)))
        info.uuid = _try(lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        info.pci_bus_id = _try(lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        info.properties = self._properties(handle)
        gpu = _Gpu(index=i, handle=handle, info=info)
        supported = self._probe_fields(gpu)
        supported |= self._probe_readers(gpu, exclude=supported)
        if "power_w" in supported:
            supported.add("power_repeat")  # derived from power_w at each poll (module doc)
        info.supported = [f for f in TELEMETRY_FIELDS if f in supported]
        return gpu

    def _properties(self, handle: Any) -> dict[str, Any]:
        nvml = self._nvml
        props: dict[str, Any] = {}

        def put(key: str, fn: Callable[[], Any]) -> None:
            value = _try(fn)
            if value is not None:
                props[key] = value

        put("clock_sm_max_mhz", lambda: float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)))
        put("clock_mem_max_mhz", lambda: float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)))
        put("power_limit_default_w", lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000.0)
        limits = _try(lambda: nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle))
        if limits is not None:
            props["power_limit_min_w"] = limits[0] / 1000.0
            props["power_limit_max_w"] = limits[1] / 1000.0
        put("power_limit_enforced_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
        put("mem_total_bytes", lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total))
        put("temp_slowdown_c", lambda: float(nvml.nvmlDeviceGetTemperatureThreshold(
            handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)))
        put("temp_shutdown_c", lambda: float(nvml.nvmlDeviceGetTemperatureThreshold(
            handle, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)))
        cc = _try(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
        if cc is not None:
            props["compute_capability"] = f"{cc[0]}.{cc[1]}"
        return props

    def _probe_fields(self, gpu: _Gpu) -> set[str]:
        """Read every candidate field once; keep the slots that returned a value."""
        nvml = self._nvml
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        candidates: list[_Slot] = []
        for spec in _FIELDS:
            field_id = getattr(nvml, spec.const, None)
            if field_id is None:  # an nvidia-ml-py too old to know the field
                continue
            scopes = range(max_links) if spec.per_link else [spec.scope]
            candidates += [_Slot(spec, int(field_id), s) for s in scopes]
        if not candidates or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return set()
        try:
            values = nvml.nvmlDeviceGetFieldValues(gpu.handle, [(s.field_id, s.scope) for s in candidates])
        except Exception as exc:
            self.notes.append(f"NVIDIA: gpu{gpu.index}: batched field reads unavailable ({_err(exc)})")
            return set()
        success = int(getattr(nvml, "NVML_SUCCESS", 0))
        kept: list[_Slot] = []
        odd: dict[str, int] = {}  # column → an unexpected return code at the probe
        for slot, value in zip(candidates, values, strict=True):
            ret = int(value.nvmlReturn)
            if ret == success and self._decode(value) is not None:
                kept.append(slot)
            elif ret not in _NOT_OFFERED:
                odd.setdefault(slot.spec.column, ret)
        gpu.slots = kept
        gpu.field_ids = [(s.field_id, s.scope) for s in kept]
        for col, ret in odd.items():
            if col not in {s.spec.column for s in kept}:  # not offered ≠ failed: say which it was
                self.notes.append(f"NVIDIA: gpu{gpu.index}: {col} not read (NVML returned code {ret} at open)")
        links = sorted({s.scope for s in kept if s.spec.per_link})
        if links:
            gpu.info.properties["nvlink_links"] = len(links)
        return {s.spec.column for s in kept}

    def _probe_readers(self, gpu: _Gpu, exclude: set[str]) -> set[str]:
        """Try the plain-call reads once; keep each one's first variant that returns a value."""
        supported: set[str] = set()
        for reader in self._readers(exclude):
            for fn in reader.candidates:
                try:
                    values = fn(gpu.handle)
                except Exception:
                    continue
                got = {k for k, v in values.items() if v is not None}
                if got:
                    reader.fn = fn
                    supported |= got
                    gpu.readers.append(reader)
                    break
        return supported

    def _readers(self, exclude: set[str]) -> list[_Reader]:
        nvml = self._nvml

        def has(name: str) -> bool:
            return hasattr(nvml, name)

        readers: list[_Reader] = []
        temp_fns = []
        if has("nvmlDeviceGetTemperatureV"):
            temp_fns.append(lambda h: {"temp_c": float(nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU))})
        if has("nvmlDeviceGetTemperature"):
            temp_fns.append(lambda h: {"temp_c": float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))})
        readers.append(_Reader("temp_c", temp_fns))
        readers.append(_Reader("clock_sm_mhz", [
            lambda h: {"clock_sm_mhz": float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))}]))
        readers.append(_Reader("clock_mem_mhz", [
            lambda h: {"clock_mem_mhz": float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))}]))

        def util(h: Any) -> dict[str, Any]:
            u = nvml.nvmlDeviceGetUtilizationRates(h)
            return {"util_pct": float(u.gpu), "util_mem_pct": float(u.memory)}

        readers.append(_Reader("util_pct", [util]))
        readers.append(_Reader("mem_used_bytes", [
            lambda h: {"mem_used_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).used)}]))
        reason_fns = [
            getattr(nvml, name) for name in
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons") if has(name)
        ]

        def throttle(f: Callable[[Any], Any]) -> Callable[[Any], dict[str, Any]]:
            return lambda h: {"throttle": throttle_from_nvml(f(h))}

        readers.append(_Reader("throttle", [throttle(f) for f in reason_fns]))
        readers.append(_Reader("fan_pct", [lambda h: {"fan_pct": float(nvml.nvmlDeviceGetFanSpeed(h))}]))
        # Plain-call fallbacks for fields a driver does not offer as field values.
        if "power_avg_w" not in exclude:
            # On Ampere and newer this is the 1 s average; on older GPUs the driver's own short average.
            readers.append(_Reader("power_avg_w", [
                lambda h: {"power_avg_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0}], nvml="nvmlDeviceGetPowerUsage"))
        if "energy_j" not in exclude:
            energy_unwrap = Unwrapper(None)
            readers.append(_Reader("energy_j", [
                lambda h: {"energy_j": energy_unwrap(nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)}],
                nvml="nvmlDeviceGetTotalEnergyConsumption"))
        if "power_limit_w" not in exclude:
            readers.append(_Reader("power_limit_w", [
                lambda h: {"power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}]))
        return readers

    # -- what each power reading is: update periods, the driver's buffer ---------------------------
    def _read_power(self, gpu: _Gpu, slots: list[_Slot]) -> dict[str, Any]:
        """The raw power readings of ``gpu`` now (column → value), for the probe."""
        out: dict[str, Any] = {}
        if slots:
            success = int(getattr(self._nvml, "NVML_SUCCESS", 0))
            values = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, [(s.field_id, s.scope) for s in slots])
            for slot, value in zip(slots, values, strict=True):
                if int(value.nvmlReturn) == success:
                    out[slot.spec.column] = self._decode(value)
        for reader in gpu.readers:
            if reader.label in POWER_COLUMNS and reader.fn is not None:
                out.update(reader.fn(gpu.handle))
        return out

    def _probe_periods(self, probe_s: float) -> None:
        """Poll the power readings of every GPU for at most ``probe_s``; each one's update period is the
        median time between its changes (module doc). All GPUs share one probe, so it costs
        ``probe_s`` at most whatever their number."""
        if probe_s <= 0:
            return
        slots = {g.index: [s for s in g.slots if s.spec.column in POWER_COLUMNS] for g in self._gpus}
        last: dict[tuple[int, str], Any] = {}
        changes: dict[tuple[int, str], list[int]] = {}
        t0 = self._clock_ns()
        polls = 0
        while True:
            for gpu in self._gpus:
                try:
                    values = self._read_power(gpu, slots[gpu.index])
                except Exception:
                    continue  # a failing read is the sampling loop's to report, not the probe's
                now = self._clock_ns()
                for col, v in values.items():
                    key = (gpu.index, col)
                    if key in last and v != last[key]:
                        changes.setdefault(key, []).append(now)
                    last[key] = v
            polls += 1
            done = bool(last) and all(len(changes.get(k, ())) >= _PROBE_CHANGES for k in last)
            if done or self._clock_ns() - t0 >= probe_s * 1e9:
                break
            self._sleep(_PROBE_POLL_S)
        poll_ns = (self._clock_ns() - t0) / max(polls, 1)
        for gpu in self._gpus:
            for col in POWER_COLUMNS:
                ts = changes.get((gpu.index, col), [])
                if len(ts) < 2:
                    gpu.periods[col] = (None, None)
                    continue
                med = _period(ts)
                gpu.periods[col] = (round(med / 1e9, 6), "probe_limit" if med <= 1.5 * poll_ns else "probe")
        log.debug("update periods probed in %d polls: %s", polls, {g.info.device: g.periods for g in self._gpus})

    def _open_buffer(self, gpu: _Gpu) -> None:
        """Whether the driver's buffer of power samples answers; its depth and sample spacing if it does."""
        nvml = self._nvml
        const = getattr(nvml, "NVML_TOTAL_POWER_SAMPLES", None)
        if const is None or not hasattr(nvml, "nvmlDeviceGetSamples"):
            gpu.info.properties["power_buffer"] = _buffer_props(None, "this nvidia-ml-py has no nvmlDeviceGetSamples")
            return
        try:
            _, samples = nvml.nvmlDeviceGetSamples(gpu.handle, const, 0)
        except Exception as exc:
            if _code(exc) != _NOT_FOUND:  # NOT_FOUND: offered, but empty yet
                gpu.info.properties["power_buffer"] = _buffer_props(None, f"NVML: {_err(exc)}")
                return
            samples = []
        buf = gpu.buffer = _Buffer()
        stamps = sorted(int(x.timeStamp) for x in samples)
        if stamps:
            buf.depth = len(stamps)
            buf.last_seen_us = stamps[-1]  # what the driver held before the run is not the run's
            self._map_buffer_clock(buf, stamps[-1])
        if len(stamps) >= 2:
            buf.period_us = statistics.median(b - a for a, b in itertools.pairwise(stamps))
        gpu.info.properties["power_buffer"] = _buffer_props(buf, None)

    def _map_buffer_clock(self, buf: _Buffer, newest_us: int) -> None:
        """How the driver's stamps map onto CLOCK_REALTIME (module doc), from the newest one's age now."""
        age = self._clock_ns() // 1000 - newest_us
        if _BUFFER_AGE_US[0] <= age <= _BUFFER_AGE_US[1]:
            buf.offset_us, buf.timestamps = 0, "CLOCK_REALTIME µs (NVML's CPU timestamp, read as the rows' clock)"
        else:
            buf.offset_us = age
            buf.timestamps = (f"not CLOCK_REALTIME: shifted by {age / 1e6:+.3f} s, the newest stamp's distance "
                              "from CLOCK_REALTIME at the first read (error up to one buffer period)")

    def _describe_sensors(self, gpu: _Gpu) -> None:
        """``properties["sensors"]``: what each power column is (sensor_facts module doc)."""
        name, cc = gpu.info.name, gpu.info.properties.get("compute_capability")
        sources = {s.spec.column: s.spec.const for s in gpu.slots if s.spec.column in POWER_COLUMNS}
        sources |= {r.label: r.nvml for r in gpu.readers if r.label in POWER_COLUMNS and r.label not in sources}
        sensors: dict[str, Any] = {}
        for col in POWER_COLUMNS:
            if col in sources:
                period, how = gpu.periods.get(col, (None, None))
                sensors[col] = sensor_facts.describe(sources[col], name, cc, path="polled",
                                                     update_period_s=period, period_from=how)
        gpu.info.properties["sensors"] = sensors
        period = sensors.get("power_w", {}).get("update_period_s")
        gpu.power_period_ns = round(period * 1e9) if period else None
        self._sync_buffer(gpu)

    def _sync_buffer(self, gpu: _Gpu) -> None:
        """Bring the buffer's entries of ``properties`` up to date (depth and spacing grow as it is read)."""
        buf = gpu.buffer
        if buf is None:
            return
        props = gpu.info.properties
        props["power_buffer"] = _buffer_props(buf, buf.why_not)
        sensors = props.setdefault("sensors", {})
        if buf.used:
            period = round(buf.period_us / 1e6, 6) if buf.period_us else None
            sensors[sensor_facts.BUFFER_KEY] = sensor_facts.describe(
                "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)", gpu.info.name,
                props.get("compute_capability"), path="buffer", update_period_s=period,
                period_from="buffer_timestamps" if period else None)
        else:
            sensors.pop(sensor_facts.BUFFER_KEY, None)

    def set_power_buffer(self, enabled: bool) -> bool:
        used = False
        for gpu in self._gpus:
            if gpu.buffer is not None:
                gpu.buffer.used = enabled
                gpu.buffer.why_not = None if enabled else "turned off (the sampler's power_buffer=False)"
                used |= enabled
                self._sync_buffer(gpu)
        return used

    def power_samples(self, host: str) -> list[dict[str, Any]]:
        """The driver's power samples since the previous call, every GPU whose buffer is used (module doc)."""
        rows: list[dict[str, Any]] = []
        for gpu in self._gpus:
            if gpu.buffer is not None and gpu.buffer.used and not gpu.lost:
                rows += self._read_buffer(gpu, gpu.buffer, host)
        return rows

    def _read_buffer(self, gpu: _Gpu, buf: _Buffer, host: str) -> list[dict[str, Any]]:
        ask, newest_ok = buf.last_seen_us, None
        if buf.timestamps is not None:
            since = self._clock_ns() // 1000 - buf.offset_us - buf.last_seen_us  # on the driver's stamps
            if buf.period_us and _BUFFER_AGE_US[0] <= since < buf.period_us:
                return []  # no driver sample can be due yet: save the call (polling faster than it samples)
            if buf.offset_us == 0:  # stamps on CLOCK_REALTIME (module doc)
                newest_ok = buf.last_seen_us + since - _BUFFER_AGE_US[0]  # later: taken before a step back
                if since < _BUFFER_AGE_US[0]:
                    ask = 0  # the clock stepped back past what was read: NVML would hide what follows
        try:
            vtype, samples = self._nvml.nvmlDeviceGetSamples(gpu.handle, self._nvml.NVML_TOTAL_POWER_SAMPLES, ask)
        except Exception as exc:
            if _code(exc) != _NOT_FOUND and "power buffer" not in gpu.logged:  # NOT_FOUND: nothing new
                gpu.logged.add("power buffer")
                self.incident(gpu.info.device, f"{gpu.info.device}: reading the driver's power buffer failed "
                                               f"({_err(exc)}); further failures of this read are not logged")
            return []
        member = _VALUE_MEMBER.get(int(vtype), ("uiVal", None))[0]
        new = sorted((int(x.timeStamp), getattr(x.sampleValue, member, None)) for x in samples
                     if int(x.timeStamp) > ask and (newest_ok is None or int(x.timeStamp) <= newest_ok))
        if not new:
            return []
        if buf.timestamps is None:
            self._map_buffer_clock(buf, new[-1][0])
        if buf.period_us is None and len(new) >= 2:
            buf.period_us = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(new))
        self._check_overrun(gpu, buf, new[0][0], len(samples))
        buf.depth = max(buf.depth or 0, len(samples))
        buf.last_seen_us = new[-1][0]
        dev = gpu.info.device
        return [{"t_ns": (ts + buf.offset_us) * 1000, "host": host, "device": dev,
                 "power_w": float(v) * 1e-3 if v is not None else None} for ts, v in new]

    def _check_overrun(self, gpu: _Gpu, buf: _Buffer, oldest_new_us: int, returned: int) -> None:
        """A full ring whose oldest sample is more than a period after the last one read: the driver
        overwrote samples before this read (the sampler read it less often than depth × period)."""
        if not (buf.last_seen_us and buf.period_us and buf.depth and returned >= buf.depth):
            return
        gap = oldest_new_us - buf.last_seen_us
        if gap <= 1.5 * buf.period_us:
            return
        lost = round(gap / buf.period_us) - 1
        buf.lost += lost
        if "power buffer overrun" not in gpu.logged:
            gpu.logged.add("power buffer overrun")
            self.incident(gpu.info.device, f"{gpu.info.device}: the driver's power buffer overran between two "
                                           f"reads (~{lost} samples lost); later losses are counted in "
                                           "power_buffer.samples_lost")

    # -- sampling -----------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        for gpu in self._gpus:
            self._sync_buffer(gpu)
        return [g.info for g in self._gpus]

    def sample(self, host: str) -> list[dict[str, Any]]:
        if self._closed:
            raise RuntimeError(f"the {self.name} backend is closed")
        return [self._sample_gpu(g, host) for g in self._gpus]

    def _decode(self, value: Any) -> float | int | None:
        member, _ = _VALUE_MEMBER.get(int(value.valueType), ("ullVal", None))
        return getattr(value.value, member, None)

    def _sample_gpu(self, gpu: _Gpu, host: str) -> dict[str, Any]:
        row = empty_telemetry_row(self._clock_ns(), host, gpu.info.device)
        if gpu.lost:
            return row
        errors: dict[str, str] = {}  # read label → error text
        lost = False
        ok = 0
        if gpu.slots:
            try:
                values = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, gpu.field_ids)
            except Exception as exc:
                errors["field values"] = _err(exc)
                lost |= _is_lost(exc)
            else:
                read, field_lost = self._apply_fields(gpu, values, row, errors)
                ok += read
                lost |= field_lost
        for reader in gpu.readers:
            assert reader.fn is not None
            try:
                values = reader.fn(gpu.handle)
            except Exception as exc:
                errors[reader.label] = _err(exc)
                lost |= _is_lost(exc)
                continue
            ok += 1
            for key, v in values.items():
                row[key] = int(v) if key in _INT_COLUMNS and v is not None else v
        self._account(gpu, row, errors, ok, lost)
        self._mark_repeat(gpu, row)
        return row

    def _mark_repeat(self, gpu: _Gpu, row: dict[str, Any]) -> None:
        """``power_repeat`` of this row (the rule is in the module doc)."""
        v, t = row["power_w"], int(row["t_ns"])
        if v is None:
            gpu.power_prev = gpu.power_seen_ns = None
            return
        if gpu.power_prev is not None and v == gpu.power_prev and gpu.power_seen_ns is not None:
            if gpu.power_period_ns is None:
                row["power_repeat"] = None  # equal, and no measured period to say whether it was refreshed
                return
            if t - gpu.power_seen_ns < gpu.power_period_ns:
                row["power_repeat"] = True
                return
        row["power_repeat"] = False
        gpu.power_prev, gpu.power_seen_ns = v, t

    def _apply_fields(self, gpu: _Gpu, values: Any, row: dict[str, Any], errors: dict[str, str]
                      ) -> tuple[int, bool]:
        """Decode one batched read into ``row``: (values read, whether NVML said the GPU is lost)."""
        success = int(getattr(self._nvml, "NVML_SUCCESS", 0))
        sums: dict[str, float | None] = {}
        ok, lost = 0, False
        for slot, value in zip(gpu.slots, values, strict=True):
            col = slot.column
            code = value.nvmlReturn  # ctypes c_uint fields read as int
            raw = None
            if code == success:
                vtype = value.valueType
                if vtype != slot.vtype:
                    slot.vtype, slot.member = vtype, _VALUE_MEMBER.get(int(vtype), ("ullVal", None))[0]
                raw = getattr(value.value, slot.member, None)
            if raw is None:
                lost |= code == _GPU_IS_LOST
                errors[col] = f"NVML return code {int(code)}"
                sums[col] = None  # a partial link sum would be a wrong total: the column is unknown
                continue
            ok += 1
            if slot.counter:
                if slot.unwrap is None:
                    slot.unwrap = Unwrapper(_VALUE_MEMBER.get(int(value.valueType), ("", None))[1])
                raw = slot.unwrap(raw)
                assert raw is not None  # a value in, a value out: only None un-wraps to None
            scaled = raw * slot.scale
            if not slot.per_link or col not in sums:
                sums[col] = scaled
            elif (total := sums[col]) is not None:
                sums[col] = total + scaled
        for col, v in sums.items():
            row[col] = round(v) if v is not None and col in _INT_COLUMNS else v
        return ok, lost

    def _account(self, gpu: _Gpu, row: dict[str, Any], errors: dict[str, str], ok: int, lost: bool) -> None:
        """Turn read errors into incidents: one per GPU failure, one per field that starts failing."""
        name = gpu.info.device
        if lost or (errors and ok == 0):
            for key in TELEMETRY_FIELDS:  # nothing half-read survives on a failed row
                row[key] = None
            if lost:
                gpu.lost = True
                self.incident(name, f"{name} is lost (NVML: GPU is lost); its rows are null from now on "
                                    f"[{'; '.join(f'{k}: {v}' for k, v in errors.items())}]")
            elif not gpu.failing:
                first = next(iter(errors.items()))
                self.incident(name, f"every NVML read of {name} failed ({first[0]}: {first[1]}); "
                                    "its rows are null until it answers again")
            gpu.failing = True
            return
        if gpu.failing:
            self.incident(name, f"{name} answers NVML reads again")
            gpu.failing = False
        for label, text in errors.items():
            if label not in gpu.logged:
                gpu.logged.add(label)
                self.incident(name, f"{name}: reading {label} failed ({text}); null where it fails "
                                    "(further failures of this read are not logged)")

    def close(self) -> None:
        """Release the library; :meth:`devices` still answers (run metadata is written after close)."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._shutdown()


_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
# Field return codes that mean "this GPU/driver does not offer it" (INVALID_ARGUMENT: a link index
# beyond the GPU's links, or a field id the driver predates), as opposed to a read that failed.
_NOT_OFFERED = {2, 3, 13}  # NVML_ERROR_INVALID_ARGUMENT, _NOT_SUPPORTED, _FUNCTION_NOT_FOUND


_NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: nvmlDeviceGetSamples has nothing newer than lastSeenTimeStamp


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _period(changes_ns: list[int]) -> float:
    """The update period from the times a value was seen to change: the median of the shortest intervals
    (within 1.5 × the shortest). A refresh that read the same value again makes an interval of two or
    more periods, which a plain median would take for the period."""
    gaps = [b - a for a, b in itertools.pairwise(changes_ns)]
    shortest = min(gaps)
    return float(statistics.median(g for g in gaps if g <= 1.5 * shortest))


def _buffer_props(buf: _Buffer | None, why_not: str | None) -> dict[str, Any]:
    """``properties["power_buffer"]`` (module doc)."""
    return {
        "used": buf is not None and buf.used,
        "depth": buf.depth if buf is not None else None,
        "update_period_s": round(buf.period_us / 1e6, 6) if buf is not None and buf.period_us else None,
        "timestamps": buf.timestamps if buf is not None else None,
        "samples_lost": buf.lost if buf is not None else 0,
        "why_not": why_not,
    }


def _is_lost(exc: BaseException) -> bool:
    return getattr(exc, "value", None) == _GPU_IS_LOST or exc.__class__.__name__ == "NVMLError_GpuIsLost"


def _err(exc: BaseException) -> str:
    """A short, single-line description of a vendor exception."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    text = " ".join(text.split())
    return text or exc.__class__.__name__


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None
