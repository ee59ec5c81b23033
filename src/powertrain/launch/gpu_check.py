"""End-to-end check of the NVIDIA telemetry path on one real GPU (what ``scripts/gpu_check.sh`` runs).

::

    python -m powertrain.launch.gpu_check --out runs/gpu-check

It starts :class:`powertrain.Monitor` with the NVIDIA and host backends at 20 Hz, records ``--idle``
seconds of idle, runs a bf16 matmul burn on one GPU for ``--burn`` seconds, records ``--idle`` seconds
more, then checks what the sampler wrote for that GPU:

* **power rises**: the median power of the burn (its first 5 s left out, while clocks and power
  ramp) is at least 1.5× and at least 50 W above the idle median;
* **energy agrees with power**: the hardware energy-counter delta over the whole recording is within
  5 % of the trapezoidal integral of the sampled power over the same interval;
* **temperatures move**: the GPU temperature rises by at least 3 °C from idle to the hottest burn
  sample (and the memory temperature by at least 1 °C where the GPU reports it);
* **clocks move**: the SM clock spans at least 50 MHz over the recording;
* **throttle reasons are read**: non-null on at least 95 % of the GPU's rows;
* **sampling keeps up**: at least 80 % of the requested rows arrived, and no incident was logged.

What it saw goes to ``<out>/gpu_check.json`` and ``<out>/gpu_check.md``; the run itself is in
``<out>/run``. Exit status: 0 all checks passed, 1 a check failed (each failure printed on one line),
2 the check could not run (no CUDA torch, no NVIDIA GPU telemetry).

This needs a real GPU; it is deliberately not part of the test suite or CI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import logging
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from powertrain.diagnostics import show_on_stderr
from powertrain.schema import Throttle

RATE_HZ = 20.0
RAMP_S = 5.0  # burn seconds left out of the burn-power median while power and clocks ramp
POWER_RATIO_MIN = 1.5
POWER_DELTA_MIN_W = 50.0
ENERGY_TOLERANCE = 0.05
TEMP_RISE_MIN_C = 3.0
TEMP_MEM_RISE_MIN_C = 1.0
CLOCK_SPAN_MIN_MHZ = 50.0
THROTTLE_READ_MIN = 0.95
ROWS_MIN_FRACTION = 0.8

# named, not __name__: run with -m, this module is __main__, outside the powertrain logger tree
log = logging.getLogger("powertrain.launch.gpu_check")


@dataclass
class Check:
    name: str
    passed: bool
    detail: str  # one line: what was measured against what was required
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class Phases:
    """Wall-clock boundaries (CLOCK_REALTIME ns, as telemetry rows are stamped)."""

    idle_start_ns: int
    burn_start_ns: int
    burn_end_ns: int
    idle_end_ns: int


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _col(rows: list[dict[str, Any]], name: str, t0: int | None = None, t1: int | None = None) -> list[float]:
    return [r[name] for r in rows if r.get(name) is not None
            and (t0 is None or r["t_ns"] >= t0) and (t1 is None or r["t_ns"] <= t1)]


def trapezoid_j(rows: list[dict[str, Any]], power_col: str) -> tuple[float, int, int] | None:
    """∫ power dt over consecutive rows with power (J), and the first/last t_ns it covers."""
    pts = [(r["t_ns"], r[power_col]) for r in rows if r.get(power_col) is not None]
    if len(pts) < 2:
        return None
    total = sum((t1 - t0) / 1e9 * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(pts))
    return total, pts[0][0], pts[-1][0]


def evaluate(rows: list[dict[str, Any]], phases: Phases, *, rate_hz: float = RATE_HZ,
             incidents: Sequence[dict[str, Any]] = (), ramp_s: float = RAMP_S, settle_s: float = 1.0) -> list[Check]:
    """The checks over one GPU's telemetry rows (sorted by ``t_ns``).

    ``ramp_s``: burn seconds left out of the burn-power median; ``settle_s``: idle seconds left out
    at the start of the idle-power median (the sampler's first reads, the CUDA context coming up).
    """
    power_col = "power_w" if any(r.get("power_w") is not None for r in rows) else "power_avg_w"
    return [_power_check(rows, phases, power_col, ramp_s, settle_s), _energy_check(rows, power_col),
            *_temperature_checks(rows, phases), _clock_check(rows, phases), _throttle_check(rows, phases),
            _sampling_check(rows, phases, rate_hz, incidents)]


def _power_check(rows: list[dict[str, Any]], p: Phases, power_col: str, ramp_s: float, settle_s: float) -> Check:
    """Power rises well above idle."""
    idle_p = _median(_col(rows, power_col, p.idle_start_ns + int(settle_s * 1e9), p.burn_start_ns))
    burn_p = _median(_col(rows, power_col, p.burn_start_ns + int(ramp_s * 1e9), p.burn_end_ns))
    if idle_p is None or burn_p is None:
        return Check("power rises", False, f"no {power_col} samples in the idle or burn phase")
    ok = burn_p >= POWER_RATIO_MIN * idle_p and burn_p - idle_p >= POWER_DELTA_MIN_W
    return Check(
        "power rises", ok,
        f"{power_col} idle median {idle_p:.1f} W → burn median {burn_p:.1f} W "
        f"(need ≥ {POWER_RATIO_MIN}× and ≥ +{POWER_DELTA_MIN_W:.0f} W)",
        {"column": power_col, "idle_median_w": idle_p, "burn_median_w": burn_p})


def _energy_check(rows: list[dict[str, Any]], power_col: str) -> Check:
    """The energy counter against the integral of power, over the rows that have both."""
    both = [r for r in rows if r.get("energy_j") is not None and r.get(power_col) is not None]
    integ = trapezoid_j(both, power_col)
    if integ is None:
        return Check("energy agrees with power", False, "need ≥ 2 rows with both energy_j and power")
    integral, _, _ = integ
    delta = both[-1]["energy_j"] - both[0]["energy_j"]
    rel = abs(delta - integral) / delta if delta > 0 else float("inf")
    values: dict[str, Any] = {"energy_counter_delta_j": delta, "power_integral_j": integral,
                              "relative_difference": rel, "power_column": power_col,
                              "seconds": (both[-1]["t_ns"] - both[0]["t_ns"]) / 1e9}
    if power_col == "power_w" and any(r.get("power_avg_w") is not None for r in both):
        avg = trapezoid_j(both, "power_avg_w")
        if avg is not None:
            values["power_avg_integral_j"] = avg[0]  # for the record: the 1 s average lags
    return Check(
        "energy agrees with power", rel <= ENERGY_TOLERANCE,
        f"energy counter Δ {delta:.1f} J vs ∫{power_col} dt {integral:.1f} J over "
        f"{values['seconds']:.1f} s: {100 * rel:.2f} % apart (need ≤ {100 * ENERGY_TOLERANCE:.0f} %)",
        values)


def _temperature_checks(rows: list[dict[str, Any]], p: Phases) -> list[Check]:
    """Temperatures move (memory temperature only where the GPU reports it)."""
    checks: list[Check] = []
    for col, need in (("temp_c", TEMP_RISE_MIN_C), ("temp_mem_c", TEMP_MEM_RISE_MIN_C)):
        idle_t = _median(_col(rows, col, p.idle_start_ns, p.burn_start_ns))
        burn_t = _col(rows, col, p.burn_start_ns, p.burn_end_ns)
        if col == "temp_mem_c" and idle_t is None and not burn_t:
            continue  # this GPU does not report memory temperature: nothing to check
        if idle_t is None or not burn_t:
            checks.append(Check(f"{col} moves", False, f"no {col} samples in the idle or burn phase"))
            continue
        rise = max(burn_t) - idle_t
        checks.append(Check(f"{col} moves", rise >= need,
                            f"{col} idle median {idle_t:.1f} °C → burn max {max(burn_t):.1f} °C "
                            f"(+{rise:.1f}, need ≥ +{need:.0f})",
                            {"idle_median_c": idle_t, "burn_max_c": max(burn_t), "rise_c": rise}))
    return checks


def _clock_check(rows: list[dict[str, Any]], p: Phases) -> Check:
    """Clocks move."""
    sm = _col(rows, "clock_sm_mhz")
    if not sm:
        return Check("clock_sm_mhz moves", False, "no clock_sm_mhz samples")
    span = max(sm) - min(sm)
    return Check(
        "clock_sm_mhz moves", span >= CLOCK_SPAN_MIN_MHZ,
        f"SM clock {min(sm):.0f}–{max(sm):.0f} MHz (span {span:.0f}, need ≥ {CLOCK_SPAN_MIN_MHZ:.0f}); "
        f"idle median {_median(_col(rows, 'clock_sm_mhz', p.idle_start_ns, p.burn_start_ns))}, "
        f"burn median {_median(_col(rows, 'clock_sm_mhz', p.burn_start_ns, p.burn_end_ns))}",
        {"min_mhz": min(sm), "max_mhz": max(sm)})


def _throttle_check(rows: list[dict[str, Any]], p: Phases) -> Check:
    """Throttle reasons are read (and which were seen in each phase)."""
    read = sum(r.get("throttle") is not None for r in rows)
    frac = read / len(rows) if rows else 0.0
    seen = {
        phase: sorted({n for r in rows if r.get("throttle") is not None and t0 <= r["t_ns"] <= t1
                       for n in Throttle.names_of(r["throttle"])})
        for phase, (t0, t1) in (("idle", (p.idle_start_ns, p.burn_start_ns)),
                                ("burn", (p.burn_start_ns, p.burn_end_ns)),
                                ("cool-down", (p.burn_end_ns, p.idle_end_ns)))
    }
    return Check("throttle reasons read", frac >= THROTTLE_READ_MIN,
                 f"throttle non-null on {100 * frac:.1f} % of rows (need ≥ {100 * THROTTLE_READ_MIN:.0f} %); "
                 f"reasons seen: {seen}", {"fraction_read": frac, "reasons_seen": seen})


def _sampling_check(rows: list[dict[str, Any]], p: Phases, rate_hz: float,
                    incidents: Sequence[dict[str, Any]]) -> Check:
    """Sampling kept up, with no incident."""
    expected = (p.idle_end_ns - p.idle_start_ns) / 1e9 * rate_hz
    ok = len(rows) >= ROWS_MIN_FRACTION * expected and not incidents
    return Check("sampling keeps up", ok,
                 f"{len(rows)} rows for ~{expected:.0f} expected at {rate_hz:g} Hz "
                 f"(need ≥ {100 * ROWS_MIN_FRACTION:.0f} %); incidents: {len(incidents)}",
                 {"rows": len(rows), "expected_rows": expected, "incidents": list(incidents)})


def _burn(torch: Any, device: Any, seconds: float, n: int) -> dict[str, Any]:
    """bf16 n×n matmuls back to back for ``seconds``; returns its interval and achieved TFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.matmul(a, b, out=c)  # warm-up: cuBLAS picks its kernel outside the timed region
    sync()
    t0 = time.time_ns()
    deadline = time.monotonic() + seconds
    iters = 0
    while time.monotonic() < deadline:
        for _ in range(10):
            torch.matmul(a, b, out=c)
        sync()
        iters += 10
    t1 = time.time_ns()
    return {"t_start_ns": t0, "t_end_ns": t1, "matmuls": iters, "n": n,
            "tflops": iters * 2 * n**3 / ((t1 - t0) / 1e9) / 1e12}


def _gpu_label(devices: list[dict[str, Any]], uuid: str | None, index: int) -> str:
    """The telemetry label (gpuN, NVML order) of the CUDA device that ran the burn."""
    for d in devices:
        if d.get("vendor") == "nvidia" and uuid and d.get("uuid") and uuid.lower() in d["uuid"].lower():
            return str(d["device"])
    return f"gpu{index}"


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# GPU check{' — REHEARSAL, burn on this CPU' if report.get('rehearsal') else ''} — {report['date']}",
        "",
        f"GPU: {report['gpu'].get('name')} ({report['gpu_label']}, UUID {report['gpu'].get('uuid')}), "
        f"driver {report['software'].get('nvidia_driver')}, torch {report['torch']}.",
        f"Burn on {report['burn']['on']}: {report['burn']['matmuls']} bf16 {report['burn']['n']}² matmuls, "
        f"{report['burn']['tflops']:.3g} TFLOP/s. Run directory: `{report['run_dir']}`.",
        "",
        f"**{'ALL CHECKS PASSED' if report['passed'] else 'SOME CHECKS FAILED'}**",
        "",
        "| check | result | what was measured |",
        "|---|---|---|",
    ]
    for c in report["checks"]:
        lines.append(f"| {c['name']} | {'pass' if c['passed'] else '**FAIL**'} | {c['detail']} |")
    lines += ["", f"Fields the GPU supports: {', '.join(report['gpu'].get('supported', []))}", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m powertrain.launch.gpu_check",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the run and the report (created)")
    ap.add_argument("--idle", type=float, default=10.0, help="idle seconds before and after the burn (10)")
    ap.add_argument("--burn", type=float, default=60.0, help="seconds of matmul burn (60)")
    ap.add_argument("--rate", type=float, default=RATE_HZ, help="sampling rate in Hz (20)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device index to burn (0)")
    ap.add_argument("--size", type=int, default=8192, help="matrix size n of the n×n bf16 matmul (8192)")
    ap.add_argument("--cpu", action="store_true",
                    help="rehearsal: run the burn on this CPU, not on a CUDA GPU (the checks then pass only "
                         "where the NVML library's GPU follows this process's load: the test suite's "
                         "stand-in, scripts/gpu_check.sh --rehearse); the report says so")
    ap.add_argument("--controls", action="store_true",
                    help="instead: the device-controls check (power limit and SM clock lock set, loaded, restored; "
                         "needs root), powertrain.launch.gpu_control_check")
    args = ap.parse_args(argv)
    show_on_stderr()  # its diagnostics (warnings and errors) on stderr, its report on stdout
    if args.controls:
        from powertrain.launch.gpu_control_check import run_control_check

        code, lines = run_control_check(args.out, args.device, burn_s=min(args.burn, 20.0))
        print("\n".join(lines))
        return code
    try:
        return _run(args)
    except Exception:  # a crash is "could not run" (2), never mistaken for a failed check (1)
        traceback.print_exc()
        log.error("gpu_check: crashed before finishing its checks (traceback above)")
        return 2


