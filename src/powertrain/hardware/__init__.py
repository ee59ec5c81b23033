"""The hardware catalog: what a device and its node can do, from vendor data sheets.

One source of truth for peak FLOP/s per precision, memory, bandwidths, power and thermal limits.
The catalog is data (``catalog.yaml`` next to this file, every value with its ``source:``); users
add or override devices with their own YAML files of the same shape (``load_catalog(extra=...)``
or ``$POWERTRAIN_HARDWARE``, colon-separated paths). The ``cpu`` entry is not looked up but
measured on the spot by a short matmul probe and labelled ``measured``.

Conventions: FLOP/s are dense (no structured sparsity); bandwidths are per device per direction.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
# Where a device lacks a format, the next wider one it has runs the work.
_FALLBACK = {"fp4": ("fp4", "fp8", "bf16", "fp16", "fp32"), "fp8": ("fp8", "bf16", "fp16", "fp32"),
             "bf16": ("bf16", "fp16", "fp32"), "fp16": ("fp16", "bf16", "fp32"), "tf32": ("tf32", "fp32"),
             "fp32": ("fp32",)}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """The node a device usually sits in.

    ``nvlink_domain`` is how many devices share the fast link (72 for an NVL72 rack; the node
    otherwise). Collectives among devices of one domain use ``intra_node_bw``; others cross NICs.
    """

    devices_per_node: int
    intra_node_bw: float  # bytes/s per device per direction
    intra_node_latency: float  # s
    nic_count: int
    nic_bw: float  # bytes/s per NIC per direction
    inter_node_latency: float  # s
    nvlink_domain: int
    source: str = ""

    @property
    def inter_node_bw_per_device(self) -> float:
        """NIC bandwidth available to one device when every device of the node sends at once."""
        return self.nic_count * self.nic_bw / self.devices_per_node


@dataclass(frozen=True, slots=True)
class ThermalSpec:
    """First-order thermal model defaults (not data-sheet values; fit them from a run)."""

    inlet_c: float
    r_c_per_w: float
    tau_s: float
    rear_preheat_c_per_kw: float
    rear_slots_of_8: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One device type. ``peak_flops`` maps precision → dense FLOP/s (absent = not supported)."""

    name: str
    vendor: str
    peak_flops: dict[str, float]
    memory_bytes: float
    memory_bw: float  # bytes/s
    tdp_w: float  # default power limit
    idle_w: float
    power_at_peak_w: float  # draw at full clocks on dense GEMMs (≥ tdp_w for power-capped SKUs)
    slowdown_c: float | None
    node: NodeSpec
    thermal: ThermalSpec
    cooling: str = "air"
    source: str = ""
    note: str = ""
    measured: bool = False
    aliases: tuple[str, ...] = field(default=())

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; falls back to the nearest wider format the device has.

        fp8 on a device without fp8 runs at 16-bit rate, fp16 on a device without it at bf16/fp32.
        """
        for p in _FALLBACK.get(precision, (precision, "fp32")):
            v = self.peak_flops.get(p)
            if v:
                return v
        raise KeyError(f"device {self.name} has no peak FLOP/s for {precision} (or fp32)")


def _node(raw: dict[str, Any], where: str) -> NodeSpec:
    try:
        dpn = int(raw["devices_per_node"])
        return NodeSpec(
            devices_per_node=dpn,
            intra_node_bw=float(raw["intra_node_bw_gb_s"]) * 1e9,
            intra_node_latency=float(raw.get("intra_node_latency_us", 3.0)) * 1e-6,
            nic_count=int(raw["nic_count"]),
            nic_bw=float(raw["nic_gbit_s"]) * 1e9 / 8,
            inter_node_latency=float(raw.get("inter_node_latency_us", 5.0)) * 1e-6,
            nvlink_domain=int(raw.get("nvlink_domain", dpn)),
            source=str(raw.get("source", "")),
        )
    except KeyError as exc:
        raise ValueError(f"{where}: node entry lacks {exc.args[0]!r} (see hardware/catalog.yaml for the keys)") from None


def _thermal(raw: dict[str, Any]) -> ThermalSpec:
    return ThermalSpec(
        inlet_c=float(raw["inlet_c"]), r_c_per_w=float(raw["r_c_per_w"]), tau_s=float(raw["tau_s"]),
        rear_preheat_c_per_kw=float(raw.get("rear_preheat_c_per_kw", 0.0)),
        rear_slots_of_8=tuple(int(s) for s in raw.get("rear_slots_of_8", ())),
    )


def _device(name: str, raw: dict[str, Any], thermal: dict[str, ThermalSpec], where: str) -> DeviceSpec:
    required = ("peak_tflops", "memory_gb", "memory_bw_gb_s", "tdp_w", "node")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ValueError(f"{where}: device {name!r} lacks {', '.join(missing)} (see hardware/catalog.yaml)")
    peaks = {k: float(v) * 1e12 for k, v in raw["peak_tflops"].items() if v is not None}
    cooling = str(raw.get("cooling", "air"))
    th = raw.get("thermal")
    return DeviceSpec(
        name=name,
        vendor=str(raw.get("vendor", "unknown")),
        peak_flops=peaks,
        # Data sheets' HBM "GB" are GiB in practice (an "80 GB" H100 shows 81,559 MiB); the driver
        # reserves a little, so usable memory is taken as 99% of that.
        memory_bytes=float(raw["memory_gb"]) * 2**30 * 0.99,
        memory_bw=float(raw["memory_bw_gb_s"]) * 1e9,
        tdp_w=float(raw["tdp_w"]),
        idle_w=float(raw.get("idle_w", 0.1 * float(raw["tdp_w"]))),
        power_at_peak_w=float(raw.get("power_at_peak_w", raw["tdp_w"])),
        slowdown_c=float(raw["slowdown_c"]) if raw.get("slowdown_c") is not None else None,
        node=_node(raw["node"], f"{where}: {name}"),
        thermal=_thermal(th) if th else thermal.get(cooling, thermal["air"]),
        cooling=cooling,
        source=str(raw.get("source", "")),
        note=str(raw.get("note", "")),
        measured=bool(raw.get("measured", False)),
        aliases=tuple(str(a) for a in raw.get("aliases", ())),
    )


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"hardware file {path} does not exist") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("devices", {}), dict):
        raise ValueError(f"{path}: expected a mapping with a `devices:` mapping (see hardware/catalog.yaml)")
    return raw


def load_catalog(extra: list[str | Path] | tuple[str | Path, ...] = ()) -> dict[str, DeviceSpec]:
    """All devices: the shipped catalog, then $POWERTRAIN_HARDWARE files, then ``extra`` (later wins)."""
    paths: list[Path] = [CATALOG_FILE]
    env = os.environ.get("POWERTRAIN_HARDWARE", "")
    paths += [Path(p) for p in env.split(":") if p]
    paths += [Path(p) for p in extra]
    base = _read(CATALOG_FILE)
    thermal = {k: _thermal(v) for k, v in base.get("thermal", {}).items()}
    out: dict[str, DeviceSpec] = {}
    for path in paths:
        raw = _read(path)
        thermal.update({k: _thermal(v) for k, v in raw.get("thermal", {}).items()})
        for name, dev in raw.get("devices", {}).items():
            out[str(name)] = _device(str(name), dev, thermal, str(path))
    return out


@cache
def _default_catalog() -> dict[str, DeviceSpec]:
    return load_catalog()


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def get_device(name: str, catalog: dict[str, DeviceSpec] | None = None) -> DeviceSpec:
    """A device by catalog name or alias (case and punctuation ignored); ``cpu`` is measured here."""
    if _norm(name) == "cpu":
        return measure_cpu()
    cat = catalog if catalog is not None else _default_catalog()
    if name in cat:
        return cat[name]
    key = _norm(name)
    for dev in cat.values():
        if key == _norm(dev.name) or any(key == _norm(a) for a in dev.aliases):
            return dev
    raise KeyError(
        f"unknown device {name!r}; known: {', '.join(sorted(cat))}, or cpu. "
        "Add your own in a YAML file with the keys of hardware/catalog.yaml and pass it with --hardware"
    )


@cache
def measure_cpu(seconds: float = 0.3) -> DeviceSpec:
    """This machine's CPU as a device, from a short fp32 matmul probe and a memory-copy probe.

    Peak FLOP/s is the best of a few 512×512 fp32 matmuls (numpy's BLAS, all cores); memory
    bandwidth is the best of a few 64 MB copies. Power and temperature values are placeholders the
    host cannot measure here (no RAPL): ``tdp_w`` is a nominal 15 W per core and is labelled so.
    """
    import numpy as np

    n = 512
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    best = float("inf")
    t_end = time.perf_counter() + seconds / 2
    while True:
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > t_end:
            break
    flops = 2 * n**3 / best
    src = np.ones(8 * 1024 * 1024)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages once so the probe times copying, not page faults
    bw_best = float("inf")
    t_end = time.perf_counter() + seconds / 2
    while True:
        t0 = time.perf_counter()
        np.copyto(dst, src)
        bw_best = min(bw_best, time.perf_counter() - t0)
        if time.perf_counter() > t_end:
            break
    bw = 2 * src.nbytes / bw_best
    cores = os.cpu_count() or 1
    try:
        import psutil

        mem = float(psutil.virtual_memory().total)
    except Exception:  # psutil is a core dependency; this only guards odd containers
        mem = 8e9
    tdp = 15.0 * cores
    node = NodeSpec(devices_per_node=1, intra_node_bw=bw / 4, intra_node_latency=20e-6, nic_count=1,
                    nic_bw=10e9 / 8, inter_node_latency=50e-6, nvlink_domain=1,
                    source="measured: shared-memory transport approximated as a quarter of copy bandwidth")
    return DeviceSpec(
        name="cpu", vendor="host",
        peak_flops={"fp32": flops, "bf16": flops, "fp16": flops, "tf32": flops},
        memory_bytes=mem, memory_bw=bw, tdp_w=tdp, idle_w=0.3 * tdp, power_at_peak_w=tdp, slowdown_c=None, node=node,
        thermal=ThermalSpec(inlet_c=25.0, r_c_per_w=0.3, tau_s=30.0, rear_preheat_c_per_kw=0.0,
                            rear_slots_of_8=()),
        source=f"measured on this host: fp32 matmul {flops / 1e9:.1f} GFLOP/s, copy {bw / 1e9:.1f} GB/s, {cores} cores",
        note="power values are nominal (15 W/core), not measured: this host has no power sensor",
        measured=True,
    )

