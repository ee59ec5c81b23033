"""Power and energy per device: a phase model driven by the step-time breakdown.

Each device spends a step in three kinds of phases, each drawing
``P = P_idle + a_phase · (P_peak − P_idle)`` with ``P_peak`` the draw at full clocks on dense
GEMMs (the catalog's ``power_at_peak_w``) and ``a_phase`` a calibration coefficient:
compute-bound (GEMM, attention: ``power_compute``), memory-bound (elementwise, optimizer:
``power_memory``), and communication or waiting (exposed collectives, pipeline bubble, host
overhead: ``power_wait``). Mean power is the time-weighted mean.

A power limit below the compute-phase draw lowers clocks: dynamic power goes as ``f^α``
(``power_clock_exponent``), so clocks fall to ``r = ((L − P_idle)/(P_c − P_idle))^(1/α)`` and
compute-bound time stretches by ``1/r`` (memory-bound time barely changes).

Peak power is what a sensor averaging over ``power_window_s`` sees: compute bursts shorter than the
window are smoothed toward the mean, so ``P_peak = P_mean + (P_c − P_mean)·min(1, burst/window)``
where ``burst`` is one micro-batch's uninterrupted forward+backward on a stage. Larger micro-batches
make longer bursts and higher observed peaks (the study's finding). The swing is peak minus the
waiting-phase draw. Node power adds a fixed host term per node.
"""

from __future__ import annotations

from dataclasses import dataclass

from powertrain.hardware import DeviceSpec
from powertrain.predict.calibration import Coefficients


def phase_powers(dev: DeviceSpec, c: Coefficients) -> tuple[float, float, float]:
    """(compute, memory-bound, waiting) power at full clocks, W."""
    dyn = dev.power_at_peak_w - dev.idle_w
    return dev.idle_w + c.power_compute * dyn, dev.idle_w + c.power_memory * dyn, dev.idle_w + c.power_wait * dyn


def clock_factor(dev: DeviceSpec, c: Coefficients, limit_w: float | None) -> float:
    """Clock ratio (≤ 1) at which the compute phase stays under ``limit_w`` (default: the TDP)."""
    limit = min(dev.tdp_w, limit_w) if limit_w else dev.tdp_w
    p_c = phase_powers(dev, c)[0]
    if p_c <= limit:
        return 1.0
    return max(0.05, ((limit - dev.idle_w) / (p_c - dev.idle_w)) ** (1.0 / c.power_clock_exponent))


@dataclass(slots=True)
class DevicePower:
    mean_w: float
    peak_w: float
    low_w: float
    compute_w: float


def device_power(dev: DeviceSpec, c: Coefficients, step_s: float, compute_s: float, memory_s: float,
                 burst_s: float, clock: float = 1.0) -> DevicePower:
    """Mean/peak/low power of one device over a step with the given phase times."""
    p_c, p_m, p_w = phase_powers(dev, c)
    if clock < 1.0:  # dynamic power at reduced clocks
        p_c = dev.idle_w + (p_c - dev.idle_w) * clock**c.power_clock_exponent
    compute_s = min(compute_s, step_s)
    memory_s = min(memory_s, step_s - compute_s)
    wait_s = max(0.0, step_s - compute_s - memory_s)
    mean = (p_c * compute_s + p_m * memory_s + p_w * wait_s) / step_s
    seen = min(1.0, burst_s / c.power_window_s) if c.power_window_s > 0 else 1.0
    peak = mean + (p_c - mean) * seen
    return DevicePower(mean_w=mean, peak_w=peak, low_w=p_w if wait_s > 0 else mean, compute_w=p_c)
