"""What a GPU draws doing a kind of work at a clock: the voltage–frequency curve and per-phase demand.

Dynamic power is ``a · C · V² · f`` (Rabaey, Chandrakasan, Nikolić, *Digital Integrated Circuits*,
§5.5): ``a`` the switching activity of the work, ``f`` the SM clock and ``V`` the supply voltage the
clock needs. Over the DVFS range the voltage rises about linearly with the clock above a knee and sits
at a floor below it, so, with ``r = f / f_max`` and ``v = V / V_max``::

    v(r) = v_floor + (1 − v_floor) · max(0, (r − r_knee) / (1 − r_knee))
    g(r) = r · v(r)²            (dynamic power at clock r ÷ at the maximum clock; g(1) = 1)

``g`` falls steeply near the top (local exponent ``1 + 2·(1 − v_floor)/(1 − r_knee)`` ≈ 2.5) and
linearly below the knee. :data:`VF_FLOOR` and :data:`VF_KNEE` are fitted on the Perseus (SOSP'24)
A100 stage profiles in ``../shared/data/real/perseus-sosp24-pipeline-energy`` — measured time and
energy of every pipeline stage's forward and backward of GPT-3 175B and BLOOM at every SM clock from
855 to 1410 MHz, 8 stages × 2 passes × 2 models, ``P = P_static + D·g(r)`` per series with the two
shape parameters shared: floor 0.83 (0.84 and 0.82 per model), knee 0.78, 4.4–5.0 W RMS
(``benchmarks/predict_power_check.py`` prints the fit). A calibration may replace them (``vf_floor``,
``vf_knee``); the defaults are what every device uses unless its own data say otherwise.

A phase's draw at clock ratio ``r`` (``P_idle`` the catalog's idle power, ``D = P_peak − P_idle``
with ``P_peak`` the catalog's ``power_at_peak_w``: large dense 16-bit GEMMs at the maximum clock):

* GEMMs and fused attention: ``P_idle + D · power_compute · g(r)`` — tensor-core work, all of its
  dynamic power follows the clock;
* memory-bound kernels and exposed communication (NCCL kernels stream HBM and drive the links):
  ``P_idle + (TDP − P_idle) · power_memory · (h + (1 − h) · g(r))`` — a share ``h``
  (:data:`MEMORY_CLOCK_FREE_SHARE`) is HBM and I/O power, which does not follow the SM clock;
* waiting (pipeline bubble, host gaps, a rank waiting for a slower one):
  ``P_idle + (TDP − P_idle) · power_wait · g(r)`` — the clock tree of a GPU whose clocks stay up between
  kernels.

Memory-bound work and waiting scale with the part's power range, not with ``D``: how far large GEMMs would
overshoot the limit at the maximum clock says nothing about an HBM stream or an idle clock tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from powertrain.hardware import DeviceSpec
from powertrain.predict.calibration import Coefficients

# The V–f curve's shape, fitted on the Perseus A100 stage profiles (module docstring).
VF_FLOOR = 0.83
VF_KNEE = 0.78
# Share of a memory-bound kernel's dynamic power that does not follow the SM clock (HBM, memory controller,
# I/O). An assumption, not fitted: no data at hand separate it (HBM3 draws about 1/5 of an H100's 700 W at
# full bandwidth, about half of what a memory-bound kernel adds above idle).
MEMORY_CLOCK_FREE_SHARE = 0.5
# The lowest clock ratio the model lets a governor reach (the DVFS table's bottom on NVIDIA data-centre GPUs is
# ~15-25 % of the maximum: 210-345 MHz of 1410-1980).
MIN_CLOCK_RATIO = 0.15

PHASES = ("compute", "memory", "wait")
# The one direct measurement of a GPU's full-clock GEMM draw: the H200 burn (docs/gpu-validation.md, 2026-11-30) —
# back-to-back bf16 8192² GEMMs at 674 TFLOP/s drew 699.3 W (median, under its 700 W limit) at a median SM clock of
# 1500 of 1980 MHz; idle 77.1 W. Through the V–f curve it would draw ~1270 W at 1980 MHz.
H200_BURN = {"power_w": 699.3, "clock_mhz": 1500.0, "max_clock_mhz": 1980.0, "idle_w": 77.1, "tdp_w": 700.0}
# (P_peak − P_idle)/(TDP − P_idle) per GPU generation where a measurement of that generation's own says so;
# the others take the H200 burn's (burn_headroom)
GENERATION_HEADROOM: dict[str, float] = {}


def voltage(r: float, c: Coefficients) -> float:
    """Supply voltage at clock ratio ``r`` ÷ the voltage at the maximum clock."""
    knee = c.vf_knee
    return c.vf_floor + (1.0 - c.vf_floor) * max(0.0, (r - knee) / (1.0 - knee))


def dynamic_scale(r: float, c: Coefficients) -> float:
    """``g(r)``: dynamic power at clock ratio ``r`` ÷ dynamic power at the maximum clock (same activity)."""
    v = voltage(r, c)
    return r * v * v


def clock_for_scale(g: float, c: Coefficients) -> float:
    """The clock ratio whose :func:`dynamic_scale` is ``g`` (inverse of ``g``; 1 for g ≥ 1)."""
    if g >= 1.0:
        return 1.0
    fl = c.vf_floor
    knee = c.vf_knee
    if g <= knee * fl * fl:  # below the knee the voltage sits at its floor: g = r·v_floor²
        return max(MIN_CLOCK_RATIO, g / (fl * fl))
    # above it v = a + b·r, so g = r·(a + b·r)²: Newton from the top of the curve (monotone, convex: converges)
    b = (1.0 - fl) / (1.0 - knee)
    a = fl - b * knee
    r = 1.0
    for _ in range(20):
        v = a + b * r
        f = r * v * v - g
        if abs(f) < 1e-12:
            break
        r -= f / (v * v + 2.0 * b * r * v)
    return max(knee, min(1.0, r))


@dataclass(frozen=True, slots=True)
class Draws:
    """One device's draw per kind of phase at one clock ratio, W."""

    compute: float
    memory: float
    wait: float
    clock: float

    def of(self, phase: str) -> float:
        return self.compute if phase == "compute" else self.memory if phase == "memory" else self.wait


