"""Applying a run's device controls, recording them, and always putting the devices back.

:func:`apply_controls` (called by the launcher on every node, before torchrun starts, so before
warm-up) does, per device the run uses:

1. refuse when another live powertrain process holds the device in the ledger;
2. read what the device has now and write it to the node's ledger (:mod:`powertrain.control.ledger`)
   **before** anything changes;
3. set each requested knob, then read the power limit back: the record keeps *requested* and
   *in effect* per device (a device may clamp), or *not applied* with the one-line reason when the
   run was allowed to go on without it (``--allow-unapplied``).

Without ``allow_unapplied`` the first refusal undoes what was already set and raises
:class:`ControlRefused` (one line: device, setting, what is needed): the run does not start.
:meth:`AppliedControls.restore` puts every changed setting back and removes the ledger entries;
:func:`restore_stale` does the same for entries whose owner died (``kill -9``).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from powertrain.control.interface import KNOBS, ControlRefused, DeviceControls, DeviceId
from powertrain.control.ledger import Ledger, owner_alive

_NO_LOCK_READ = "not readable (NVML and amdsmi do not report an existing lock); restored as the driver default"


def open_controls(vendor: str, binding: Any | None = None) -> DeviceControls:
    """The controls of ``vendor`` (``nvidia`` or ``amd``) on this node; ``binding`` injects the vendor library."""
    if vendor == "nvidia":
        from powertrain.control.nvidia import NvidiaControls

        return NvidiaControls(binding)
    if vendor == "amd":
        from powertrain.control.amd import AmdControls

        return AmdControls(binding)
    raise ControlRefused(vendor, "device controls", f"no device controls for vendor {vendor!r}",
                         "an NVIDIA or AMD device")


def _key(vendor: str, dev: DeviceId) -> str:
    return f"{vendor}:{dev.uuid or dev.bus_id or dev.label}"


def _find(controls: DeviceControls, entry: dict[str, Any]) -> DeviceId | None:
    """The device an entry names, by UUID first (indices can change across reboots), else its label."""
    devs = controls.devices()
    for d in devs:
        if entry.get("key") == _key(controls.vendor, d):
            return d
    return next((d for d in devs if d.label == entry.get("device") and not entry.get("uuid")), None)


def restore_entry(controls: DeviceControls, entry: dict[str, Any]) -> list[str]:
    """Put back what ``entry`` says was changed; the problems, one line each (empty: all restored)."""
    dev = _find(controls, entry)
    if dev is None:
        return [f"{entry.get('device')} ({entry.get('uuid')}): device not found on this node"]
    problems = []
    for knob in entry.get("changed", []):
        try:
            if knob == "power_limit_w":
                found = entry.get("found", {}).get("power_limit_w")
                if found is None:
                    problems.append(f"{dev.label}: the power limit found before is unknown; not restored")
                    continue
                controls.set_power_limit_w(dev.index, float(found))
            else:
                controls.reset_clock(dev.index, "sm" if knob == "sm_clock_mhz" else "mem")
        except ControlRefused as exc:
            problems.append(str(exc))
    return problems


def restore_stale(controls: DeviceControls, ledger: Ledger, *, force: bool = False) -> list[dict[str, Any]]:
    """Restore every ledger entry of this vendor whose owner is gone (every entry with ``force``).

    Returns one report per entry handled: device, owner, run, ``problems`` (empty when restored).
    Entries restored are removed; entries that failed stay, with their problems, for the next try.
    """
    host = socket.gethostname()
    done = []
    with ledger.locked() as entries:
        for e in list(entries):
            owner = e.get("owner", {})
            if e.get("vendor") != controls.vendor or owner.get("host") not in (None, host):
                continue  # another vendor's controls restore it; another host's entry is not ours to judge
            if owner_alive(owner) and not force:
                continue
            problems = restore_entry(controls, e)
            if problems:
                e["restore_problems"] = problems
            else:
                entries.remove(e)
            done.append({"device": e.get("device"), "uuid": e.get("uuid"), "run": owner.get("run"),
                         "pid": owner.get("pid"), "changed": e.get("changed"), "problems": problems})
    return done


class AppliedControls:
    """The settings one run applied on this node; :meth:`restore` undoes them (idempotent)."""

    def __init__(self, controls: DeviceControls, ledger: Ledger, record: dict[str, Any],
                 entries: list[dict[str, Any]]) -> None:
        self.controls, self.ledger, self.record, self._entries = controls, ledger, record, entries
        self.restored = False
        # key → knobs actually set (a refused set changed nothing and is not "restored"); the ledger
        # itself lists every knob about to change, which is all a restore after kill -9 can go by
        self.done: dict[str, list[str]] = {e["key"]: [] for e in entries}

    def restore(self) -> dict[str, Any]:
        """Put every changed setting back, drop the ledger entries; the outcome is also kept in ``record``."""
        if self.restored:
            return dict(self.record.get("restored", {}))
        problems: list[str] = []
        keys = {e["key"] for e in self._entries}
        for e in self._entries:
            problems += restore_entry(self.controls, {**e, "changed": self.done[e["key"]]})
        with self.ledger.locked() as entries:
            if problems:  # kept for `powertrain restore`
                for e in entries:
                    if e.get("key") in keys:
                        e["restore_problems"] = problems
            else:
                entries[:] = [e for e in entries if e.get("key") not in keys]
        self.restored = True
        self.record["restored"] = {"t_ns": time.time_ns(), "ok": not problems, "problems": problems}
        return dict(self.record["restored"])


def _claim(controls: DeviceControls, ledger: Ledger, devices: list[DeviceId], requested: dict[str, Any],
           owner: dict[str, Any]) -> list[dict[str, Any]]:
    """Write-ahead: each device's found settings into the ledger before any change; refuse a held device."""
    mine = []
    with ledger.locked() as entries:
        for d in devices:
            key = _key(controls.vendor, d)
            held = next((e for e in entries if e.get("key") == key), None)
            if held is not None and owner_alive(held.get("owner", {})):
                o = held["owner"]
                raise ControlRefused(d.label, "device controls", f"held by powertrain pid {o.get('pid')} "
                                     f"(run {o.get('run')})", "that run to end first")
            if held is not None:  # a dead owner's entry: restore_stale runs first, so this one failed
                raise ControlRefused(d.label, "device controls", "a dead run's settings were not restored "
                                     f"({'; '.join(held.get('restore_problems', [])) or 'unknown'})",
                                     "`powertrain restore` to succeed first")
            found = {"power_limit_w": controls.power_limit_w(d.index), "sm_clock_mhz": _NO_LOCK_READ,
                     "mem_clock_mhz": _NO_LOCK_READ}
            entry = {"key": key, "vendor": controls.vendor, "device": d.label, "uuid": d.uuid,
                     "bus_id": d.bus_id, "found": found, "changed": [k for k in KNOBS if k in requested],
                     "owner": owner, "t_ns": time.time_ns()}
            entries.append(entry)
            mine.append(entry)
    return mine


