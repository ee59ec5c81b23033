"""The NVIDIA backend against a stand-in of nvidia-ml-py (tests/standins/fake_nvml.py), and the real
nvidia-ml-py on this GPU-less machine."""

from __future__ import annotations

import inspect
import itertools
import json
import threading
import time

import pynvml
import pytest

from powertrain.core.throttle import throttle_from_nvml
from powertrain.schema import TELEMETRY_FIELDS, Throttle
from powertrain.store import read_telemetry
from powertrain.telemetry import sensor_facts
from powertrain.telemetry.backend import BackendUnavailable
from powertrain.telemetry.discover import open_backends
from powertrain.telemetry.nvidia import NvidiaBackend
from powertrain.telemetry.sampler import Sampler
from standins import fake_nvml
from standins.fake_nvml import FakeClock, FakeGpu, FakeNvml, PowerSensor, training_swing
from standins.nvml_state import PersistentNvml, read_state, write_state

MEASURED = [f for f in TELEMETRY_FIELDS if f not in ("cpu_util_pct", "cgroup_cpu_s", "cgroup_mem_bytes",
                                                    "load_1m", "energy_dram_j", "temp_hotspot_c")]


def _backend(*gpus: FakeGpu) -> tuple[NvidiaBackend, FakeNvml]:
    """Scripted GPUs whose values change only when a test changes them: no update-period probe (it
    would poll them for its whole 0.5 s of real time and find nothing)."""
    nvml = FakeNvml(list(gpus) or [FakeGpu()])
    return NvidiaBackend(nvml=nvml, probe_s=0), nvml


def _sensing(clock: FakeClock, *gpus: FakeGpu, **kw) -> NvidiaBackend:
    """A backend over stand-in GPUs with known-truth sensors, on the fake clock (the probe sleeps on it)."""
    return NvidiaBackend(nvml=FakeNvml(list(gpus)), clock_ns=clock.time_ns, sleep=clock.sleep, **kw)


def test_standin_mirrors_the_real_pynvml():
    """Every constant, exception class and function of the stand-in exists in nvidia-ml-py as spelled."""
    for name, value in fake_nvml.CONSTANTS.items():
        assert getattr(pynvml, name) == value, name
    for name in fake_nvml.ERRORS:
        assert issubclass(getattr(pynvml, name), pynvml.NVMLError), name
        assert pynvml.NVMLError(getattr(fake_nvml, name)(0).value).__class__.__name__ == name
    functions = [n for n, _ in inspect.getmembers(FakeNvml, inspect.isfunction) if n.startswith("nvml")]
    assert len(functions) > 20
    for name in functions:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml, name))
        # Same positional parameters (the stand-in's methods have `self` first).
        assert len(list(fake.parameters)[1:]) == len(real.parameters), name
    assert "nvmlDeviceGetSamples" in functions and fake_nvml.CONSTANTS["NVML_TOTAL_POWER_SAMPLES"] == 0
    # the shapes nvmlDeviceGetSamples returns: c_nvmlSample_t and its c_nvmlValue_t union, member for member
    sample = fake_nvml._Sample(1, "uiVal", 2)
    assert [f[0] for f in pynvml.c_nvmlSample_t._fields_] == [k for k in vars(sample) if not k.startswith("_")]
    assert [f[0] for f in pynvml.c_nvmlValue_t._fields_] == list(fake_nvml._Union.MEMBERS)
    assert all(hasattr(sample.sampleValue, m) for m in fake_nvml._Union.MEMBERS) and sample.sampleValue.uiVal == 2


