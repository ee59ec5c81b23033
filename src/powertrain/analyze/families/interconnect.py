"""Interconnect: link and PCIe bytes per measured step, and the share of the peak link bandwidth used."""

from __future__ import annotations

import numpy as np

from powertrain.analyze import work
from powertrain.analyze.families.context import Family, RunContext


def interconnect_family(ctx: RunContext) -> Family:
    fam = Family()
    m, why = fam.metrics, fam.why_null
    counted = ctx.counted
    n_steps = ctx.sd.n if ctx.sd is not None else None
    for field, metric in (("link_tx_bytes", "link_bytes_per_step"), ("pcie_tx_bytes", "pcie_bytes_per_step")):
        have_ctr = [s for s in counted if s.get(f"{field}_delta") is not None]
        if have_ctr and n_steps:
            m[metric] = float(sum(s[f"{field}_delta"] for s in have_ctr) / n_steps)
        else:
            why[metric] = (ctx.no_tel or f"no {field} counter on these devices") if not have_ctr else \
                "no measured steps to divide by"
    link_ctr = [s for s in counted if s.get("link_tx_bytes_delta") is not None]
    shares = []
    config = ctx.config
    catalog_link = work.peak_link_bw(((config or {}).get("hardware") or {}).get("device")
                                     if isinstance(config, dict) else None)
    for s in link_ctr:
        # the device's own link bandwidth property first, else the catalog's for the run's device type
        props = (ctx.kinds.get((s["host"], s["device"])) or {}).get("properties") or {}
        peak = props.get("link_bw_bytes_per_s") or catalog_link
        if peak and s.get("link_tx_bytes_delta_s"):
            shares.append(s["link_tx_bytes_delta"] / s["link_tx_bytes_delta_s"] / peak)
    if shares:
        m["link_bw_share"] = float(np.mean(shares))
    else:
        why["link_bw_share"] = ("no link byte counters on these devices" if not link_ctr
                                else "peak link bandwidth unknown (no device property link_bw_bytes_per_s, not in the catalog)")
    return fam
