"""Power in the loop: a layout across power caps (its knee), and the best layout under a node budget.

:func:`cap_sweep` predicts one configuration at each power cap and reports what the cap does:
the clock the cap allows (power-cap throttling: the predictor's ``clock_factor_power_limit``), the
slots that pass their slowdown temperature (thermal throttling), tokens/s, J/token and the node's
peak draw. :func:`knee` is the cap with the lowest J/token — below it the longer step costs more
static (idle and host) energy than the lower clocks save. Both energies are shown: the devices'
(``j_per_token``, as ``predict`` reports it) and the node's (devices plus the calibration's host
power per node, at the wall: :func:`powertrain.predict.power.node_power_w`), since a whole node is what
the site pays for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from powertrain.advise.search import Advice, Point
from powertrain.predict import Calibration, Case, load_calibration, predict
from powertrain.predict.power import node_power_w


@dataclass(frozen=True)
class CapPoint:
    cap_w: float | None  # None: the device's default limit
    tokens_per_s: float
    j_per_token: float | None  # devices only (estimate)
    node_j_per_token: float | None  # devices + host per node (estimate)
    power_peak_w: float | None
    node_peak_w: float | None
    clock_factor: float  # the lowest stage clock the cap allows ÷ full clock (power-cap throttling)
    throttle_share: float | None  # share of device time thermally slowed
    temp_peak_c: float | None
    capped_share: float | None = None  # share of device time the cap holds the clock
    clock_mhz: float | None = None  # mean SM clock

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def default_caps(case: Case, steps: int = 12, site_cap: float | None = None) -> list[float | None]:
    """The default limit and ``steps`` caps from the TDP down to 30 % above idle.

    Under a ``site_cap`` below the TDP (``advise --power-cap``) the sweep starts at the site cap instead,
    and no cap above it is tried: a knee there would recommend a limit the site does not allow."""
    dev = case.device
    lo = dev.idle_w + 0.3 * (dev.tdp_w - dev.idle_w)
    if site_cap is None or site_cap >= dev.tdp_w:
        return [None] + [round(dev.tdp_w - i * (dev.tdp_w - lo) / (steps - 1)) for i in range(steps)]
    lo = min(lo, site_cap)
    caps = [round(site_cap - i * (site_cap - lo) / (steps - 1)) for i in range(1, steps)]
    return list(dict.fromkeys([site_cap, *(c for c in caps if c < site_cap)]))


def cap_sweep(case: Case, calibration: Calibration | str | None = None,
              caps: list[float | None] | None = None) -> list[CapPoint]:
    """``case`` predicted at each cap (default: :func:`default_caps`)."""
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    if not case.device.has_power_sensor:
        raise ValueError(f"power caps: {case.device.name} has no power model (no sensor); use a GPU device")
    dpn = min(case.devices_per_node, case.world)
    out = []
    for cap in caps if caps is not None else default_caps(case):
        p = predict(replace(case, power_limit_w=cap), cal)
        m, bd = p.metrics, p.breakdown
        tokens = case.global_batch * case.seq_len
        node_e = bd.get("node_energy_per_step_j")
        peak = m["power_peak_w"]
        phys = p.physics
        sustained = phys.peaks["average"].power_w if phys is not None else None  # a node budget is over seconds
        out.append(CapPoint(cap, m["tokens_per_s"], m["j_per_token"],
                            node_e / tokens if node_e is not None else None, peak,
                            node_power_w(dpn * sustained, 1, case.device, ranks_per_node=dpn)
                            if sustained is not None else None,
                            float(bd.get("clock_factor_power_limit") or 1.0), m["throttle_share_thermal_sw"],
                            m["temp_peak_c"], m["throttle_share_power_cap"], m["clock_sm_mean_mhz"]))
    return out


def knee(points: list[CapPoint], node: bool = False) -> CapPoint:
    """The cap with the lowest J/token (devices', or the node's with ``node``)."""
    key = (lambda p: p.node_j_per_token) if node else (lambda p: p.j_per_token)
    usable = [p for p in points if key(p) is not None]
    if not usable:
        raise ValueError("power caps: no prediction has an energy (device without a power model)")
    return min(usable, key=lambda p: key(p) or 0.0)


def best_under_node_budget(advice: Advice, node_kw: float) -> Point | None:
    """The best point of ``advice`` (by its objective's score) whose predicted node peak ≤ ``node_kw``."""
    ok = [p for p in advice.points if p.node_peak_w is not None and p.node_peak_w <= node_kw * 1000]
    return min(ok, key=lambda p: (p.score, -p.tokens_per_s)) if ok else None
