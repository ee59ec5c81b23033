"""Calibration: fit a calibration's coefficients to measured runs and report the fit error.

Measured runs come from run directories (``run.json`` with the resolved RunConfig under
``config`` or ``spec``; ``events/rank-*.parquet`` whose ``kind == "step"`` rows in the ``measured`` window
give the step time — per step the slowest rank, then the mean over steps; telemetry ``power_w``
where present gives mean power per device) or from any list of (Case, step time) pairs, e.g.
published runs.

CPU runs: the peak a GEMM efficiency is relative to is the host probe the launcher recorded in
``run.json["host_probe"]`` before the ranks started; a run without one (made before probes were
recorded) gets a fresh probe of the calibrating host, labelled so in its device's ``source``. The
fitted calibration keeps the probes (median per rank thread count) so predictions with it reuse them.

The fit minimises the mean absolute log error of step time (and of mean power for the power
coefficients, where measured) over a handful of named coefficients by Nelder–Mead in log space,
so every coefficient stays positive. Fewer coefficients than runs, always.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from powertrain.hardware import HostProbe, is_cpu_name, probe_host, rank_threads
from powertrain.predict.calibration import COEFFICIENT_NAMES, Calibration, load_calibration
from powertrain.predict.case import Case, case_from_run_config
from powertrain.predict.core import predict

STEP_PARAMS_1 = ("gemm_eff", "layer_overhead_s")
STEP_PARAMS_MULTI = ("gemm_eff", "layer_overhead_s", "comm_eff_intra")
# ranks on one host CPU talk through gloo over shared memory: latency, not bandwidth, bounds them. The
# per-layer overhead is left at the base profile's value: a few CPU runs do not constrain it (the fit
# drove it to its lower bound on the README's three runs, the GEMM term absorbing it)
STEP_PARAMS_CPU = ("gemm_eff", "comm_latency_scale")
POWER_PARAMS = ("power_compute", "power_wait")
# Plausible ranges the fit may not leave (GEMM efficiency is relative to the catalog or probe peak,
# which on a busy CPU can read low, hence > 1 allowed).
BOUNDS = {"gemm_eff_fp32": (0.01, 4.0), "gemm_eff_16": (0.01, 4.0), "gemm_eff_fp8": (0.01, 4.0),
          "gemm_eff_fp4": (0.01, 4.0), "layer_overhead_s": (1e-7, 1.0), "comm_latency_scale": (0.01, 1e5),
          "comm_eff_intra": (0.01, 1.5), "comm_eff_inter": (0.01, 1.5), "power_compute": (0.05, 1.2),
          "power_wait": (0.0, 1.0)}


def _unrecorded(probe: HostProbe) -> HostProbe:
    """The host's probe standing in for a run that recorded none, labelled so."""
    return replace(probe, source=f"{probe.source}: the run recorded none")


def _clamp(name: str, value: float) -> float:
    lo, hi = BOUNDS.get(name, (0.0, math.inf))
    return min(hi, max(lo, value))


@dataclass
class MeasuredRun:
    """One measured configuration and what was measured."""

    label: str
    case: Case
    step_time_s: float
    power_mean_w: float | None = None


def _gemm_key(case: Case) -> str:
    p = case.precision
    return {"fp32": "gemm_eff_fp32", "tf32": "gemm_eff_fp32", "fp8": "gemm_eff_fp8", "fp4": "gemm_eff_fp4"}.get(
        p, "gemm_eff_16")


