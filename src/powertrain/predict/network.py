"""Collective communication from first principles: alpha–beta costs over a two-level fabric.

A device sits in a **scale-up domain** (NVLink/NVSwitch of a node, 72 GPUs of an NVL72 rack,
xGMI of an MI300X board) of ``domain`` devices at ``up_bw`` bytes/s per direction, and reaches
other domains through the **scale-out fabric**: the node's NICs, ``nic_count × nic_rate`` per
node, which NCCL stripes its channels over (one ring/tree per NIC, PXN routes a GPU's traffic
to any NIC of the node over NVLink). Above ``pod_devices`` the fabric may be oversubscribed.

A collective over a group of ``g`` ranks of which ``g_in`` share one's domain (so ``g/g_in``
domains) costs, per NCCL's own performance model (bus bandwidth, nccl-tests ``PERFORMANCE.md``):

* **all-reduce**, ring: ``2(g−1)/g · S / B_bus`` with ``B_bus = up_bw`` inside one domain and
  ``min(up_bw, g_in · nic_share)`` across domains (each ring enters and leaves a domain once per
  channel and the channels stripe all NICs: the domain's ``g_in`` members together own ``g_in``
  devices' share of the NICs). Latency ``2(g−1)`` hops for the ring, ``2·log2`` hops for the tree
  NCCL picks at small sizes — the smaller of the two. With **NVLS** (NVLink SHARP, the NVSwitch
  reduces in the switch) an all-reduce inside one domain moves ``S`` per device instead of
  ``2(g−1)/g·S``, at ``NVLS_EFF`` of the link (nccl-tests on 8×H100: about 480 GB/s bus bandwidth
  with NVLS against about 360 GB/s with rings).
* **reduce-scatter / all-gather**: half of a ring all-reduce, ``(g−1)/g · S / B_bus``.
* **all-to-all**: each rank sends ``(g−1)/g`` of its ``S`` bytes; the share for domain peers
  moves over the scale-up links while the rest moves over the device's share of the NICs, at the
  same time (the slower of the two), plus one latency per hop level and ``log2 g`` rounds.
* **send/recv**: ``S / link + α`` on the link the pair crosses.

Link efficiencies are literature values, not fitted: NCCL rings reach about 80 % of NVLink's
unidirectional rate (360 of 450 GB/s on H100) and about 90–95 % of InfiniBand line rate
(nccl-tests, NVIDIA DGX SuperPOD reference architecture). A calibration may still change them
(``comm_eff_intra``, ``comm_eff_inter``).

Ranks talking through gloo on one host CPU (the CPU path) keep the same ring formulas on the
probed shared-memory bandwidth; their latency is what a calibration fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from powertrain.hardware.catalog import NodeSpec
from powertrain.predict.calibration import Coefficients
from powertrain.predict.case import Case

# Share of the scale-up link an NVLS all-reduce reaches as algorithm bandwidth (480 GB/s bus bandwidth
# = 274 GB/s algorithm bandwidth on 8×H100 of 450 GB/s per direction: ~0.6).
NVLS_EFF = 0.6
# Extra switch hop latency on a fabric that is not rail-optimized (a GPU's peer in the next node
# hangs off another leaf switch): one more spine crossing, ~1 µs per message.
NON_RAIL_EXTRA_LATENCY_S = 1e-6


@dataclass(frozen=True, slots=True)
class Fabric:
    """What the devices of one case can send, per device and per direction."""

    up_bw: float  # bytes/s inside the scale-up domain (achieved)
    up_lat: float  # s per hop inside the domain
    nic_share: float  # bytes/s of NIC bandwidth per device (node NICs ÷ devices per node, achieved)
    out_lat: float  # s per hop across domains
    domain: int  # devices per scale-up domain
    nvls: bool  # the domain's switch reduces in-network (NVLink SHARP)
    pod_devices: int  # devices below which the scale-out fabric is non-blocking
    oversubscription: float  # above a pod: bandwidth ÷ this
    tree: bool = True  # NCCL may pick a tree at small sizes (gloo runs rings only)


# The last fabric asked for, by the (frozen) node object it was built from and the other arguments: one prediction
# asks for its fabric half a dozen times, and hashing a NodeSpec for _fabric's cache costs more than the arithmetic
# it saves. One tuple, read and replaced whole, so concurrent callers never see a half-updated entry.
_last_fabric: tuple[NodeSpec, tuple[int, int, str, float, float, float], Fabric] | None = None


def fabric(case: Case, c: Coefficients) -> Fabric:
    """The case's fabric: catalog link rates × achieved efficiencies, latencies × the latency scale."""
    global _last_fabric
    node = case.device.node
    rest = (case.devices_per_node, case._domain, case.device.transport, c.comm_eff_intra, c.comm_eff_inter,
            c.comm_latency_scale)
    last = _last_fabric
    if last is not None and last[0] is node and last[1] == rest:
        return last[2]
    f = _fabric(node, *rest)
    _last_fabric = (node, rest, f)
    return f


