"""Measured anchors: a profile's own runs correct the ranking of the layouts they measured.

A calibration profile keeps each fitted run's signed step-time error (``error.per_run``: run
directory → predicted/measured − 1). Where the predictor's structure is wrong for a layout family
on a machine — on a CPU with gloo, FSDP's per-layer all-gathers are predicted about twice too fast
even after fitting — no global coefficient fixes it, and ranking by the raw prediction puts that
family on top. So when those run directories are readable and ran the same job size on the same
kind of device, each candidate of a measured **family** (TP, PP, CP, EP degrees, FSDP, pipeline schedule
and virtual stages) has its
predicted tokens/s multiplied by that family's measured/predicted ratio (geometric mean over its
runs), and its step time and J/token divided by it. Every corrected row says so (``anchor``); a
family with no measured run keeps the raw prediction. ``--no-anchors`` turns it off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from powertrain.predict import Calibration, Case, read_measured_run


@dataclass(frozen=True)
class Anchor:
    family: Family
    factor: float  # measured tokens/s ÷ predicted tokens/s of the family's runs (geometric mean)
    runs: tuple[str, ...]

    def text(self) -> str:
        tp, pp, cp, ep, fsdp, sched, vp, etp = self.family
        fam = "·".join(f"{k}{v}" for k, v in (("TP", tp), ("PP", pp), ("CP", cp), ("EP", ep), ("V", vp)) if v > 1)
        fam += f"·ETP{etp}" if etp is not None else ""
        sched_txt = f" {sched}" if pp > 1 else ""
        return f"{fam or 'DP'}{'·FSDP' if fsdp else ''}{sched_txt} ×{self.factor:.2f} ({len(self.runs)} measured run(s))"


Family = tuple[int, int, int, int, bool, str, int, int | None]


def family(case: Case) -> Family:
    """What a measured run stands for: the degrees, FSDP, (with a pipeline) its schedule, and expert folding."""
    return (case.tp, case.pp, case.cp, case.ep, case.fsdp, case.pp_schedule if case.pp > 1 else "", case.vp, case.etp)


def profile_anchors(cal: Calibration, world: int, transport: str) -> dict[Family, Anchor]:
    """The families the profile's readable runs measured, for a job of ``world`` ranks on ``transport``."""
    per = (cal.error or {}).get("per_run") or {}
    logs: dict[Family, list[tuple[float, str]]] = {}
    for label, err in per.items():
        if not isinstance(err, (int, float)) or err <= -1:
            continue
        try:
            m = read_measured_run(label)
        except (OSError, ValueError):
            continue  # not on this machine (a shipped profile), or not a run any more
        if m.case.world != world or m.case.device.transport != transport:
            continue
        # step-time error e = predicted/measured − 1 → measured tokens/s = predicted × (1 + e)
        logs.setdefault(family(m.case), []).append((math.log1p(float(err)), str(label)))
    return {k: Anchor(k, math.exp(sum(x for x, _ in v) / len(v)), tuple(r for _, r in v)) for k, v in logs.items()}