def read_measured_run(path: str | Path) -> MeasuredRun:
    """A measured run directory → MeasuredRun (raises with the fix if it lacks what calibration needs)."""
    import pyarrow.compute as pc

    from powertrain.spec.run import RunConfig
    from powertrain.store import RunDir, read_events, read_telemetry

    rd = RunDir(path)
    info = rd.read()
    if info.get("kind") == "prediction":
        raise ValueError(f"{path} is a prediction, not a measured run; calibrate on measured runs only")
    if info.get("status") not in (None, "ok"):
        raise ValueError(f"{path}: run status is {info.get('status')!r}; only finished (ok) runs calibrate")
    # the resolved RunConfig: run.json "config", or the spec.json `powertrain run` leaves beside it
    cfg_raw = info.get("config")
    if not isinstance(cfg_raw, dict) and (rd.path / "spec.json").is_file():
        import json

        cfg_raw = json.loads((rd.path / "spec.json").read_text())
    if not isinstance(cfg_raw, dict):
        raise ValueError(f"{path}: run.json has no resolved `config`; runs made by `powertrain run` carry one")
    cfg = RunConfig.model_validate(cfg_raw)
    probe = None
    if is_cpu_name(cfg.hardware.device):
        rec = info.get("host_probe")
        probe = (HostProbe.from_dict(rec, f"run.json of {rd.path.name}") if isinstance(rec, dict) else
                 _unrecorded(probe_host(rank_threads(cfg.hardware.devices_per_node))))
    ev = read_events(rd.path)
    mask = pc.and_(pc.equal(ev["kind"], "step"), pc.equal(ev["window"], "measured"))
    steps = ev.filter(mask)
    if steps.num_rows == 0:
        raise ValueError(f"{path}: no measured step events (events/rank-*.parquet, kind=step, window=measured)")
    step = np.asarray(steps["step"].to_pylist(), dtype=float)
    dur = (np.asarray(steps["t_end_ns"].to_pylist(), dtype=float)
           - np.asarray(steps["t_start_ns"].to_pylist(), dtype=float)) / 1e9
    per_step = [dur[step == s].max() for s in np.unique(step)]
    step_time = float(np.mean(per_step))
    power = None
    tel = read_telemetry(rd.path)
    if tel.num_rows:
        pw = np.asarray([v for v in tel["power_w"].to_pylist() if v is not None], dtype=float)
        dev = tel["device"].to_pylist()
        if len(pw) and any(str(d).startswith("gpu") for d in dev):
            power = float(np.mean(pw))
    return MeasuredRun(label=str(rd.path), case=case_from_run_config(cfg, host_probe=probe), step_time_s=step_time,
                       power_mean_w=power)