def burn_headroom(c: Coefficients) -> float:
    """``(P_peak − P_idle) / (TDP − P_idle)`` of the measured H200 burn: the dynamic power large GEMMs would draw at
    the maximum clock over what the power limit leaves them (:data:`H200_BURN` through the V–f curve)."""
    b = H200_BURN
    full = (b["power_w"] - b["idle_w"]) / dynamic_scale(b["clock_mhz"] / b["max_clock_mhz"], c)
    return full / (b["tdp_w"] - b["idle_w"])


def peak_draw_w(dev: DeviceSpec, c: Coefficients) -> float:
    """``P_peak``: what ``dev`` draws running large dense 16-bit GEMMs at its maximum clock with no power limit — the
    catalog's ``power_at_peak_w`` where measured, else its dynamic range ``TDP − P_idle`` × its generation's ratio
    (:data:`GENERATION_HEADROOM`; the H200 burn's for generations with no measurement of their own, stated as
    such in docs/model.md)."""
    if dev.power_at_peak_w is not None:
        return dev.power_at_peak_w
    from powertrain.predict.precision import generation

    ratio = GENERATION_HEADROOM.get(generation(dev.name))
    return dev.idle_w + (dev.tdp_w - dev.idle_w) * (burn_headroom(c) if ratio is None else ratio)


def dynamic_w(dev: DeviceSpec, c: Coefficients) -> float:
    """``D``: the dynamic power of large dense GEMMs at the maximum clock, W (``P_peak − idle_w``)."""
    return max(0.0, peak_draw_w(dev, c) - dev.idle_w)


def draws(dev: DeviceSpec, c: Coefficients, r: float = 1.0) -> Draws:
    """The device's draw in each kind of phase at clock ratio ``r`` (module docstring)."""
    d = dynamic_w(dev, c)
    rng = dev.tdp_w - dev.idle_w
    g = dynamic_scale(r, c)
    h = MEMORY_CLOCK_FREE_SHARE
    return Draws(compute=dev.idle_w + d * c.power_compute * g,
                 memory=dev.idle_w + rng * c.power_memory * (h + (1.0 - h) * g),
                 wait=dev.idle_w + rng * c.power_wait * g, clock=r)
