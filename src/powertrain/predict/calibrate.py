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
so every coefficient stays positive. Never more coefficients than runs, and none that no run's
prediction moves (its fitted value would be arbitrary, and every later prediction would use it).
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
from powertrain.predict.calibration import (
    COEFFICIENT_NAMES,
    RETIRED_COEFFICIENTS,
    VALID_RANGES,
    Calibration,
    load_calibration,
)
from powertrain.predict.case import Case, case_from_run_config
from powertrain.predict.core import predict

STEP_PARAMS_1 = ("gemm_eff", "layer_overhead_s")
STEP_PARAMS_MULTI = ("gemm_eff", "layer_overhead_s", "comm_eff_intra")
# ranks on one host CPU talk through gloo over shared memory: latency, not bandwidth, bounds them. Each
# op's host time on a CPU adds to its compute (nothing runs ahead), about a millisecond per layer and
# micro-batch for a small model; the per-layer overhead is fitted where two runs differ only in micro-batch
# size (:func:`_per_layer_time_unseen`), else it keeps the base profile's value and says why
STEP_PARAMS_CPU = ("gemm_eff", "comm_latency_scale", "layer_overhead_s")
POWER_PARAMS = ("power_compute", "power_wait")
# what the power fit moves (against measured mean device power); every other coefficient is fitted on step time
POWER_COEFFICIENTS = tuple(n for n in COEFFICIENT_NAMES if n.startswith("power_"))
# Plausible ranges the fit may not leave (GEMM efficiency is relative to the catalog or probe peak,
# which on a busy CPU can read low, hence > 1 allowed).
BOUNDS = {"gemm_eff_fp32": (0.01, 4.0), "gemm_eff_16": (0.01, 4.0), "gemm_eff_fp8": (0.01, 4.0),
          "gemm_eff_fp4": (0.01, 4.0), "layer_overhead_s": (1e-7, 1.0), "comm_latency_scale": (0.01, 1e5),
          "comm_eff_intra": (0.01, 1.5), "comm_eff_inter": (0.01, 1.5), "power_compute": (0.05, 1.2),
          "power_wait": (0.0, 1.0)}
# How far from its start the fit looks (a step either way, and its coarse grid's e^3 start): a coefficient
# that moves no prediction at any of these is one the fit cannot see, and its fitted value would be arbitrary.
_PROBE_FACTORS = (1.1, 1 / 1.1, math.exp(3.0))


def _unrecorded(probe: HostProbe) -> HostProbe:
    """The host's probe standing in for a run that recorded none, labelled so."""
    return replace(probe, source=f"{probe.source}: the run recorded none")


def _bounds(name: str) -> tuple[float, float]:
    """The fit's range for ``name``: its plausible range, else where it means something at all (a value
    outside that would make a profile that no longer loads)."""
    return BOUNDS.get(name) or VALID_RANGES[name][:2]


def _clamp(name: str, value: float) -> float:
    lo, hi = _bounds(name)
    return min(hi, max(lo, value))


@dataclass
class MeasuredRun:
    """One measured configuration and what was measured."""

    label: str
    case: Case
    step_time_s: float
    power_mean_w: float | None = None
    # seconds of each step outside forward, backward and the optimizer, from the run's events (None: unknown)
    fixed_time_s: float | None = None


def _gemm_key(run: MeasuredRun, cal: Calibration) -> str:
    """The GEMM-efficiency coefficient that sets ``run``'s GEMM rate, the one ``gemm_eff`` means.

    Not always the run precision's own: fp8/fp4 on a generation the model knows run at gemm_eff_16 × the
    literature ratio × gemm_lowp_scale, and fp8 on a device without fp8 units at the 16-bit efficiency
    (``compute_rates`` in predict/steptime.py). Asking the prediction which one moves keeps this in step
    with those rules instead of restating them."""
    own = {"fp32": "gemm_eff_fp32", "tf32": "gemm_eff_fp32", "fp8": "gemm_eff_fp8", "fp4": "gemm_eff_fp4"}.get(
        run.case.precision, "gemm_eff_16")
    for key in dict.fromkeys((own, "gemm_lowp_scale", "gemm_eff_16")):
        if _moves(key, [run], cal, "step_time_mean_s"):
            return key
    return own


