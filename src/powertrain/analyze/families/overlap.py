"""Overlap: the share of a profiled step spent in communication not hidden behind compute, from the
run's profiler traces (:mod:`powertrain.analyze.profiles`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from powertrain.analyze import profiles
from powertrain.analyze.families.context import Family, RunContext


@dataclass
class OverlapFamily(Family):
    """``comm_exposed_share``, and the breakdown of every profiled step."""

    profiles: list[dict[str, Any]] = field(default_factory=list)


def overlap_family(ctx: RunContext) -> OverlapFamily:
    fam = OverlapFamily(profiles=profiles.run_profiles(ctx.run.path))
    shares = [p["comm_exposed_s"] / p["span_s"] for p in fam.profiles if p["span_s"] > 0]
    if shares:
        fam.metrics["comm_exposed_share"] = float(np.mean(shares))
    else:
        fam.why_null["comm_exposed_share"] = "no profiler traces (profiles/rank-<r>-step-<i>.json) in this run"
    return fam
