"""The power-cap view of a sweep: throughput and energy per token against the power limit (and the SM clock lock).

From the sweep table's rows (:func:`powertrain.analyze.sweep.load_sweep`), one line per
configuration — the run's model, layout label and variant, everything but the control — through
its runs at each power limit (``power_limit_w``, the run's knob) or each SM clock lock (the grid axis
``knobs.sm_clock_mhz``). Runs without the control (the default limit) are not on these lines: their
limit was not set, so it is not known here. A run without a throughput or an energy measurement
leaves a gap, never a zero.

:func:`add_powercap_section` adds the section to a sweep report where the sweep sets a control.
"""

from __future__ import annotations

from typing import Any, Protocol

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

CONTROLS = (("power_limit_w", "power limit (W)"), ("axis.knobs.sm_clock_mhz", "SM clock lock (MHz)"))


class _Report(Protocol):
    def h(self, text: str, level: int = 2) -> None: ...
    def p(self, text: str, cls: str = "") -> None: ...
    def figure(self, name: str, make: Any, caption: str) -> None: ...


def _setting(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    if isinstance(v, list | tuple) and v:  # an SM clock lock [min, max]: its top is what the load runs at
        v = v[-1]
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def series(rows: list[dict[str, Any]], key: str) -> dict[str, list[tuple[float, float | None, float | None]]]:
    """configuration → [(setting, tokens/s, J/token)] sorted by the setting, for runs that set ``key``."""
    out: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for r in rows:
        x = _setting(r, key)
        if x is None or r.get("status") not in ("ok", None) or r.get("kind") == "prediction":
            continue
        name = " ".join(str(p) for p in (r.get("model"), r.get("label"), r.get("variant")) if p)
        out.setdefault(name, []).append((x, r.get("tokens_per_s"), r.get("j_per_token")))
    return {k: sorted(v) for k, v in sorted(out.items())}


def figure(rows: list[dict[str, Any]], key: str, label: str) -> Figure:
    """Two panels against the setting: tokens/s and J/token, one line per configuration."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    for name, pts in series(rows, key).items():
        xs = [p[0] for p in pts]
        a1.plot(xs, [p[1] if p[1] is not None else float("nan") for p in pts], "o-", lw=1, ms=4, label=name)
        a2.plot(xs, [p[2] if p[2] is not None else float("nan") for p in pts], "o-", lw=1, ms=4, label=name)
    a1.set_xlabel(label)
    a1.set_ylabel("throughput (tokens/s, whole job)")
    a2.set_xlabel(label)
    a2.set_ylabel("energy per token (J/token)")
    a1.set_title(f"Throughput against the {label.split(' (')[0]}")
    a2.set_title(f"Energy per token against the {label.split(' (')[0]}")
    a2.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    return fig


def add_powercap_section(rep: _Report, rows: list[dict[str, Any]]) -> None:
    """The section "Power limit and clock lock" when any run of the sweep set one; nothing otherwise."""
    present = [(k, lab) for k, lab in CONTROLS if series(rows, k)]
    if not present:
        return
    rep.h("Power limit and clock lock")
    for key, label in present:
        rep.figure(f"powercap_{key.split('.')[-1]}", lambda k=key, lb=label: figure(rows, k, lb),
                   f"Throughput and energy per token of each configuration against its {label}, as set on every "
                   "device before warm-up (run.json `controls` has each device's requested and in-effect value).")
