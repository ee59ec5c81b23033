"""The hardware catalog: what a device and its node can do, from vendor data sheets.

One source of truth for peak FLOP/s per precision, memory, bandwidths, power and thermal limits.
The catalog is data (``catalog.yaml`` next to this file, every value with its ``source:``); users
add or override devices with their own YAML files of the same shape (``load_catalog(extra=...)``
or ``$POWERTRAIN_HARDWARE``, colon-separated paths). The ``cpu`` entry is not looked up but
measured by a host probe (:func:`probe_host`) and labelled ``measured``.

**The host probe** (:class:`HostProbe`) times fp32 matmuls with the thread count the training ranks
use (:func:`rank_threads`: ``OMP_NUM_THREADS``, else torchrun's 1 per rank when a node runs several
ranks, else torch's default) and a memory copy on one thread (a rank's elementwise work on small
tensors runs on one thread whatever its thread count), and keeps the best of several short repeats,
so background load on a shared host reads as little as it can. A probe is still a measurement of a
moment: the launcher records the one it took in ``run.json["host_probe"]``, a calibration profile
keeps the probes it was fitted with, and predictions and summaries reuse those rather than probe
again (``HostProbe.source`` says which one a number came from).

Conventions: FLOP/s are dense (no structured sparsity); bandwidths are per device per direction.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
log = logging.getLogger(__name__)
# Where a device lacks a format, the next wider one it has runs the work.
_FALLBACK = {"fp4": ("fp4", "fp8", "bf16", "fp16", "fp32"), "fp8": ("fp8", "bf16", "fp16", "fp32"),
             "bf16": ("bf16", "fp16", "fp32"), "fp16": ("fp16", "bf16", "fp32"), "tf32": ("tf32", "fp32"),
             "fp32": ("fp32",)}


@dataclass(frozen=True, slots=True)
class HostProbe:
    """What one host CPU did in a short probe, with the thread count it was pinned to.

    ``matmul_flops``: fp32 matmul FLOP/s with ``threads`` threads (best of the repeats);
    ``copy_bytes_per_s``: bytes read + written per second by a large tensor copy on one thread;
    ``cores``: the cores this process could run on; ``method``: how it was measured;
    ``source``: where this value came from now (a fresh probe, a run's ``run.json``, a profile).
    """

    matmul_flops: float
    copy_bytes_per_s: float
    threads: int
    cores: int
    method: str
    source: str = "fresh probe of this host"

    def to_dict(self) -> dict[str, Any]:
        """The record written to ``run.json["host_probe"]`` and to calibration profiles."""
        return {"matmul_flops": self.matmul_flops, "copy_bytes_per_s": self.copy_bytes_per_s,
                "threads": self.threads, "cores": self.cores, "method": self.method}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str) -> HostProbe:
        """A recorded probe; raises ``ValueError`` naming the missing key."""
        try:
            return cls(matmul_flops=float(raw["matmul_flops"]), copy_bytes_per_s=float(raw["copy_bytes_per_s"]),
                       threads=int(raw["threads"]), cores=int(raw["cores"]), method=str(raw.get("method", "")),
                       source=source)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: host probe record is incomplete ({exc}); it needs matmul_flops, "
                             "copy_bytes_per_s, threads and cores") from None


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
    probe: HostProbe | None = None  # the host probe a measured (CPU) device was built from

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


def is_cpu_name(name: str | None) -> bool:
    """Whether a device name means the host CPU (case and punctuation ignored)."""
    return bool(name) and _norm(str(name)) == "cpu"


def get_device(name: str, catalog: dict[str, DeviceSpec] | None = None) -> DeviceSpec:
    """A device by catalog name or alias (case and punctuation ignored); ``cpu`` is measured here."""
    if is_cpu_name(name):
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


PROBE_MATMUL_N = 1024  # fp32 n×n matmul: ~2 GFLOP, tens of ms on one core
PROBE_COPY_ELEMS = 8 * 1024 * 1024  # 32 MiB of fp32: larger than any last-level cache it will meet
PROBE_REPEATS = 7


def host_cores() -> int:
    """Cores this process may run on (its CPU affinity: a container's share, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS): all cores
        return os.cpu_count() or 1


def rank_threads(ranks_per_node: int, environ: Mapping[str, str] | None = None) -> int:
    """Intra-op threads each training rank uses, as torchrun sets them up.

    ``OMP_NUM_THREADS`` when set (torch reads it at start); otherwise torchrun sets it to 1 for
    every rank when a node runs more than one rank, and a lone rank gets torch's default (the
    host's physical cores as torch counts them).
    """
    env = os.environ if environ is None else environ
    raw = env.get("OMP_NUM_THREADS")
    if raw is not None and raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    if raw is None and ranks_per_node > 1:
        return 1  # torchrun's default for several ranks per node
    try:
        import torch
    except ImportError:
        return host_cores()
    return int(torch.get_num_threads())


def _best_time(fn: Any, repeats: int) -> float:
    fn()  # warm: thread pool, caches, page faults
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_host_probe(threads: int, repeats: int = PROBE_REPEATS) -> HostProbe:
    """Probe this host's CPU with ``threads`` threads now: best of ``repeats`` fp32 matmuls and copies.

    Uses torch (what the training ranks run) with its intra-op threads pinned to ``threads`` for
    the matmuls and to one for the copy, restored after. Without torch it falls back to numpy,
    whose BLAS thread count it cannot pin; ``method`` says so. About 0.1–0.5 s.
    """
    if threads < 1:
        raise ValueError(f"host probe needs at least one thread, got {threads}")
    n = PROBE_MATMUL_N
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            g = torch.Generator().manual_seed(0)
            a = torch.randn(n, n, generator=g)
            b = torch.randn(n, n, generator=g)
            c = torch.empty(n, n)
            mm = _best_time(lambda: torch.mm(a, b, out=c), repeats)
            torch.set_num_threads(1)
            src = torch.ones(PROBE_COPY_ELEMS)
            dst = torch.empty_like(src)
            cp = _best_time(lambda: dst.copy_(src), repeats)
            nbytes = src.numel() * src.element_size()
        finally:
            torch.set_num_threads(before)
        method = (f"torch {torch.__version__} fp32 {n}x{n} matmul on {threads} thread(s) and "
                  f"{nbytes >> 20} MiB copy on 1 thread, best of {repeats}")
    else:
        import numpy as np

        a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
        mm = _best_time(lambda: a @ a, repeats)
        src = np.ones(PROBE_COPY_ELEMS, dtype=np.float32)
        dst = np.empty_like(src)
        cp = _best_time(lambda: np.copyto(dst, src), repeats)
        nbytes = src.nbytes
        method = (f"numpy fp32 {n}x{n} matmul (BLAS threads not pinned: torch is not installed) and "
                  f"{nbytes >> 20} MiB copy (one thread), best of {repeats}")
    return HostProbe(matmul_flops=2.0 * n**3 / mm, copy_bytes_per_s=2.0 * nbytes / cp, threads=threads,
                     cores=host_cores(), method=method)


def probe_cache_dir() -> Path:
    """Where host probes are kept between processes: ``$POWERTRAIN_CACHE_DIR``, else the user's cache."""
    if env := os.environ.get("POWERTRAIN_CACHE_DIR"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "powertrain"


def _probe_identity(threads: int) -> dict[str, Any]:
    """What a kept probe must match to be reused: same host, CPU, core count, threads and torch."""
    import platform
    import socket

    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = None
    return {"host": socket.gethostname(), "machine": platform.machine(), "processor": platform.processor(),
            "cores": host_cores(), "threads": threads, "torch": torch_version}


@cache
def probe_host(threads: int) -> HostProbe:
    """This host's probe for ``threads`` threads: measured once, then kept on disk and reused.

    A probe is a measurement of a moment, and a busy host reads differently from one second to the
    next; re-probing on every call made identical ``predict`` calls disagree. So the first probe of
    a host (for a thread count, CPU and torch version) is kept in :func:`probe_cache_dir` and every
    later process uses it; its ``source`` names the file and when it was measured. Delete the file
    to probe again. Runs record their own probe (``run.json``) and profiles keep theirs; this one
    serves only where neither exists.
    """
    ident = _probe_identity(threads)
    path = probe_cache_dir() / f"host-probe-{ident['host']}-{threads}t.json"
    kept = _read_kept_probe(path, ident)
    if kept is not None:
        return kept
    probe = measure_host_probe(threads)
    record = {**probe.to_dict(), "identity": ident, "t_ns": time.time_ns()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        try:
            os.replace(tmp, path) if path.exists() else os.link(tmp, path)  # first writer wins a race
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("host probe not kept (%s): later processes will probe again", exc)
        return HostProbe(**{**probe.to_dict(), "source": "probe of this host, measured now (could not be kept)"})
    return _read_kept_probe(path, ident) or probe


def _read_kept_probe(path: Path, ident: dict[str, Any]) -> HostProbe | None:
    """The probe kept at ``path`` if it was taken under the same identity; None otherwise."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable host probe %s (%s): probing again", path, exc)
        return None
    if not isinstance(raw, dict) or raw.get("identity") != ident:
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(raw.get("t_ns", 0)) / 1e9))
    try:
        return HostProbe.from_dict(raw, f"probe of this host measured {when}, kept in {path} (delete it to re-probe)")
    except ValueError as exc:
        log.warning("ignoring host probe %s: %s", path, exc)
        return None


def record_host_probe(ranks_per_node: int, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A fresh probe pinned to the threads a run's ranks will use, as ``run.json["host_probe"]``.

    The launcher calls this for a CPU run before its ranks start; ``environ`` is the ranks' environment.
    """
    probe = measure_host_probe(rank_threads(ranks_per_node, environ))
    return {**probe.to_dict(), "t_ns": time.time_ns(), "by": "launcher, before the ranks started"}


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
        import psutil

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
        measured=True,
        probe=probe,
    )


@cache
def measure_cpu(threads: int | None = None) -> DeviceSpec:
    """This machine's CPU as one rank's device: a fresh :func:`probe_host` with ``threads``
    (default: what a lone training rank would use)."""
    return cpu_device(probe_host(threads or rank_threads(1)), 1)
