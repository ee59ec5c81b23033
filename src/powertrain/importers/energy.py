"""Importers' energy figures: power readings → joules, through :mod:`powertrain.core.energy` only.

There is one energy integral in powertrain (:mod:`powertrain.core.energy`): trapezoid over an
explicit window, interpolated window edges, the nearest reading held at an edge the readings stop
short of for up to ``hold_limit_s`` (default 5 s, reported), and null with a reason beyond that.
This module only adapts it to the shapes the importers use (per-step arrays, a window and the
seconds the readings cover); it integrates nothing itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from powertrain.core.energy import DEFAULT_HOLD_LIMIT_S, WindowEnergy, window_energy, windows_energy

__all__ = ["DEFAULT_HOLD_LIMIT_S", "WindowEnergy", "energy_between_j", "total_energy_j", "window_energy"]


def energy_between_j(
    t_ns: Any, power_w: Any, a_ns: Any, b_ns: Any, *, span: tuple[int, int] | None = None,
    hold_limit_s: float = DEFAULT_HOLD_LIMIT_S,
) -> tuple[np.ndarray, str | None]:
    """Energy (J) in each window ``[a_i, b_i]`` (e.g. every step) and, when the enclosing ``span``
    (default: the windows' extent) is refused by the edge rule, NaN for all and the reason."""
    return windows_energy(t_ns, power_w, a_ns, b_ns, span=span, hold_limit_s=hold_limit_s)


def total_energy_j(t_ns: Any, power_w: Any, a_ns: int, b_ns: int, *,
                   hold_limit_s: float = DEFAULT_HOLD_LIMIT_S) -> tuple[float | None, float]:
    """Energy (J) of one series over ``[a, b]`` (``None`` when an edge gap exceeds the hold limit)
    and the seconds of the window the readings cover (the rest is held)."""
    w = window_energy(t_ns, power_w, a_ns, b_ns, hold_limit_s=hold_limit_s)
    return w.energy_j, max(w.window_s - w.edge_held_s, 0.0)
