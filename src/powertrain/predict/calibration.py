"""Calibrations: the model's few global coefficients, with physical meaning, stored as YAML.

A :class:`Calibration` is a named set of :class:`Coefficients` (what fraction of peak large GEMMs
reach per precision, how much elementwise traffic a layer makes, how well communication overlaps,
how much power each phase draws) plus the error it had on the runs it was fitted to. ``default``
ships with the package (``calibrations/default.yaml``, fitted on ``calibration_runs.yaml`` by
``benchmarks/predict_accuracy.py --refit``); users write their own with ``powertrain calibrate``.
The command line calls a calibration a *profile* (``--profile NAME``); they are looked up as a
path, then in ``$POWERTRAIN_PROFILES`` / ``~/.config/powertrain/profiles``, then among the shipped
ones.

A calibration fitted on CPU runs also keeps ``host_probes``: the host probe (fp32 matmul FLOP/s and copy
bandwidth, per rank thread count) its runs were measured with, the median over the runs. Its GEMM
efficiency is relative to that probe, so predictions with the calibration use the same numbers instead
of probing the host again (which on a shared machine reads differently on every call).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from powertrain.core.yamlfile import load_yaml_file
from powertrain.hardware import HostProbe

SHIPPED_DIR = Path(__file__).with_name("calibrations")


def user_calibration_dir() -> Path:
    """Where users' calibrations live: ``$POWERTRAIN_PROFILES``, else ``~/.config/powertrain/profiles``."""
    env = os.environ.get("POWERTRAIN_PROFILES")
    return Path(env) if env else Path.home() / ".config" / "powertrain" / "profiles"


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Global model coefficients. Each is a physical quantity, not a per-run fudge."""

    # Fraction of dense peak that large GEMMs sustain, per precision class.
    gemm_eff_fp32: float = 0.70
    gemm_eff_16: float = 0.72
    gemm_eff_fp8: float = 0.55
    gemm_eff_fp4: float = 0.45
    # On a GPU generation predict/precision.py knows, fp8/fp4 GEMMs reach gemm_eff_16 × the literature
    # ratio for the generation and recipe × this scale (1 = the literature ratio); gemm_eff_fp8/fp4 then
    # apply only to devices of unknown generation.
    gemm_lowp_scale: float = 1.0
    # A grouped GEMM (several local experts in one launch) ÷ one dense GEMM of the same shape: CUTLASS /
    # Transformer Engine grouped GEMMs reach 70-90 % of dense (tails per expert, scheduling, per-expert scales).
    grouped_gemm_eff: float = 0.8
    # Fused attention (flash) throughput relative to a large 16-bit GEMM.
    attn_eff_ratio: float = 0.55
    # Multiplier on the counted elementwise traffic (norms, activations, residuals, routing).
    elementwise_scale: float = 1.0
    # Fraction of HBM bandwidth memory-bound kernels reach.
    mem_eff: float = 0.75
    # Host/launch overhead per layer per micro-batch forward (backward costs twice).
    layer_overhead_s: float = 15e-6
    # Host time of one MoE layer pass (forward, or backward) after the dropless dispatcher syncs token counts
    # (routing metadata to the CPU): the GPU waits for the CPU to launch the rest of the layer, so a layer pass takes
    # at least this long (launch-bound at small micro-batches).  Range 0.1-3 ms (docs/model.md §8).
    moe_layer_overhead_s: float = 300e-6
    # Fixed per-step overhead (optimizer launch, data loading, logging).
    step_overhead_s: float = 0.01
    # Achieved fraction of link bandwidth for NCCL-style collectives.
    comm_eff_intra: float = 0.75
    comm_eff_inter: float = 0.80
    # Achieved collective latency ÷ the catalog's link latency (CPU/gloo collectives are latency-bound).
    comm_latency_scale: float = 1.0
    # Share of a compute window that overlapped communication can hide behind.
    overlap_eff: float = 0.85
    # Exposed share of TP communication when TP-comm overlap is on.
    tp_overlap_exposed: float = 0.35
    # Expert-load imbalance (slowest expert rank ÷ mean) when the run does not force balance.
    moe_imbalance: float = 1.15
    # Power (predict/dvfs.py), what each kind of phase draws above idle at the maximum clock: compute as a share
    # of large dense GEMMs' dynamic power (P_peak − idle), memory-bound work and waiting as shares of the part's
    # power range (TDP − idle).
    power_compute: float = 0.76
    power_memory: float = 0.47
    power_wait: float = 0.10
    # The voltage–frequency curve: voltage floor (÷ the voltage at the maximum clock) and the clock ratio
    # below which the voltage sits at it; fitted on the Perseus A100 stage profiles (predict/dvfs.py).
    vf_floor: float = 0.83
    vf_knee: float = 0.78
    # Below this clock ratio memory-bound kernels slow with the clock too (too few loads issued to keep HBM busy).
    memory_clock_floor: float = 0.5
    # The power limiter (predict/governor.py): the window over which it holds power at the limit, and how long
    # the clock takes to come back after the limit stops binding (the throttle reason stays set meanwhile).
    power_limiter_window_s: float = 0.05
    power_limiter_release_s: float = 1.0
    # Framework memory overhead per device: context, communicator buffers, allocator slack.
    mem_overhead_bytes: float = 2.5e9
    mem_fragmentation: float = 1.03

    def gemm_eff(self, precision: str) -> float:
        return {"fp32": self.gemm_eff_fp32, "tf32": self.gemm_eff_fp32, "fp8": self.gemm_eff_fp8,
                "fp4": self.gemm_eff_fp4}.get(precision, self.gemm_eff_16)


@dataclass(frozen=True, slots=True)
class Calibration:
    """A named set of coefficients plus how well they fit (``error``: MAPE etc., may be empty)."""

    name: str = "default"
    coefficients: Coefficients = field(default_factory=Coefficients)
    error: dict[str, Any] = field(default_factory=dict)
    fitted_on: list[str] = field(default_factory=list)
    device: str | None = None
    # CPU calibrations: the host probes the fit used, one record per rank thread count (HostProbe.to_dict()
    # plus ``runs``, how many fitted runs it is the median of, and ``how``, where they came from)
    host_probes: list[dict[str, Any]] = field(default_factory=list)
    # the training stack its runs ran (predict/engines.py): "megatron" for the published runs the shipped
    # profile is fitted on, "builtin" for powertrain's own runs. The engine-bound coefficient (the step's fixed
    # time) describes that stack only; another engine's prediction takes its own (coefficients_for)
    engine: str = "megatron"

    def host_probe(self, threads: int) -> HostProbe | None:
        """The stored host probe for ranks running ``threads`` threads, or None."""
        for rec in self.host_probes:
            if int(rec.get("threads", 0)) == threads:
                return HostProbe.from_dict(rec, f"calibration profile {self.name!r}: {rec.get('how', 'stored probe')}")
        return None

    def coefficients_for(self, engine: str) -> Coefficients:
        """The coefficients for a case run on ``engine``: this profile's, with the step's fixed time of that
        engine where the profile was fitted on another (:data:`ENGINE_FIXED_STEP_S`; published frameworks' 59 ms
        of host work per step is not what powertrain's own trainer spends)."""
        if engine == self.engine or engine not in ENGINE_FIXED_STEP_S:
            return self.coefficients
        return _for_engine(self.coefficients, engine)

    def with_coefficients(self, **updates: float) -> Calibration:
        return replace(self, coefficients=replace(self.coefficients, **updates))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "engine": self.engine, "coefficients": asdict(self.coefficients),
                "error": self.error, "fitted_on": self.fitted_on, "host_probes": self.host_probes}