def collect_runs(paths: Iterable[str | Path]) -> list[MeasuredRun]:
    """Run directories, or sweep folders holding run directories, → measured runs (predictions skipped)."""
    out: list[MeasuredRun] = []
    for p in map(Path, paths):
        dirs = [p] if (p / "run.json").is_file() else sorted(d for d in p.iterdir() if (d / "run.json").is_file()) \
            if p.is_dir() else []
        if not dirs:
            raise FileNotFoundError(f"{p} is neither a run directory (run.json) nor a folder of run directories")
        for d in dirs:
            try:
                out.append(read_measured_run(d))
            except ValueError:
                if len(dirs) == 1:
                    raise
    return out


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, iters: int = 400, step: float = 0.3) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (a small, dependency-free Nelder–Mead)."""
    n = len(x0)
    pts = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < 1e-10:
            break
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
                vals = [f(p) for p in pts]
    return pts[int(np.argmin(vals))]


def errors(runs: Sequence[MeasuredRun], calibration: Calibration) -> list[float]:
    """Signed relative step-time error (predicted/measured − 1) of each run."""
    return [predict(r.case, calibration).metrics["step_time_mean_s"] / r.step_time_s - 1 for r in runs]


def mape(errs: Sequence[float]) -> float:
    return float(np.mean(np.abs(errs))) if errs else float("nan")


def pinned_at_bounds(values: dict[str, float], bounds: dict[str, tuple[float, float]], tol: float = 0.01) -> list[str]:
    """The coefficients whose fitted value ended within ``tol`` (in log) of a bound of their range.

    A fit that runs into a bound is telling that the model's structure is wrong for these runs (the
    coefficient stands in for something else), so its value has no physical meaning."""
    out = []
    for k, v in values.items():
        lo, hi = bounds.get(k, (0.0, math.inf))
        for b in (lo, hi):
            if b > 0 and math.isfinite(b) and v > 0 and abs(math.log(v / b)) < tol:
                out.append(f"{k} = {v:.4g} at its bound {b:g}")
    return out


def interval_half_width(log_residuals: Sequence[float], level: float = 0.8) -> float:
    """Half-width (in log space) of the ``level`` prediction interval: the empirical ``level``
    quantile of |log(predicted/measured)| over held-out residuals."""
    if not log_residuals:
        raise ValueError("interval_half_width needs at least one residual")
    return float(np.quantile(np.abs(np.asarray(log_residuals, dtype=float)), level))


def fit_calibration(runs: Sequence[MeasuredRun], name: str, base: Calibration | str | None = None,
                    params: Sequence[str] | None = None, *, allow_pinned: bool = False) -> Calibration:
    """Fit ``params`` (default: GEMM efficiency of the runs' precision, per-layer overhead, and, when
    any run is distributed, the intra-node link efficiency — or, for ranks sharing a host CPU, GEMM
    efficiency and the collective latency scale only) to ``runs``; returns the new calibration with
    its fit error (``error.step_time_mape`` before and after, per run)."""
    if not runs:
        raise ValueError("calibration needs at least one measured run")
    cal = base if isinstance(base, Calibration) else load_calibration(base)
    multi = any(r.case.world > 1 for r in runs)
    cpu = all(r.case.device.transport == "gloo" for r in runs)
    chosen = list(params or (STEP_PARAMS_1 if not multi else STEP_PARAMS_CPU if cpu else STEP_PARAMS_MULTI))
    chosen = [_gemm_key(runs[0].case) if p == "gemm_eff" else p for p in chosen]
    unknown = [p for p in chosen if p not in COEFFICIENT_NAMES]
    if unknown:
        raise ValueError(f"unknown coefficients {unknown}; known: {', '.join(COEFFICIENT_NAMES)}")
    if len(chosen) > len(runs):
        chosen = chosen[: len(runs)]
    x0 = np.log([getattr(cal.coefficients, p) for p in chosen])
    before = errors(runs, cal)

    def make(x: np.ndarray) -> Calibration:
        return cal.with_coefficients(**{k: _clamp(k, float(math.exp(v))) for k, v in zip(chosen, x, strict=True)})

    def objective(x: np.ndarray) -> float:
        p = make(x)
        errs = errors(runs, p)
        # mean |log ratio|: close to MAPE, and robust to one noisy measurement
        return float(np.mean([abs(math.log1p(e)) for e in errs]))

    # Nelder–Mead is local; coefficients can sit orders of magnitude from the defaults (a CPU's
    # collective latency, say), so start from a coarse grid of scales and keep the best.
    starts = [x0 + np.array(offs) for offs in itertools.product((0.0, 3.0), repeat=len(chosen))]
    results = [_nelder_mead(objective, x, iters=120, step=1.0) for x in starts]
    best = _nelder_mead(objective, min(results, key=objective), iters=300, step=0.2)
    fitted = make(best)
    after = errors(runs, fitted)
    if any(r.power_mean_w for r in runs):
        fitted = _fit_power(runs, fitted)
    pins = pinned_at_bounds({k: getattr(fitted.coefficients, k) for k in chosen}, BOUNDS)
    if pins and not allow_pinned:
        raise ValueError(f"calibration {name!r}: {'; '.join(pins)} — the fit ran into the edge of the physical range, "
                         "so the model does not describe these runs there; fit fewer coefficients (--params) or "
                         "add runs that vary what it stands for")
    error: dict[str, Any] = {
        "step_time_mape": mape(after), "step_time_mape_before": mape(before), "n_runs": len(runs),
        "fitted": chosen, "per_run": {r.label: round(e, 4) for r, e in zip(runs, after, strict=True)},
        "pinned_at_bound": pins,
    }
    return replace(fitted, name=name, error=error, fitted_on=[r.label for r in runs],
                   device=runs[0].case.device.name, host_probes=fitted_probes(runs))


def fitted_probes(runs: Sequence[MeasuredRun]) -> list[dict[str, Any]]:
    """The host probes of CPU runs, one record per rank thread count: the median over those runs."""
    by_threads: dict[int, list[HostProbe]] = {}
    for r in runs:
        if r.case.device.probe is not None:
            by_threads.setdefault(r.case.device.probe.threads, []).append(r.case.device.probe)
    out = []
    for threads, probes in sorted(by_threads.items()):
        # where the probes came from: the runs' own records, or fresh probes at calibration time
        kinds = sorted({"recorded in run.json" if p.source.startswith("run.json") else p.source for p in probes})
        out.append({
            "matmul_flops": float(np.median([p.matmul_flops for p in probes])),
            "copy_bytes_per_s": float(np.median([p.copy_bytes_per_s for p in probes])),
            "threads": threads, "cores": probes[0].cores,
            "method": "; ".join(sorted({p.method for p in probes})),
            "runs": len(probes),
            "how": f"median of the {len(probes)} fitted run(s)' probes ({'; '.join(kinds)})",
        })
    return out


def _fit_power(runs: Sequence[MeasuredRun], cal: Calibration) -> Calibration:
    with_power = [r for r in runs if r.power_mean_w]
    x0 = np.log([getattr(cal.coefficients, p) for p in POWER_PARAMS])

    def objective(x: np.ndarray) -> float:
        p = cal.with_coefficients(**{k: _clamp(k, float(math.exp(v))) for k, v in zip(POWER_PARAMS, x, strict=True)})
        out = []
        for r in with_power:
            pw = predict(r.case, p).metrics["power_mean_w"]
            out.append(math.log(pw / r.power_mean_w) ** 2 if pw else 1.0)
        return float(np.mean(out))

    best = _nelder_mead(objective, x0, iters=200)
    return cal.with_coefficients(**{k: _clamp(k, float(math.exp(v))) for k, v in zip(POWER_PARAMS, best, strict=True)})
