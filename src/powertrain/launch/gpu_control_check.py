"""Device controls end to end on one real NVIDIA GPU (what ``scripts/gpu_check.sh`` runs as its control step).

::

    sudo python -m powertrain.launch.gpu_check --controls --out runs/gpu-check --device 0

On GPU ``--device`` it measures a short bf16 matmul load (``--burn`` seconds) three times — as found,
under a power limit of ``--cap-fraction`` of the limit found (not below the device minimum), and
under an SM clock lock at ``--clock-fraction`` of the highest SM clock — each setting applied through
:mod:`powertrain.control` (ledger first, read back, restored after), and checks:

* **the limit is in effect**: read back within 1 W of the request, and the load's median power at
  most 5 % (+10 W) above it;
* **the lock is in effect**: the load's median SM clock at most 15 MHz above the lock;
* **everything is restored**: the limit found is back after each step, and the ledger is empty.

What it saw goes to ``<out>/gpu_controls.json`` and ``.md``. Exit status: 0 every check passed,
1 a check failed, 2 it could not run (not root, no CUDA torch, no NVML). Whatever happens, the
settings are restored (``finally``; SIGTERM/SIGINT too; after a ``kill -9`` the next powertrain start
or ``powertrain restore`` does it). This needs a real GPU and root; it is not part of the test suite.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from powertrain.control.apply import apply_controls, restore_stale
from powertrain.control.interface import ControlRefused
from powertrain.control.ledger import Ledger, this_owner
from powertrain.control.nvidia import NvidiaControls


def _burn(controls: NvidiaControls, index: int, seconds: float) -> dict[str, Any]:
    """A bf16 matmul load on CUDA device ``index``; NVML power and SM clock sampled between batches."""
    import torch

    dev = torch.device("cuda", index)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    nvml, handle = controls.nvml, controls._handles[index]
    power, clock, flops = [], [], 0.0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(8):
            a = torch.matmul(a, b).clamp_(-1, 1)
        torch.cuda.synchronize(dev)
        flops += 8 * 2 * 8192**3
        if time.monotonic() - t0 > 2.0:  # leave the ramp out
            power.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            clock.append(float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
    elapsed = time.monotonic() - t0
    return {"seconds": elapsed, "tflops": flops / elapsed / 1e12, "power_median_w": statistics.median(power),
            "sm_clock_median_mhz": statistics.median(clock), "samples": len(power)}


def _step(controls: NvidiaControls, ledger: Ledger, index: int, knob: dict[str, Any], burn_s: float,
          found_w: float) -> dict[str, Any]:
    """One setting: apply (unless empty), measure the load, restore; the record with its checks."""
    rec: dict[str, Any] = {"setting": knob or "as found"}
    applied = apply_controls(knob, controls, ledger, [index], this_owner("gpu_control_check")) if knob else None
    try:
        rec["load"] = _burn(controls, index, burn_s)
        if applied is not None:
            rec["controls"] = applied.record["devices"][0]["settings"]
    finally:
        if applied is not None:
            rec["restored"] = applied.restore()
    checks = []
    load = rec["load"]
    if "power_limit_w" in knob:
        eff = rec["controls"]["power_limit_w"]["in_effect"]
        want = knob["power_limit_w"]
        checks.append(("limit read back", eff is not None and abs(eff - want) <= 1.0, f"{eff} W for {want} W"))
        checks.append(("power under the limit", load["power_median_w"] <= want * 1.05 + 10,
                       f"median {load['power_median_w']:.0f} W under a {want:.0f} W limit"))
    if "sm_clock_mhz" in knob:
        lock = knob["sm_clock_mhz"][1]
        checks.append(("SM clock at the lock", load["sm_clock_median_mhz"] <= lock + 15,
                       f"median {load['sm_clock_median_mhz']:.0f} MHz under a {lock} MHz lock"))
    if knob:
        now = controls.power_limit_w(index)
        checks.append(("limit restored", now is not None and abs(now - found_w) <= 1.0, f"{now} W, found {found_w} W"))
    rec["checks"] = [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks]
    return rec


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # the finally blocks restore


def run_control_check(out: Path, i: int = 0, burn_s: float = 15.0, cap_fraction: float = 0.6,
                      clock_fraction: float = 0.6) -> tuple[int, list[str]]:
    """Run the check on GPU ``i``; (exit status, the report's lines for the terminal)."""
    if os.geteuid() != 0:
        return 2, ["gpu_control_check: needs root to set a power limit or lock clocks; skipped"]
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA GPU")
        controls = NvidiaControls()
    except (ImportError, RuntimeError, ControlRefused) as exc:
        return 2, [f"gpu_control_check: cannot run here: {exc}"]
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, _stop)
    ledger = Ledger()
    report: dict[str, Any] = {"device": i, "restored_at_start": restore_stale(controls, ledger)}
    found = controls.power_limit_w(i)
    rng = controls.power_limit_range_w(i)
    top = controls.max_clock_mhz(i, "sm")
    if found is None or rng is None or top is None:
        controls.close()
        return 2, ["gpu_control_check: NVML reports no power limit, range or SM clock here"]
    cap = float(round(max(rng[0], cap_fraction * found)))
    lock = int(clock_fraction * top)
    report.update(found_power_limit_w=found, power_limit_range_w=list(rng), max_sm_clock_mhz=top, steps=[])
    try:
        for knob in ({}, {"power_limit_w": cap}, {"sm_clock_mhz": [lock, lock]}):
            report["steps"].append(_step(controls, ledger, i, knob, burn_s, found))
    except ControlRefused as exc:
        report["error"] = str(exc)
    finally:
        report["ledger_left"] = [e for e in ledger.entries() if e.get("owner", {}).get("run") == "gpu_control_check"]
        controls.close()
    checks = [c for s in report["steps"] for c in s["checks"]]
    checks.append({"name": "ledger empty", "ok": not report["ledger_left"], "detail": f"{len(report['ledger_left'])} left"})
    ok = "error" not in report and all(c["ok"] for c in checks)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_controls.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [f"# GPU controls check — gpu{i}: {'PASSED' if ok else 'FAILED'}", ""]
    lines += [f"- {s['setting']}: {s['load']['power_median_w']:.0f} W, {s['load']['sm_clock_median_mhz']:.0f} MHz, "
              f"{s['load']['tflops']:.0f} TFLOP/s" for s in report["steps"]]
    lines += [f"- [{'x' if c['ok'] else ' '}] {c['name']}: {c['detail']}" for c in checks]
    lines += [f"- error: {report['error']}"] if "error" in report else []
    (out / "gpu_controls.md").write_text("\n".join(lines) + "\n")
    return (0 if ok else 1), lines
