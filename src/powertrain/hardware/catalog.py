"""The hardware catalog: what a device and its node can do, from vendor data sheets.

One source of truth for peak FLOP/s per precision, memory, bandwidths, power and thermal limits.
The catalog is data (``catalog.yaml`` next to this file, every value with its ``source:``); users
add or override devices with their own YAML files of the same shape (``load_catalog(extra=...)``
or ``$POWERTRAIN_HARDWARE``, colon-separated paths). The ``cpu`` entry is not looked up but
measured by a host probe (:func:`~powertrain.hardware.host_probe.probe_host`) and labelled
``measured``: :func:`cpu_device` makes one rank's share of it a device (no power sensor; its ranks
talk through gloo).

Conventions: FLOP/s are dense (no structured sparsity); bandwidths are per device per direction.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from powertrain.core.yamlfile import load_yaml_file
from powertrain.hardware.host_probe import HostProbe, probe_host, rank_threads

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
TRANSPORTS = ("nccl", "gloo")  # collective libraries the model knows (RCCL is NCCL's AMD port: "nccl")
# Where a device lacks a format, the next wider one it has runs the work.
_FALLBACK = {"fp4": ("fp4", "fp8", "bf16", "fp16", "fp32"), "fp8": ("fp8", "bf16", "fp16", "fp32"),
             "bf16": ("bf16", "fp16", "fp32"), "fp16": ("fp16", "bf16", "fp32"), "tf32": ("tf32", "fp32"),
             "fp32": ("fp32",)}


@dataclass(frozen=True, slots=True)
class PsuSpec:
    """The node's power supplies: ``count`` supplies of ``rated_w`` output each, ``redundant`` of them spare
    (DGX H100: 6 × 3300 W, 4+2). All of them share the load (the DGX user guides' "balanced distribution of the
    power load"), so each runs at DC load ÷ (count × rated_w) of its rating."""

    count: int
    rated_w: float  # output rating of one supply, W
    redundant: int = 0  # supplies the node can lose and keep running (the 2 of "4+2"); 0: not stated


@dataclass(frozen=True, slots=True)
class HostSpec:
    """What a node holds besides its GPUs, for its power (:mod:`powertrain.predict.node_power`).

    Counts and ratings come from the node's data sheet or user guide; a value left ``None`` is not
    described and the node-power model says what it assumes in its place (per-part watts that no data
    sheet gives: NIC, DIMM, NVSwitch, drive). CPU figures are per socket. ``max_power_w`` is the data
    sheet's maximum system input, which an air-cooled node's fans are sized to remove at full speed.
    """

    cpu_sockets: int | None = None
    cpu_cores: int | None = None  # per socket
    cpu_tdp_w: float | None = None  # per socket (Intel ARK / AMD data sheet)
    cpu_idle_w: float | None = None  # per socket
    memory_gb: float | None = None
    dimms: int | None = None
    dimm_w: float | None = None
    nics: int | None = None  # scale-out NICs; None: the node's nic_count
    nic_w: float | None = None
    dpus: int | None = None
    dpu_w: float | None = None
    nvswitches: int | None = None  # NVSwitch / NVLink switch chips on the node's baseboard
    nvswitch_w: float | None = None
    retimers: int | None = None  # PCIe retimers on the baseboard
    retimer_w: float | None = None
    drives: int | None = None
    drive_w: float | None = None
    other_w: float | None = None  # BMC, chipset, board and voltage-regulator losses not counted above
    fans_max_w: float | None = None  # all fans at full speed (air cooling)
    fan_min_speed: float | None = None  # the lowest fan speed the controller runs, a share of full speed
    airflow_max_cfm: float | None = None  # the fans' airflow at full speed
    air_delta_t_c: float | None = None  # the air temperature rise the fan control allows, inlet to exhaust
    max_power_w: float | None = None  # data sheet maximum system power (input)
    psu: PsuSpec | None = None
    source: str = ""
    note: str = ""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """The node a device usually sits in.

    ``nvlink_domain`` is how many devices share the fast link (72 for an NVL72 rack; the node
    otherwise). Collectives among devices of one domain use ``intra_node_bw``; others cross NICs.
    ``host`` describes what else the node holds, for its power at the wall (None: not described, so node
    power is unknown and a prediction says so).
    """

    devices_per_node: int
    intra_node_bw: float  # bytes/s per device per direction
    intra_node_latency: float  # s
    nic_count: int
    nic_bw: float  # bytes/s per NIC per direction
    inter_node_latency: float  # s
    nvlink_domain: int
    source: str = ""
    # scale-up switch reduces in-network (NVLink SHARP / NVLS: NVSwitch gen 3+, H100 and later)
    nvls: bool = False
    # scale-out fabric: rail-optimized (GPU i of every node on leaf i), and oversubscribed above a pod
    rail_optimized: bool = True
    pod_devices: int = 0  # devices below which the fabric is non-blocking (0: all of it)
    oversubscription: float = 1.0
    host: HostSpec | None = None

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
    # draw of large dense 16-bit GEMMs at the maximum SM clock with no power limit (far above tdp_w on parts that
    # run GEMMs power-capped); None: not measured for this part, predict/dvfs.py takes its generation's ratio
    power_at_peak_w: float | None
    slowdown_c: float | None
    node: NodeSpec
    thermal: ThermalSpec
    cooling: str = "air"
    source: str = ""
    note: str = ""
    # False: nothing reads this device's power or temperature (a host CPU), so the model predicts none
    has_power_sensor: bool = True
    # the collective library its ranks talk through: "nccl" (GPUs; RCCL on AMD) or "gloo" (host CPUs),
    # whose every call also pays a rendezvous round trip
    transport: str = "nccl"
    aliases: tuple[str, ...] = field(default=())
    probe: HostProbe | None = None  # the host probe a measured (CPU) device was built from
    # the highest SM (graphics) clock the device runs at (nvidia-smi's "Max Clocks", AMD's peak engine clock):
    # what turns a clock lock in MHz into a clock ratio; None: not known, a lock cannot be predicted
    max_sm_clock_mhz: float | None = None
    # streaming multiprocessors (NVIDIA) or compute units (AMD): the slots a GEMM's or attention kernel's thread
    # blocks fill wave by wave (predict/kernel_shape.py); None: not known (a host CPU), no wave model
    compute_units: int | None = None

    @property
    def is_host_cpu(self) -> bool:
        """A host CPU standing in for a device (no CUDA context, no power or temperature sensor)."""
        return self.vendor == "host"

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; falls back to the nearest wider format the device has.

        fp8 on a device without fp8 runs at 16-bit rate, fp16 on a device without it at bf16/fp32.
        """
        for p in _FALLBACK.get(precision, (precision, "fp32")):
            v = self.peak_flops.get(p)
            if v:
                return v
        raise KeyError(f"device {self.name} has no peak FLOP/s for {precision} (or fp32)")


# Every key an entry may carry, per level. A key outside them is a typo or a knob the model lacks, and a
# typo read as "absent" puts the default in its place (`idle_watts` → idle_w = 10 % of TDP, `slowdown_temp_c`
# → no throttling) without a word: so it is refused. `note` and `source` document a value; no formula reads them.
_DOC_KEYS = frozenset({"note", "source"})
_TOP_KEYS = frozenset({"devices", "thermal"})
_DEVICE_KEYS = _DOC_KEYS | {"aliases", "vendor", "peak_tflops", "memory_gb", "memory_bw_gb_s", "tdp_w", "idle_w",
                            "power_at_peak_w", "slowdown_c", "node", "thermal", "cooling", "has_power_sensor",
                            "transport", "measured", "max_sm_clock_mhz", "compute_units"}
_NODE_KEYS = _DOC_KEYS | {"devices_per_node", "intra_node_bw_gb_s", "intra_node_latency_us", "nic_count",
                          "nic_gbit_s", "inter_node_latency_us", "nvlink_domain", "nvls", "rail_optimized",
                          "pod_devices", "oversubscription", "host"}
# a node's host description (HostSpec): counts are whole numbers, the rest non-negative numbers
_HOST_COUNTS = frozenset({"cpu_sockets", "cpu_cores", "dimms", "nics", "dpus", "nvswitches", "retimers", "drives"})
_HOST_NUMBERS = frozenset({"cpu_tdp_w", "cpu_idle_w", "memory_gb", "dimm_w", "nic_w", "dpu_w", "nvswitch_w",
                           "retimer_w", "drive_w", "other_w", "fans_max_w", "fan_min_speed", "airflow_max_cfm",
                           "air_delta_t_c", "max_power_w"})
_HOST_KEYS = _DOC_KEYS | _HOST_COUNTS | _HOST_NUMBERS | {"psu"}
_PSU_KEYS = _DOC_KEYS | {"count", "rated_w", "redundant"}
_THERMAL_KEYS = _DOC_KEYS | {"inlet_c", "r_c_per_w", "tau_s", "rear_preheat_c_per_kw", "rear_slots_of_8"}
# keys people write for what the catalog names otherwise, too far in spelling for difflib to find
_MEANS = {k: "tdp_w, the default power limit" for k in ("power_limit_w", "power_limit", "tdp")}


def _check_keys(raw: Any, known: frozenset[str], where: str) -> None:
    """Refuse (one-line ValueError naming the closest known key) anything but a mapping of ``known`` keys."""
    import difflib

    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping of key: value, not {type(raw).__name__} "
                         "(see hardware/catalog.yaml)")
    for key in raw:
        if key in known:
            continue
        near = [_MEANS[key]] if key in _MEANS else difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(sorted(known))}"
        raise ValueError(f"{where}: unknown key {key!r} ({hint})")


def _peaks(raw: Any, where: str) -> dict[str, float]:
    """``peak_tflops`` as precision → FLOP/s (a null value: the device lacks the format).

    Precisions are read case-insensitively (data sheets write BF16); any other name would never be
    looked up, so its work would silently run at the fp32 fallback: refused."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: peak_tflops must map precisions ({', '.join(PRECISIONS)}) to dense TFLOP/s")
    out: dict[str, float] = {}
    seen: dict[str, Any] = {}
    for key, value in raw.items():
        prec = str(key).strip().lower()
        if prec not in PRECISIONS:
            raise ValueError(f"{where}: peak_tflops {key!r} is not a precision the model computes in; "
                             f"use {', '.join(PRECISIONS)} or drop it")
        if prec in seen:
            raise ValueError(f"{where}: peak_tflops gives {prec} twice ({seen[prec]!r} and {key!r}); keep one")
        seen[prec] = key
        if value is None:
            continue
        try:
            tflops = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            tflops = math.nan
        if not (math.isfinite(tflops) and tflops >= 0):
            raise ValueError(f"{where}: peak_tflops {key!r} = {value!r} is not a number of TFLOP/s "
                             "(null: the device lacks the format)")
        out[prec] = tflops * 1e12
    return out


