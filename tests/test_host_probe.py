"""The CPU host probe: pinned to the ranks' threads, recorded once, reused by predict and analyze.

A probe is a measurement of a moment (on a shared host it reads differently on every call), so what
must hold is where each number comes from: a run's MFU comes from the probe recorded in its
run.json (the same on every re-analysis), a prediction from its profile's probe, and only what has
no record probes afresh, labelled so.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from powertrain.analyze.summary import summarize_run
from powertrain.hardware import (
    HostProbe,
    cpu_device,
    measure_host_probe,
    probe_host,
    rank_threads,
    record_host_probe,
)
from powertrain.predict import predict
from powertrain.predict.calibration import Calibration, load_calibration, save_calibration
from powertrain.schema import EVENTS_SCHEMA
from powertrain.spec.run import RunConfig
from powertrain.store import RunDir

RECORD = {"matmul_flops": 4.0e10, "copy_bytes_per_s": 1.0e10, "threads": 1, "cores": 2, "method": "fixture"}


def test_rank_threads_follow_torchrun() -> None:
    assert rank_threads(2, {}) == 1  # torchrun sets OMP_NUM_THREADS=1 for several ranks per node
    assert rank_threads(2, {"OMP_NUM_THREADS": "3"}) == 3
    assert rank_threads(1, {"OMP_NUM_THREADS": "4"}) == 4
    torch = pytest.importorskip("torch")
    assert rank_threads(1, {}) == torch.get_num_threads()  # a lone rank: torch's default


def test_probe_is_pinned_to_the_threads_and_restores_them() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    p = measure_host_probe(1, repeats=2)
    assert torch.get_num_threads() == before
    assert p.threads == 1 and "1 thread(s)" in p.method and "best of 2" in p.method
    assert p.matmul_flops > 1e8 and p.copy_bytes_per_s > 1e8
    assert HostProbe.from_dict(p.to_dict(), "x") == HostProbe(**{**p.to_dict(), "source": "x"})


def test_launcher_record_and_incomplete_records() -> None:
    rec = record_host_probe(2, {})
    assert rec["threads"] == 1 and rec["matmul_flops"] > 0 and rec["by"].startswith("launcher")
    with pytest.raises(ValueError, match="copy_bytes_per_s"):
        HostProbe.from_dict({"matmul_flops": 1.0, "threads": 1, "cores": 1}, "run.json host_probe")


def _cpu_run(root, record: dict | None) -> RunDir:
    cfg = RunConfig(name="cpu", model="llama3-tiny", knobs={"global_batch": 8, "micro_batch": 1, "precision": "fp32"},
                    hardware={"nodes": 1, "devices_per_node": 2, "device": "cpu"})
    rd = RunDir(root / ("rec" if record else "old")).create()
    info = {"kind": "run", "status": "ok", "name": "cpu", "config": cfg.model_dump(mode="json")}
    if record:
        info["host_probe"] = record
    rd.write(info)
    t = 1_000_000_000
    for rank in range(2):
        rows = [{"rank": rank, "kind": "step", "name": "step", "step": s, "t_start_ns": t + s * 10**9,
                 "t_end_ns": t + s * 10**9 + 400_000_000, "window": "warmup" if s < 1 else "measured",
                 "tokens": 4 * cfg.model.seq_len, "samples": 4} for s in range(4)]
        pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), rd.events_file(rank))
    return rd


def test_summary_mfu_uses_the_runs_recorded_probe(tmp_path) -> None:
    rd = _cpu_run(tmp_path, RECORD)
    first = summarize_run(rd.path)
    probe_host.cache_clear()  # a later `summarize --refresh` is another process
    second = summarize_run(rd.path, probe_cpu_peak=False)  # a recorded probe needs no probing
    assert first["metrics"]["mfu"] == second["metrics"]["mfu"]
    assert "recorded in run.json" in first["sources"]["peak_flops"]
    # 2 ranks × 1 thread fit in the record's 2 cores: each rank's peak is the probe's matmul rate
    tflops = first["metrics"]["tflops_per_device"] * 1e12
    assert first["metrics"]["mfu"] == pytest.approx(tflops / RECORD["matmul_flops"])


def test_summary_of_an_old_run_probes_afresh_and_says_so(tmp_path) -> None:
    s = summarize_run(_cpu_run(tmp_path, None).path)
    assert s["metrics"]["mfu"] is not None
    assert "probe of this host" in s["sources"]["peak_flops"] and "recorded none" in s["sources"]["peak_flops"]
    bad = _cpu_run(tmp_path / "bad", {"matmul_flops": 1.0})
    s = summarize_run(bad.path)
    assert s["metrics"]["mfu"] is None and "copy_bytes_per_s" in s["why_null"]["mfu"]


def test_prediction_uses_the_profiles_probe_and_a_roundtrip_keeps_it(tmp_path) -> None:
    cfg = RunConfig(name="p", model="llama3-tiny", hardware={"nodes": 1, "devices_per_node": 2, "device": "cpu"},
                    knobs={"global_batch": 8, "micro_batch": 1, "precision": "fp32"})
    prof = Calibration(name="cpu-rec", host_probes=[{**RECORD, "how": "fixture"}])
    path = save_calibration(prof, tmp_path / "cpu-rec.yaml")
    loaded = load_calibration(str(path))
    assert loaded.host_probes == prof.host_probes
    bd = predict(cfg, loaded).breakdown
    assert bd["host_probe"]["matmul_flops"] == RECORD["matmul_flops"]
    assert bd["host_probe"]["source"].startswith("calibration profile 'cpu-rec'")
    # no probe for these threads in the profile: this host's kept probe, and the breakdown says so
    assert predict(cfg, Calibration()).breakdown["host_probe"]["source"].startswith("probe of this host measured")
    assert cpu_device(HostProbe.from_dict(RECORD, "x"), 2).peak("fp32") == RECORD["matmul_flops"]


def test_a_profile_with_an_incomplete_probe_is_refused(tmp_path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(json.dumps({"name": "bad", "host_probes": [{"threads": 1}]}))
    with pytest.raises(ValueError, match="matmul_flops"):
        load_calibration(str(f))


def test_the_host_probe_is_kept_so_later_processes_reuse_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POWERTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    probe_host.cache_clear()
    first = probe_host(1)
    probe_host.cache_clear()  # another process
    second = probe_host(1)
    assert first == second and second.source.startswith("probe of this host measured")
    kept = list((tmp_path / "cache").glob("host-probe-*-1t.json"))
    assert len(kept) == 1 and str(kept[0]) in second.source
    # a probe taken under another identity (e.g. another torch) is not reused: probed again, kept anew
    raw = json.loads(kept[0].read_text())
    raw["identity"]["torch"] = "0.0"
    raw["matmul_flops"] = 1.0
    kept[0].write_text(json.dumps(raw))
    probe_host.cache_clear()
    assert probe_host(1).matmul_flops != 1.0
    # one kept by an earlier measuring method (no "method" in its identity, as before it was recorded) neither
    raw = json.loads(kept[0].read_text())
    del raw["identity"]["method"]
    raw["matmul_flops"] = 1.0
    kept[0].write_text(json.dumps(raw))
    probe_host.cache_clear()
    assert probe_host(1).matmul_flops != 1.0
    kept[0].write_text("{not json")
    probe_host.cache_clear()
    assert probe_host(1).matmul_flops > 1.0
    probe_host.cache_clear()


def test_three_predict_calls_with_the_default_profile_print_identical_step_times(tmp_path) -> None:
    """A new user's first `predict` of a CPU spec, three times: the host is probed once and kept, so
    every call prints the same step times to the last digit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    spec = Path(__file__).resolve().parents[1] / "examples" / "cpu-sweep.yaml"
    env = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
           "POWERTRAIN_CACHE_DIR": str(tmp_path / "cache")}
    outs = []
    for _ in range(3):
        res = subprocess.run([sys.executable, "-m", "powertrain.cli", "predict", str(spec), "--json"],
                             capture_output=True, text=True, env=env, timeout=300, check=False)
        assert res.returncode == 0, res.stderr
        rows = [json.loads(line) for line in res.stdout.splitlines()]
        assert rows and all("kept in" in r["breakdown"]["host_probe"]["source"] for r in rows)
        outs.append([(r["config"]["name"], repr(r["metrics"]["step_time_mean_s"])) for r in rows])
    assert outs[0] == outs[1] == outs[2]
