"""Node power at the wall: the GPUs plus every part of the host, each named, through the power supplies.

One node's power is the sum of named terms (W, DC side — what the power supplies deliver):

* ``gpus_w`` — given (the power model's mean or peak device power × the devices of the node);
* ``cpus_w = sockets · (P_idle + (TDP − P_idle) · load)`` — TDP per socket from the catalog (Intel ARK / AMD
  data sheets); ``P_idle`` the catalog's ``cpu_idle_w``, else :data:`CPU_IDLE_SHARE` × TDP (estimate). ``load``
  is what the host does while the GPUs train: each rank keeps :data:`THREADS_PER_RANK` threads busy (the Python
  thread that launches kernels and waits on the GPU by spinning, and NCCL's proxy thread that drives the
  network; data loading of token ids is light), so ``load = min(1, ranks · THREADS_PER_RANK ÷ cores)`` —
  an assumption, stated, not a measurement; an idle node has ``load = 0``;
* ``memory_w = DIMMs · dimm_w`` — DIMMs from the catalog (or ``memory_gb`` ÷ :data:`DIMM_GB`), ``dimm_w`` else
  :data:`DIMM_W` (estimate);
* ``nics_w = NICs · nic_w + DPUs · dpu_w`` — counts from the node's data sheet (NICs default to the node's
  ``nic_count``), watts else :data:`NIC_W` / :data:`DPU_W` (estimates);
* ``baseboard_w = NVSwitches · nvswitch_w + retimers · retimer_w`` (estimates per chip: NVIDIA publishes none);
* ``storage_w = drives · drive_w``; ``other_w`` (BMC, chipset, board and regulator losses; estimate);
* ``fans_w`` — air cooling only. Fans move the heat of the node at an allowed air temperature rise ΔT: the
  airflow needed is ``Q = heat ÷ (ρ·c_p·ΔT)``; at full speed they move ``Q_max`` (``airflow_max_cfm``, or, where
  the data sheet gives none, the airflow that removes the node's maximum input ``max_power_w`` at the same ΔT,
  so ``speed = heat ÷ max_power_w``). ``speed = clamp(Q ÷ Q_max, fan_min_speed, 1)`` and by the fan affinity
  law (power ∝ speed³) ``fans_w = fans_max_w · speed³``; ``fans_max_w`` else :data:`FAN_MAX_SHARE` ×
  ``max_power_w`` (estimate). Liquid: pumps and the CDU are rack / facility load, outside the node's meter;
  immersion: no fans in the node at all; both 0 in the node.
* ``dc_w`` = the sum; ``ac_w = dc_w ÷ η(load share)`` with η the **80 PLUS Titanium** curve (230 V internal
  redundant: 90 / 94 / 96 / 91 % at 10 / 20 / 50 / 100 % of rated output, linear in between, held flat outside),
  the load share ``dc_w ÷ (supplies × rating)``: redundant supplies share the load (N+N: each at most half);
  ``conversion_w = ac_w − dc_w``.

A node the catalog describes no host for (``NodeSpec.host`` is None) has no node power: every host term and
the totals are None and ``why_null`` says how to describe it — never a fixed host figure in its place. Every
value the model assumed because the description leaves it out is one line of ``notes``.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from powertrain.hardware import DeviceSpec, HostSpec, NodeSpec

COOLINGS = ("air", "liquid", "immersion")

# 80 PLUS Titanium, 230 V internal redundant (the 80 PLUS / CLEAResult program requirements): efficiency at
# 10 %, 20 %, 50 % and 100 % of rated output. The standard sets nothing below 10 % or above 100 %.
TITANIUM_CURVE: tuple[tuple[float, float], ...] = ((0.10, 0.90), (0.20, 0.94), (0.50, 0.96), (1.00, 0.91))

# --- model defaults: estimates, used only where a host description leaves a value out (each use is noted) ---
# A server CPU's package power with no work, as a share of its TDP: deep package C-states are commonly limited on
# GPU servers and the uncore stays up (estimate; Sapphire Rapids-class parts idle near 80–110 W of 300–350 W).
CPU_IDLE_SHARE = 0.30
# Busy host threads per training rank: the Python thread launching kernels (it spins on the GPU) and NCCL's
# proxy thread (one per rank for network transfers). Data loading of token ids is light. An assumption.
THREADS_PER_RANK = 2
# Memory: a 64 GB DDR5 RDIMM lightly used draws about 5 W (background and refresh dominate at the small traffic
# of GPU training; module data sheets give 3–4 W idle, 10–13 W at full bandwidth): estimate.
DIMM_GB = 64.0
DIMM_W = 5.0
# A 400 Gb/s NIC (ConnectX-7 class) with its port's optics, while training: estimate.
NIC_W = 25.0
# A BlueField-3 DPU carrying storage and management traffic: half of its 150 W maximum (NVIDIA BlueField-3 DPU
# Controller user manual: "maximum power consumption is up to 150W"): estimate.
DPU_W = 75.0
# One NVSwitch chip on an HGX baseboard with NVLink traffic: NVIDIA publishes no figure; estimate.
NVSWITCH_W = 100.0
# A PCIe retimer: 10–15 W (ServeTheHome on the HGX B200 board, 2024): 12 W, estimate.
RETIMER_W = 12.0
# An NVMe U.2 / M.2 drive mostly idle during training (data sheets: ≈ 5 W idle, 12–25 W active): estimate.
DRIVE_W = 8.0
# BMC, chipset, board and voltage-regulator losses the parts above do not count: estimate.
OTHER_W = 50.0
# All fans of an air-cooled 8-GPU server at full speed, as a share of its maximum input: no vendor publishes the
# figure; fan walls of 8-GPU HGX servers are commonly put at 10–15 % of the system's maximum power: estimate.
FAN_MAX_SHARE = 0.12
# The lowest speed a server fan controller runs (a share of full speed): estimate.
FAN_MIN_SPEED = 0.20
# The air temperature rise inlet → exhaust the fan control holds, used with a stated airflow: estimate.
AIR_DELTA_T_C = 15.0
AIR_RHO_CP = 1.2 * 1005.0  # J/(m³·K): air at about 20 °C, sea level
CFM_M3_S = 0.3048**3 / 60  # one cubic foot per minute in m³/s


def psu_efficiency(load_share: float) -> float:
    """Power-supply efficiency at ``load_share`` of rated output on the 80 PLUS Titanium curve
    (:data:`TITANIUM_CURVE`), linear between its points and held at its end points outside them."""
    pts = TITANIUM_CURVE
    if load_share <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if load_share <= x1:
            return y0 + (y1 - y0) * (load_share - x0) / (x1 - x0)
    return pts[-1][1]


@dataclass(frozen=True, slots=True)
class NodePower:
    """One node's power, term by term (W). DC terms sum to ``dc_w``; ``ac_w`` is at the wall.

    A term is None where the node's host is not described (``why_null`` says so); ``notes`` name every value
    the model assumed in place of one the description leaves out.
    """

    gpus_w: float
    cpus_w: float | None
    memory_w: float | None
    nics_w: float | None  # NICs and DPUs
    baseboard_w: float | None  # NVSwitch chips and PCIe retimers
    storage_w: float | None
    other_w: float | None
    fans_w: float | None
    dc_w: float | None
    conversion_w: float | None  # the power supplies' loss: ac_w − dc_w
    ac_w: float | None
    cooling: str
    cpu_load: float | None = None
    fan_speed: float | None = None
    psu_load: float | None = None  # DC load ÷ (supplies × rating)
    psu_efficiency: float | None = None
    notes: tuple[str, ...] = ()
    why_null: str | None = None

    @property
    def host_w(self) -> float | None:
        """Everything but the GPUs, DC side (None where the host is not described)."""
        return None if self.dc_w is None else self.dc_w - self.gpus_w

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "host_w": self.host_w, "notes": list(self.notes)}


def undescribed(node: NodeSpec, cooling: str, name: str = "") -> str | None:
    """Why the node's power cannot be computed from its description (None: it can)."""
    h = node.host
    if h is not None and not (cooling == "air" and h.max_power_w is None
                              and (h.fans_max_w is None or h.airflow_max_cfm is None)):
        return None  # described: no message to build (every prediction asks)
    what = f"the node of {name!r}" if name else "this node"
    if h is None:
        fix = ("add a `host:` block to the device's `node:` in a --hardware / $POWERTRAIN_HARDWARE file (keys: the "
               "header of hardware/catalog.yaml, docs/model.md §6)")
        return (f"{what}: the hardware catalog describes no host (CPUs, memory, NICs, power supplies), so node "
                f"power is unknown; {fix}")
    return (f"{what}: air-cooled, but its host gives neither max_power_w (the data sheet's maximum system "
            "power, which sizes the fans) nor fans_max_w with airflow_max_cfm, so fan power is unknown; add them")