def _node(raw: dict[str, Any], where: str) -> NodeSpec:
    _check_keys(raw, _NODE_KEYS, where)
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
            nvls=bool(raw.get("nvls", False)),
            rail_optimized=bool(raw.get("rail_optimized", True)),
            pod_devices=int(raw.get("pod_devices", 0)),
            oversubscription=float(raw.get("oversubscription", 1.0)),
            host=_host(raw["host"], f"{where} host") if raw.get("host") is not None else None,
        )
    except KeyError as exc:
        raise ValueError(f"{where}: node entry lacks {exc.args[0]!r} (see hardware/catalog.yaml for the keys)") from None


def _host_value(raw: dict[str, Any], key: str, where: str) -> Any:
    """One host value: a whole number ≥ 0 for a count, a finite number ≥ 0 otherwise; None where absent."""
    v = raw.get(key)
    if v is None:
        return None
    count = key in _HOST_COUNTS or key in ("count", "redundant")
    ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and v >= 0
    if not ok or (count and v != int(v)):
        what = "a whole number ≥ 0" if count else "a number ≥ 0"
        raise ValueError(f"{where}: {key} = {v!r} is not {what}")
    return int(v) if count else float(v)


def _host(raw: Any, where: str) -> HostSpec:
    """A node's ``host:`` block (see the catalog header); unknown keys refused, values checked."""
    _check_keys(raw, _HOST_KEYS, where)
    vals = {k: _host_value(raw, k, where) for k in _HOST_COUNTS | _HOST_NUMBERS}
    # the two largest host terms cannot be guessed: a host block states them (0 where the part is not there)
    lacks = [k for k in ("cpu_sockets",) if vals[k] is None] + (
        ["cpu_tdp_w"] if vals["cpu_sockets"] and vals["cpu_tdp_w"] is None else []) + (
        ["dimms or memory_gb"] if vals["dimms"] is None and vals["memory_gb"] is None else [])
    if lacks:
        raise ValueError(f"{where} lacks {', '.join(lacks)} (see the host keys in the header of hardware/catalog.yaml)")
    if vals["fan_min_speed"] is not None and vals["fan_min_speed"] > 1:
        raise ValueError(f"{where}: fan_min_speed = {vals['fan_min_speed']:g} is a share of full speed; give 0-1")
    if vals["cpu_idle_w"] is not None and vals["cpu_tdp_w"] is not None and vals["cpu_idle_w"] > vals["cpu_tdp_w"]:
        raise ValueError(f"{where}: cpu_idle_w {vals['cpu_idle_w']:g} is above cpu_tdp_w {vals['cpu_tdp_w']:g}")
    psu = None
    if raw.get("psu") is not None:
        p, at = raw["psu"], f"{where} psu"
        _check_keys(p, _PSU_KEYS, at)
        count, rated = _host_value(p, "count", at), _host_value(p, "rated_w", at)
        if not count or not rated:
            raise ValueError(f"{at}: give count (supplies, ≥ 1) and rated_w (W output each), e.g. "
                             "{count: 6, rated_w: 3300, redundant: 2}")
        redundant = _host_value(p, "redundant", at) or 0
        if redundant >= count:
            raise ValueError(f"{at}: redundant {redundant} of {count} supplies leaves none to carry the load")
        psu = PsuSpec(count=count, rated_w=rated, redundant=redundant)
    return HostSpec(**vals, psu=psu, source=str(raw.get("source", "")), note=str(raw.get("note", "")))


