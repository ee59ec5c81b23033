"""Balance: whether the slow ranks are the throttled ones (the straggler spread itself is a step metric)."""

from __future__ import annotations

from typing import Any

import numpy as np

from powertrain.analyze import signal
from powertrain.analyze.families.context import DeviceKey, Family, RunContext


def balance_family(ctx: RunContext) -> Family:
    """``straggler_throttle_corr``: Pearson correlation, over ranks, of a rank's mean step time and the
    throttled share of its device's samples."""
    fam = Family()
    sd = ctx.sd
    rank_dev = ctx.rank_dev
    by_dev: dict[DeviceKey, dict[str, Any]] = {(s["host"], s["device"]): s for s in ctx.dev_stats}
    if sd is not None and len(sd.ranks) >= 3 and ctx.have("throttle"):
        xs, ys = [], []
        for i, r in enumerate(sd.ranks):
            s = by_dev.get(rank_dev.get(r, (None, None)))
            if s is not None and s.get("throttle_n"):
                xs.append(float(np.nanmean(sd.rank_step_s[i])))
                ys.append(s["throttle_any"])
        fam.metrics["straggler_throttle_corr"] = signal.pearson(np.array(xs), np.array(ys))
        if fam.metrics["straggler_throttle_corr"] is None:
            fam.why_null["straggler_throttle_corr"] = "no variation in step time or throttle share across ranks"
    else:
        fam.why_null["straggler_throttle_corr"] = (
            "needs step events from at least three ranks mapped to devices with a throttle field")
    return fam
