"""Which slot of a node runs hotter: per-slot coefficients of the node thermal model, fitted on real logs.

The node thermal model (used by :func:`powertrain.predict.thermal.slot_temperatures`) gives slot ``s``
of a node whose devices draw ``P`` on average the steady temperature

    T_s = T_inlet + preheat_s + R · ratio_s · P

* ``ratio_s`` — the slot's power at equal work over the node mean, **fitted** on real 8×H100
  nvidia-smi logs of DDP training (``data/slot_thermal.yaml``, refit with
  ``benchmarks/fit_slot_thermal.py``; the logs carry no licence, so only the numbers ship). Its
  spread (about ±1 %, 2.2 % hottest to coolest) is the measured part of the slot-to-slot spread.
* ``preheat_s`` — air-cooled baseboards blow front to back, so the rear row breathes air heated by the
  front row: ``rear_preheat_c_per_kw · P/1000`` for the catalog's ``rear_slots_of_8``. A model
  default, **not** fitted: the logs have no temperature.
* ``R``, ``T_inlet`` — the device's thermal defaults (catalog ``thermal``).

The ratios apply to air-cooled nodes of the size they were fitted on (8 devices); elsewhere every ratio
is 1 (no data), which :attr:`SlotCoefficients.applies_to` says.

For placement (e.g. heavy pipeline stages on cool slots), per slot and device power:
:func:`slot_temperature_c` (steady °C), :func:`slot_offset_c` (°C above the node's coolest slot),
:func:`throttle_margin_c` (°C left before slowdown; negative: it throttles) and
:func:`slot_power_limit_w` (the device mean power at which the slot reaches slowdown).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from powertrain.core.yamlfile import load_yaml
from powertrain.hardware import DeviceSpec

SLOT_FILE = Path(__file__).with_name("data") / "slot_thermal.yaml"


@dataclass(frozen=True, slots=True)
class SlotCoefficients:
    """Fitted per-slot power ratios and where they come from."""

    power_ratio: tuple[float, ...]
    std_across_runs: tuple[float, ...]
    devices_per_node: int
    source: str
    runs: tuple[str, ...]

    def applies_to(self, dev: DeviceSpec, devices_per_node: int) -> bool:
        """Whether the fitted ratios describe this node: air cooled, as many slots as fitted."""
        return dev.cooling == "air" and devices_per_node == self.devices_per_node and not dev.is_host_cpu


@cache
def slot_coefficients(path: Path | None = None) -> SlotCoefficients:
    """The shipped (or ``path``'s) per-slot coefficients."""
    raw = load_yaml((path or SLOT_FILE).read_text(), path or SLOT_FILE)
    ratio = tuple(float(v) for v in raw["power_ratio"])
    return SlotCoefficients(power_ratio=ratio,
                            std_across_runs=tuple(float(v) for v in raw.get("power_ratio_std_across_runs", ())),
                            devices_per_node=int(raw.get("devices_per_node", len(ratio))),
                            source=str(raw.get("source", "")),
                            runs=tuple(str(r.get("file")) for r in raw.get("runs", ())))


def slot_ratios(dev: DeviceSpec, devices_per_node: int) -> tuple[float, ...]:
    """Each slot's power over the node mean at equal work (all 1 where the fit does not apply)."""
    co = slot_coefficients()
    if co.applies_to(dev, devices_per_node):
        return co.power_ratio
    return (1.0,) * max(1, devices_per_node)


def rear_slots(dev: DeviceSpec, devices_per_node: int) -> frozenset[int]:
    """Slots that breathe air pre-heated by the front row (none for a single device or liquid cooling)."""
    if devices_per_node < 2:
        return frozenset()
    return frozenset(s for s in dev.thermal.rear_slots_of_8 if s < devices_per_node)


def slot_inlet_c(dev: DeviceSpec, devices_per_node: int, slot: int, power_w: float) -> float:
    """Air (or coolant) temperature at ``slot`` when the devices draw ``power_w`` on average."""
    th = dev.thermal
    pre = th.rear_preheat_c_per_kw * power_w / 1000.0 if slot in rear_slots(dev, devices_per_node) else 0.0
    return th.inlet_c + pre


def slot_temperature_c(dev: DeviceSpec, devices_per_node: int, slot: int, power_w: float,
                       node_power_w: float | None = None) -> float:
    """Steady temperature of ``slot`` when its device draws ``power_w`` (the work placed there, e.g. a
    pipeline stage) and the node's devices ``node_power_w`` on average (default: ``power_w``), which sets
    the rear row's pre-heat."""
    ratio = slot_ratios(dev, devices_per_node)[slot]
    node = power_w if node_power_w is None else node_power_w
    return slot_inlet_c(dev, devices_per_node, slot, node) + dev.thermal.r_c_per_w * ratio * power_w


def slot_offset_c(dev: DeviceSpec, devices_per_node: int, slot: int, power_w: float) -> float:
    """How much hotter ``slot`` runs than the node's coolest slot at the same device power, °C."""
    temps = [slot_temperature_c(dev, devices_per_node, s, power_w) for s in range(devices_per_node)]
    return temps[slot] - min(temps)


def throttle_margin_c(dev: DeviceSpec, devices_per_node: int, slot: int, power_w: float,
                      node_power_w: float | None = None) -> float | None:
    """Degrees left before ``slot`` reaches the device's slowdown temperature (negative: it throttles);
    None when the catalog has no slowdown temperature for the device. Powers as :func:`slot_temperature_c`."""
    if dev.slowdown_c is None:
        return None
    return dev.slowdown_c - slot_temperature_c(dev, devices_per_node, slot, power_w, node_power_w)


def slot_power_limit_w(dev: DeviceSpec, devices_per_node: int, slot: int) -> float | None:
    """Device mean power at which ``slot`` reaches its slowdown temperature (None without one).

    Solves ``T_inlet + preheat·P/1000 + R·ratio·P = T_slow`` for ``P``.
    """
    if dev.slowdown_c is None:
        return None
    th = dev.thermal
    pre = th.rear_preheat_c_per_kw / 1000.0 if slot in rear_slots(dev, devices_per_node) else 0.0
    per_w = pre + th.r_c_per_w * slot_ratios(dev, devices_per_node)[slot]
    return (dev.slowdown_c - th.inlet_c) / per_w if per_w > 0 else None