def _thermal(raw: dict[str, Any], where: str) -> ThermalSpec:
    _check_keys(raw, _THERMAL_KEYS, where)
    missing = [k for k in ("inlet_c", "r_c_per_w", "tau_s") if k not in raw]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)} (see the thermal entries of hardware/catalog.yaml)")
    return ThermalSpec(
        inlet_c=float(raw["inlet_c"]), r_c_per_w=float(raw["r_c_per_w"]), tau_s=float(raw["tau_s"]),
        rear_preheat_c_per_kw=float(raw.get("rear_preheat_c_per_kw", 0.0)),
        rear_slots_of_8=tuple(int(s) for s in raw.get("rear_slots_of_8", ())),
    )


def _device(name: str, raw: dict[str, Any], thermal: dict[str, ThermalSpec], where: str) -> DeviceSpec:
    at = f"{where}: device {name!r}"
    _check_keys(raw, _DEVICE_KEYS, at)
    required = ("peak_tflops", "memory_gb", "memory_bw_gb_s", "tdp_w", "node")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ValueError(f"{where}: device {name!r} lacks {', '.join(missing)} (see hardware/catalog.yaml)")
    peaks = _peaks(raw["peak_tflops"], at)
    cooling = str(raw.get("cooling", "air"))
    th = raw.get("thermal")
    if not th and cooling not in thermal:  # else its thermal model would silently be air's
        raise ValueError(f"{at}: cooling {cooling!r} has no thermal entry (known: {', '.join(sorted(thermal))}); "
                         "add one under the file's `thermal:` or give the device its own `thermal:`")
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
        power_at_peak_w=_positive(raw.get("power_at_peak_w"), f"{at}: power_at_peak_w"),
        slowdown_c=float(raw["slowdown_c"]) if raw.get("slowdown_c") is not None else None,
        node=_node(raw["node"], f"{at} node"),
        thermal=_thermal(th, f"{at} thermal") if th else thermal[cooling],
        cooling=cooling,
        source=str(raw.get("source", "")),
        note=str(raw.get("note", "")),
        **_sensor_and_transport(raw, f"{where}: device {name!r}"),
        aliases=tuple(str(a) for a in raw.get("aliases", ())),
        max_sm_clock_mhz=_positive(raw.get("max_sm_clock_mhz"), f"{at}: max_sm_clock_mhz"),
        compute_units=_whole(raw.get("compute_units"), f"{at}: compute_units"),
    )


