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
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powertrain.core.counters import Unwrapper
from powertrain.core.throttle import throttle_from_nvml
from powertrain.schema import TELEMETRY_FIELDS, empty_telemetry_row
from powertrain.telemetry.backend import Backend, BackendUnavailable, DeviceInfo

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


@dataclass
class _Slot:
    """One (fieldId, scopeId) request of the batched read, and where its value goes."""

    spec: _FieldSpec
    field_id: int
    scope: int
    unwrap: Unwrapper | None = None


@dataclass
class _Reader:
    """A plain NVML call feeding some columns; the first candidate that works at open is kept."""

    label: str
    candidates: list[Callable[[Any], dict[str, Any]]]
    fn: Callable[[Any], dict[str, Any]] | None = None


@dataclass
class _Gpu:
    index: int
    handle: Any
    info: DeviceInfo
    slots: list[_Slot] = field(default_factory=list)
    readers: list[_Reader] = field(default_factory=list)
    lost: bool = False  # NVML said "GPU is lost": no more calls on this handle
    failing: bool = False  # the last sample had no successful read at all
    logged: set[str] = field(default_factory=set)  # reads whose error was already recorded


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
    """

    name = "nvidia"

    def __init__(self, nvml: Any | None = None) -> None:
        super().__init__()
        self.notes: list[str] = []
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
                lambda h: {"power_avg_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0}]))
        if "energy_j" not in exclude:
            energy_unwrap = Unwrapper(None)
            readers.append(_Reader("energy_j", [
                lambda h: {"energy_j": energy_unwrap(nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)}]))
        if "power_limit_w" not in exclude:
            readers.append(_Reader("power_limit_w", [
                lambda h: {"power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}]))
        return readers

    # -- sampling -----------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return [g.info for g in self._gpus]

    def sample(self, host: str) -> list[dict[str, Any]]:
        if self._closed:
            raise RuntimeError(f"the {self.name} backend is closed")
        return [self._sample_gpu(g, host) for g in self._gpus]

    def _decode(self, value: Any) -> float | int | None:
        member, _ = _VALUE_MEMBER.get(int(value.valueType), ("ullVal", None))
        return getattr(value.value, member, None)

    def _sample_gpu(self, gpu: _Gpu, host: str) -> dict[str, Any]:
        row = empty_telemetry_row(time.time_ns(), host, gpu.info.device)
        if gpu.lost:
            return row
        errors: dict[str, str] = {}  # read label → error text
        lost = False
        ok = 0
        if gpu.slots:
            try:
                values = self._nvml.nvmlDeviceGetFieldValues(
                    gpu.handle, [(s.field_id, s.scope) for s in gpu.slots])
            except Exception as exc:
                errors["field values"] = _err(exc)
                lost |= _is_lost(exc)
            else:
                ok += self._apply_fields(gpu, values, row, errors)
                lost |= any(int(v.nvmlReturn) == _GPU_IS_LOST for v in values)
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
        return row

    def _apply_fields(self, gpu: _Gpu, values: Any, row: dict[str, Any], errors: dict[str, str]) -> int:
        success = int(getattr(self._nvml, "NVML_SUCCESS", 0))
        sums: dict[str, float | None] = {}
        ok = 0
        for slot, value in zip(gpu.slots, values, strict=True):
            col = slot.spec.column
            raw = self._decode(value) if int(value.nvmlReturn) == success else None
            if raw is None:
                errors[col] = f"NVML return code {int(value.nvmlReturn)}"
                sums[col] = None  # a partial link sum would be a wrong total: the column is unknown
                continue
            ok += 1
            if slot.spec.counter:
                if slot.unwrap is None:
                    slot.unwrap = Unwrapper(_VALUE_MEMBER.get(int(value.valueType), ("", None))[1])
                raw = slot.unwrap(raw)
                assert raw is not None  # a value in, a value out: only None un-wraps to None
            scaled = float(raw) * slot.spec.scale
            if slot.spec.per_link:
                if col not in sums:
                    sums[col] = scaled
                elif (total := sums[col]) is not None:
                    sums[col] = total + scaled
            else:
                sums[col] = scaled
        for col, v in sums.items():
            if v is not None and col in _INT_COLUMNS:
                row[col] = round(v)
            else:
                row[col] = v
        return ok

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