def _moves(name: str, runs: Sequence[MeasuredRun], cal: Calibration, metric: str) -> bool:
    """Whether moving coefficient ``name`` as far as the fit looks changes ``metric`` of any of ``runs``."""
    v0 = getattr(cal.coefficients, name)
    before = [predict(r.case, cal).metrics.get(metric) for r in runs]
    for f in _PROBE_FACTORS:
        v = _clamp(name, v0 * f)
        if v == v0:
            continue
        moved = cal.with_coefficients(**{name: v})
        for r, b in zip(runs, before, strict=True):
            a = predict(r.case, moved).metrics.get(metric)
            if a is None or b is None:
                if a is not b:
                    return True
            elif not math.isclose(a, b, rel_tol=1e-9):  # rounding is no dependence
                return True
    return False


def _why_unseen(name: str, runs: Sequence[MeasuredRun], cal: Calibration) -> tuple[str, str]:
    """(why moving ``name`` changes none of these runs' step times, as specifically as the runs tell; the fix)."""
    cases = [r.case for r in runs]
    if name in ("moe_layer_overhead_s", "moe_imbalance", "grouped_gemm_eff") and not any(c.is_moe for c in cases):
        return "no run here is MoE", "drop it"
    if name in ("gemm_eff_fp8", "gemm_eff_fp4"):
        prec = name.removeprefix("gemm_eff_")
        own = [r for r in runs if r.case.precision == prec]
        if not own:
            return f"no run here is {prec}", "drop it"
        key = _gemm_key(own[0], cal)
        return (f"the {prec} runs here ({own[0].case.device.name}) take their GEMM rate from {key}, not from it",
                f"fit {key} (or gemm_eff) instead")
    if name == "gemm_eff_fp32" and not any(c.precision in ("fp32", "tf32") for c in cases):
        return "no run here is fp32 or tf32", "drop it"
    if name == "gemm_lowp_scale" and not any(c.precision in ("fp8", "fp4") for c in cases):
        return "no run here is fp8 or fp4", "drop it"
    if name in ("mem_overhead_bytes", "mem_fragmentation"):
        return "it sets predicted memory, not step time", "drop it"
    if name == "comm_eff_inter" and all(c.nodes <= 1 for c in cases):
        return "no run here spans nodes", "drop it"
    if name.startswith(("comm_", "overlap_", "tp_overlap")) and all(c.world <= 1 for c in cases):
        return "no run here is distributed", "drop it"
    return "moving it by 10 % either way, or 20× up, changes no run's predicted step time", "drop it"


def _unseen(names: Sequence[str], runs: Sequence[MeasuredRun], cal: Calibration) -> dict[str, tuple[str, str]]:
    """``{name: (why, fix)}`` for each of ``names`` the fit cannot see on ``runs``: a step-time coefficient
    that moves no run's step time, a power coefficient that moves no measured run's mean device power."""
    powered = [r for r in runs if r.power_mean_w]
    out: dict[str, tuple[str, str]] = {}
    for name in names:
        if getattr(cal.coefficients, name) <= 0:
            out[name] = ("it is 0 in the base profile, and a fit in log space cannot move it from there",
                         "start from a profile where it is positive, or drop it")
        elif name in POWER_COEFFICIENTS:
            if not powered:
                out[name] = ("no run here has measured power", "drop it")
            elif not _moves(name, powered, cal, "power_mean_w"):
                out[name] = ("moving it changes no measured run's predicted mean device power", "drop it")
        elif not _moves(name, runs, cal, "step_time_mean_s"):
            out[name] = _why_unseen(name, runs, cal)
    return out


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
    case = case_from_run_config(cfg, host_probe=probe)
    power = None
    tel = read_telemetry(rd.path)
    if tel.num_rows:
        pw = np.asarray([v for v in tel["power_w"].to_pylist() if v is not None], dtype=float)
        dev = tel["device"].to_pylist()
        if len(pw) and any(str(d).startswith("gpu") for d in dev):
            power = float(np.mean(pw))
    return MeasuredRun(label=str(rd.path), case=case, step_time_s=step_time, power_mean_w=power,
                       fixed_time_s=step_fixed_time(ev, case))


_PHASES = ("forward", "backward", "optimizer")  # the spans of a step the model times itself