def _whole(value: Any, where: str) -> int | None:
    """A positive whole number, or None where absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where} must be a whole number ≥ 1, got {value!r}")
    return value


def _positive(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where} must be a positive number, not {value!r}")
    return float(value)


def _sensor_and_transport(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``has_power_sensor`` and ``transport`` of a device entry.

    The old key ``measured: true`` (before these two existed) still reads as what it meant: no power
    sensor, collectives through gloo; the new keys win where both are given.
    """
    old = bool(raw.get("measured", False))
    transport = str(raw.get("transport", "gloo" if old else "nccl"))
    if transport not in TRANSPORTS:
        raise ValueError(f"{where}: transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    return {"has_power_sensor": bool(raw.get("has_power_sensor", not old)), "transport": transport}


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = load_yaml_file(path, "hardware file") or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"hardware file {path} does not exist") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("devices", {}), dict):
        raise ValueError(f"{path}: expected a mapping with a `devices:` mapping (see hardware/catalog.yaml)")
    _check_keys(raw, _TOP_KEYS, str(path))
    if not isinstance(raw.get("thermal", {}), dict):
        raise ValueError(f"{path}: `thermal:` must map a cooling name to its entry (see hardware/catalog.yaml)")
    return raw


def _catalog_files(extra: list[str | Path] | tuple[str | Path, ...] = ()) -> list[tuple[Path, dict[str, Any]]]:
    paths: list[Path] = [CATALOG_FILE]
    env = os.environ.get("POWERTRAIN_HARDWARE", "")
    paths += [Path(p) for p in env.split(":") if p]
    paths += [Path(p) for p in extra]
    return [(path, _read(path)) for path in paths]


def _thermal_table(raws: list[tuple[Path, dict[str, Any]]]) -> dict[str, ThermalSpec]:
    # every file's cooling entries first (later wins), so a user's `thermal: air:` reaches the shipped
    # air-cooled devices too, not only devices defined after it
    thermal: dict[str, ThermalSpec] = {}
    for path, raw in raws:
        thermal.update({k: _thermal(v, f"{path}: thermal {k!r}") for k, v in raw.get("thermal", {}).items()})
    return thermal


def cooling_thermal(cooling: str) -> ThermalSpec:
    """The thermal entry of a cooling kind (``air``, ``liquid``, ``immersion``: the catalog's ``thermal:`` table,
    $POWERTRAIN_HARDWARE files included); a kind no file describes is refused naming the known ones."""
    table = _cooling_table(os.environ.get("POWERTRAIN_HARDWARE", ""))
    if cooling not in table:
        raise ValueError(f"cooling {cooling!r} has no thermal entry (known: {', '.join(sorted(table))}); add one "
                         "under `thermal:` in a --hardware file")
    return table[cooling]