def test_fields_are_mapped_with_their_units():
    gpu = FakeGpu(power_mw=312_456, power_avg_mw=300_500, energy_mj=7_250_000, temp_c=61, mem_temp_c=70,
                  clock_sm_mhz=1755, clock_mem_mhz=2619, util_gpu=97, util_mem=45, mem_used=40 * 2**30,
                  power_limit_mw=650_000, reasons=fake_nvml.nvmlClocksEventReasonSwPowerCap, fan_pct=55,
                  pcie_tx=123_456_789, pcie_rx=987_654,
                  nvlink_tx_kib=[1, 2, 3] + [0] * 15, nvlink_rx_kib=[10] * 18)
    backend, _ = _backend(gpu)
    (row,) = backend.sample("node1")
    assert (row["host"], row["device"]) == ("node1", "gpu0")
    assert row["power_w"] == pytest.approx(312.456)  # mW → W
    assert row["power_avg_w"] == pytest.approx(300.5)
    assert row["energy_j"] == pytest.approx(7250.0)  # mJ → J
    assert (row["temp_c"], row["temp_mem_c"]) == (61.0, 70.0)
    assert (row["clock_sm_mhz"], row["clock_mem_mhz"]) == (1755.0, 2619.0)
    assert (row["util_pct"], row["util_mem_pct"]) == (97.0, 45.0)
    assert row["mem_used_bytes"] == 40 * 2**30
    assert row["power_limit_w"] == pytest.approx(650.0)
    assert row["throttle"] == Throttle.POWER_CAP
    assert row["fan_pct"] == 55.0
    assert (row["pcie_tx_bytes"], row["pcie_rx_bytes"]) == (123_456_789, 987_654)
    assert row["link_tx_bytes"] == 6 * 1024  # KiB summed over all links → bytes
    assert row["link_rx_bytes"] == 18 * 10 * 1024
    for col in ("mem_used_bytes", "pcie_tx_bytes", "link_tx_bytes", "throttle"):
        assert isinstance(row[col], int), col

    (info,) = backend.devices()
    assert (info.device, info.kind, info.vendor, info.index) == ("gpu0", "gpu", "nvidia", 0)
    assert info.uuid == gpu.uuid and info.pci_bus_id == gpu.bus_id and info.name == gpu.name
    assert info.supported == MEASURED  # every GPU field of the schema, in schema order
    p = info.properties
    assert (p["clock_sm_max_mhz"], p["clock_mem_max_mhz"]) == (1980.0, 2619.0)
    assert (p["power_limit_default_w"], p["power_limit_min_w"], p["power_limit_max_w"]) == (700.0, 200.0, 700.0)
    assert p["mem_total_bytes"] == 80 * 2**30 and p["temp_slowdown_c"] == 87.0 and p["nvlink_links"] == 18
    assert backend.software == {"nvidia_driver": "550.54.15", "nvml_version": "12.550.54.15", "cuda_driver": "12.4"}


def test_one_batched_field_read_per_gpu_and_no_blocking_call():
    backend, nvml = _backend(FakeGpu(), FakeGpu())
    nvml.calls.clear()
    for _ in range(5):
        backend.sample("h")
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 5 * 2
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0  # blocks 20 ms: never in the loop
    # Static facts are read once at open, not per sample.
    assert nvml.calls["nvmlDeviceGetMaxClockInfo"] == nvml.calls["nvmlDeviceGetName"] == 0
    # Power, energy and link counters come from the batch, not from separate calls.
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0


def test_counters_unwrap_and_energy_follows_power():
    gpu = FakeGpu(pcie_tx=2**32 - 1000, power_mw=400_000, energy_mj=10_000_000)
    backend, _ = _backend(gpu)
    rows = [backend.sample("h")[0]]
    for _ in range(3):
        gpu.pcie_tx += 3000  # the 32-bit value NVML returns wraps on the first step
        gpu.nvlink_tx_kib[0] += 5
        gpu.advance(0.5)  # 400 W for 0.5 s = 200 J
        rows.append(backend.sample("h")[0])
    tx = [r["pcie_tx_bytes"] for r in rows]
    assert tx == [2**32 - 1000 + 3000 * i for i in range(4)]  # monotonic 64-bit, never a drop
    assert [r["link_tx_bytes"] for r in rows] == [5 * 1024 * i for i in range(4)]
    assert rows[-1]["energy_j"] - rows[0]["energy_j"] == pytest.approx(3 * 200.0)

    gpu.energy_mj = 1_000  # a 64-bit counter drops only on reset (driver reload): the total keeps going
    after = backend.sample("h")[0]["energy_j"]
    assert after >= rows[-1]["energy_j"]


