"""AMD GPU telemetry through AMD SMI (the ``amdsmi`` Python package that ships with ROCm).

One row per GPU per sample, labelled ``gpu<i>`` in ``amdsmi_get_processor_handles`` order. What is
read, with the units the amdsmi 7.x headers document:

- ``power_w`` / ``power_avg_w``: ``amdsmi_get_power_info`` current_socket_power (MI300 and newer) /
  average_socket_power (MI200, Navi), W;
- ``energy_j``: ``amdsmi_get_energy_count`` energy_accumulator × counter_resolution (µJ), → J,
  held cumulative across resets;
- ``temp_c`` / ``temp_hotspot_c`` / ``temp_mem_c``: ``amdsmi_get_temp_metric`` EDGE / HOTSPOT
  (= junction) / VRAM, CURRENT, °C;
- ``clock_sm_mhz`` / ``clock_mem_mhz``: ``amdsmi_get_clock_info`` GFX / MEM ``clk``, MHz;
- ``util_pct`` / ``util_mem_pct``: ``amdsmi_get_gpu_activity`` gfx / umc, %;
- ``mem_used_bytes``: ``amdsmi_get_gpu_memory_usage(VRAM)``, bytes (``amdsmi_get_gpu_vram_usage``
  in MiB as a fallback);
- ``power_limit_w``: ``amdsmi_get_power_cap_info`` power_cap, µW → W;
- ``throttle``: ``amdsmi_get_violation_status`` active_* flags (MI300 and newer), else the
  gpu-metrics ``throttle_status`` flag (→ OTHER);
- ``link_tx_bytes`` / ``link_rx_bytes``: gpu-metrics ``xgmi_write_data_acc`` / ``xgmi_read_data_acc``
  (KB per link, taken as 1024 bytes), summed over the links present;
- ``fan_pct``: ``amdsmi_get_gpu_fan_speed`` over ``amdsmi_get_gpu_fan_speed_max`` (0–255 scale), %.

Not measured, on purpose: ``pcie_tx_bytes`` / ``pcie_rx_bytes``. AMD SMI's only byte counts
(``amdsmi_get_gpu_pci_throughput``) block for a one-second window, and the gpu-metrics
``pcie_bandwidth_acc`` accumulates GB/s samples over an undocumented period, so neither gives bytes
without inventing a number. The Python binding also reduces the gpu-metrics throttle bit masks to
a single flag, so without violation status a throttled GPU reads as ``OTHER``.

amdsmi reports an unsupported value as the string ``"N/A"`` (or raises ``AMDSMI_STATUS_NOT_SUPPORTED``);
both become null. Every read is probed once at open and dropped from the loop when it gives nothing.
A GPU whose every read fails gets null rows and one incident (and one more when it answers again).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powertrain.core.counters import Unwrapper
from powertrain.schema import TELEMETRY_FIELDS, Throttle, empty_telemetry_row
from powertrain.telemetry.backend import Backend, BackendUnavailable, DeviceInfo

_INSTEAD = "AMD GPU power/temperature/clocks not measured — using host counters only"
_MAX_SENTINELS = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)  # amdsmi's "no value" markers
_DRIVER_NOT_LOADED = 34  # AMDSMI_STATUS_DRIVER_NOT_LOADED

# amdsmi_get_violation_status "active_*" flags → vendor-neutral bits
_VIOLATIONS: dict[str, Throttle] = {
    "active_ppt_pwr": Throttle.POWER_CAP,  # package power tracking limit
    "active_socket_thrm": Throttle.THERMAL_SW,  # socket thermal limit (firmware-enforced)
    "active_hbm_thrm": Throttle.THERMAL_SW,  # memory thermal limit
    "active_vr_thrm": Throttle.THERMAL_SW,  # voltage-regulator thermal limit
    "active_prochot_thrm": Throttle.THERMAL_HW,  # PROCHOT: hardware thermal signal
}


def _num(value: Any) -> float | None:
    """An amdsmi value as a number, or None for "N/A", missing or a max-int sentinel."""
    if value is None or isinstance(value, str | bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if v in _MAX_SENTINELS else v


def throttle_from_violations(status: dict[str, Any]) -> int | None:
    """Map an ``amdsmi_get_violation_status`` dict onto Throttle bits (None if it says nothing)."""
    out = Throttle(0)
    known = False
    for key, bit in _VIOLATIONS.items():
        v = status.get(key)
        if isinstance(v, bool):
            known = True
            if v:
                out |= bit
    low = [v for v in _flat(status.get("active_low_utilization")) if isinstance(v, bool)]
    if low:
        known = True
        if any(low):
            out |= Throttle.IDLE
    below = status.get("active_gfx_clk_below_host_limit")
    if isinstance(below, bool):
        known = True
        # Clocks below the host limit for a reason none of the flags above names.
        if below and not out:
            out |= Throttle.OTHER
    return int(out) if known else None


@dataclass
class _Reader:
    label: str
    candidates: list[Callable[[Any], dict[str, Any]]]
    fn: Callable[[Any], dict[str, Any]] | None = None


@dataclass
class _Gpu:
    index: int
    handle: Any
    info: DeviceInfo
    readers: list[_Reader] = field(default_factory=list)
    failing: bool = False
    logged: set[str] = field(default_factory=set)


def _import_amdsmi() -> Any:
    try:
        import amdsmi
    except ModuleNotFoundError as exc:
        if exc.name != "amdsmi":
            raise BackendUnavailable(f"AMD: amdsmi is installed but a module it needs is missing ({exc}); "
                                     f"{_INSTEAD}") from None
        raise BackendUnavailable(f"AMD: amdsmi is not installed; {_INSTEAD} (it ships with ROCm)") from None
    except KeyError as exc:
        # amdsmi 6.x/7.x raise KeyError('libamd_smi.so') at import when the ROCm library is absent.
        raise BackendUnavailable(
            f"AMD: amdsmi is installed but the ROCm library {exc.args[0] if exc.args else ''} was not found "
            f"(no ROCm on this node); {_INSTEAD}"
        ) from None
    except Exception as exc:
        raise BackendUnavailable(f"AMD: importing amdsmi failed ({_err(exc)}); {_INSTEAD}") from None
    return amdsmi


class AmdBackend(Backend):
    """Telemetry of every AMD GPU on this node.

    Args:
        amdsmi: the AMD SMI binding to use; by default the real ``amdsmi`` package. Tests pass a
            stand-in with the same names here, the one place one is injected.
    """

    name = "amd"

    def __init__(self, amdsmi: Any | None = None) -> None:
        super().__init__()
        self.notes: list[str] = [
            "AMD: PCIe byte counters are not measured (amdsmi offers them only through a blocking 1 s read)"
        ]
        self._smi = amdsmi if amdsmi is not None else _import_amdsmi()
        smi = self._smi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except Exception as exc:
            if getattr(exc, "err_code", None) == _DRIVER_NOT_LOADED:
                what = "the amdgpu driver is not loaded"
            else:
                what = f"amdsmi_init failed ({_err(exc)})"
            raise BackendUnavailable(f"AMD: amdsmi is installed but {what}; {_INSTEAD}") from None
        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except Exception as exc:
            self._shutdown()
            raise BackendUnavailable(f"AMD: amdsmi found no AMD GPU ({_err(exc)}); {_INSTEAD}") from None
        if not handles:
            self._shutdown()
            raise BackendUnavailable(f"AMD: amdsmi works but no AMD GPU is visible; {_INSTEAD}")
        self._read_software(handles[0])
        self._gpus: list[_Gpu] = []
        for i, h in enumerate(handles):
            try:
                self._gpus.append(self._open_gpu(i, h))
            except Exception as exc:
                self.notes.append(f"AMD: gpu{i} could not be opened ({_err(exc)}); it is not sampled")
        if not self._gpus:
            self._shutdown()
            raise BackendUnavailable(f"AMD: none of the {len(handles)} GPU(s) could be opened; {_INSTEAD}")
        self._closed = False

    # -- opening ------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._smi.amdsmi_shut_down()

    def _read_software(self, h: Any) -> None:
        smi = self._smi
        lib = _try(smi.amdsmi_get_lib_version)
        if isinstance(lib, dict):
            self.software["amdsmi_lib"] = ".".join(str(lib.get(k)) for k in ("major", "minor", "release"))
        drv = _try(lambda: smi.amdsmi_get_gpu_driver_info(h))
        if isinstance(drv, dict) and drv.get("driver_version") not in (None, "N/A"):
            self.software["amdgpu_driver"] = f"{drv.get('driver_name', 'amdgpu')} {drv['driver_version']}"
        rocm = _try(smi.amdsmi_get_rocm_version) if hasattr(smi, "amdsmi_get_rocm_version") else None
        if isinstance(rocm, tuple) and len(rocm) == 2 and rocm[0]:
            self.software["rocm"] = str(rocm[1])

    def _open_gpu(self, i: int, h: Any) -> _Gpu:
        smi = self._smi
        info = DeviceInfo(device=f"gpu{i}", kind="gpu", vendor="amd", index=i)
        asic = _try(lambda: smi.amdsmi_get_gpu_asic_info(h)) or {}
        name = asic.get("market_name")
        info.name = name if name not in (None, "N/A") else None
        info.uuid = _try(lambda: smi.amdsmi_get_gpu_device_uuid(h))
        info.pci_bus_id = _try(lambda: smi.amdsmi_get_gpu_device_bdf(h))
        info.properties = self._properties(h)
        gpu = _Gpu(index=i, handle=h, info=info)
        supported: set[str] = set()
        for reader in self._readers(h, info.properties):
            for fn in reader.candidates:
                try:
                    values = fn(h)
                except Exception:
                    continue
                got = {k for k, v in values.items() if v is not None}
                if got:
                    reader.fn = fn
                    supported |= got
                    gpu.readers.append(reader)
                    break
        info.supported = [f for f in TELEMETRY_FIELDS if f in supported]
        return gpu

    def _properties(self, h: Any) -> dict[str, Any]:
        smi = self._smi
        props: dict[str, Any] = {}
        for key, clk in (("clock_sm_max_mhz", smi.AmdSmiClkType.GFX), ("clock_mem_max_mhz", smi.AmdSmiClkType.MEM)):
            v = _num((_try(functools.partial(smi.amdsmi_get_clock_info, h, clk)) or {}).get("max_clk"))
            if v is not None:
                props[key] = v
        cap = _try(lambda: smi.amdsmi_get_power_cap_info(h)) or {}
        for key, src in (("power_limit_default_w", "default_power_cap"), ("power_limit_min_w", "min_power_cap"),
                         ("power_limit_max_w", "max_power_cap")):
            v = _num(cap.get(src))
            if v is not None:
                props[key] = v / 1e6  # µW on Linux bare metal
        total = _try(lambda: smi.amdsmi_get_gpu_memory_total(h, smi.AmdSmiMemoryType.VRAM))
        if _num(total) is not None:
            props["mem_total_bytes"] = int(total)
        crit = _num(_try(lambda: smi.amdsmi_get_temp_metric(
            h, smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CRITICAL)))
        if crit is not None:
            props["temp_hotspot_critical_c"] = crit
        fan_max = _num(_try(lambda: smi.amdsmi_get_gpu_fan_speed_max(h, 0)))
        if fan_max:
            props["fan_max"] = fan_max
        return props

    def _readers(self, h: Any, props: dict[str, Any]) -> list[_Reader]:
        smi = self._smi
        readers: list[_Reader] = []

        def power(h: Any) -> dict[str, Any]:
            p = smi.amdsmi_get_power_info(h)
            return {"power_w": _num(p.get("current_socket_power")),
                    "power_avg_w": _num(p.get("average_socket_power"))}

        readers.append(_Reader("power", [power]))
        energy_unwrap = Unwrapper(None)  # 64-bit accumulator: a drop is a reset, not a wrap

        def energy(h: Any) -> dict[str, Any]:
            e = smi.amdsmi_get_energy_count(h)
            ticks, res = _num(e.get("energy_accumulator")), _num(e.get("counter_resolution"))
            if ticks is None or not res:
                return {"energy_j": None}
            total = energy_unwrap(ticks)
            return {"energy_j": None if total is None else total * res / 1e6}

        readers.append(_Reader("energy_j", [energy]))
        def temperature(col: str, sensor: Any) -> Callable[[Any], dict[str, Any]]:
            return lambda h: {col: _num(smi.amdsmi_get_temp_metric(h, sensor, smi.AmdSmiTemperatureMetric.CURRENT))}

        def clock(col: str, clk: Any) -> Callable[[Any], dict[str, Any]]:
            return lambda h: {col: _num(smi.amdsmi_get_clock_info(h, clk).get("clk"))}

        for col, sensor in (("temp_c", smi.AmdSmiTemperatureType.EDGE),
                            ("temp_hotspot_c", smi.AmdSmiTemperatureType.HOTSPOT),
                            ("temp_mem_c", smi.AmdSmiTemperatureType.VRAM)):
            readers.append(_Reader(col, [temperature(col, sensor)]))
        for col, clk in (("clock_sm_mhz", smi.AmdSmiClkType.GFX), ("clock_mem_mhz", smi.AmdSmiClkType.MEM)):
            readers.append(_Reader(col, [clock(col, clk)]))

        def activity(h: Any) -> dict[str, Any]:
            a = smi.amdsmi_get_gpu_activity(h)
            return {"util_pct": _num(a.get("gfx_activity")), "util_mem_pct": _num(a.get("umc_activity"))}

        readers.append(_Reader("util_pct", [activity]))

        def vram_bytes(h: Any) -> dict[str, Any]:
            v = _num(smi.amdsmi_get_gpu_memory_usage(h, smi.AmdSmiMemoryType.VRAM))
            return {"mem_used_bytes": None if v is None else int(v)}

        def vram_mb(h: Any) -> dict[str, Any]:
            v = _num(smi.amdsmi_get_gpu_vram_usage(h).get("vram_used"))
            return {"mem_used_bytes": None if v is None else int(v) * 2**20}

        readers.append(_Reader("mem_used_bytes", [vram_bytes, vram_mb]))
        readers.append(_Reader("power_limit_w", [
            lambda h: {"power_limit_w": _scaled(smi.amdsmi_get_power_cap_info(h).get("power_cap"), 1e-6)}]))
        readers.append(_Reader("throttle", [
            lambda h: {"throttle": throttle_from_violations(smi.amdsmi_get_violation_status(h))},
            lambda h: {"throttle": _throttle_from_metrics(smi.amdsmi_get_gpu_metrics_info(h))}]))
        links = _LinkCounters()
        readers.append(_Reader("xgmi", [lambda h: links.read(smi.amdsmi_get_gpu_metrics_info(h))]))
        fan_max = props.get("fan_max")
        if fan_max:
            readers.append(_Reader("fan_pct", [
                lambda h: {"fan_pct": _scaled(smi.amdsmi_get_gpu_fan_speed(h, 0), 100.0 / fan_max)}]))
        return readers

    # -- sampling -----------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return [g.info for g in self._gpus]

    def sample(self, host: str) -> list[dict[str, Any]]:
        if self._closed:
            raise RuntimeError(f"the {self.name} backend is closed")
        return [self._sample_gpu(g, host) for g in self._gpus]

    def _sample_gpu(self, gpu: _Gpu, host: str) -> dict[str, Any]:
        row = empty_telemetry_row(time.time_ns(), host, gpu.info.device)
        errors: dict[str, str] = {}
        ok = 0
        for reader in gpu.readers:
            assert reader.fn is not None
            try:
                values = reader.fn(gpu.handle)
            except Exception as exc:
                errors[reader.label] = _err(exc)
                continue
            ok += 1
            row.update(values)
        name = gpu.info.device
        if errors and ok == 0:
            for key in TELEMETRY_FIELDS:
                row[key] = None
            if not gpu.failing:
                label, text = next(iter(errors.items()))
                self.incident(name, f"every amdsmi read of {name} failed ({label}: {text}); "
                                    "its rows are null until it answers again")
            gpu.failing = True
            return row
        if gpu.failing:
            self.incident(name, f"{name} answers amdsmi reads again")
            gpu.failing = False
        for label, text in errors.items():
            if label not in gpu.logged:
                gpu.logged.add(label)
                self.incident(name, f"{name}: reading {label} failed ({text}); null where it fails "
                                    "(further failures of this read are not logged)")
        return row

    def close(self) -> None:
        """Release the library; :meth:`devices` still answers (run metadata is written after close)."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._shutdown()