@functools.lru_cache(maxsize=64)
def _for_engine(coefficients: Coefficients, engine: str) -> Coefficients:
    # cached: a sweep predicts thousands of cases of one engine with one profile
    return replace(coefficients, step_overhead_s=ENGINE_FIXED_STEP_S[engine])


COEFFICIENT_NAMES = tuple(f.name for f in fields(Coefficients))
# The step's fixed time (host work outside forward, backward and the optimizer: data, loss sync, logging) of an
# engine whose runs a profile was not fitted on. powertrain's trainer: its events measure ~5 ms per step on a
# 2-core CPU host (docs/model.md §9, the CPU check), mostly Python around a synchronising loss read; on a GPU
# node's faster host the same work is taken as 2 ms (an estimate, not fitted).
ENGINE_FIXED_STEP_S = {"builtin": 2e-3}

# Where each coefficient means something: outside, a formula divides by zero, a share exceeds the whole or
# a time runs backwards. These are validity limits, not priors: the fits (predict/calibrate.py, the
# published-run refit in benchmarks/predict_accuracy.py) keep to narrower literature ranges inside them.
_EFF = (1e-3, 4.0, "a fraction of the device's peak (above 1 only where a CPU probe reads its peak low)")
VALID_RANGES: dict[str, tuple[float, float, str]] = {
    "gemm_eff_fp32": _EFF, "gemm_eff_16": _EFF, "gemm_eff_fp8": _EFF, "gemm_eff_fp4": _EFF,
    "gemm_lowp_scale": (0.1, 4.0, "a multiplier on the generation's fp8/fp4 speed-up (1: the literature ratio)"),
    "grouped_gemm_eff": (0.05, 1.5, "a grouped GEMM's speed ÷ one dense GEMM of the same shape"),
    "attn_eff_ratio": (0.01, 2.0, "attention's speed ÷ a large 16-bit GEMM's"),
    "elementwise_scale": (0.05, 20.0, "a multiplier on the counted elementwise traffic"),
    "mem_eff": (0.01, 1.0, "the fraction of memory bandwidth memory-bound kernels reach"),
    "layer_overhead_s": (0.0, 1.0, "seconds per layer and micro-batch"),
    "moe_layer_overhead_s": (0.0, 0.1, "seconds per MoE layer pass"),
    "step_overhead_s": (0.0, 600.0, "seconds per step"),
    "comm_eff_intra": (0.01, 1.5, "the fraction of link bandwidth collectives reach"),
    "comm_eff_inter": (0.01, 1.5, "the fraction of link bandwidth collectives reach"),
    "comm_latency_scale": (0.01, 1e5, "achieved collective latency ÷ the link's"),
    "overlap_eff": (0.0, 1.0, "the share of a compute window communication hides behind"),
    "tp_overlap_exposed": (0.0, 1.0, "the exposed share of overlapped TP communication"),
    "moe_imbalance": (1.0, 64.0, "the busiest expert's load ÷ the mean"),
    "power_compute": (0.0, 1.2, "a share of large dense GEMMs' full-clock power above idle"),
    "power_memory": (0.0, 2.0, "a share of the part's power range (TDP − idle)"),
    "power_wait": (0.0, 1.0, "a share of the part's power range (TDP − idle)"),
    "vf_floor": (0.3, 1.0, "the supply voltage's floor ÷ its value at the maximum clock"),
    "vf_knee": (0.05, 0.99, "the clock ratio below which the voltage sits at its floor"),
    "memory_clock_floor": (0.0, 1.0, "the clock ratio below which memory-bound work slows with the clock"),
    "power_limiter_window_s": (1e-3, 10.0, "the window over which the power limiter holds the limit, seconds"),
    "power_limiter_release_s": (0.0, 60.0, "seconds the clock takes to recover once the limit stops binding"),
    "mem_overhead_bytes": (0.0, 1e13, "bytes per device"),
    "mem_fragmentation": (1.0, 4.0, "allocated ÷ requested memory"),
}
# Coefficients earlier releases wrote into profiles that no longer change any prediction: named, not ignored.
RETIRED_COEFFICIENTS = {
    "gemm_knee": "a GEMM's and an attention kernel's shape are costed from their tiles and waves on the device's "
                 "SMs (predict/kernel_shape.py), not a fitted knee",
    "moe_dispatch_passes": "routing traffic is now counted from the model's shape (predict/moe.py)",
    "power_clock_exponent": "dynamic power follows the voltage–frequency curve (vf_floor, vf_knee; predict/dvfs.py)",
    "power_window_s": "each power field's own averaging window comes from the sensor table (predict/sensors.py)",
    "host_w_per_node": "node power is now built term by term from the catalog's node description "
                       "(predict/node_power.py; describe a node's host under `node: host:` in a --hardware file)",
    "psu_efficiency": "power-supply efficiency now follows the 80 PLUS Titanium curve at the supplies' load "
                      "share (predict/node_power.py; the supplies are `node: host: psu:` in a --hardware file)",
}