def test_unsupported_fields_are_null_not_zero_and_not_listed():
    gpu = FakeGpu(unsupported={"NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_POWER_INSTANT", "nvmlDeviceGetFanSpeed",
                               "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"},
                  nvlink_tx_kib=[], nvlink_rx_kib=[])  # no NVLink on this GPU
    backend, nvml = _backend(gpu)
    (info,) = backend.devices()
    gone = {"temp_mem_c", "power_w", "power_repeat", "fan_pct", "pcie_tx_bytes", "pcie_rx_bytes", "link_tx_bytes",
            "link_rx_bytes"}
    assert gone.isdisjoint(info.supported)
    assert "nvlink_links" not in info.properties
    assert backend.notes == []  # not offered is not an error: nothing to report
    nvml.calls.clear()
    for _ in range(3):
        (row,) = backend.sample("h")
        for col in gone:
            assert row[col] is None, col
        assert row["power_avg_w"] == pytest.approx(98.0) and row["temp_c"] == 35.0
    assert nvml.calls["nvmlDeviceGetFanSpeed"] == 0  # dropped at the probe: the loop stays cheap
    assert backend.incidents == []


def test_a_field_failing_at_open_is_named_in_a_note():
    backend, _ = _backend(FakeGpu(field_errors={"NVML_FI_DEV_MEMORY_TEMP": fake_nvml.NVML_ERROR_UNKNOWN}))
    assert "temp_mem_c" not in backend.devices()[0].supported
    assert backend.notes == ["NVIDIA: gpu0: temp_mem_c not read (NVML returned code 999 at open)"]
    assert backend.sample("h")[0]["temp_mem_c"] is None


def test_plain_call_fallbacks_when_a_driver_lacks_the_fields():
    gpu = FakeGpu(power_avg_mw=250_000, energy_mj=3_000_000, reasons=fake_nvml.nvmlClocksEventReasonGpuIdle,
                  unsupported={"NVML_FI_DEV_POWER_AVERAGE", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                               "NVML_FI_DEV_POWER_CURRENT_LIMIT", "nvmlDeviceGetCurrentClocksEventReasons",
                               "nvmlDeviceGetTemperatureV"})
    backend, _ = _backend(gpu)
    (row,) = backend.sample("h")
    assert row["power_avg_w"] == pytest.approx(250.0)
    assert row["energy_j"] == pytest.approx(3000.0)
    assert row["power_limit_w"] == pytest.approx(700.0)
    assert row["throttle"] == Throttle.IDLE  # from the older ...ThrottleReasons call
    assert row["temp_c"] == 35.0  # from the older nvmlDeviceGetTemperature


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (0, Throttle(0)),
        (0x001, Throttle.IDLE),
        (0x002, Throttle.APP_CLOCKS),
        (0x004 | 0x040, Throttle.POWER_CAP | Throttle.THERMAL_HW),
        (0x008 | 0x010 | 0x020 | 0x080, Throttle.HW_SLOWDOWN | Throttle.SYNC_BOOST | Throttle.THERMAL_SW
         | Throttle.POWER_BRAKE),
        (0x100, Throttle.OTHER),  # display clock setting: no neutral equivalent
        (0x200 | 0x004, Throttle.OTHER | Throttle.POWER_CAP),  # board limit is kept as OTHER, not dropped
        (1 << 40, Throttle.OTHER),  # a reason a future driver adds
    ],
)
def test_throttle_reasons_map_to_the_neutral_set(mask, expected):
    assert throttle_from_nvml(mask) == expected
    backend, _ = _backend(FakeGpu(reasons=mask))
    assert backend.sample("h")[0]["throttle"] == expected


