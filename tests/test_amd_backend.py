"""The AMD backend against a stand-in of amdsmi (tests/standins/fake_amdsmi.py), and the real import
failure on this machine without ROCm."""

from __future__ import annotations

import importlib.abc
import json
import sys
import threading
import time

import pytest

from powertrain.schema import TELEMETRY_FIELDS, Throttle
from powertrain.store import read_telemetry
from powertrain.telemetry.amd import AmdBackend, throttle_from_violations
from powertrain.telemetry.backend import BackendUnavailable
from powertrain.telemetry.sampler import Sampler
from standins import fake_amdsmi
from standins.fake_amdsmi import NA, FakeAmdGpu, FakeAmdSmi


def _backend(*gpus: FakeAmdGpu) -> tuple[AmdBackend, FakeAmdSmi]:
    smi = FakeAmdSmi(list(gpus) or [FakeAmdGpu()])
    return AmdBackend(amdsmi=smi), smi


def test_fields_are_mapped_with_their_units():
    gpu = FakeAmdGpu(current_socket_power=612, energy_accumulator=2_000_000, counter_resolution=15.25,
                     temps={"EDGE": 50, "HOTSPOT": 81, "VRAM": 77}, gfx_clk=1950, mem_clk=1300,
                     gfx_activity=99, umc_activity=60, vram_used=100 * 2**30, power_cap_uw=700_000_000,
                     xgmi_read_kb=[1, 2, 3, 4, 5, 6, 7, NA], xgmi_write_kb=[10] * 7 + [NA], fan_speed=51)
    backend, smi = _backend(gpu)
    (row,) = backend.sample("node1")
    assert (row["host"], row["device"]) == ("node1", "gpu0")
    assert row["power_w"] == 612.0 and row["power_avg_w"] is None  # MI300: current, no average
    assert row["energy_j"] == pytest.approx(2_000_000 * 15.25 / 1e6)  # ticks × µJ → J
    assert (row["temp_c"], row["temp_hotspot_c"], row["temp_mem_c"]) == (50.0, 81.0, 77.0)
    assert (row["clock_sm_mhz"], row["clock_mem_mhz"]) == (1950.0, 1300.0)
    assert (row["util_pct"], row["util_mem_pct"]) == (99.0, 60.0)
    assert row["mem_used_bytes"] == 100 * 2**30
    assert row["power_limit_w"] == pytest.approx(700.0)  # µW → W
    assert row["link_rx_bytes"] == 28 * 1024 and row["link_tx_bytes"] == 70 * 1024  # KB over 7 links
    assert row["fan_pct"] == pytest.approx(51 / 255 * 100)
    assert row["throttle"] == 0
    assert row["pcie_tx_bytes"] is None and row["pcie_rx_bytes"] is None  # never faked
    assert smi.calls["amdsmi_get_gpu_pci_throughput"] == 0  # blocks 1 s: never called

    (info,) = backend.devices()
    assert (info.device, info.kind, info.vendor) == ("gpu0", "gpu", "amd")
    assert (info.name, info.uuid, info.pci_bus_id) == (gpu.market_name, gpu.uuid, gpu.bdf)
    assert "pcie_tx_bytes" not in info.supported and "power_avg_w" not in info.supported
    assert {"power_w", "energy_j", "temp_c", "temp_hotspot_c", "link_tx_bytes", "fan_pct"} <= set(info.supported)
    p = info.properties
    assert (p["clock_sm_max_mhz"], p["power_limit_default_w"], p["mem_total_bytes"]) == (2100.0, 750.0, 192 * 2**30)
    assert backend.software == {"amdsmi_lib": "25.5.1", "amdgpu_driver": "amdgpu 6.12.12", "rocm": "7.0.2"}
    assert any("PCIe" in n for n in backend.notes)