def _checked_coefficients(coeffs: dict[str, Any], where: str) -> dict[str, float]:
    """The profile's coefficients as floats, each inside :data:`VALID_RANGES`, or a ValueError naming the fix."""
    retired = sorted(set(coeffs) & set(RETIRED_COEFFICIENTS))
    if retired:
        why = "; ".join(f"{k}: {RETIRED_COEFFICIENTS[k]}" for k in retired)
        raise ValueError(f"{where}: {', '.join(retired)} no longer change(s) any prediction ({why}); delete the line")
    unknown = set(coeffs) - set(COEFFICIENT_NAMES)
    if unknown:
        raise ValueError(f"{where}: unknown coefficients {sorted(unknown)}; known: {', '.join(COEFFICIENT_NAMES)}")
    out: dict[str, float] = {}
    for k, v in coeffs.items():
        lo, hi, meaning = VALID_RANGES[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{where}: coefficient {k} = {v!r} is not a number; it is {meaning}")
        if not lo <= v <= hi:
            raise ValueError(f"{where}: coefficient {k} = {v!r} is outside {lo:g}-{hi:g}: it is {meaning}; "
                             f"give a value in that range (the default is {getattr(Coefficients(), k):g})")
        out[k] = float(v)
    return out


def calibration_from_dict(raw: dict[str, Any], where: str = "profile") -> Calibration:
    coeffs = raw.get("coefficients", {}) or {}
    if not isinstance(coeffs, dict):
        raise ValueError(f"{where}: `coefficients` must be a mapping of name: value; known: {', '.join(COEFFICIENT_NAMES)}")
    checked = _checked_coefficients(coeffs, where)
    probes = [dict(r) for r in raw.get("host_probes", []) or []]
    for r in probes:
        HostProbe.from_dict(r, f"{where}: host_probes")  # refuse an incomplete record now, not mid-prediction
    engine = raw.get("engine")
    if engine is None:  # profiles written before engines were named: powertrain's own CPU runs, else published ones
        engine = "builtin" if probes or str(raw.get("device") or "").lower().startswith("cpu") else "megatron"
    if engine not in ("megatron", "builtin"):
        raise ValueError(f"{where}: engine {engine!r} is not one of megatron, builtin")
    return Calibration(
        engine=str(engine),
        name=str(raw.get("name", "custom")),
        coefficients=Coefficients(**checked),
        error=dict(raw.get("error", {}) or {}),
        fitted_on=list(raw.get("fitted_on", []) or []),
        device=raw.get("device"),
        host_probes=probes,
    )


def save_calibration(calibration: Calibration, path: str | Path | None = None) -> Path:
    """Write ``calibration`` as YAML (default: the user calibration folder, ``<name>.yaml``) with the
    project's file mode whatever the umask (:func:`powertrain.store.rundir.write_text_atomic`)."""
    from powertrain.store.rundir import write_text_atomic  # here: the store package loads pyarrow

    out = Path(path) if path else user_calibration_dir() / f"{calibration.name}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(out, yaml.safe_dump(calibration.to_dict(), sort_keys=False))


_CACHE: dict[tuple[str, float], Calibration] = {}


def load_calibration(name_or_path: str | Path | Calibration | None = None) -> Calibration:
    """A calibration by path or name (user folder first, then shipped); None → ``default``."""
    if isinstance(name_or_path, Calibration):
        return name_or_path
    key = str(name_or_path or "default")
    candidates = [Path(key)] if key.endswith((".yaml", ".yml")) or os.sep in key else []
    candidates += [user_calibration_dir() / f"{key}.yaml", SHIPPED_DIR / f"{key}.yaml"]
    for path in candidates:
        if path.is_file():
            stamp = (str(path.resolve()), path.stat().st_mtime)
            if stamp not in _CACHE:
                _CACHE[stamp] = calibration_from_dict(load_yaml_file(path, "calibration profile") or {}, str(path))
            return _CACHE[stamp]
    if key == "default":
        return Calibration()
    known = sorted({p.stem for d in (user_calibration_dir(), SHIPPED_DIR) if d.is_dir() for p in d.glob("*.yaml")})
    raise FileNotFoundError(
        f"no profile {key!r}; known: {', '.join(known) or 'none'}. "
        "Create one with `powertrain calibrate RUN... --name NAME`, or pass a YAML path"
    )