@lru_cache(maxsize=1024)
def _fabric(node: NodeSpec, dpn: int, domain: int, transport: str, eff_intra: float, eff_inter: float,
            lat_scale: float) -> Fabric:
    # cached: a sweep predicts thousands of cases on a handful of fabrics
    extra = 0.0 if node.rail_optimized else NON_RAIL_EXTRA_LATENCY_S
    return Fabric(
        up_bw=node.intra_node_bw * eff_intra,
        up_lat=node.intra_node_latency * lat_scale,
        nic_share=node.nic_count * node.nic_bw / max(1, dpn) * eff_inter,
        out_lat=(node.inter_node_latency + extra) * lat_scale,
        domain=domain,
        nvls=node.nvls and transport == "nccl",
        pod_devices=node.pod_devices,
        oversubscription=node.oversubscription or 1.0,
        tree=transport == "nccl",
    )


class Group(NamedTuple):
    """A communicator: ``size`` ranks; ``in_domain`` of them share one's domain; ``domains`` it spans."""

    size: int
    in_domain: int
    span: int  # consecutive ranks the group covers (stride × size)
    domains: int = 1


def group(case: Case, stride: int, size: int) -> Group:
    n_in = case.peers_in_domain(stride, size) if size > 1 else 1
    return Group(size, n_in, stride * size, max(1, size // n_in))


def _scale_out_bw(f: Fabric, g: Group) -> float:
    """Bus bandwidth of a ring/tree that leaves the domain: the domain's members' NIC shares."""
    bw = g.in_domain * f.nic_share
    if f.pod_devices and g.span > f.pod_devices:
        bw /= f.oversubscription
    return min(f.up_bw, bw)


def _bus(f: Fabric, g: Group) -> tuple[float, float, float]:
    """(bus bandwidth, ring latency per step, tree latency of one pass) of a group."""
    if not f.tree:
        tree_lat = math.inf
    elif g.domains <= 1:
        tree_lat = math.log2(max(2, g.size)) * f.up_lat
    else:
        tree_lat = (g.in_domain - 1) * f.up_lat + math.log2(max(2, g.domains)) * f.out_lat
    if g.domains <= 1:
        return f.up_bw, f.up_lat, tree_lat
    ring_step = ((g.size - g.domains) * f.up_lat + g.domains * f.out_lat) / g.size
    return _scale_out_bw(f, g), ring_step, tree_lat


def all_reduce(f: Fabric, g: Group, size_bytes: float) -> float:
    """All-reduce of ``size_bytes`` per rank: ring, tree latency or NVLS, whichever NCCL would pick."""
    n = g.size
    if n <= 1:
        return 0.0
    bw, step, tree = _bus(f, g)
    t_bw = 2 * (n - 1) / n * size_bytes / bw
    if f.nvls and g.domains <= 1 and n > 2:
        t_bw = min(t_bw, size_bytes / (f.up_bw * NVLS_EFF))
    return t_bw + min(2 * (n - 1) * step, 2 * tree)


def reduce_scatter(f: Fabric, g: Group, size_bytes: float) -> float:
    """Reduce-scatter of a ``size_bytes`` buffer (each rank keeps 1/g); all-gather costs the same."""
    n = g.size
    if n <= 1:
        return 0.0
    bw, step, tree = _bus(f, g)
    return (n - 1) / n * size_bytes / bw + min((n - 1) * step, tree)


all_gather = reduce_scatter


def all_to_all(f: Fabric, g: Group, size_bytes: float) -> float:
    """All-to-all where each rank holds ``size_bytes`` spread evenly over the group."""
    n = g.size
    if n <= 1:
        return 0.0
    near = size_bytes * (g.in_domain - 1) / n
    far = size_bytes * (n - g.in_domain) / n
    t_near = near / f.up_bw
    share = f.nic_share
    if f.pod_devices and g.span > f.pod_devices:
        share /= f.oversubscription
    t_far = far / share if far else 0.0
    lat = (f.out_lat if g.domains > 1 else f.up_lat) * math.log2(n)
    return max(t_near, t_far) + lat


def send_recv(f: Fabric, crosses_domain: bool, size_bytes: float) -> float:
    """One point-to-point transfer between neighbours (pipeline stages, CP ring steps)."""
    if crosses_domain:
        return size_bytes / f.nic_share + f.out_lat
    return size_bytes / f.up_bw + f.up_lat