def _set_one(controls: DeviceControls, d: DeviceId, knob: str, value: Any) -> dict[str, Any]:
    """Set one knob on one device; its record (requested, in effect, how). Raises ControlRefused."""
    if knob == "power_limit_w":
        rng = controls.power_limit_range_w(d.index)
        if rng is not None and not rng[0] - 0.5 <= float(value) <= rng[1] + 0.5:
            raise ControlRefused(d.label, "the power limit", f"{value:g} W is outside the device's range "
                                 f"{rng[0]:g}–{rng[1]:g} W", f"a limit within {rng[0]:g}–{rng[1]:g} W")
        controls.set_power_limit_w(d.index, float(value))
        return {"requested": value, "in_effect": controls.power_limit_w(d.index), "applied": True,
                "how": "read back from the device"}
    kind = "sm" if knob == "sm_clock_mhz" else "mem"
    lo, hi = (value[0], value[1]) if isinstance(value, list | tuple) else (value, value)
    how = controls.lock_clock_mhz(d.index, kind, int(lo), int(hi))
    top = controls.max_clock_mhz(d.index, kind)
    eff = [min(lo, top), min(hi, top)] if top is not None else [lo, hi]
    clamp = f"clamped to the device's highest clock {top} MHz" if top is not None else "highest clock not reported"
    return {"requested": value, "in_effect": eff if isinstance(value, list | tuple) else eff[1], "applied": True,
            "how": f"{how}, accepted by the driver (a lock is not readable back); {clamp}"}


def apply_controls(requested: dict[str, Any], controls: DeviceControls, ledger: Ledger, device_indices: list[int],
                   owner: dict[str, Any], *, allow_unapplied: bool = False) -> AppliedControls:
    """Apply ``requested`` (knob → value, from :meth:`Knobs.controls`) on the devices ``device_indices``.

    Returns the :class:`AppliedControls` whose ``record`` goes to run.json. Raises ControlRefused (and
    leaves every device as found) when a device is missing or a setting is refused and
    ``allow_unapplied`` is false.
    """
    devs = {d.index: d for d in controls.devices()}
    missing = [i for i in device_indices if i not in devs]
    if missing:
        raise ControlRefused(f"gpu{missing[0]}", "device controls", f"this node has {len(devs)} {controls.vendor} "
                             "device(s)", f"a node with at least {max(device_indices) + 1}")
    chosen = [devs[i] for i in device_indices]
    entries = _claim(controls, ledger, chosen, requested, owner)
    record: dict[str, Any] = {"vendor": controls.vendor, "requested": requested, "allow_unapplied": allow_unapplied,
                              "devices": []}
    applied = AppliedControls(controls, ledger, record, entries)
    try:
        for d, entry in zip(chosen, entries, strict=True):
            settings: dict[str, Any] = {}
            for knob in KNOBS:
                if knob not in requested:
                    continue
                try:
                    settings[knob] = _set_one(controls, d, knob, requested[knob])
                    applied.done[entry["key"]].append(knob)
                except ControlRefused as exc:
                    if not allow_unapplied:
                        raise
                    settings[knob] = {"requested": requested[knob], "in_effect": None, "applied": False,
                                      "not_applied": str(exc)}
            record["devices"].append({"device": d.label, "uuid": d.uuid, "bus_id": d.bus_id,
                                      "found": entry["found"], "settings": settings})
    except BaseException:
        applied.restore()
        raise
    record["t_applied_ns"] = time.time_ns()  # every setting is in place from here: before torchrun starts
    return applied