def node_power(gpus_w: float, node: NodeSpec, cooling: str, *, ranks: int | None = None, training: bool = True,
               name: str = "") -> NodePower:
    """One node's power: its GPUs drawing ``gpus_w`` together, its host (``node.host``) under a training load
    (``training=False``: an idle host), cooled by ``cooling`` (air, liquid, immersion). ``ranks``: the training
    ranks on the node (default: ``node.devices_per_node``). See the module docstring for every term."""
    if cooling not in COOLINGS:
        raise ValueError(f"cooling {cooling!r}: the node-power model knows {', '.join(COOLINGS)}")
    why = undescribed(node, cooling, name)
    if why is not None:
        return NodePower(gpus_w, None, None, None, None, None, None, None, None, None, None, cooling, why_null=why)
    st = _host_terms(node, cooling, node.devices_per_node if ranks is None else ranks, training)
    notes = list(st.notes)
    heat = gpus_w + st.cpus + st.memory + st.nics + st.baseboard + st.storage + st.other
    fans, speed = 0.0, None
    if st.design_heat is not None:  # air
        need = heat / st.design_heat
        if need > 1:
            notes.append(f"heat {heat:.0f} W is more than full-speed fans remove ({st.design_heat:.0f} W): fans at "
                         "full speed")
        speed = min(1.0, max(st.fan_floor, need))
        fans = st.fans_max * speed**3
    dc = heat + fans
    eff, share = _conversion(dc, node.host, notes)
    ac = dc / eff
    return NodePower(gpus_w, st.cpus, st.memory, st.nics, st.baseboard, st.storage, st.other, fans, dc, ac - dc, ac,
                     cooling, cpu_load=st.cpu_load, fan_speed=speed, psu_load=share, psu_efficiency=eff,
                     notes=tuple(notes))


