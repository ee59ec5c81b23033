"""The host backend, on this machine for real and on sysfs/procfs trees laid out in tmp folders."""

from pathlib import Path

import pytest

from powertrain.telemetry.host import HostBackend

STAT = "cpu  {u} 0 {s} {i} 0 0 0 0 0 0\ncpu0 1 2 3 4 0 0 0 0 0 0\n"
MEMINFO = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:   12000000 kB\n"


def _proc(tmp: Path, user=100, system=50, idle=850) -> Path:
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(STAT.format(u=user, s=system, i=idle))
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "cpuinfo").write_text("processor : 0\nmodel name : Test CPU 9000\n")
    (proc / "self/cgroup").write_text("0::/\n")
    return proc


def _rapl(sys: Path, name: str, idx: str, energy_uj: int, max_uj: int) -> Path:
    zone = sys / "class/powercap" / f"intel-rapl:{idx}"
    zone.mkdir(parents=True)
    (zone / "name").write_text(name + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_real_host_measures_cpu_and_reports_no_power(tmp_path):
    backend = HostBackend()
    (row,) = backend.sample("h")
    info = backend.devices()[0]
    assert row["device"] == "cpu" and info.kind == "cpu"
    assert row["mem_used_bytes"] > 0
    assert "cpu_util_pct" in info.supported
    # This machine has no RAPL, hwmon or GPU: those fields are unknown, never 0.
    if not Path("/sys/class/powercap").is_dir():
        assert row["energy_j"] is None and "energy_j" not in info.supported
        assert any("RAPL" in n for n in backend.notes)
    assert row["power_w"] is None and row["temp_mem_c"] is None


def test_cpu_utilisation_from_proc_stat_deltas(tmp_path):
    proc = _proc(tmp_path)
    backend = HostBackend(proc=proc, sys=tmp_path / "sys")
    _proc(tmp_path, user=100 + 30, system=50 + 10, idle=850 + 60)  # 40 busy of 100 jiffies
    (row,) = backend.sample("h")
    assert row["cpu_util_pct"] == pytest.approx(40.0)
    assert row["mem_used_bytes"] == (16000000 - 12000000) * 1024
    (row,) = backend.sample("h")  # no time passed in the fake /proc: unknown, not 0 %
    assert row["cpu_util_pct"] is None
    assert backend.devices()[0].name == "Test CPU 9000"


def test_rapl_package_and_dram_energy_with_wrap(tmp_path):
    proc = _proc(tmp_path)
    sys = tmp_path / "sys"
    pkg0 = _rapl(sys, "package-0", "0", 999_000_000, 1_000_000_000)
    pkg1 = _rapl(sys, "package-1", "1", 10_000_000, 1_000_000_000)
    dram = sys / "class/powercap/intel-rapl:0:0"
    dram.mkdir()
    (dram / "name").write_text("dram\n")
    (dram / "energy_uj").write_text("5000000\n")
    (dram / "max_energy_range_uj").write_text("65532610987\n")
    backend = HostBackend(proc=proc, sys=sys)
    assert {"energy_j", "energy_dram_j"} <= set(backend.devices()[0].supported)
    (r1,) = backend.sample("h")
    assert r1["energy_j"] == pytest.approx(999.0 + 10.0)
    assert r1["energy_dram_j"] == pytest.approx(5.0)
    # package-0 wraps: 999 J → 1 J means 2 J were used, not -998 J.
    (pkg0 / "energy_uj").write_text("1000000\n")
    (pkg1 / "energy_uj").write_text("12000000\n")
    (r2,) = backend.sample("h")
    assert r2["energy_j"] - r1["energy_j"] == pytest.approx(2.0 + 2.0)


def test_unreadable_rapl_is_named_not_zero(tmp_path):
    proc = _proc(tmp_path)
    sys = tmp_path / "sys"
    zone = _rapl(sys, "package-0", "0", 1, 10)
    (zone / "energy_uj").write_text("")  # what a permission-stripped read looks like to us: no value
    backend = HostBackend(proc=proc, sys=sys)
    (row,) = backend.sample("h")
    assert row["energy_j"] is None
    assert any("not readable" in n for n in backend.notes)


def test_cpu_temperature_prefers_hwmon_package_sensor(tmp_path):
    proc = _proc(tmp_path)
    sys = tmp_path / "sys"
    mon = sys / "class/hwmon/hwmon3"
    mon.mkdir(parents=True)
    (mon / "name").write_text("coretemp\n")
    (mon / "temp1_input").write_text("61000\n")
    (mon / "temp1_label").write_text("Package id 0\n")
    (mon / "temp2_input").write_text("75000\n")
    (mon / "temp2_label").write_text("Core 0\n")
    backend = HostBackend(proc=proc, sys=sys)
    (row,) = backend.sample("h")
    assert row["temp_c"] == 61.0
    assert "temp_c" in backend.devices()[0].supported


def test_thermal_zone_fallback_and_cgroup_v2(tmp_path):
    proc = _proc(tmp_path)
    sys = tmp_path / "sys"
    zone = sys / "class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("x86_pkg_temp\n")
    (zone / "temp").write_text("48500\n")
    cg = sys / "fs/cgroup"
    cg.mkdir(parents=True)
    (cg / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (cg / "memory.current").write_text("123456\n")
    backend = HostBackend(proc=proc, sys=sys)
    (row,) = backend.sample("h")
    assert row["temp_c"] == 48.5
    assert row["cgroup_cpu_s"] == pytest.approx(2.5)
    assert row["cgroup_mem_bytes"] == 123456


def test_cgroup_v1_cpuacct(tmp_path):
    proc = _proc(tmp_path)
    sys = tmp_path / "sys"
    acct = sys / "fs/cgroup/cpuacct"
    acct.mkdir(parents=True)
    (acct / "cpuacct.usage").write_text("3000000000\n")
    backend = HostBackend(proc=proc, sys=sys)
    (row,) = backend.sample("h")
    assert row["cgroup_cpu_s"] == pytest.approx(3.0)
