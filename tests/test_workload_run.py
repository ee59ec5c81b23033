"""`powertrain run` end to end: a complete run directory, bad specs refused before anything starts,
and a crashing rank that ends the run as failed with its error tail and the data up to the crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from powertrain.store import read_events, read_telemetry

MODEL = {"name": "llama-test", "family": "llama", "layers": 4, "hidden": 32, "ffn": 64, "heads": 4,
         "kv_heads": 2, "vocab": 128, "seq_len": 16}


def write_spec(path, **over) -> str:
    spec = {"name": "t", "model": MODEL, "layout": {"pp": 2, "pp_schedule": "gpipe"},
            "knobs": {"global_batch": 4, "micro_batch": 2}, "hardware": {"devices_per_node": 2},
            "protocol": {"warmup_steps": 2, "measured_steps": 3}, "profile": {"enabled": True}}
    spec.update(over)
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def powertrain(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "powertrain.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_run_writes_a_complete_run_directory(tmp_path):
    out = tmp_path / "run"
    res = powertrain("run", write_spec(tmp_path / "s.yaml"), "--out", str(out), "--rate", "10")
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "ok" and info["kind"] == "run" and info["world"] == 2
    assert info["config"]["layout"]["pp"] == 2 and info["config"]["layout"]["dp"] == 1  # resolved
    assert [r["coords"]["pp"] for r in info["rank_map"]] == [0, 1]
    assert all(r["device"] == "cpu" and r["local_rank"] == r["rank"] for r in info["rank_map"])
    ev = read_events(out).to_pylist()
    for rank in (0, 1):
        steps = [e for e in ev if e["kind"] == "step" and e["rank"] == rank]
        assert [e["window"] for e in steps] == ["warmup"] * 2 + ["measured"] * 3
        assert all(e["tokens"] == 4 * 16 and e["mem_peak_bytes"] is None for e in steps)
        # the loss lives on the last pipeline stage only
        assert all((e["loss"] is not None) == (rank == 1) for e in steps)
    assert {e["kind"] for e in ev} >= {"step", "phase", "optimizer", "data"}
    assert read_telemetry(out).num_rows > 0
    assert sorted(p.name for p in (out / "profiles").iterdir()) == ["rank-0-step-1.json", "rank-1-step-1.json"]
    assert (out / "logs" / "rank-1.log").read_text().count("[measured]") == 3
    assert "measured window: 3 steps" in res.stderr


@pytest.mark.parametrize(("over", "rule"), [
    ({"hardware": {"devices_per_node": 3}}, "world_size"),
    ({"layout": {"tp": 4}}, "kv_heads_divisible_by_tp"),
    ({"knobs": {"global_batch": 2, "micro_batch": 2}, "layout": {"pp": 2}}, "pipeline_microbatches"),
])
def test_bad_spec_fails_before_anything_starts(tmp_path, over, rule):
    out = tmp_path / "run"
    res = powertrain("run", write_spec(tmp_path / "s.yaml", **over), "--out", str(out), timeout=60)
    assert res.returncode == 2
    assert rule in res.stderr and "fix:" in res.stderr and "nothing was started" in res.stderr
    assert not out.exists()


@pytest.mark.slow
def test_killed_rank_fails_the_run_with_its_error_and_keeps_data(tmp_path):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", layout={}, protocol={"warmup_steps": 1, "measured_steps": 20},
                      profile={"enabled": False})
    # rank 1 SIGKILLs itself at step 8 (no Python clean-up at all); the hang guard is the timeout.
    res = powertrain("run", spec, "--out", str(out), env={"POWERTRAIN_FAULT": "1:8:kill", "POWERTRAIN_EVENTS_FLUSH_S": "0"}, timeout=150)
    assert res.returncode == 1
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_rank"] == 1
    assert "rank 1 killed by SIGKILL" in info["reason"]
    assert "step 8/21" in info["error_tail"]  # the last lines rank 1 wrote
    ev = read_events(out)
    steps1 = sorted({e["step"] for e in ev.to_pylist() if e["rank"] == 1 and e["kind"] == "step"})
    # every event flushed before the kill is kept (flushing after each step here; 1 s by default)
    assert steps1 == list(range(8))
    assert read_telemetry(out).num_rows > 0
    assert not list((out / "events").glob("*.parts"))  # compacted after the crash


@pytest.mark.slow
def test_rank_that_raises_fails_the_run_with_its_traceback(tmp_path):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", layout={}, protocol={"warmup_steps": 1, "measured_steps": 20},
                      profile={"enabled": False})
    res = powertrain("run", spec, "--out", str(out), env={"POWERTRAIN_FAULT": "0:2"}, timeout=150)
    assert res.returncode == 1
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_rank"] == 0
    assert info["reason"] == "rank 0 failed: RuntimeError: injected fault (POWERTRAIN_FAULT) on rank 0 at step 2"
    assert "Traceback" in info["error_tail"] and "trainer.py" in info["error_tail"]
    assert "injected fault" in res.stderr  # the terminal shows the error too


def test_failure_attribution_helpers(tmp_path):
    from powertrain.launch.local import first_error, torchrun_failures

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-0.error.json").write_text(json.dumps({"rank": 0, "t_ns": 20, "error": "echo"}))
    (logs / "rank-3.error.json").write_text(json.dumps({"rank": 3, "t_ns": 10, "error": "ValueError: boom"}))
    assert first_error(tmp_path)["rank"] == 3
    (logs / "torchrun.log").write_text(
        "Failures:\n[1]:\n  time : x\n  rank      : 1 (local_rank: 1)\n  exitcode  : -15 (pid: 9)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 2 (local_rank: 2)\n  exitcode  : -9 (pid: 8)\n")
    assert torchrun_failures(logs / "torchrun.log") == {1: -15, 2: -9}
