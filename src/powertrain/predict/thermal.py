"""Temperature: a first-order thermal model per device, chassis slots, throttling, and fitting.

Each device is one thermal mass: ``τ·dT/dt = T_in(slot) + R·P − T``. Its steady state is
``T_ss = T_in + R·P_mean`` (temperature follows mean power: τ of tens of seconds is far longer
than a training step's phases) and it gets within ``δ`` of it after ``τ·ln(|T_ss − T0|/δ)``.

Slots: every slot of a node has its own steady temperature (:mod:`powertrain.predict.slot_thermal`):
its power is the device power × the slot's power ratio, fitted on real 8×H100 logs, and in an
air-cooled 8-device baseboard, where air flows front to back, the rear slots
(``rear_slots_of_8`` of the device's thermal defaults) breathe air pre-heated by the front row:
``T_in = T_inlet + rear_preheat_c_per_kw · P/1000``. Liquid-cooled parts have no pre-heat.

Throttling: when a slot's ``T_ss`` exceeds the device's slowdown temperature, that device lowers
clocks until its mean power gives exactly that temperature (``P_allowed``, solved with the slot's
ratio and pre-heat). :func:`node_heat` gives every slot of a node its temperatures from its own
device's power (its pipeline stage's); :mod:`powertrain.predict.physics` finds the clock that holds a
hot slot at ``P_allowed`` and lets that straggler set its stage's pace (the job is synchronous).

:func:`fit_thermal` recovers ``R``, ``τ`` and ``T_in`` from a measured power and temperature
timeline by least squares on the exact discretisation of the model on a uniform grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from powertrain.hardware import DeviceSpec


@dataclass(frozen=True, slots=True)
class ThermalParams:
    """Fitted (or default) thermal parameters of one device."""

    r_c_per_w: float
    tau_s: float
    inlet_c: float
    rmse_c: float | None = None


@dataclass(slots=True)
class SlotHeat:
    """Temperature of one chassis slot whose device draws a given mean power."""

    inlet_c: float  # air (or coolant) at the slot: the node's inlet, plus the front row's heat for a rear slot
    steady_c: float  # where it settles: inlet + R · power
    end_c: float  # at the end of the run, heated from its idle temperature for the run's length
    idle_c: float  # its temperature at idle, where the run starts
    time_to_steady_s: float  # until within 1 °C of steady


def node_heat(dev: DeviceSpec, devices_per_node: int, powers: list[float], run_s: float) -> list[SlotHeat]:
    """Every slot's temperature when the device in slot ``i`` draws ``powers[i]`` (its stage's power × the slot's
    fitted ratio): inlet (the node's, plus the front row's heat for a rear slot: ``rear_preheat_c_per_kw`` × the
    node's mean device power), steady ``T_in + R·P``, and after ``run_s`` of it from idle
    ``T_ss + (T_idle − T_ss)·e^(−t/τ)`` (first order)."""
    th = dev.thermal
    rear = _rear_flags(dev, max(1, devices_per_node))
    node_mean = sum(powers) / len(powers)
    pre, pre_idle = th.rear_preheat_c_per_kw * node_mean / 1000.0, th.rear_preheat_c_per_kw * dev.idle_w / 1000.0
    decay = math.exp(-max(0.0, run_s) / th.tau_s)
    r, tau, inlet = th.r_c_per_w, th.tau_s, th.inlet_c
    # a front and a rear slot's inlet and idle temperature: the same for every slot of the row
    idle_rise = r * dev.idle_w
    t_in_of = (inlet + 0.0, inlet + pre)
    idle_of = (inlet + 0.0 + idle_rise, inlet + pre_idle + idle_rise)
    log = math.log
    out = []
    for i, p in enumerate(powers):
        row = 1 if rear[i] else 0
        t_in = t_in_of[row]
        steady = t_in + r * p
        idle = idle_of[row]
        gap = abs(steady - idle)
        out.append(SlotHeat(t_in, steady, steady + (idle - steady) * decay, idle, tau * log(gap) if gap > 1.0 else 0.0))
    return out


_REAR: dict[tuple[object, ...], tuple[bool, ...]] = {}


def _rear_flags(dev: DeviceSpec, n: int) -> tuple[bool, ...]:
    """Whether each slot breathes the front row's air; cached: a sweep asks the same node often."""
    key = (dev.cooling, dev.thermal, n)
    got = _REAR.get(key)
    if got is None:
        from powertrain.predict.slot_thermal import rear_slots

        rear = rear_slots(dev, n)
        got = _REAR[key] = tuple(s in rear for s in range(n))
    return got


def simulate(params: ThermalParams, t_s: np.ndarray, power_w: np.ndarray, start_c: float | None = None) -> np.ndarray:
    """Temperature timeline of the first-order model under ``power_w`` (zero-order hold between samples)."""
    temp = np.empty(len(t_s))
    temp[0] = params.inlet_c if start_c is None else start_c
    for i in range(1, len(t_s)):
        a = math.exp(-(t_s[i] - t_s[i - 1]) / params.tau_s)
        target = params.inlet_c + params.r_c_per_w * power_w[i - 1]
        temp[i] = target + (temp[i - 1] - target) * a
    return temp


def fit_thermal(t_s: np.ndarray, power_w: np.ndarray, temp_c: np.ndarray, dt_s: float | None = None) -> ThermalParams:
    """Fit ``R``, ``τ``, ``T_in`` of one device from its timelines.

    The samples are resampled to a uniform grid (``dt_s``, default the median sample spacing);
    then ``T[k+1] = a·T[k] + b·P[k] + c`` is solved by least squares, giving ``τ = −dt/ln a``,
    ``R = b/(1−a)``, ``T_in = c/(1−a)``. Needs power that varies (a load change) and a temperature
    that has not yet settled, or the three are not separable.
    """
    t = np.asarray(t_s, dtype=float)
    p = np.asarray(power_w, dtype=float)
    y = np.asarray(temp_c, dtype=float)
    ok = np.isfinite(t) & np.isfinite(p) & np.isfinite(y)
    t, p, y = t[ok], p[ok], y[ok]
    if len(t) < 10:
        raise ValueError("fit_thermal needs at least 10 samples with power and temperature")
    order = np.argsort(t)
    t, p, y = t[order], p[order], y[order]
    dt = float(dt_s or np.median(np.diff(t)))
    if dt <= 0:
        raise ValueError("timestamps must increase")
    grid = np.arange(t[0], t[-1], dt)
    # power is held between samples; temperature is a smooth state, so interpolate it linearly
    idx = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(t) - 1)
    pg = p[idx]
    yg = np.interp(grid, t, y)
    a_mat = np.column_stack([yg[:-1], pg[:-1], np.ones(len(grid) - 1)])
    coef, *_ = np.linalg.lstsq(a_mat, yg[1:], rcond=None)
    a, b, c = (float(v) for v in coef)
    if not 0 < a < 1:
        raise ValueError(f"no first-order thermal response found (a={a:.3f}); the run needs a load change")
    tau = -dt / math.log(a)
    r = b / (1 - a)
    t_in = c / (1 - a)
    params = ThermalParams(r_c_per_w=r, tau_s=tau, inlet_c=t_in)
    rmse = float(np.sqrt(np.mean((simulate(params, grid, pg, yg[0]) - yg) ** 2)))
    return ThermalParams(r_c_per_w=r, tau_s=tau, inlet_c=t_in, rmse_c=rmse)