def test_na_and_unsupported_values_are_null_and_not_listed():
    gpu = FakeAmdGpu(current_socket_power=NA, average_socket_power=280, gfx_activity=NA,
                     temps={"EDGE": None, "HOTSPOT": 60, "VRAM": None}, fan_speed=None,
                     xgmi_read_kb=[NA] * 8, xgmi_write_kb=[NA] * 8,
                     unsupported={"amdsmi_get_gpu_memory_usage"})
    backend, _ = _backend(gpu)
    (info,) = backend.devices()
    gone = {"power_w", "util_pct", "temp_c", "temp_mem_c", "fan_pct", "link_tx_bytes", "link_rx_bytes"}
    assert gone.isdisjoint(info.supported)
    (row,) = backend.sample("h")
    for col in gone:
        assert row[col] is None, col
    assert row["power_avg_w"] == 280.0 and row["temp_hotspot_c"] == 60.0
    assert row["util_mem_pct"] == 0.0  # umc activity is real 0 %, not unknown
    assert row["mem_used_bytes"] == 300 * 2**20  # from the MB fallback (amdsmi_get_gpu_vram_usage)


def test_energy_and_link_counters_are_cumulative_across_resets():
    gpu = FakeAmdGpu(current_socket_power=500)
    backend, _ = _backend(gpu)
    first = backend.sample("h")[0]
    gpu.advance(2.0)  # 500 W × 2 s
    gpu.xgmi_read_kb[0] += 100
    second = backend.sample("h")[0]
    assert second["energy_j"] - first["energy_j"] == pytest.approx(1000.0, rel=1e-4)
    assert second["link_rx_bytes"] - first["link_rx_bytes"] == 100 * 1024
    gpu.energy_accumulator = 10  # reset (driver reload): never a drop in the recorded total
    gpu.xgmi_read_kb[0] = 0
    third = backend.sample("h")[0]
    assert third["energy_j"] >= second["energy_j"] and third["link_rx_bytes"] >= second["link_rx_bytes"]


@pytest.mark.parametrize(
    ("flags", "low", "expected"),
    [
        ({}, [False], Throttle(0)),
        ({"active_ppt_pwr": True}, [False], Throttle.POWER_CAP),
        ({"active_prochot_thrm": True, "active_hbm_thrm": True}, [False], Throttle.THERMAL_HW | Throttle.THERMAL_SW),
        ({"active_socket_thrm": True}, [False], Throttle.THERMAL_SW),
        ({}, [True], Throttle.IDLE),
        ({"active_gfx_clk_below_host_limit": True}, [False], Throttle.OTHER),
    ],
)
def test_violation_status_maps_to_the_neutral_set(flags, low, expected):
    violation = dict.fromkeys(fake_amdsmi._VIOLATION_KEYS, False) | flags
    backend, _ = _backend(FakeAmdGpu(violation=violation, low_utilization=low + [NA] * 7))
    assert backend.sample("h")[0]["throttle"] == expected


def test_throttle_falls_back_to_the_gpu_metrics_flag():
    gpu = FakeAmdGpu(violation=None, throttle_status=True)  # pre-MI300: no violation status
    backend, _ = _backend(gpu)
    assert "throttle" in backend.devices()[0].supported
    assert backend.sample("h")[0]["throttle"] == Throttle.OTHER  # binding gives only a flag
    gpu.throttle_status = False
    assert backend.sample("h")[0]["throttle"] == 0
    assert throttle_from_violations({"active_ppt_pwr": NA}) is None  # says nothing → unknown


def test_a_failing_gpu_gives_null_rows_one_incident_and_recovers():
    backend, smi = _backend(FakeAmdGpu(), FakeAmdGpu())
    smi.gpus[1].failing = fake_amdsmi.AMDSMI_STATUS_DRM_ERROR
    for _ in range(5):
        rows = backend.sample("h")
        assert rows[0]["power_w"] == 150.0
        assert all(rows[1][f] is None for f in TELEMETRY_FIELDS)
    (inc,) = backend.incidents
    assert inc.device == "gpu1" and "AMDSMI_STATUS_DRM_ERROR" in inc.what and "\n" not in inc.what
    smi.gpus[1].failing = None
    assert backend.sample("h")[1]["power_w"] == 150.0
    assert len(backend.incidents) == 2


