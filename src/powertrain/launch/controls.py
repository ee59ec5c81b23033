"""The launcher's side of device controls: which devices, what the run may start on, and restoring.

* :func:`check_node_device` — ``hardware.device`` must be what this node has: a GPU spec on a node
  without GPUs is refused unless it says ``hardware.stand_in: true`` (then the CPU trains in its
  place and run.json says so).
* :func:`restore_left_over` — the "next start" of :mod:`powertrain.control.ledger`: settings a run
  killed with ``kill -9`` left on this node are put back before anything else happens.
* :func:`node_controls` — a context manager around the run's life on this node: apply the spec's
  controls (before torchrun, so before warm-up), yield the record for run.json, and restore on
  every way out (normal end, an exception, SIGTERM/SIGHUP turned into one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from powertrain.control.apply import apply_controls, open_controls, restore_stale
from powertrain.control.interface import ControlRefused
from powertrain.control.ledger import Ledger, this_owner
from powertrain.hardware import get_device, is_cpu_name
from powertrain.hardware.catalog import UnknownDeviceError, resolve_device
from powertrain.spec.run import RunConfig

UNAPPLIED_HINT = ("; nothing was started — or pass --allow-unapplied to run with the device as it is "
                  "(run.json then records the setting as not applied)")


def check_node_device(cfg: RunConfig, node_device_type: str, node_device_name: str | None = None
                      ) -> dict[str, Any] | None:
    """Refuse (ValueError, one line) a spec whose ``hardware.device`` is not what this node has, unless
    it is a declared stand-in (``hardware.stand_in: true``: then it runs here, and run.json says so).

    ``node_device_type``: ``cpu`` or the accelerator type; ``node_device_name``: the GPU's own name
    (``torch.cuda.get_device_name``), matched to the catalog. A CPU spec always runs on the CPU (the
    launcher hides the GPUs from its ranks). Returns the stand-in record for run.json, or None."""
    name = cfg.hardware.device
    if is_cpu_name(name):
        return None
    if node_device_type == "cpu":
        if not cfg.hardware.stand_in:
            raise ValueError(f"hardware.device is {name} but this node has no GPU (torch sees only the CPU); "
                             "run it on a node with that device, or set hardware.stand_in: true to rehearse it "
                             "on this CPU (run.json records it as a stand-in; calibrate refuses it)")
        if cfg.knobs.overlap.async_tp and cfg.layout.tp > 1:
            raise ValueError("knobs.overlap.async_tp needs CUDA (symmetric memory, torch.compile's micro-pipeline "
                             "TP pass) and this stand-in trains on the CPU; set it false for the rehearsal")
        return {"device": name, "ran_on": "cpu"}
    if node_device_name is None:
        return None
    try:
        found = resolve_device(node_device_name)
    except UnknownDeviceError:  # a GPU the catalog does not know: nothing to compare it with
        return None
    if found == get_device(name).name:
        return None
    if not cfg.hardware.stand_in:
        raise ValueError(f"hardware.device is {name} but this node's GPUs are {node_device_name} ({found}); set "
                         f"hardware.device: {found}, or hardware.stand_in: true to rehearse {name} on them")
    return {"device": name, "ran_on": found}


# The variables that choose which GPUs a process sees, outermost first (ROCm applies ROCR's, then
# HIP's indexes into what is left).
_VISIBLE = {"nvidia": ("CUDA_VISIBLE_DEVICES",), "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}


def device_indices(cfg: RunConfig, environ: Mapping[str, str] | None = None) -> list[int]:
    """The vendor library's (NVML / amdsmi) index of each local rank's GPU: ``launch.device_order``
    (the launcher sets the ranks' visible devices to it); else local rank i runs on the i-th GPU the
    inherited ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` of
    ``environ`` (default ``os.environ``; Slurm sets them to a job's GPUs) lets it see, and on GPU i
    when none is set. The controls library numbers every GPU of the node whatever those say, so
    without this a run on GPUs 4 and 5 would set GPUs 0 and 1. Raises ValueError (one line) for a
    list that is not indices (UUIDs, MIG) or leaves too few GPUs."""
    order = cfg.launch.device_order
    if order is not None:
        return list(order)
    n = cfg.hardware.devices_per_node
    env = os.environ if environ is None else environ
    visible: list[int] | None = None
    for var in _VISIBLE.get(get_device(cfg.hardware.device).vendor, ()):
        raw = env.get(var)
        if raw is None:
            continue
        items = [x.strip() for x in raw.split(",") if x.strip()]
        if not all(x.isdigit() for x in items):
            raise ValueError(f"{var}={raw!r} does not list GPU indices, so the device controls cannot tell which "
                             "GPUs the ranks use; unset it and give launch.device_order (the GPU indices) instead")
        idx = [int(x) for x in items]
        if visible is not None:
            if any(i >= len(visible) for i in idx):
                raise ValueError(f"{var}={raw!r} names a device outside the {len(visible)} the outer variable "
                                 "leaves visible; fix it, or unset both and give launch.device_order")
            idx = [visible[i] for i in idx]
        visible = idx
    if visible is None:
        return list(range(n))
    if not visible:
        raise ValueError("the visible-devices variables hide every GPU from the ranks, so the device controls "
                         "have none of theirs to set; unset them, or drop the device controls from knobs")
    if len(visible) < n:
        raise ValueError(f"the visible-devices variables leave {len(visible)} GPU(s) {visible} for "
                         f"{n} ranks per node; set hardware.devices_per_node ≤ {len(visible)}, or widen them")
    return visible[:n]


def visible_devices_env(cfg: RunConfig, node_device_type: str) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` in ``launch.device_order``'s order: local rank
    i (which uses visible device i) then runs on GPU ``device_order[i]``. Empty without an order; both
    empty (no GPU visible) for a CPU spec."""
    if is_cpu_name(cfg.hardware.device):  # a CPU spec trains on the CPU even on a GPU node
        return {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
    order = cfg.launch.device_order
    if order is None:
        return {}
    vendor = get_device(cfg.hardware.device).vendor
    var = "HIP_VISIBLE_DEVICES" if vendor == "amd" else "CUDA_VISIBLE_DEVICES"
    return {var: ",".join(str(i) for i in order)}


def restore_left_over(binding: Any | None = None, *, force: bool = False) -> list[dict[str, Any]]:
    """Restore every ledger entry of this node whose run is gone (killed with -9); one report per entry.
    ``force`` restores the entries of live runs too (``powertrain restore --force``).

    Reads the ledger only (no vendor library is loaded when it is empty). A vendor library that
    cannot start is reported as the entry's problem, and the entry kept."""
    ledger = Ledger()
    try:
        entries = ledger.entries()
    except OSError as exc:  # a damaged ledger: kept as it is for a person to repair, and said
        return [{"device": None, "run": None, "problems": [str(exc)]}]
    reports: list[dict[str, Any]] = []
    for vendor in sorted({str(e.get("vendor")) for e in entries}):
        try:
            controls = open_controls(vendor, binding)
        except ControlRefused as exc:
            reports += [{"device": e.get("device"), "run": e.get("owner", {}).get("run"), "problems": [str(exc)]}
                        for e in entries if e.get("vendor") == vendor]
            continue
        try:
            reports += restore_stale(controls, ledger, force=force)
        except OSError as exc:  # the ledger is not ours to change (another user's): say so, run on
            reports += [{"device": e.get("device"), "run": e.get("owner", {}).get("run"), "problems": [str(exc)]}
                        for e in entries if e.get("vendor") == vendor]
        finally:
            controls.close()
    return reports


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def node_controls(cfg: RunConfig, run_label: str, *, allow_unapplied: bool = False,
                  binding: Any | None = None) -> Iterator[dict[str, Any] | None]:
    """Apply ``cfg``'s device controls on this node for the duration of the block; yields the record
    for run.json (None when the spec asks for none). Raises ValueError (one line, nothing changed)
    when a setting is refused and ``allow_unapplied`` is false.

    While the block runs outside the supervisor, SIGTERM and SIGHUP end it with ``SystemExit`` so
    the restore still runs (the supervisor forwards them itself while torchrun runs)."""
    requested = cfg.knobs.controls()
    if not requested:
        yield None
        return
    indices = device_indices(cfg)  # refuses an unreadable visible-devices variable before anything changes
    vendor = get_device(cfg.hardware.device).vendor
    main = threading.current_thread() is threading.main_thread()  # only there can handlers be set
    old = {s: signal.signal(s, _raise_exit) for s in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        try:
            controls = open_controls(vendor, binding)
        except ControlRefused as exc:
            if not allow_unapplied:
                raise ValueError(f"{exc}{UNAPPLIED_HINT}") from None
            yield {"vendor": vendor, "requested": requested, "allow_unapplied": True, "not_applied": str(exc),
                   "devices": []}
            return
        try:
            applied = apply_controls(requested, controls, Ledger(), indices, this_owner(run_label),
                                     allow_unapplied=allow_unapplied)
        except ControlRefused as exc:
            controls.close()
            raise ValueError(f"{exc}{UNAPPLIED_HINT}") from None
        except OSError as exc:  # the ledger cannot be written: nothing may change without it
            controls.close()
            raise ValueError(f"{exc}; nothing was changed and nothing started") from None
        try:
            yield applied.record
        finally:
            applied.restore()
            controls.close()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