@cache
def _cooling_table(env: str) -> dict[str, ThermalSpec]:
    del env  # the cache key: the files $POWERTRAIN_HARDWARE names
    return _thermal_table(_catalog_files())


def load_catalog(extra: list[str | Path] | tuple[str | Path, ...] = ()) -> dict[str, DeviceSpec]:
    """All devices: the shipped catalog, then $POWERTRAIN_HARDWARE files, then ``extra`` (later wins)."""
    raws = _catalog_files(extra)
    thermal = _thermal_table(raws)
    out: dict[str, DeviceSpec] = {}
    for path, raw in raws:
        for name, dev in raw.get("devices", {}).items():
            out[str(name)] = _device(str(name), dev, thermal, str(path))
    return out


@cache
def _default_catalog() -> dict[str, DeviceSpec]:
    return load_catalog()


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def is_cpu_name(name: str | None) -> bool:
    """Whether a device name means the host CPU (case and punctuation ignored)."""
    return bool(name) and _norm(str(name)) == "cpu"


def get_device(name: str, catalog: dict[str, DeviceSpec] | None = None) -> DeviceSpec:
    """A device by catalog name, alias, or a name as people write it; ``cpu`` is measured here.

    Exact names and aliases match first (case and punctuation ignored); otherwise the name is read as
    tokens — vendor, family (``h100``, ``gb200``, ``mi300x``), memory size (``80GB``), form factor
    (SXM, PCIe, NVL, OAM) and power (``700W``) — and matched against what each entry states
    (:func:`resolve_device`). An unknown or ambiguous name raises :class:`UnknownDeviceError` naming the
    closest entries.
    """
    if is_cpu_name(name):
        return measure_cpu()
    cat = catalog if catalog is not None else _default_catalog()
    if name in cat:
        return cat[name]
    return cat[resolve_device(name, cat)]


def looks_like_path(text: str) -> bool:
    """Whether a --hardware value is a file, not a device name: a path separator, a YAML suffix, or a file there."""
    return os.sep in text or Path(text).suffix.lower() in (".yaml", ".yml") or Path(text).is_file()


def use_catalog_file(path: str | os.PathLike[str]) -> None:
    """Add a hardware file to this process's catalog, after $POWERTRAIN_HARDWARE's (a later entry of a name wins):
    every lookup from here on — a spec's device, a case, the planner's rules — sees its devices."""
    resolved = str(Path(path).resolve())
    files = [p for p in os.environ.get("POWERTRAIN_HARDWARE", "").split(":") if p]
    if resolved not in files:
        os.environ["POWERTRAIN_HARDWARE"] = ":".join([*files, resolved])
    _default_catalog.cache_clear()


def hardware_from_option(text: str) -> tuple[DeviceSpec, str | None]:
    """The device a ``--hardware`` value means, and one line saying how it was read (None: it is an entry's own
    name, or ``cpu``).

    A path (:func:`looks_like_path`) is that file, never a name: it must exist and describe exactly one device,
    which is read with the catalog's rules (its keys checked, its thermal and node entries) and used as is. A
    name is an entry's name; an alias or a name read by its features (:func:`resolve_device`) says which entry it
    became, every time, since a near name silently becoming another part is how a wrong network gets advised.
    """
    if is_cpu_name(text):
        return measure_cpu(), None
    if looks_like_path(text):
        path = Path(text)
        if not path.exists():
            raise ValueError(f"--hardware {text}: no such file; give the path of a hardware YAML (the schema of "
                             "hardware/catalog.yaml) or a catalog device name")
        names = [str(n) for n in (_read(path).get("devices") or {})]
        if len(names) != 1:
            raise ValueError(f"--hardware {text}: the file describes {len(names)} devices "
                             f"({', '.join(names) or 'none'}); give --hardware a file with one device, or list the file "
                             "in $POWERTRAIN_HARDWARE and give --hardware the device's name")
        use_catalog_file(path)
        return _default_catalog()[names[0]], (f"--hardware {text}: device {names[0]!r} as that file describes it "
                                              "(an emitted spec needs the file too: POWERTRAIN_HARDWARE=" f"{path})")
    return device_by_name(text, "--hardware")


def device_by_name(text: str, what: str = "device") -> tuple[DeviceSpec, str | None]:
    """A catalog device by name, and the one line that says which entry an alias or a near name became (None:
    the entry's own name). ``what`` names where the name was given (``--hardware``, ``hardware.device``)."""
    cat = _default_catalog()
    entry = cat.get(text) or cat.get(_index(cat).labels.get(_norm(text), ""))
    if entry is not None:
        exact = _norm(text) == _norm(entry.name)
        return entry, None if exact else f"{what} {text!r}: catalog entry {entry.name!r} ({text!r} is one of its aliases)"
    name = resolve_device(text, cat)  # an UnknownDeviceError names the closest entries
    return cat[name], (f"{what} {text!r} is no catalog name or alias: read as entry {name!r} by what the name "
                       "states (family, memory, form factor); give that name, or a hardware file, to be exact")