def test_a_lost_gpu_gives_null_rows_and_one_incident():
    backend, nvml = _backend(FakeGpu(), FakeGpu(uuid="GPU-1"))
    backend.sample("h")
    nvml.gpus[1].lost = True
    for _ in range(10):
        rows = backend.sample("h")
        assert rows[0]["power_w"] == pytest.approx(100.0)
        assert rows[1]["device"] == "gpu1"
        assert all(rows[1][f] is None for f in TELEMETRY_FIELDS)
    (inc,) = backend.incidents
    assert inc.device == "gpu1" and "lost" in inc.what


def test_a_gpu_failing_every_read_is_logged_once_and_recovers():
    backend, nvml = _backend(FakeGpu())
    nvml.gpus[0].failing = fake_nvml.NVML_ERROR_UNKNOWN
    for _ in range(5):
        (row,) = backend.sample("h")
        assert row["power_w"] is None and row["throttle"] is None
    assert len(backend.incidents) == 1 and "Unknown Error" in backend.incidents[0].what
    nvml.gpus[0].failing = None
    (row,) = backend.sample("h")
    assert row["power_w"] == pytest.approx(100.0)
    assert len(backend.incidents) == 2 and "again" in backend.incidents[1].what


def test_sampler_keeps_going_when_a_gpu_is_lost(tmp_path):
    backend, nvml = _backend(FakeGpu(), FakeGpu(uuid="GPU-1"))
    sampler = Sampler(tmp_path / "run", backends=[backend], host="h", rate_hz=50, flush_s=0.1)
    thread = threading.Thread(target=sampler.run)
    thread.start()
    _wait_for_samples(sampler, 8)
    t_lost = time.time_ns()
    nvml.gpus[1].lost = True
    _wait_for_samples(sampler, sampler.samples + 8)
    sampler.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()

    tel = read_telemetry(tmp_path / "run").to_pylist()
    gpu0 = [r for r in tel if r["device"] == "gpu0"]
    gpu1 = [r for r in tel if r["device"] == "gpu1"]
    assert len(gpu0) == len(gpu1) >= 10  # the lost GPU keeps its rows; sampling did not stop
    assert all(r["power_w"] == pytest.approx(100.0) for r in gpu0)
    assert any(r["power_w"] is not None for r in gpu1 if r["t_ns"] < t_lost)
    late = [r for r in gpu1 if r["t_ns"] > t_lost][1:]  # the first may have been read before the loss
    assert late and all(r["power_w"] is None and r["temp_c"] is None for r in late)
    meta = json.loads((tmp_path / "run/telemetry/h.meta.json").read_text())
    assert [i["device"] for i in meta["incidents"]] == ["gpu1"]
    assert meta["devices"][0]["supported"] == MEASURED and meta["software"]["nvidia_driver"] == "550.54.15"
    assert nvml.calls["nvmlShutdown"] == 1  # the sampler closed the backend


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text.startswith("NVIDIA: ")
    return text