def test_sampler_keeps_going_when_a_gpu_fails(tmp_path):
    backend, smi = _backend(FakeAmdGpu(), FakeAmdGpu())
    sampler = Sampler(tmp_path / "run", backends=[backend], host="h", rate_hz=50, flush_s=0.1)
    thread = threading.Thread(target=sampler.run)
    thread.start()
    _wait_for_samples(sampler, 8)
    t_fail = time.time_ns()
    smi.gpus[1].failing = fake_amdsmi.AMDSMI_STATUS_NOT_FOUND
    _wait_for_samples(sampler, sampler.samples + 8)
    sampler.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    tel = read_telemetry(tmp_path / "run").to_pylist()
    gpu1 = [r for r in tel if r["device"] == "gpu1"]
    assert len(gpu1) == len([r for r in tel if r["device"] == "gpu0"]) >= 10
    late = [r for r in gpu1 if r["t_ns"] > t_fail][1:]  # the first may have been read before the failure
    assert late and all(r["power_w"] is None for r in late)
    assert any(r["power_w"] == 150.0 for r in gpu1 if r["t_ns"] < t_fail)
    meta = json.loads((tmp_path / "run/telemetry/h.meta.json").read_text())
    assert [i["device"] for i in meta["incidents"]] == ["gpu1"]
    assert [d["device"] for d in meta["devices"]] == ["gpu0", "gpu1"]


def _wait_for_samples(sampler: Sampler, n: int) -> None:
    """Wait until the sampler has taken ``n`` samples (by count, not by time: CI boxes are loaded)."""
    deadline = time.monotonic() + 60
    while sampler.samples < n:
        assert time.monotonic() < deadline, f"sampler took only {sampler.samples} samples in 60 s"
        time.sleep(0.01)


class _RocmAbsent(importlib.abc.MetaPathFinder):
    """Makes `import amdsmi` fail the way amdsmi 7.x does on a machine without ROCm."""

    def find_spec(self, name, path=None, target=None):
        if name == "amdsmi":
            raise KeyError("libamd_smi.so")
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text.startswith("AMD: ")
    return text


def test_missing_library_and_missing_rocm_say_so_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(BackendUnavailable) as err:
        AmdBackend()
    assert "amdsmi is not installed" in _one_line(err.value)

    monkeypatch.delitem(sys.modules, "amdsmi")
    monkeypatch.setattr(sys, "meta_path", [_RocmAbsent(), *sys.meta_path])
    with pytest.raises(BackendUnavailable) as err:
        AmdBackend()
    assert "ROCm library libamd_smi.so was not found" in _one_line(err.value)


@pytest.mark.parametrize(
    ("smi", "says"),
    [
        (FakeAmdSmi(init_error=fake_amdsmi.AMDSMI_STATUS_DRIVER_NOT_LOADED), "the amdgpu driver is not loaded"),
        (FakeAmdSmi(init_error=fake_amdsmi.AMDSMI_STATUS_INIT_ERROR), "amdsmi_init failed (AMDSMI_STATUS_INIT_ERROR)"),
        (FakeAmdSmi(gpus=[]), "no AMD GPU is visible"),
    ],
)
def test_library_without_driver_or_gpus_says_what_was_found(smi, says):
    with pytest.raises(BackendUnavailable) as err:
        AmdBackend(amdsmi=smi)
    assert says in _one_line(err.value)


def test_real_amdsmi_on_this_machine_gives_one_clear_line():
    try:
        backend = AmdBackend()
    except BackendUnavailable as exc:  # no amdsmi, or amdsmi without ROCm
        assert "host counters only" in _one_line(exc)
    else:  # a machine with ROCm and an AMD GPU
        assert backend.devices()
        backend.close()