class _HostTerms(NamedTuple):
    """The terms of a described host that do not depend on the GPUs' draw, and what was assumed for them."""

    cpus: float
    memory: float
    nics: float
    baseboard: float
    storage: float
    other: float
    cpu_load: float
    fans_max: float
    design_heat: float | None  # heat full-speed fans remove (air); None: no fans in the node
    fan_floor: float
    notes: tuple[str, ...]


@functools.lru_cache(maxsize=512)
def _host_terms(node: NodeSpec, cooling: str, ranks: int, training: bool) -> _HostTerms:
    """The load-independent host terms (cached: ``advise`` prices 10⁵ candidates on a handful of nodes)."""
    h = node.host
    assert h is not None  # node_power checked
    notes: list[str] = []

    def given(value: float | int | None, default: float, what: str, each: str = "") -> float:
        if value is None:
            notes.append(f"{what} not described: {default:g} W{each} assumed (estimate)")
            return float(default)
        return float(value)

    # CPUs
    sockets = h.cpu_sockets or 0
    tdp = h.cpu_tdp_w or 0.0
    idle = h.cpu_idle_w if h.cpu_idle_w is not None else CPU_IDLE_SHARE * tdp
    if h.cpu_idle_w is None and sockets:
        notes.append(f"cpu_idle_w not described: {CPU_IDLE_SHARE:.0%} of TDP = {idle:g} W per socket assumed (estimate)")
    if not training:
        load = 0.0
    elif h.cpu_cores:
        load = min(1.0, ranks * THREADS_PER_RANK / (sockets * h.cpu_cores)) if sockets else 0.0
    else:
        load = 0.5
        if sockets:
            notes.append("cpu_cores not described: CPU load 50 % assumed (estimate)")
    cpus = sockets * (idle + (tdp - idle) * load)
    # memory
    if h.dimms is not None:
        dimms = float(h.dimms)
    else:
        dimms = math.ceil((h.memory_gb or 0.0) / DIMM_GB)
        if dimms:
            notes.append(f"dimms not described: {h.memory_gb:g} GB as {dimms:g} × {DIMM_GB:g} GB DIMMs assumed")
    memory = dimms * given(h.dimm_w, DIMM_W, "dimm_w", " per DIMM") if dimms else 0.0
    # network
    nics = node.nic_count if h.nics is None else h.nics
    if h.nics is None:
        notes.append(f"nics not described: the node's nic_count ({nics}) counted")
    dpus = h.dpus or 0
    if h.dpus is None:
        notes.append("dpus not described: none counted")
    nics_w = (nics * given(h.nic_w, NIC_W, "nic_w", " per NIC") if nics else 0.0) + (
        dpus * given(h.dpu_w, DPU_W, "dpu_w", " per DPU") if dpus else 0.0)
    # baseboard, storage, the rest
    baseboard = _parts(h.nvswitches, h.nvswitch_w, NVSWITCH_W, "nvswitch", notes) + _parts(
        h.retimers, h.retimer_w, RETIMER_W, "retimer", notes)
    storage = _parts(h.drives, h.drive_w, DRIVE_W, "drive", notes)
    other = given(h.other_w, OTHER_W, "other_w")
    fans_max, design, floor = _fan_design(cooling, h, notes)
    if h.psu is None:
        notes.append(f"power supplies not described: taken at half load, {psu_efficiency(0.5):.0%} efficient "
                     "(80 PLUS Titanium; assumed)")
    return _HostTerms(cpus, memory, nics_w, baseboard, storage, other, load, fans_max, design, floor, tuple(notes))