def describe_hardware(dev: DeviceSpec) -> str:
    """One line of what a prediction assumes about the hardware: GPU, memory, scale-up domain, NICs, cooling."""
    if dev.is_host_cpu:
        return f"{dev.name} (this host's CPU, measured)"
    n = dev.node
    nics = f"{n.nic_count} × {n.nic_bw * 8 / 1e9:g} Gb/s NICs" if n.nic_count else "no NICs described"
    return (f"{dev.name}: {dev.memory_bytes / (2**30 * 0.99):g} GB, {dev.tdp_w:g} W; {n.devices_per_node} per node, "
            f"scale-up domain {n.nvlink_domain} at {n.intra_node_bw / 1e9:g} GB/s per GPU per direction; {nics} per "
            f"node; {dev.cooling} cooled")


# --- reading device names as people write them ------------------------------------------------------------

# Words that say nothing about which device it is (vendor and marketing words, memory technologies).
_NOISE = frozenset({"nvidia", "amd", "intel", "tesla", "instinct", "tensor", "core", "gpu", "accelerator",
                    "grace", "hopper", "blackwell", "ampere", "volta", "superchip", "dgx", "hgx", "the", "in",
                    "with", "and", "per", "of", "lower", "tdp", "sku", "gb", "gib", "w"})
_NOT_FAMILY = re.compile(r"^(sxm\d*|pcie\d*|nvl\d*|oam|hbm\d*e?|gddr\d*x?|ddr\d*|gen\d+|x\d+|cx\d+|nvlink\d*|tb|s)$")
_FAMILY = re.compile(r"^(?:[a-z]{1,3}\d{2,4}[a-z]{0,2})$")
# a size in GB, not a bandwidth ("900 GB/s" of NVLink is no memory size)
_MEMORY = re.compile(r"(?<![a-z0-9.])(\d{2,4}(?:\.\d+)?)\s*(?:gb|gib|g)(?![a-z])(?!\s*/\s*s)")
_POWER = re.compile(r"(?<![a-z0-9.])(\d{2,4})\s*w(?![a-z])")
_FORMS = (("sxm", "sxm"), ("pcie", "pcie"), ("nvl", "nvl"), ("oam", "oam"))


@dataclass(frozen=True, slots=True)
class DeviceName:
    """What a device name states: family, memory (GB), form factor and power (W); None where silent."""

    family: str | None
    memory_gb: float | None
    form: str | None
    power_w: float | None
    vendor: str | None


def parse_device_name(text: str) -> DeviceName:
    """Read a free-text device name (``"NVIDIA H100 80GB HBM3"``, ``"h200 141gb"``, ``"GB200 NVL72"``)."""
    t = str(text).lower()
    mem = _MEMORY.findall(t)
    pw = _POWER.findall(t)
    # a device count glued to the name ("8xH100", "72xGB200") is not part of the family
    tokens = [re.sub(r"^\d+x(?=[a-z])", "", w) for w in re.split(r"[^a-z0-9]+", t) if w]
    family = next((w for w in tokens if _FAMILY.match(w) and not _NOT_FAMILY.match(w) and w not in _NOISE
                   and not re.match(r"^\d", w)), None)
    form = next((f for key, f in _FORMS if any(w.startswith(key) for w in tokens)), None)
    vendor = next((v for v in ("nvidia", "amd", "intel") if v in tokens), None)
    return DeviceName(family=family, memory_gb=float(mem[-1]) if mem else None, form=form,
                      power_w=float(pw[-1]) if pw else None, vendor=vendor)


@dataclass(slots=True)
class _Index:
    """A catalog's labels and stated features, built once per catalog dict."""

    catalog: dict[str, DeviceSpec]
    labels: dict[str, str]  # normalised name or alias -> entry name
    families: dict[str, list[str]]  # family token -> entry names
    forms: dict[str, frozenset[str]]  # entry name -> form factors its name and aliases state
    memo: dict[str, str | UnknownDeviceError]


_INDEXES: dict[int, _Index] = {}