def step_fixed_time(ev: Any, case: Case) -> float | None:
    """Seconds of a measured step outside its micro-batches' forward and backward and the optimizer (data
    loading, zeroing gradients, the loss's reduction and logging): the median over measured steps and
    ranks, from the run's own events; only spans inside their step's span count (a trainer may time the
    optimizer after the step). ``None`` for a pipeline run — a stage's waits for the others fall outside
    its forward and backward events, and the model counts those as the bubble — and where the events lack
    forward, backward or optimizer spans inside measured steps (a run recorded by another trainer)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if case.pp > 1:
        return None
    steps = ev.filter(pc.and_(pc.equal(ev["kind"], "step"), pc.equal(ev["window"], "measured")))
    steps = steps.filter(pc.is_valid(steps["step"]))
    phases = ev.filter(pc.is_in(ev["kind"], value_set=pa.array(_PHASES)))
    phases = phases.filter(pc.is_valid(phases["step"]))
    if steps.num_rows == 0 or phases.num_rows == 0:
        return None

    def keys(t: Any) -> np.ndarray:  # one integer per (rank, step)
        return np.asarray(t["rank"], dtype=np.int64) * (1 << 40) + np.asarray(t["step"], dtype=np.int64)

    s_key, order = np.unique(keys(steps), return_index=True)  # the first span of each (rank, step)
    s0 = np.asarray(steps["t_start_ns"], dtype=np.int64)[order]
    s1 = np.asarray(steps["t_end_ns"], dtype=np.int64)[order]
    p_key, p0, p1 = keys(phases), np.asarray(phases["t_start_ns"], np.int64), np.asarray(phases["t_end_ns"], np.int64)
    at = np.clip(np.searchsorted(s_key, p_key), 0, len(s_key) - 1)
    inside = (s_key[at] == p_key) & (s0[at] <= p0) & (p1 <= s1[at])
    if set(np.asarray(phases["kind"], dtype=object)[inside]) != set(_PHASES):
        return None
    spent = np.bincount(at[inside], weights=(p1 - p0)[inside] / 1e9, minlength=len(s_key))
    return float(np.median(np.maximum(0.0, (s1 - s0) / 1e9 - spent)))


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


def _for_engine(base: Calibration, engine: str) -> Calibration:
    """``base`` as a starting point for runs of ``engine``: a fit describes the runs' own stack, so it starts from the
    base's coefficients as that engine takes them (its own fixed time per step where the base was fitted on another
    stack, :meth:`Calibration.coefficients_for`)."""
    if base.engine == engine:
        return base
    return replace(base, engine=engine, coefficients=base.coefficients_for(engine))


def fit_calibration(runs: Sequence[MeasuredRun], name: str, base: Calibration | str | None = None,
                    params: Sequence[str] | None = None, *, allow_pinned: bool = False) -> Calibration:
    """Fit ``params`` to ``runs``; returns the new calibration with its fit error (``error.step_time_mape``
    before and after, per run).

    ``gemm_eff`` stands for the GEMM efficiency that sets the first run's GEMM rate (:func:`_gemm_key`).
    Step-time coefficients are fitted on step time, ``power_*`` ones on measured mean device power.
    Named ``params`` are refused (ValueError, one line) when unknown, repeated, more than the runs
    that measure them, or invisible to the fit: moving one changes none of these runs' predictions, so
    any value would fit. The default — GEMM efficiency and per-layer overhead, plus the intra-node link
    efficiency when any run is distributed (for ranks sharing a host CPU: GEMM efficiency, the collective
    latency scale where a run has TP or FSDP, and the per-layer overhead where two runs differ only in
    micro-batch size) — leaves out what the runs cannot see (``error.not_fitted`` says why) and takes no
    more than there are runs;
    power_compute and power_wait are fitted where power was measured and ``params`` names no power
    coefficient. The step's fixed time is measured from the runs' events where they time it
    (:func:`_measured_fixed_time`, ``error.measured``), unless ``params`` names it."""
    if not runs:
        raise ValueError("calibration needs at least one measured run")
    base_cal = _for_engine(base if isinstance(base, Calibration) else load_calibration(base), runs[0].case.engine)
    cal, measured = _measured_fixed_time(runs, base_cal, params)
    multi = any(r.case.world > 1 for r in runs)
    cpu = all(r.case.device.transport == "gloo" for r in runs)
    powered = [r for r in runs if r.power_mean_w]
    named = bool(params)
    given = list(params) if params else list(STEP_PARAMS_1 if not multi else STEP_PARAMS_CPU if cpu else STEP_PARAMS_MULTI)
    gemm = _gemm_key(runs[0], cal) if "gemm_eff" in given else ""
    chosen = [gemm if p == "gemm_eff" else p for p in given]
    retired = [p for p in chosen if p in RETIRED_COEFFICIENTS]
    if retired:
        raise ValueError("; ".join(f"--params {p}: no longer a coefficient ({RETIRED_COEFFICIENTS[p]}); drop it"
                                   for p in retired))
    unknown = [p for p in chosen if p not in COEFFICIENT_NAMES]
    if unknown:
        raise ValueError(f"unknown coefficients {unknown}; known: {', '.join(COEFFICIENT_NAMES)}")
    repeated = sorted({p for p in chosen if chosen.count(p) > 1})
    if repeated:
        also = f" (gemm_eff means {gemm} for these runs)" if gemm in repeated else ""
        raise ValueError(f"--params names {', '.join(repeated)} more than once{also}; name each coefficient once")
    step = [p for p in chosen if p not in POWER_COEFFICIENTS]
    power = [p for p in chosen if p in POWER_COEFFICIENTS]
    not_fitted: dict[str, str] = {}
    if named:
        for what, names, n in (("", step, len(runs)), (" with measured power", power, len(powered))):
            if n and len(names) > n:
                raise ValueError(f"--params names {len(names)} coefficients ({', '.join(names)}) for {n} run(s){what}; "
                                 f"a fit needs at least one run per coefficient: name at most {n} or add runs")
        unseen = _unseen(chosen, runs, cal)
        if unseen:
            raise ValueError("; ".join(f"--params {k}: {why}, so the fit cannot see it; {fix}"
                                       for k, (why, fix) in unseen.items()))
    else:
        step, not_fitted = _default_step_params(step, runs, cal, cpu)
    if not measured and "step_overhead_s" not in chosen:
        not_fitted["step_overhead_s"] = _NOT_MEASURED
    if not power and powered:
        power = list(POWER_PARAMS)
    before = errors(runs, base_cal)
    fitted = _fit_step(runs, cal, step) if step else cal
    after = errors(runs, fitted)
    if power and powered:
        fitted = _fit_power(runs, fitted, power)
    pins = pinned_at_bounds({k: getattr(fitted.coefficients, k) for k in step}, {k: _bounds(k) for k in step})
    if pins and not allow_pinned:
        raise ValueError(f"calibration {name!r}: {'; '.join(pins)} — the fit ran into the edge of the physical range, "
                         "so the model does not describe these runs there; fit fewer coefficients (--params) or "
                         "add runs that vary what it stands for")
    error: dict[str, Any] = {
        "step_time_mape": mape(after), "step_time_mape_before": mape(before), "n_runs": len(runs),
        "fitted": step, "per_run": {r.label: round(e, 4) for r, e in zip(runs, after, strict=True)},
        "pinned_at_bound": pins,
    }
    if power and powered:
        error["fitted_power"] = power
    if measured:
        error["measured"] = measured
    if not_fitted:
        error["not_fitted"] = not_fitted
    return replace(fitted, name=name, error=error, fitted_on=[r.label for r in runs],
                   device=runs[0].case.device.name, host_probes=fitted_probes(runs), engine=runs[0].case.engine)


def _per_layer_time_unseen(runs: Sequence[MeasuredRun]) -> str:
    """Why these CPU runs cannot tell a per-layer host time from GEMM efficiency ("" when they can).

    Both scale a layer pass's time: GEMM time with its tokens, host time not. What separates them cleanly
    is two runs that differ only in tokens per micro-batch — one model, layout and recompute. Across
    layouts the difference goes to other terms as well (on a host CPU what TP adds per layer is collective
    latency, which ``comm_latency_scale`` takes; recompute and pipelines add passes), and across models the
    layers launch other ops; the README's three runs, two models over three layouts, left it anywhere
    between 0.3 ms and its lower bound from one measurement to the next."""
    tokens: dict[tuple[object, ...], set[int]] = {}
    for r in runs:
        c = r.case
        key = (c.layers, c.hidden, c.ffn, c.tp, c.pp, c.dp, c.cp, c.vp, c.recompute, c.sequence_parallel)
        tokens.setdefault(key, set()).add(c.micro_batch * c.seq_len)
    if any(len(t) > 1 for t in tokens.values()):
        return ""
    return ("no two runs here differ only in tokens per micro-batch (one model, layout and recompute), so its "
            "per-layer host time cannot be told from GEMM efficiency; add one of them again at another micro-batch size")


def _default_step_params(step: list[str], runs: Sequence[MeasuredRun], cal: Calibration,
                         cpu: bool) -> tuple[list[str], dict[str, str]]:
    """(the default step-time coefficients these runs can fit, {left out: why}): none the runs cannot see;
    on CPU runs the per-layer host time only where they separate it and gloo's latency only where some run
    has per-layer collectives; no more than there are runs."""
    not_fitted = {k: why for k, (why, _) in _unseen(step, runs, cal).items()}
    if cpu and "layer_overhead_s" in step and "layer_overhead_s" not in not_fitted and (
            why := _per_layer_time_unseen(runs)):
        not_fitted["layer_overhead_s"] = why
    if cpu and "comm_latency_scale" in step and not any(r.case.tp > 1 or r.case.fsdp for r in runs):
        # seen (it moves a prediction a little) but not pinned: on DDP and pipeline sweeps it ran to its bound
        not_fitted["comm_latency_scale"] = ("no run here has per-layer collectives (TP or FSDP): DDP's few bucketed "
                                            "all-reduces and a pipeline's sends do not pin gloo's latency")
    step = [p for p in step if p not in not_fitted]
    if not step:
        raise ValueError(f"these runs constrain none of the default coefficients "
                         f"({'; '.join(f'{k}: {why}' for k, why in not_fitted.items())}); name some with --params")
    not_fitted.update({p: f"only {len(runs)} run(s), one per coefficient" for p in step[len(runs):]})
    return step[: len(runs)], not_fitted


_NOT_MEASURED = ("not measured either: no run here times its steps' forward, backward and optimizer spans outside "
                 "a pipeline (whose stages wait outside them)")


def _measured_fixed_time(runs: Sequence[MeasuredRun], cal: Calibration,
                         params: Sequence[str] | None) -> tuple[Calibration, dict[str, Any]]:
    """``cal`` with ``step_overhead_s`` set to what these runs measured, and a record of it.

    The base profile's value was fitted on other frameworks' published runs (their host syncs and
    logging), so a calibration whose runs time it directly (:func:`step_fixed_time`) uses their median
    instead of inheriting it or fitting it. Unchanged where no run measured it, or where ``params``
    names ``step_overhead_s`` (the user asked for it to be fitted)."""
    fixed = [r.fixed_time_s for r in runs if r.fixed_time_s is not None]
    if not fixed or (params and "step_overhead_s" in params):
        return cal, {}
    value = float(np.median(fixed))
    record = {"step_overhead_s": {
        "value": value, "runs": len(fixed), "base_value": cal.coefficients.step_overhead_s,
        "how": "median over the runs of each run's median per-step time outside forward, backward and the "
               "optimizer (events/rank-*.parquet); pipeline runs left out"}}
    return cal.with_coefficients(step_overhead_s=value), record


def _fit_step(runs: Sequence[MeasuredRun], cal: Calibration, chosen: list[str]) -> Calibration:
    """``cal`` with ``chosen`` fitted to the runs' step times (mean |log ratio|, within bounds)."""
    x0 = np.log([getattr(cal.coefficients, p) for p in chosen])

    def make(x: np.ndarray) -> Calibration:
        return cal.with_coefficients(**{k: _clamp(k, float(math.exp(v))) for k, v in zip(chosen, x, strict=True)})

    def objective(x: np.ndarray) -> float:
        p = make(x)
        errs = errors(runs, p)
        # mean |log ratio|: close to MAPE, and robust to one noisy measurement
        return float(np.mean([abs(math.log1p(e)) for e in errs]))

    # Nelder–Mead is local; coefficients can sit orders of magnitude from the defaults, either way (a CPU's
    # collective latency above, its GEMM efficiency below), so start from a coarse grid of scales — ×1/20, ×1,
    # ×20 each — and keep the best.
    starts = [x0 + np.array(offs) for offs in itertools.product((-3.0, 0.0, 3.0), repeat=len(chosen))]
    results = [_nelder_mead(objective, x, iters=120, step=1.0) for x in starts]
    best = _nelder_mead(objective, min(results, key=objective), iters=300, step=0.2)
    return make(best)


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


def _fit_power(runs: Sequence[MeasuredRun], cal: Calibration, params: Sequence[str] = POWER_PARAMS) -> Calibration:
    with_power = [r for r in runs if r.power_mean_w]
    x0 = np.log([getattr(cal.coefficients, p) for p in params])

    def objective(x: np.ndarray) -> float:
        p = cal.with_coefficients(**{k: _clamp(k, float(math.exp(v))) for k, v in zip(params, x, strict=True)})
        out = []
        for r in with_power:
            pw = predict(r.case, p).metrics["power_mean_w"]
            out.append(math.log(pw / r.power_mean_w) ** 2 if pw else 1.0)
        return float(np.mean(out))

    best = _nelder_mead(objective, x0, iters=200)
    return cal.with_coefficients(**{k: _clamp(k, float(math.exp(v))) for k, v in zip(params, best, strict=True)})
