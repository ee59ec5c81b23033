"""How many candidates `advise` searches per second (issue 17 target: ≥ 10⁵ candidates in ≤ 10 s).

Two requests on the study's 32×H200 cluster (4 nodes × 8), global batch 128:

* GPT-3 175B, objective throughput (no power caps in the space: ~10⁵ candidates);
* GPT-3 175B, objective energy (six power caps per layout: ~6·10⁵ candidates).

A *candidate* is one point of the space (layout × micro-batch × memory knobs × overlap flags ×
power point); rules and memory prune before any prediction, so the figures printed are: candidates
per second (the search's rate), predictions per second, and the wall and process CPU seconds of the
whole search (on a shared machine the CPU time is the honest figure: wall time also counts time
other processes held the cores).

    python benchmarks/advise_speed.py
"""

from __future__ import annotations

import time

from powertrain.advise import Objective, advise, make_request
from powertrain.predict import load_calibration


def main() -> int:
    cal = load_calibration()
    for objective in ("throughput", "energy"):
        req = make_request("gpt3-175b", "h200", 32, 4, 128, objective=Objective(objective))
        w0, c0 = time.perf_counter(), time.process_time()
        adv = advise(req, cal, top_n=5)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        st = adv.stats
        # the target as a rate: 10⁵ candidates in ≤ 10 s is ≥ 10⁴ candidates per second, on a space of ≥ 10⁵
        verdict = "met" if st.enumerated >= 1e5 and st.enumerated / cpu >= 1e4 else "NOT met"
        print(f"gpt3-175b on 32×H200, objective {objective}: {st.enumerated:,} candidates "
              f"({st.rejected_rules:,} rules, {st.rejected_memory:,} memory, {st.same_as_uncapped:,} caps not binding, "
              f"{st.kept:,} predicted) in {wall:.1f} s wall / {cpu:.1f} s CPU → {st.enumerated / cpu:,.0f} "
              f"candidates/s, {st.kept / cpu:,.0f} predictions/s (CPU time); 10⁵ candidates in "
              f"{1e5 / (st.enumerated / cpu):.1f} s CPU: {verdict}")
        print(f"  #1 {adv.top[0].point.cand.label()}: {adv.top[0].point.tokens_per_s:,.0f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