def _index(cat: dict[str, DeviceSpec]) -> _Index:
    idx = _INDEXES.get(id(cat))
    if idx is not None and idx.catalog is cat:
        return idx
    labels: dict[str, str] = {}
    families: dict[str, list[str]] = {}
    forms: dict[str, frozenset[str]] = {}
    for dev in cat.values():
        fams: set[str] = set()
        fs: set[str] = set()
        for label in (dev.name, *dev.aliases):
            labels.setdefault(_norm(label), dev.name)
            parsed = parse_device_name(label)
            if parsed.family:
                fams.add(parsed.family)
            if parsed.form:
                fs.add(parsed.form)
        for fam in fams:
            families.setdefault(fam, []).append(dev.name)
        forms[dev.name] = frozenset(fs)
    if len(_INDEXES) > 16:  # user catalogs come and go (tests, --hardware); keep the cache small
        _INDEXES.clear()
    idx = _INDEXES[id(cat)] = _Index(cat, labels, families, forms, {})
    return idx


def _entry_memory_gb(dev: DeviceSpec) -> float:
    return dev.memory_bytes / (2**30 * 0.99)  # what `memory_gb` said (see _device)


_GIB_PER_GB = 2**30 / 1e9


def _memory_gap(dev: DeviceSpec, stated_gb: float) -> float:
    """GB between a stated memory size and the entry's, read as GB or as GiB, whichever is nearer.

    Data sheets and tables mix the two: B200 is "180GB" in DGX B200's sheet and "192GB" (decimal, ≈ 179 GiB)
    in others; nvidia-smi's MiB make the 96 GB H100 "94GB"."""
    gb = _entry_memory_gb(dev)
    return min(abs(gb - stated_gb), abs(gb * _GIB_PER_GB - stated_gb), abs(gb / _GIB_PER_GB - stated_gb))


def resolve_device(name: str, catalog: dict[str, DeviceSpec] | None = None) -> str:
    """The catalog entry a device name means, by exact label or by its stated features.

    Rules: the family must match an entry's family; a stated memory size must be within 4 % (or 2 GB) of
    the entry's, read as GB or GiB (:func:`_memory_gap`); a stated form factor must be one the entry states
    (entries that state none accept any); of several entries left, the nearest memory sizes win;
    a stated vendor must match. Among several entries left, a stated power picks the closest TDP, else
    the entry the family's bare name is an alias of (``A100`` → the 80 GB part); otherwise the name is
    ambiguous. Raises :class:`UnknownDeviceError` (closest entries listed) when nothing or several match.
    """
    cat = catalog if catalog is not None else _default_catalog()
    idx = _index(cat)
    got = idx.memo.get(name)
    if got is None:
        got = _resolve(name, idx)
        idx.memo[name] = got
    if isinstance(got, UnknownDeviceError):
        raise UnknownDeviceError(got.name, got.closest, got.why)  # a fresh one: no traceback piles up
    return got


def _resolve(name: str, idx: _Index) -> str | UnknownDeviceError:
    key = _norm(name)
    if key in idx.labels:
        return idx.labels[key]
    q = parse_device_name(name)
    if q.family is None or q.family not in idx.families:
        return UnknownDeviceError(name, closest_devices(name, idx.catalog))
    cands = [idx.catalog[n] for n in idx.families[q.family]]
    if q.vendor:
        cands = [d for d in cands if d.vendor in (q.vendor, "unknown")]
    if q.memory_gb is not None:
        # 4 %: usable vs nominal HBM (GB200 186 of 192 GB, GB300 279 of 288: 3.2 %)
        cands = [d for d in cands if _memory_gap(d, q.memory_gb) <= max(2.0, 0.04 * _entry_memory_gb(d))]
    if q.form is not None:  # before the nearest size: "H100 SXM5 94GB" is the 96 GB SXM part, not the 94 GB NVL card
        cands = [d for d in cands if not idx.forms[d.name] or q.form in idx.forms[d.name]]
    if q.memory_gb is not None and len(cands) > 1:  # "H100 96GB" is the 96 GB part, not the 94 GB card
        nearest = min(_memory_gap(d, q.memory_gb) for d in cands)
        cands = [d for d in cands if _memory_gap(d, q.memory_gb) == nearest]
    if len(cands) == 1:
        return cands[0].name
    if not cands:
        return UnknownDeviceError(name, closest_devices(name, idx.catalog), _stated(q))
    if q.power_w is not None:
        best = min(abs(d.tdp_w - q.power_w) for d in cands)
        cands = [d for d in cands if abs(d.tdp_w - q.power_w) == best]
        if len(cands) == 1:
            return cands[0].name
    default = idx.labels.get(q.family)  # the entry the family's bare name is an alias of
    if default in {d.name for d in cands}:
        return str(default)
    return UnknownDeviceError(name, [d.name for d in cands][:3], "ambiguous: several entries match; "
                              "state the memory size or form factor")


def _stated(q: DeviceName) -> str:
    parts = [f"family {q.family}"] + ([f"{q.memory_gb:g} GB"] if q.memory_gb is not None else []) + (
        [q.form.upper()] if q.form else []) + ([q.vendor] if q.vendor else [])
    return f"no catalog entry has {', '.join(parts)}"


