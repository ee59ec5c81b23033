"""Host telemetry from procfs, cgroups, RAPL (powercap), hwmon and thermal zones.

One device row, ``cpu``, per sample. Everything is read from plain files whose roots are
parameters, so tests can point the backend at a tree laid out in a temporary folder. Sources that are
absent (no RAPL, no hwmon, as on VMs and containers) leave their fields null and are named in
:attr:`HostBackend.notes`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powertrain.core.counters import Unwrapper
from powertrain.schema import empty_telemetry_row
from powertrain.telemetry.backend import Backend, DeviceInfo

# hwmon drivers that report the CPU package temperature, in order of preference
_CPU_HWMON = ("coretemp", "k10temp", "zenpower", "cpu_thermal")
_CPU_THERMAL_ZONE_TYPES = ("x86_pkg_temp", "cpu-thermal", "cpu_thermal", "soc_thermal")


@dataclass
class _RaplDomain:
    path: Path
    name: str  # "package-0", "dram", "core", ...
    unwrap: Unwrapper

    def read_j(self) -> float | None:
        try:
            return self.unwrap(int(self.path.joinpath("energy_uj").read_text()) / 1e6)
        except (OSError, ValueError):
            return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class HostBackend(Backend):
    """CPU utilisation, memory, cgroup usage, RAPL energy and CPU temperature where present."""

    name = "host"

    def __init__(self, proc: str | Path = "/proc", sys: str | Path = "/sys") -> None:
        super().__init__()
        self.proc = Path(proc)
        self.sys = Path(sys)
        self.notes: list[str] = []
        self._prev_cpu: tuple[int, int] | None = self._read_cpu_times()
        self._cgroup_cpu, self._cgroup_cpu_scale, self._cgroup_mem = self._find_cgroup()
        self._rapl_pkg, self._rapl_dram = self._find_rapl()
        self._temp_path = self._find_cpu_temp()
        self._info = DeviceInfo(
            device="cpu",
            kind="cpu",
            vendor="host",
            name=self._cpu_model(),
            supported=self._supported(),
            properties={"cores": os.cpu_count(), "mem_total_bytes": self._meminfo().get("MemTotal")},
        )

    # -- discovery ----------------------------------------------------------------------------
    def _cpu_model(self) -> str | None:
        try:
            for line in self.proc.joinpath("cpuinfo").read_text().splitlines():
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return None

    def _find_cgroup(self) -> tuple[Path | None, float, Path | None]:
        """The cgroup this process lives in: (cpu usage file, seconds per unit, memory usage file)."""
        rel = "/"
        try:
            for line in self.proc.joinpath("self/cgroup").read_text().splitlines():
                _, controllers, cgroup = line.split(":", 2)
                if controllers == "" or "cpuacct" in controllers.split(","):
                    rel = cgroup
                    if controllers:
                        break
        except (OSError, ValueError):
            pass
        base = self.sys / "fs/cgroup"
        rel = rel.lstrip("/")
        candidates_cpu = [
            (base / rel / "cpu.stat", 1e-6),  # v2: usage_usec
            (base / "cpuacct" / rel / "cpuacct.usage", 1e-9),  # v1: ns
            (base / "cpu,cpuacct" / rel / "cpuacct.usage", 1e-9),
            (base / "cpuacct/cpuacct.usage", 1e-9),
            (base / "cpu.stat", 1e-6),
        ]
        cpu: Path | None = None
        scale = 1.0
        for path, s in candidates_cpu:
            if path.is_file():
                cpu, scale = path, s
                break
        mem: Path | None = None
        for path in (base / rel / "memory.current", base / "memory" / rel / "memory.usage_in_bytes",
                     base / "memory/memory.usage_in_bytes", base / "memory.current"):
            if path.is_file():
                mem = path
                break
        if cpu is None:
            self.notes.append("host: no cgroup CPU accounting found; cgroup_cpu_s not measured")
        return cpu, scale, mem

    def _find_rapl(self) -> tuple[list[_RaplDomain], list[_RaplDomain]]:
        root = self.sys / "class/powercap"
        pkg: list[_RaplDomain] = []
        dram: list[_RaplDomain] = []
        if not root.is_dir():
            self.notes.append("host: no RAPL (/sys/class/powercap absent): CPU energy not measured here")
            return pkg, dram
        unreadable = False
        for zone in sorted(root.glob("*rapl:*")):
            name_file = zone / "name"
            if not name_file.is_file() or not (zone / "energy_uj").exists():
                continue
            name = name_file.read_text().strip()
            if _read_int(zone / "energy_uj") is None:
                unreadable = True
                continue
            modulus = _read_int(zone / "max_energy_range_uj")
            dom = _RaplDomain(zone, name, Unwrapper(modulus / 1e6 if modulus else None))
            if name.startswith("package"):
                pkg.append(dom)
            elif name == "dram":
                dram.append(dom)
        if unreadable and not pkg:
            self.notes.append("host: RAPL present but energy_uj is not readable (needs root): CPU energy not measured")
        elif not pkg:
            self.notes.append("host: no RAPL package domain found: CPU energy not measured here")
        return pkg, dram

    def _find_cpu_temp(self) -> list[Path]:
        hw = self.sys / "class/hwmon"
        for driver in _CPU_HWMON:
            for mon in sorted(hw.glob("hwmon*")):
                try:
                    if mon.joinpath("name").read_text().strip() != driver:
                        continue
                except OSError:
                    continue
                inputs = sorted(mon.glob("temp*_input"))
                # Prefer the package / Tctl sensors over per-core ones.
                labelled = [
                    p for p in inputs
                    if p.with_name(p.name.replace("_input", "_label")).is_file()
                    and p.with_name(p.name.replace("_input", "_label")).read_text().strip().startswith(
                        ("Package", "Tctl", "Tdie"))
                ]
                if labelled or inputs:
                    return labelled or inputs
        for zone in sorted((self.sys / "class/thermal").glob("thermal_zone*")):
            try:
                if zone.joinpath("type").read_text().strip() in _CPU_THERMAL_ZONE_TYPES:
                    return [zone / "temp"]
            except OSError:
                continue
        self.notes.append("host: no CPU temperature sensor (hwmon / thermal zone) found: not measured here")
        return []

    def _supported(self) -> list[str]:
        fields = ["cpu_util_pct", "mem_used_bytes", "load_1m"]
        if self._cgroup_cpu:
            fields.append("cgroup_cpu_s")
        if self._cgroup_mem:
            fields.append("cgroup_mem_bytes")
        if self._rapl_pkg:
            fields.append("energy_j")
        if self._rapl_dram:
            fields.append("energy_dram_j")
        if self._temp_path:
            fields.append("temp_c")
        return fields

    # -- sampling -----------------------------------------------------------------------------
    def _read_cpu_times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies over all CPUs from the first line of /proc/stat."""
        try:
            with open(self.proc / "stat", "rb") as f:
                parts = f.readline().split()
        except OSError:
            return None
        vals = [int(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq steal
        total = sum(vals)
        idle = vals[3] + vals[4]
        return total - idle, total

    def _meminfo(self) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            with open(self.proc / "meminfo") as f:
                for line in f:
                    key, rest = line.split(":", 1)
                    if key in ("MemTotal", "MemAvailable"):
                        out[key] = int(rest.split()[0]) * 1024
                        if len(out) == 2:
                            break
        except (OSError, ValueError):
            pass
        return out

    def devices(self) -> list[DeviceInfo]:
        return [self._info]

    def sample(self, host: str) -> list[dict[str, Any]]:
        row = empty_telemetry_row(time.time_ns(), host, "cpu")
        cur = self._read_cpu_times()
        if cur is not None and self._prev_cpu is not None:
            d_busy, d_total = cur[0] - self._prev_cpu[0], cur[1] - self._prev_cpu[1]
            if d_total > 0:  # no jiffy passed yet: unknown, not 0 %
                row["cpu_util_pct"] = 100.0 * d_busy / d_total
                self._prev_cpu = cur
        elif cur is not None:
            self._prev_cpu = cur
        mem = self._meminfo()
        if "MemTotal" in mem and "MemAvailable" in mem:
            row["mem_used_bytes"] = mem["MemTotal"] - mem["MemAvailable"]
        row["load_1m"] = os.getloadavg()[0]
        if self._cgroup_cpu is not None:
            row["cgroup_cpu_s"] = self._read_cgroup_cpu()
        if self._cgroup_mem is not None:
            row["cgroup_mem_bytes"] = _read_int(self._cgroup_mem)
        if self._rapl_pkg:
            row["energy_j"] = _sum_or_none(d.read_j() for d in self._rapl_pkg)
        if self._rapl_dram:
            row["energy_dram_j"] = _sum_or_none(d.read_j() for d in self._rapl_dram)
        if self._temp_path:
            temps = [t for t in (_read_int(p) for p in self._temp_path) if t is not None]
            row["temp_c"] = max(temps) / 1000.0 if temps else None
        return [row]

    def _read_cgroup_cpu(self) -> float | None:
        assert self._cgroup_cpu is not None
        if self._cgroup_cpu.name == "cpu.stat":
            try:
                for line in self._cgroup_cpu.read_text().splitlines():
                    if line.startswith("usage_usec"):
                        return int(line.split()[1]) * self._cgroup_cpu_scale
            except (OSError, ValueError):
                return None
            return None
        raw = _read_int(self._cgroup_cpu)
        return None if raw is None else raw * self._cgroup_cpu_scale


def _sum_or_none(values: Any) -> float | None:
    vals = list(values)
    if not vals or any(v is None for v in vals):
        return None  # a partial sum would be a wrong total
    return float(sum(vals))
