"""Power and energy per device: a phase model driven by the step-time breakdown.

Each device spends a step in four kinds of phases, each drawing
``P = P_idle + a_phase · (P_peak − P_idle)`` with ``P_peak`` the draw at full clocks on dense
GEMMs (the catalog's ``power_at_peak_w``) and ``a_phase`` a calibration coefficient:
compute-bound (GEMM, attention: ``power_compute``), memory-bound (elementwise, optimizer:
``power_memory``), exposed communication (NCCL kernels stream HBM and drive the links with the SMs
clocked up: drawn like memory-bound work, ``power_memory``; an assumption, see docs/model.md §6),
and waiting (pipeline bubble, stage imbalance, host overhead: ``power_wait``). Mean power is the
time-weighted mean.

A power limit below the compute-phase draw lowers clocks: dynamic power goes as ``f^α``
(``power_clock_exponent``, held to :data:`CLOCK_EXPONENT_RANGE`, the physical range: ``P ∝ f·V²``
with ``V`` roughly ∝ ``f`` over the DVFS range gives α ≈ 2–3, and measured A100 stage profiles
give ≈ 1.9 above idle), so clocks fall to ``r = ((L − P_idle)/(P_c − P_idle))^(1/α)`` and
compute-bound time stretches by ``1/r`` (memory-bound time barely changes).

Peak power is what a sensor averaging over ``power_window_s`` sees at its highest. The highest
window sits inside the longest uninterrupted stretch of work — a device's micro-batches back to back,
less the pipeline's fill and drain (``burst_s``, :func:`powertrain.predict.steptime.busy_run_s`) —
whose draw is set by its **share of dense GEMM time**
(:func:`burst_gemm_share`: GEMM+attention time ÷ the stretch's GEMM, memory-bound, in-stretch
communication and per-layer host time): ``P_burst = P_m + (P_c − P_m)·share``. A larger micro-batch
makes every GEMM larger while the per-layer host time and collective latencies stay fixed, so the
share — and the peak — grow with it (the study's finding: larger micro-batches, higher peak
excursions). A run of work shorter than the window (a short step) is smoothed with the waiting draw
around it: ``P_peak = max(P_mean, P_w + (P_burst − P_w)·min(1, burst/window))``.
The swing is peak minus the waiting-phase draw. Node power (:func:`node_power_w`) adds a fixed host term
per node and the power supplies' conversion loss: it is wall (AC) power.

:func:`step_power` is the one call a predictor makes with a :class:`~powertrain.predict.steptime.StepTime`;
:func:`device_power` takes the phase times as numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from powertrain.hardware import DeviceSpec
from powertrain.predict.calibration import Coefficients

# Physical range of the clock exponent α of dynamic power (P_dyn ∝ f^α). Theory: P_dyn = a·C·V²·f with V
# rising about linearly with f across the DVFS range → α ≈ 3, flatter where V sits at its floor → toward 2
# (Rabaey et al., Digital Integrated Circuits, §5.5; Mei et al., "A survey and measurement study of GPU DVFS
# on energy conservation", Digital Communications and Networks 3(2), 2017). Measured: the Perseus (SOSP'24)
# A100 stage profiles in ../shared/data/real give α ≈ 1.8–2.0 above a 60 W idle floor
# (benchmarks/predict_power_check.py prints the fit). A calibration outside the range is held to its edge.
CLOCK_EXPONENT_RANGE = (1.8, 3.0)

# Step-time breakdown keys (see steptime._breakdown) that are communication; those of data parallelism
# happen once per step after the backward, the others inside every micro-batch's stretch of work.
_STEP_LEVEL_COMM = ("dp_", "fsdp_")


def clock_exponent(c: Coefficients) -> float:
    """The calibration's ``power_clock_exponent`` held to :data:`CLOCK_EXPONENT_RANGE`."""
    lo, hi = CLOCK_EXPONENT_RANGE
    return min(hi, max(lo, c.power_clock_exponent))


def phase_powers(dev: DeviceSpec, c: Coefficients) -> tuple[float, float, float]:
    """(compute, memory-bound, waiting) power at full clocks, W."""
    dyn = dev.power_at_peak_w - dev.idle_w
    return dev.idle_w + c.power_compute * dyn, dev.idle_w + c.power_memory * dyn, dev.idle_w + c.power_wait * dyn


def node_dc_w(devices_w: float, nodes: float, c: Coefficients) -> float:
    """The DC load of ``nodes`` nodes whose devices draw ``devices_w`` together: the devices plus the host
    term of each node (what an MLPerf DC power log reads)."""
    return devices_w + c.host_w_per_node * nodes


def node_power_w(devices_w: float, nodes: float, c: Coefficients) -> float:
    """Wall (AC) power of those nodes: their DC load through the power supplies' conversion loss
    (``psu_efficiency``). What a facility meter or an MLPerf AC power log reads; the one formula for node
    power that predict and advise use."""
    return node_dc_w(devices_w, nodes, c) / c.psu_efficiency