def _parts(count: int | None, watts: float | None, default: float, part: str, notes: list[str]) -> float:
    """``count`` parts of ``watts`` each (``{part}s`` and ``{part}_w`` of the host description)."""
    if count is None:
        notes.append(f"{part}s not described: none counted")
        return 0.0
    if not count:
        return 0.0
    if watts is None:
        notes.append(f"{part}_w not described: {default:g} W each assumed (estimate)")
        watts = default
    return count * watts


def _fan_design(cooling: str, h: HostSpec, notes: list[str]) -> tuple[float, float | None, float]:
    """(fans' power at full speed, the heat they remove at full speed — None where the node has no fans —, the
    lowest speed they run) of a node cooled by ``cooling`` (see the module docstring)."""
    if cooling == "liquid":
        notes.append("liquid cooled: pumps and the CDU are rack / facility load, outside the node; fans for the "
                     "parts still air-cooled are not modelled")
        return 0.0, None, 0.0
    if cooling == "immersion":
        notes.append("immersion cooled: no fans in the node; coolant pumps are facility load")
        return 0.0, None, 0.0
    if h.airflow_max_cfm is not None:
        dt = h.air_delta_t_c if h.air_delta_t_c is not None else AIR_DELTA_T_C
        if h.air_delta_t_c is None:
            notes.append(f"air_delta_t_c not described: {AIR_DELTA_T_C:g} °C air temperature rise assumed (estimate)")
        design = h.airflow_max_cfm * CFM_M3_S * AIR_RHO_CP * dt
    else:
        assert h.max_power_w is not None  # undescribed() said so otherwise
        design = h.max_power_w
        notes.append("airflow_max_cfm not described: the fans are taken to remove the node's maximum power "
                     f"({design:g} W) at full speed (assumed)")
    if h.fans_max_w is not None:
        fans_max = h.fans_max_w
    else:
        assert h.max_power_w is not None  # undescribed() said so otherwise
        fans_max = FAN_MAX_SHARE * h.max_power_w
        notes.append(f"fans_max_w not described: {FAN_MAX_SHARE:.0%} of max_power_w = {fans_max:g} W at full speed "
                     "assumed (estimate)")
    return fans_max, design, h.fan_min_speed if h.fan_min_speed is not None else FAN_MIN_SPEED


def _conversion(dc: float, h: HostSpec | None, notes: list[str]) -> tuple[float, float | None]:
    """(power-supply efficiency, load share of the supplies' rating) for a DC load of ``dc`` W (the note for
    undescribed supplies is one of the host's static notes)."""
    if h is None or h.psu is None:
        return psu_efficiency(0.5), None
    p = h.psu
    share = dc / (p.count * p.rated_w)
    if share < TITANIUM_CURVE[0][0]:
        notes.append(f"power supplies at {share:.0%} of rating, below the 10 % the 80 PLUS standard sets: "
                     f"held at {TITANIUM_CURVE[0][1]:.0%} (optimistic)")
    if p.redundant and dc > (p.count - p.redundant) * p.rated_w:
        notes.append(f"DC load {dc:.0f} W is above the supplies' non-redundant capacity "
                     f"({p.count - p.redundant} × {p.rated_w:g} W)")
    if share > 1:
        notes.append(f"DC load {dc:.0f} W is above the supplies' rating ({p.count} × {p.rated_w:g} W)")
    return psu_efficiency(share), share


def nodes_power(devices_w: float, nodes: float, device: DeviceSpec, *, ranks_per_node: int | None = None,
                training: bool = True) -> NodePower:
    """One node's power when ``nodes`` nodes of ``device`` draw ``devices_w`` together at their devices
    (each node alike): its catalog node, host and cooling."""
    return node_power(devices_w / max(nodes, 1e-12), device.node, device.cooling, ranks=ranks_per_node,
                      training=training, name=device.name)
