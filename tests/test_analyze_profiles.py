"""Profiler-trace breakdown: compute, overlap, exposed communication and idle, known by construction."""

from __future__ import annotations

import json

import pytest

from powertrain.analyze import summarize_run, synthetic
from powertrain.analyze.profiles import breakdown, run_profiles


def _trace(events):
    return {"traceEvents": [{"ph": "X", "pid": 1, "tid": t, "name": n, "cat": c, "ts": ts, "dur": d}
                            for n, c, t, ts, d in events]}


TRACE = _trace([
    ("ProfilerStep#3", "user_annotation", 1, 0, 10_000),
    ("aten::mm", "cpu_op", 1, 0, 4_000),  # compute 0–4 ms
    ("c10d::allreduce_", "cpu_op", 1, 3_000, 3_000),  # comm 3–6 ms: 1 ms hidden under compute
    ("aten::add", "cpu_op", 2, 7_000, 1_000),  # compute 7–8 ms on another thread
])


def test_breakdown_known_intervals():
    b = breakdown(TRACE)
    assert b["span_s"] == pytest.approx(0.010)
    assert b["compute_only_s"] == pytest.approx(0.004)  # 0–3 and 7–8
    assert b["overlap_s"] == pytest.approx(0.001)  # 3–4
    assert b["comm_exposed_s"] == pytest.approx(0.002)  # 4–6
    assert b["idle_s"] == pytest.approx(0.003)  # 6–7 and 8–10
    assert b["timeline"] == "cpu operators"


def test_gpu_kernels_take_precedence():
    t = _trace([("aten::mm", "cpu_op", 1, 0, 9_000), ("sm90_gemm", "kernel", 7, 1_000, 2_000),
                ("ncclDevKernel_AllReduce_Sum_bf16", "kernel", 8, 2_000, 2_000)])
    b = breakdown(t)
    assert b["timeline"] == "gpu kernels"
    assert b["overlap_s"] == pytest.approx(0.001) and b["comm_exposed_s"] == pytest.approx(0.001)


def test_run_with_profiles(tmp_path):
    run = synthetic.write_run(tmp_path / "r", hosts=1, devices_per_host=2, steps=2)
    (run / "profiles").mkdir()
    (run / "profiles" / "rank-0-step-1.json").write_text(json.dumps(TRACE))
    (run / "profiles" / "rank-1-step-1.json").write_text("{torn")
    assert [p["rank"] for p in run_profiles(run)] == [0]
    s = summarize_run(run, probe_cpu_peak=False)
    assert s["metrics"]["comm_exposed_share"] == pytest.approx(0.2)


def test_no_profiles_is_null_with_reason(tmp_path):
    run = synthetic.write_run(tmp_path / "r", hosts=1, devices_per_host=1, steps=2)
    s = summarize_run(run, probe_cpu_peak=False)
    assert s["metrics"]["comm_exposed_share"] is None
    assert "no profiler traces" in s["why_null"]["comm_exposed_share"]