def _run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        log.error("gpu_check: torch is not installed here; it needs a CUDA-enabled torch")
        return 2
    if not args.cpu and not torch.cuda.is_available():
        log.error("gpu_check: torch %s sees no CUDA GPU (a CPU build, or no driver); "
                  "run with a CUDA-enabled torch on a machine with an NVIDIA GPU", torch.__version__)
        return 2

    from powertrain.monitor import Monitor, MonitorError
    from powertrain.store import read_json, read_telemetry
    from powertrain.telemetry.backend import BackendUnavailable
    from powertrain.telemetry.nvidia import NvidiaBackend

    try:  # fail here with the backend's one line, before a sampler process is started
        NvidiaBackend(probe_s=0).close()  # only "is there a GPU": no update-period probe
    except BackendUnavailable as exc:
        log.error("gpu_check: %s", exc)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / "run"
    if args.cpu:  # the burn's device is this CPU; the GPU telemetry read is NVML's GPU args.device
        device, uuid, burn_on = torch.device("cpu"), None, "this CPU (rehearsal: no GPU kernel runs)"
    else:
        device = torch.device(f"cuda:{args.device}")
        props = torch.cuda.get_device_properties(device)
        uuid = str(getattr(props, "uuid", "") or "") or None
        burn_on = str(props.name)
    print(f"gpu_check: burn on {burn_on}; sampling at {args.rate:g} Hz into {run_dir}")
    try:
        with Monitor(run_dir, rate_hz=args.rate, backends=["nvidia", "host"], name="gpu-check") as mon:
            t_idle0 = time.time_ns()
            print(f"gpu_check: idle {args.idle:g} s")
            time.sleep(args.idle)
            print(f"gpu_check: bf16 matmul burn {args.burn:g} s")
            burn = _burn(torch, device, args.burn, args.size)
            print(f"gpu_check: {burn['tflops']:.3g} TFLOP/s; idle {args.idle:g} s")
            time.sleep(args.idle)
            t_idle1 = time.time_ns()
            if not mon.check_sampler():
                log.error("gpu_check: %s", mon.sampler_death)
    except MonitorError as exc:
        log.error("gpu_check: the sampler could not start with the NVIDIA backend: %s", exc)
        return 2

    info = read_json(run_dir / "run.json")
    label = _gpu_label(info.get("devices", []), uuid, args.device)
    gpu: dict[str, Any] = next((d for d in info.get("devices", []) if d.get("device") == label), {})
    rows = [r for r in read_telemetry(run_dir).to_pylist() if r["device"] == label]
    phases = Phases(t_idle0, burn["t_start_ns"], burn["t_end_ns"], t_idle1)
    incidents = [i for i in info.get("incidents", []) if i.get("device") in (label, "*")]
    checks = evaluate(rows, phases, rate_hz=args.rate, incidents=incidents)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "passed": all(c.passed for c in checks),
        "rehearsal": bool(args.cpu),
        "gpu_label": label,
        "gpu": gpu,
        "software": info.get("device_software", {}),
        "torch": torch.__version__,
        "burn": {**burn, "on": burn_on},
        "phases": asdict(phases),
        "run_dir": str(run_dir),
        "run_status": info.get("status"),
        "not_measured": info.get("not_measured"),
        "checks": [asdict(c) for c in checks],
    }
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "gpu_check.md").write_text(_markdown(report))
    for c in checks:
        print(f"gpu_check: {'PASS' if c.passed else 'FAIL'} {c.name}: {c.detail}")
    print(f"gpu_check: report in {args.out / 'gpu_check.md'} and gpu_check.json")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