def clock_factor(dev: DeviceSpec, c: Coefficients, limit_w: float | None) -> float:
    """Clock ratio (≤ 1) at which the compute phase stays under ``limit_w`` (default: the TDP)."""
    limit = min(dev.tdp_w, limit_w) if limit_w else dev.tdp_w
    p_c = phase_powers(dev, c)[0]
    if p_c <= limit:
        return 1.0
    return max(0.05, ((limit - dev.idle_w) / (p_c - dev.idle_w)) ** (1.0 / clock_exponent(c)))


@dataclass(slots=True)
class DevicePower:
    mean_w: float
    peak_w: float
    low_w: float
    compute_w: float
    burst_w: float | None = None  # draw of one uninterrupted stretch of work (before sensor smoothing)
    gemm_share: float | None = None  # share of dense GEMM/attention time in that stretch


def _is_comm(key: str) -> bool:
    return key.endswith("_s") and ("comm" in key or "p2p" in key or "all_to_all" in key or "a2a" in key)


def step_comm_s(breakdown: dict[str, float]) -> tuple[float, float]:
    """(communication inside a micro-batch's stretch, communication once per step) of a step breakdown, s."""
    inside = once = 0.0
    for k, v in breakdown.items():
        if _is_comm(k):
            if k.startswith(_STEP_LEVEL_COMM):
                once += v
            else:
                inside += v
    return inside, once


def burst_gemm_share(breakdown: dict[str, float], compute_s: float, memory_s: float) -> float:
    """Share of dense GEMM/attention time in one micro-batch's uninterrupted stretch of work.

    The stretch holds the layers' GEMMs and attention (``compute_s``), their memory-bound kernels
    (``memory_bound_s``), the communication inside it (TP, EP, CP, pipeline sends) and the per-layer host
    time (``overhead_s``). Ratios of per-step sums equal the per-micro-batch ratio.
    """
    comp = breakdown.get("compute_s", compute_s)
    mem = breakdown.get("memory_bound_s", memory_s)
    inside, _ = step_comm_s(breakdown)
    total = comp + mem + inside + breakdown.get("overhead_s", 0.0)
    return comp / total if total > 0 else 0.0


def device_power(dev: DeviceSpec, c: Coefficients, step_s: float, compute_s: float, memory_s: float,
                 burst_s: float, clock: float = 1.0, *, comm_s: float = 0.0,
                 gemm_share: float | None = None) -> DevicePower:
    """Mean/peak/low power of one device over a step with the given phase times.

    ``comm_s`` is the exposed communication time (drawn like memory-bound work; 0: all time outside
    compute and memory-bound work is waiting). ``gemm_share`` is the GEMM share of one stretch of work
    (:func:`burst_gemm_share`; default: compute ÷ (compute + memory-bound + communication) over the step).
    """
    p_c, p_m, p_w = phase_powers(dev, c)
    if clock < 1.0:  # dynamic power at reduced clocks
        p_c = dev.idle_w + (p_c - dev.idle_w) * clock ** clock_exponent(c)
        # the clock was lowered until the compute phase draws the limit: the power controller holds
        # every other phase at or under that limit too
        p_m, p_w = min(p_m, p_c), min(p_w, p_c)
    compute_s = min(compute_s, step_s)
    memory_s = min(memory_s, step_s - compute_s)
    comm_s = min(max(0.0, comm_s), step_s - compute_s - memory_s)
    wait_s = max(0.0, step_s - compute_s - memory_s - comm_s)
    mean = (p_c * compute_s + p_m * (memory_s + comm_s) + p_w * wait_s) / step_s
    if gemm_share is None:
        busy = compute_s + memory_s + comm_s
        gemm_share = compute_s / busy if busy > 0 else 0.0
    p_burst = p_m + (p_c - p_m) * gemm_share
    seen = min(1.0, burst_s / c.power_window_s) if c.power_window_s > 0 else 1.0
    peak = max(mean, p_w + (p_burst - p_w) * seen)
    return DevicePower(mean_w=mean, peak_w=peak, low_w=p_w if wait_s > 0 else mean, compute_w=p_c,
                       burst_w=p_burst, gemm_share=gemm_share)


def step_power(dev: DeviceSpec, c: Coefficients, st: Any, clock: float = 1.0,
               step_s: float | None = None) -> DevicePower:
    """:func:`device_power` of a :class:`~powertrain.predict.steptime.StepTime`: its exposed communication
    and the GEMM share of its micro-batch stretch are read from ``st.breakdown``. ``step_s`` (default the
    step's own) is the step the device's work is spread over: a device that waits for a slower one (a
    thermal straggler) does its own work in the straggler's step."""
    bd: dict[str, float] = st.breakdown or {}
    inside, once = step_comm_s(bd)
    return device_power(dev, c, st.total_s if step_s is None else step_s, st.compute_s, st.memory_s, st.burst_s,
                        clock, comm_s=inside + once, gemm_share=burst_gemm_share(bd, st.compute_s, st.memory_s))