class UnknownDeviceError(KeyError):
    """A device name the catalog does not hold (or that fits several entries); lists the closest names."""

    def __init__(self, name: str, closest: list[str], why: str = "") -> None:
        super().__init__(name)
        self.name, self.closest, self.why = name, closest, why
        near = f"closest: {', '.join(closest)}" if closest else "no close catalog name"
        what = "ambiguous" if why.startswith("ambiguous") else "unknown"
        detail = f"{why}; " if why and what == "unknown" else ""
        self.message = (f"{what} device {name!r} ({detail}{near}; or cpu). Add your own in a YAML file with the "
                        "keys of hardware/catalog.yaml and pass it with --hardware")

    def __str__(self) -> str:
        return self.message


def closest_devices(name: str, catalog: dict[str, DeviceSpec] | None = None, n: int = 3) -> list[str]:
    """Up to ``n`` catalog names closest to ``name``: entries of the same family first (nearest memory
    size first), then by spelling (difflib; case and punctuation ignored, aliases count)."""
    import difflib

    cat = catalog if catalog is not None else _default_catalog()
    out: list[str] = []
    q = parse_device_name(name)
    if q.family:
        fam = [d for d in cat.values() if q.family in {parse_device_name(lbl).family for lbl in (d.name, *d.aliases)}]
        fam.sort(key=lambda d: abs(_entry_memory_gb(d) - (q.memory_gb or _entry_memory_gb(d))))
        out += [d.name for d in fam]
    by_key: dict[str, str] = {}
    for dev in cat.values():
        for label in (dev.name, *dev.aliases):
            by_key.setdefault(_norm(label), dev.name)
    for m in difflib.get_close_matches(_norm(name), list(by_key), n=n * 3, cutoff=0.5):
        if by_key[m] not in out:
            out.append(by_key[m])
    if q.family and len(out) < n:  # a family the catalog lacks: the nearest family names by spelling
        fams = {parse_device_name(lbl).family: d.name for d in cat.values() for lbl in (d.name, *d.aliases)}
        for m in difflib.get_close_matches(q.family, [f for f in fams if f], n=n, cutoff=0.3):
            if fams[m] not in out:
                out.append(fams[m])
    return out[:n]


def cpu_device(probe: HostProbe, ranks_per_node: int = 1) -> DeviceSpec:
    """One training rank's share of a probed host CPU, as a device.

    Each rank runs ``probe.threads`` matmul threads; while the ranks' threads fit in the cores every
    rank gets the probe's matmul rate, beyond that they share the cores evenly. The copy rate is one
    thread's, as is a rank's elementwise work: ranks divide it only when they outnumber the cores.
    Power and temperature values are placeholders the host cannot measure (no sensor): ``tdp_w`` is
    a nominal 15 W per core.
    """
    ranks = max(1, ranks_per_node)
    flops = probe.matmul_flops * min(1.0, probe.cores / (ranks * probe.threads))
    bw = probe.copy_bytes_per_s * min(1.0, probe.cores / ranks)
    try:
        import psutil  # type: ignore[import-untyped]  # psutil ships no type information

        mem = float(psutil.virtual_memory().total) / ranks
    except Exception:  # psutil is a core dependency; this only guards odd containers
        mem = 8e9 / ranks
    tdp = 15.0 * probe.cores
    node = NodeSpec(devices_per_node=ranks, intra_node_bw=bw / 4, intra_node_latency=20e-6, nic_count=1,
                    nic_bw=10e9 / 8, inter_node_latency=50e-6, nvlink_domain=ranks,
                    source="measured: shared-memory transport approximated as a quarter of copy bandwidth")
    return DeviceSpec(
        name="cpu", vendor="host",
        peak_flops={"fp32": flops, "bf16": flops, "fp16": flops, "tf32": flops},
        memory_bytes=mem, memory_bw=bw, tdp_w=tdp, idle_w=0.3 * tdp, power_at_peak_w=tdp, slowdown_c=None, node=node,
        thermal=ThermalSpec(inlet_c=25.0, r_c_per_w=0.3, tau_s=30.0, rear_preheat_c_per_kw=0.0,
                            rear_slots_of_8=()),
        source=(f"measured ({probe.source}): fp32 matmul {probe.matmul_flops / 1e9:.1f} GFLOP/s, copy "
                f"{probe.copy_bytes_per_s / 1e9:.1f} GB/s (one thread), {probe.threads} matmul thread(s); {ranks} rank(s) "
                f"on {probe.cores} cores"),
        note="power values are nominal (15 W/core), not measured: this host has no power sensor",
        has_power_sensor=False,
        transport="gloo",
        probe=probe,
    )


@cache
def measure_cpu(threads: int | None = None) -> DeviceSpec:
    """This machine's CPU as one rank's device: a fresh :func:`probe_host` with ``threads``
    (default: what a lone training rank would use)."""
    return cpu_device(probe_host(threads or rank_threads(1)), 1)
