"""Kineto traces: per-step compute / communication / memory time and exposed communication per rank."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pyarrow.compute as pc
import pytest

from powertrain.importers import import_sources
from powertrain.importers.common import SourceFormatError
from powertrain.importers.kineto import import_kineto
from powertrain.store import read_events

FIX = Path(__file__).parent / "fixtures" / "kineto"
REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real")) / "hta-kineto-traces"


def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def _trace(tmp_path, rank=2):
    base = 1_700_000_000_000_000.0  # epoch µs
    ev = [
        _x("user_annotation", "ProfilerStep#5", base + 1000, 1000),
        _x("user_annotation", "ProfilerStep#6", base + 2000, 1000),
    ]
    kernels = [  # (cat, name, launch µs, start µs, dur µs, stream)
        ("kernel", "sm90_xmma_gemm_bf16", 1010, 1100, 300, 7),
        ("kernel", "flash_fwd_kernel", 1020, 1300, 200, 8),  # overlaps the gemm: union 1100–1500
        ("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 1030, 1450, 250, 20),
        ("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1040, 1700, 50, 9),
        ("kernel", "elementwise_kernel", 1950, 2050, 100, 7),  # launched in step 5, runs in step 6's time
        ("kernel", "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*)", 2010, 2100, 200, 20),
    ]
    for corr, (cat, name, launch, start, dur, stream) in enumerate(kernels):
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", base + launch, 5, correlation=corr))
        ev.append(_x(cat, name, base + start, dur, correlation=corr, stream=stream))
    f = tmp_path / f"rank{rank}.json.gz"
    with gzip.open(f, "wt") as fh:
        json.dump({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4},
                   "traceEvents": ev}, fh)
    return f, base


def test_overlap_arithmetic_on_a_known_trace(tmp_path):
    f, base = _trace(tmp_path)
    out = import_sources("auto", [f], tmp_path / "run")
    ev = read_events(out)
    assert set(ev.column("rank").to_pylist()) == {2}
    steps = ev.filter(pc.equal(ev.column("kind"), "step")).to_pylist()
    s5, s6 = (json.loads(s["attrs"]) for s in steps)
    assert steps[0]["step"] == 5 and steps[0]["t_start_ns"] == int((base + 1000) * 1000)
    us = 1e-6
    assert s5["compute_s"] == pytest.approx(500 * us)  # 1100–1500 (two streams, counted once) + 2050–2150
    assert s5["comm_s"] == pytest.approx(250 * us)
    assert s5["overlapped_comm_s"] == pytest.approx(50 * us)  # 1450–1500 under the flash kernel
    assert s5["exposed_comm_s"] == pytest.approx(200 * us)
    assert s5["overlap_pct"] == pytest.approx(20.0)
    assert s5["memory_s"] == pytest.approx(50 * us)
    assert s5["gpu_window_s"] == pytest.approx(1050 * us)
    assert s5["idle_s"] == pytest.approx(300 * us)
    assert s5["comm_by_collective_s"] == pytest.approx({"allreduce": 250 * us})
    assert s6["comm_by_collective_s"] == pytest.approx({"allgather": 200 * us})
    assert s6["exposed_comm_s"] == pytest.approx(200 * us) and s6["compute_s"] == 0.0
    comm = ev.filter(pc.equal(ev.column("kind"), "comm"))
    assert comm.column("name").to_pylist() == ["allreduce", "allgather"]
    summary = json.loads((out / "run.json").read_text())["kineto"]["per_rank"]["2"]
    assert summary["steps"] == 2 and summary["overlap_pct"] == pytest.approx(100 * 50 / 450)


def test_rocm_trace_without_collectives(tmp_path):
    b = import_kineto([FIX / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
    s = b.info["kineto"]["per_rank"]["0"]
    assert s["steps"] == 2 and s["comm_kernels"] == 0
    assert s["overlap_pct"] is None  # no communication: the share is undefined, not 0
    assert s["mean_compute_s"] > 0


def test_real_nccl_trace_with_collective_metadata(tmp_path):
    src = REAL / "a100_rank0_of_2_nccl_meta"
    if not src.exists():
        pytest.skip(f"real Kineto traces not found at {src} (set POWERTRAIN_REAL_DATA)")
    b = import_kineto([src])
    steps = b.events().filter(pc.equal(b.events().column("kind"), "step"))
    assert steps.num_rows == 3
    for a in map(json.loads, steps.column("attrs").to_pylist()):
        assert a["compute_s"] > 0 and a["comm_s"] > 0
        assert a["overlapped_comm_s"] + a["exposed_comm_s"] == pytest.approx(a["comm_s"])
        assert set(a["comm_by_collective_s"]) <= {"allreduce", "broadcast"}
        assert 0 <= a["overlap_pct"] <= 100
    s = b.info["kineto"]["per_rank"]["0"]
    # HTA's whole-trace figure for this trace is 14.31 %; ours is per ProfilerStep window
    assert 5 < s["overlap_pct"] < 30


def test_two_ranks_of_a_128_way_job(tmp_path):
    src = REAL / "sampled_world128"
    if not src.exists():
        pytest.skip(f"real Kineto traces not found at {src} (set POWERTRAIN_REAL_DATA)")
    b = import_kineto([src])
    assert set(b.info["kineto"]["per_rank"]) == {"0", "1"}
    assert set(b.events().column("rank").to_pylist()) == {0, 1}


def test_malformed_traces_are_rejected_with_the_file_named(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1')
    with pytest.raises(SourceFormatError, match=r"t\.json:1: not valid JSON"):
        import_sources("kineto", [bad], tmp_path / "run")
    bad.write_text(json.dumps({"traceEvents": [_x("kernel", "k", 1, 2)]}))
    with pytest.raises(SourceFormatError, match="no ProfilerStep#N annotations"):
        import_sources("kineto", [bad], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_profiled_steps_are_measured_and_summarized(tmp_path):
    """Real traces: every ProfilerStep is in the measured window; the job's size is the traces' world size."""
    from powertrain.analyze.summary import summarize_run

    src = REAL / "sampled_world128"
    if not src.exists():
        pytest.skip(f"real Kineto traces not found at {src} (set POWERTRAIN_REAL_DATA)")
    out = import_sources("kineto", [src], tmp_path / "run")
    ev = read_events(out)
    steps = ev.filter(pc.equal(ev.column("kind"), "step"))
    assert set(steps.column("window").to_pylist()) == {"measured"}
    comm = ev.filter(pc.equal(ev.column("kind"), "comm"))
    assert comm.num_rows and set(comm.column("window").to_pylist()) == {"measured"}  # collectives of their step
    info = json.loads((out / "run.json").read_text())
    assert info["job_device_count"] == 128
    s = summarize_run(out, probe_cpu_peak=False)
    per_step = {}
    for r in steps.to_pylist():  # a step lasts as long as its slowest rank
        per_step[r["step"]] = max(per_step.get(r["step"], 0), (r["t_end_ns"] - r["t_start_ns"]) / 1e9)
    assert s["metrics"]["step_time_mean_s"] == pytest.approx(sum(per_step.values()) / len(per_step), rel=1e-9)
    assert s["metrics"]["straggler_spread_pct"] is not None  # two ranks


def test_warmup_steps_on_a_synthetic_trace(tmp_path):
    f, _ = _trace(tmp_path)
    b = import_kineto([f], warmup_steps=1)
    ev = b.events()
    steps = ev.filter(pc.equal(ev.column("kind"), "step"))
    assert dict(zip(steps.column("step").to_pylist(), steps.column("window").to_pylist(), strict=True)) == {
        5: "warmup", 6: "measured"}
    assert b.info["job_device_count"] == 4


def test_the_runs_window_is_the_measured_profiler_steps(tmp_path):
    f, _ = _trace(tmp_path)
    b = import_kineto([f], warmup_steps=1)
    steps = b.events().filter(pc.equal(b.events().column("kind"), "step"))
    six = steps.filter(pc.equal(steps.column("step"), 6))
    assert b.info["window"] == {"t0_ns": six.column("t_start_ns")[0].as_py(), "t1_ns": six.column("t_end_ns")[0].as_py(),
                                "source": "Kineto: first measured ProfilerStep start → last ProfilerStep end (all ranks)"}