def test_missing_library_says_so_in_one_line(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    with pytest.raises(BackendUnavailable) as err:
        NvidiaBackend()
    assert "nvidia-ml-py is not installed" in _one_line(err.value)
    assert "host counters only" in str(err.value)


@pytest.mark.parametrize(
    ("nvml", "says"),
    [
        (FakeNvml(library_found=False), "no NVIDIA driver was found (NVML library not found)"),
        (FakeNvml(init_error=fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED), "the NVIDIA driver is not loaded"),
        (FakeNvml(gpus=[]), "driver 550.54.15 found but no NVIDIA GPU is visible"),
    ],
)
def test_library_without_driver_or_gpus_says_what_was_found(nvml, says):
    with pytest.raises(BackendUnavailable) as err:
        NvidiaBackend(nvml=nvml)
    assert says in _one_line(err.value)


def test_real_nvidia_ml_py_on_this_machine_gives_one_clear_line():
    try:
        backend = NvidiaBackend()
    except BackendUnavailable as exc:  # this CPU machine: the library is there, the driver is not
        text = _one_line(exc)
        assert "nvidia-ml-py is installed but" in text and "host counters only" in text
        # Under `auto` it is a note, not an error; named explicitly it is the error.
        backends, notes = open_backends("auto")
        assert "nvidia" not in [b.name for b in backends] and text in notes
        with pytest.raises(BackendUnavailable):
            open_backends(["nvidia"])
    else:  # a machine with an NVIDIA GPU and driver
        assert backend.devices() and backend.sample("h")[0]["device"] == "gpu0"
        backend.close()


def _wait_for_samples(sampler: Sampler, n: int) -> None:
    """Wait until the sampler has taken ``n`` samples (by count, not by time: CI boxes are loaded)."""
    deadline = time.monotonic() + 60
    while sampler.samples < n:
        assert time.monotonic() < deadline, f"sampler took only {sampler.samples} samples in 60 s"
        time.sleep(0.01)


class _BurningNvml(FakeNvml):
    """The stand-in, scripted like a GPU under scripts/gpu_check.sh: idle, burn, idle, by sample count.

    Power moves linearly between reads (as a finely sampled real GPU's would) and the energy counter
    is its exact integral in wall-clock time; temperature, clocks and throttle reasons follow the phase.
    """

    IDLE, BURN = 15, 40  # samples per phase: idle, burn, then idle again

    def __init__(self) -> None:
        super().__init__([FakeGpu()])
        self.reads = 0
        self.t_prev: int | None = None

    def nvmlDeviceGetFieldValues(self, h, fieldIds):
        now = time.time_ns()
        gpu, k = self.gpus[0], self.reads
        burning = self.IDLE <= k < self.IDLE + self.BURN
        p_prev = gpu.power_mw
        gpu.power_mw = gpu.power_avg_mw = 620_000 if burning else 95_000
        if self.t_prev is not None:
            gpu.energy_mj += round((p_prev + gpu.power_mw) / 2 * (now - self.t_prev) / 1e9)
        self.t_prev = now
        gpu.clock_sm_mhz = 1830 if burning else 345
        gpu.reasons = fake_nvml.nvmlClocksEventReasonSwPowerCap if burning else fake_nvml.nvmlClocksEventReasonGpuIdle
        if burning:
            gpu.temp_c, gpu.mem_temp_c = min(75, gpu.temp_c + 2), min(70, gpu.mem_temp_c + 2)
        self.reads += 1  # the first call is the backend's probe at open: an idle read too
        return super().nvmlDeviceGetFieldValues(h, fieldIds)


def test_gpu_check_analysis_on_a_scripted_burn(tmp_path):
    """Rehearse scripts/gpu_check.sh's checks on sampler output from a stand-in GPU (no torch, no GPU)."""
    from powertrain.launch.gpu_check import Phases, evaluate

    nvml = _BurningNvml()
    backend = NvidiaBackend(nvml=nvml, probe_s=0)  # the script counts reads: a probe's would use it up
    t_start = time.time_ns()
    sampler = Sampler(tmp_path / "run", backends=[backend], host="h", rate_hz=50, flush_s=0.2)
    thread = threading.Thread(target=sampler.run)
    thread.start()
    _wait_for_samples(sampler, 2 * _BurningNvml.IDLE + _BurningNvml.BURN)
    sampler.stop()
    thread.join(timeout=10)
    rows = [r for r in read_telemetry(tmp_path / "run").to_pylist() if r["device"] == "gpu0"]
    burn = [i for i, r in enumerate(rows) if r["power_w"] > 500]
    assert burn == list(range(burn[0], burn[0] + _BurningNvml.BURN))
    p = Phases(t_start, rows[burn[0]]["t_ns"], rows[burn[-1] + 1]["t_ns"] - 1, rows[-1]["t_ns"])

    def check(rows: list[dict], name: str):
        # rate_hz=1: the row-count check is about rows arriving at all, not speed on a loaded CI box.
        return {c.name: c for c in evaluate(rows, p, rate_hz=1, ramp_s=0, settle_s=0)}[name]

    checks = {c.name: c for c in evaluate(rows, p, rate_hz=1, ramp_s=0, settle_s=0)}
    assert all(c.passed for c in checks.values()), [c.detail for c in checks.values() if not c.passed]
    assert checks["energy agrees with power"].values["relative_difference"] < 0.01
    assert checks["throttle reasons read"].values["reasons_seen"]["burn"] == ["power_cap"]

    # The same checks fail when the data is wrong: energy counter off by 10 %, power flat, ...
    bad_energy = check([dict(r, energy_j=r["energy_j"] * 1.1) for r in rows], "energy agrees with power")
    assert not bad_energy.passed and bad_energy.values["relative_difference"] > 0.05
    flat = check([dict(r, power_w=95.0) for r in rows], "power rises")
    assert not flat.passed and flat.values["burn_median_w"] == 95.0
    assert not check([dict(r, throttle=None) for r in rows], "throttle reasons read").passed
    assert not check([dict(r, temp_c=35.0) for r in rows], "temp_c moves").passed


# -- what each field is: the probe, the published windows, power_repeat, the driver's buffer ------------
def test_the_probe_measures_each_power_readings_update_period_on_the_fake_clock():
    clock = FakeClock()
    t0 = clock.time_ns()
    backend = _sensing(clock, FakeGpu(sensor=clock.sensor(training_swing(), phase_s=0.03)))
    assert clock.time_ns() - t0 <= 0.5e9 + 5e6  # bounded by probe_s (fake time: nothing waited)
    s = backend.devices()[0].properties["sensors"]
    assert (s["power_w"]["update_period_s"], s["power_w"]["period_from"]) == (0.1, "probe")
    assert (s["power_avg_w"]["update_period_s"], s["power_avg_w"]["source"]) == (0.1, "average")
    assert (s["power_avg_w"]["averaging_window_s"], s["power_avg_w"]["window_source"]) == (1.0, "nvml-api")
    # the counter changes at every 5 ms poll: its period is at most that
    assert (s["energy_j"]["period_from"], s["energy_j"]["update_period_s"]) == ("probe_limit", 0.005)
    assert s["power_samples"] == {
        "source": "driver_buffer", "nvml": "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)", "update_period_s": 0.1,
        "period_from": "buffer_timestamps", "averaging_window_s": None, "published_update_period_s": None,
        "window_source": None, "note": None, "path": "buffer"}


def test_a_scripted_gpu_that_never_changes_has_no_period_and_equal_values_are_unknown():
    backend = NvidiaBackend(nvml=FakeNvml([FakeGpu()]), probe_s=0.02)  # 20 ms of real time, bounded
    s = backend.devices()[0].properties["sensors"]["power_w"]
    assert (s["update_period_s"], s["period_from"], s["source"], s["nvml"]) == (
        None, None, "instant", "NVML_FI_DEV_POWER_INSTANT")
    nvml = backend._nvml
    first, same = backend.sample("h")[0], backend.sample("h")[0]
    nvml.gpus[0].power_mw = 250_000
    changed = backend.sample("h")[0]
    assert [r["power_repeat"] for r in (first, same, changed)] == [False, None, False]


def test_power_repeat_follows_the_probed_period():
    clock = FakeClock()
    gpu = FakeGpu(sensor=clock.sensor(lambda t: 400.0, noise_w=0.0))  # flat and exact: every reading equal
    backend = _sensing(clock, gpu)
    # a flat truth never changes value: the probe finds no period, so an equal value is unknown
    assert backend.devices()[0].properties["sensors"]["power_w"]["update_period_s"] is None
    backend._gpus[0].power_period_ns = 100_000_000  # as a probe of a noisy real sensor would have found
    marks = []
    for _ in range(6):
        marks.append(backend.sample("h")[0]["power_repeat"])
        clock.advance(0.04)
    # fresh at 0, repeat at 40 and 80 ms, fresh at 120 ms (a full period after it was first seen), ...
    assert marks == [False, True, True, False, True, True]
    gpu.lost = True
    assert backend.sample("h")[0]["power_repeat"] is None


@pytest.mark.parametrize(
    ("name", "cc", "nvml", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "9.0", "NVML_FI_DEV_POWER_INSTANT", ("instant", 0.025, 0.1, "yang-sc24")),
        ("NVIDIA H100 80GB HBM3", "9.0", "nvmlDeviceGetPowerUsage", ("average", 1.0, None, "yang-sc24")),
        ("NVIDIA A100-SXM4-80GB", "8.0", "nvmlDeviceGetPowerUsage", ("instant", 0.025, 0.1, "yang-sc24")),
        ("NVIDIA A100-SXM4-80GB", "8.0", "NVML_FI_DEV_POWER_AVERAGE", ("average", None, None, None)),
        ("Tesla V100-SXM2-32GB", "7.0", "NVML_FI_DEV_POWER_INSTANT", ("instant", 0.010, 0.020, "yang-sc24")),
        ("NVIDIA H200", "9.0", "NVML_FI_DEV_POWER_INSTANT", ("instant", None, None, None)),  # not measured
        ("NVIDIA H200", "9.0", "NVML_FI_DEV_POWER_AVERAGE", ("average", 1.0, None, "nvml-api")),
        ("NVIDIA L40S", None, "nvmlDeviceGetPowerUsage", ("unknown", None, None, None)),
        ("NVIDIA H200", "9.0", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", ("energy_counter", None, None, None)),
    ],
)
def test_published_windows_only_where_a_source_states_them(name, cc, nvml, expected):
    e = sensor_facts.describe(nvml, name, cc, path="polled", update_period_s=None, period_from=None)
    assert (e["source"], e["averaging_window_s"], e["published_update_period_s"], e["window_source"]) == expected
    assert e["window_source"] is None or e["window_source"] in sensor_facts.CITATIONS


def test_a100_pcie_carries_the_published_steady_state_bias():
    e = sensor_facts.describe("NVML_FI_DEV_POWER_INSTANT", "NVIDIA A100-PCIE-40GB", "8.0", path="polled",
                              update_period_s=0.1, period_from="probe")
    assert e["note"] == "A100-PCIe reads ~5.5 % low at steady state [yang-sc24]"


def test_the_fallback_reads_say_which_nvml_call_they_are():
    clock = FakeClock()
    gpu = FakeGpu(name="NVIDIA A100-SXM4-80GB", sensor=clock.sensor(training_swing()),
                  unsupported={"NVML_FI_DEV_POWER_AVERAGE", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"})
    s = _sensing(clock, gpu).devices()[0].properties["sensors"]
    assert s["power_avg_w"]["nvml"] == "nvmlDeviceGetPowerUsage"
    assert s["energy_j"]["nvml"] == "nvmlDeviceGetTotalEnergyConsumption"
    # the stand-in says compute capability 9.0 whatever its name: NVML documents the call as the 1 s average
    assert s["power_avg_w"]["source"] == "average"


def test_the_buffer_returns_each_driver_sample_once():
    clock = FakeClock()
    ps = clock.sensor(training_swing(), buffer_period_s=0.02, buffer_window_s=0.02)
    backend = _sensing(clock, FakeGpu(sensor=ps), probe_s=0)
    assert backend.devices()[0].properties["power_buffer"]["depth"] == 120  # the whole ring at open
    assert backend.power_samples("h") == []  # nothing since open: NVML's NOT_FOUND is no error
    clock.advance(0.1)
    got = backend.power_samples("h")
    assert len(got) == 5 and backend.power_samples("h") == []
    assert [r["t_ns"] for r in got] == sorted(r["t_ns"] for r in got)
    assert all(r["t_ns"] <= clock.time_ns() and (r["host"], r["device"]) == ("h", "gpu0") for r in got)
    assert got[-1]["power_w"] == pytest.approx(ps.reading_w(ps.now_s(), 0.02), abs=1e-3)
    assert backend.incidents == []
    calls = backend._nvml.calls["nvmlDeviceGetSamples"]
    clock.advance(0.01)  # half a driver period since the last sample read: none can be due, no call made
    assert backend.power_samples("h") == [] and backend._nvml.calls["nvmlDeviceGetSamples"] == calls


def test_an_overrun_ring_is_counted_and_logged_once():
    clock = FakeClock()
    ps = clock.sensor(training_swing(), buffer_period_s=0.01, buffer_window_s=0.01)
    backend = _sensing(clock, FakeGpu(sensor=ps), probe_s=0)
    for _ in range(2):
        clock.advance(3.0)  # 300 samples into a 120-sample ring
        assert len(backend.power_samples("h")) == 120
    info = backend.devices()[0].properties["power_buffer"]
    assert info["samples_lost"] == 2 * 180
    (inc,) = backend.incidents
    assert "overran" in inc.what and "~180 samples lost" in inc.what


class _OtherClockNvml(FakeNvml):
    """A driver whose sample stamps are on another clock (an hour behind the wall clock)."""

    def nvmlDeviceGetSamples(self, device, sampling_type, timeStamp):
        vtype, samples = super().nvmlDeviceGetSamples(device, sampling_type, timeStamp + 3_600_000_000)
        for x in samples:
            x.timeStamp -= 3_600_000_000
        return vtype, samples


def test_driver_stamps_on_another_clock_are_shifted_onto_the_rows_clock():
    clock = FakeClock()
    ps = clock.sensor(training_swing())
    backend = NvidiaBackend(nvml=_OtherClockNvml([FakeGpu(sensor=ps)]), clock_ns=clock.time_ns, sleep=clock.sleep,
                            probe_s=0)
    assert "shifted by +3600.000 s" in backend.devices()[0].properties["power_buffer"]["timestamps"]
    clock.advance(0.25)
    got = backend.power_samples("h")
    assert got and all(0 <= clock.time_ns() - r["t_ns"] < 0.3e9 for r in got)


def test_the_sampler_streams_the_buffer_with_its_own_clock_shift(tmp_path):
    clock = FakeClock()
    ps = clock.sensor(training_swing())
    backend = _sensing(clock, FakeGpu(sensor=ps), probe_s=0)
    sampler = Sampler(tmp_path / "run", backends=[backend], host="h", clocks=(clock.time_ns, clock.monotonic_ns))
    for _ in range(10):
        sampler._sample_once()
        clock.advance(0.05)
    clock.wall -= 60_000_000_000  # the system clock steps back a minute: neither stream moves with it
    for _ in range(10):
        sampler._sample_once()
        clock.advance(0.05)
    sampler._close_sinks()
    from powertrain.store.tables import read_power_samples

    t = read_power_samples(tmp_path / "run").column("t_ns").to_pylist()
    rows = read_telemetry(tmp_path / "run").column("t_ns").to_pylist()
    # one time line: every 100 ms; the sample the driver took between the last read and the step (stamped
    # ahead of the stepped clock) is the one that may be lost
    gaps = [b - a for a, b in itertools.pairwise(t)]
    assert set(gaps) <= {100_000_000, 200_000_000} and gaps.count(200_000_000) <= 1 and len(t) >= 9
    assert rows[0] <= t[0] and t[-1] <= rows[-1]
    assert (tmp_path / "run/telemetry/power-samples/h.parquet").is_file()
    assert read_telemetry(tmp_path / "run").num_rows == 20  # the telemetry readers do not see the stream


def test_a_sensor_spec_survives_the_process_shared_state(tmp_path):
    state = tmp_path / "gpus.json"
    spec = {"waveform": "training_swing", "args": {"burst_w": 100.0}, "buffer_depth": 30}
    write_state(state, [FakeGpu(sensor_spec=spec)])
    assert read_state(state)[0].sensor_spec == spec
    nvml = PersistentNvml(state)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    vtype, samples = nvml.nvmlDeviceGetSamples(h, nvml.NVML_TOTAL_POWER_SAMPLES, 0)
    assert vtype == nvml.NVML_VALUE_TYPE_UNSIGNED_INT and len(samples) == 30  # one sensor, kept across calls
    with pytest.raises(ValueError, match="sensor_spec"):
        write_state(state, [FakeGpu(sensor=PowerSensor(training_swing()))])