class _LinkCounters:
    """xGMI read/write accumulators (KB per link) → cumulative bytes summed over the links present."""

    def __init__(self) -> None:
        self.links: list[int] | None = None  # indices that gave a number on the first read
        self.unwrap: dict[tuple[str, int], Unwrapper] = {}

    def read(self, metrics: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for col, key in (("link_rx_bytes", "xgmi_read_data_acc"), ("link_tx_bytes", "xgmi_write_data_acc")):
            values = metrics.get(key)
            if not isinstance(values, list):
                out[col] = None
                continue
            if self.links is None:
                self.links = [i for i, v in enumerate(values) if _num(v) is not None]
            total = 0.0
            for i in self.links:
                v = _num(values[i]) if i < len(values) else None
                if v is None:  # a link that stopped answering: the sum would be wrong
                    total = float("nan")
                    break
                u = self.unwrap.setdefault((col, i), Unwrapper(None))
                total += float(u(v) or 0.0)
            out[col] = None if not self.links or total != total else round(total * 1024)
        return out


def _throttle_from_metrics(metrics: dict[str, Any]) -> int | None:
    """The gpu-metrics throttle flag (the Python binding returns it as a bool): set → OTHER."""
    flags = [metrics.get(k) for k in ("throttle_status", "indep_throttle_status")]
    flags = [f for f in flags if isinstance(f, bool)]
    if not flags:
        return None
    return int(Throttle.OTHER) if any(flags) else 0


def _flat(values: Any) -> list[Any]:
    """Flatten amdsmi's per-XCP (list of lists) values into one list."""
    if not isinstance(values, list):
        return []
    return [v for item in values for v in (item if isinstance(item, list) else [item])]


def _scaled(value: Any, factor: float) -> float | None:
    v = _num(value)
    return None if v is None else v * factor


def _err(exc: BaseException) -> str:
    """A short, single-line description of a vendor exception."""
    info = getattr(exc, "get_error_info", None)
    try:
        text = info(detailed=False) if callable(info) else str(exc)
    except Exception:
        text = str(exc)
    text = " ".join(str(text).split())
    return text or exc.__class__.__name__


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None
