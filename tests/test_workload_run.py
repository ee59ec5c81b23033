"""`powertrain run` end to end: a complete run directory, bad specs refused before anything starts,
and a crashing rank that ends the run as failed with its error tail and the data up to the crash."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
def test_run_writes_a_complete_run_directory(pp_launch):
    # The session's shared 2-rank pipeline run (conftest.pp_launch: 1F1B, 4 micro-batches of
    # 4·16 tokens in all, 2 warm-up + 3 measured steps, step 1 profiled, sampled at 10 Hz).
    out, stderr = Path(pp_launch["run"]), pp_launch["stderr"]
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
    assert "measured window: 3 steps" in stderr


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
    # rank 0 follows: it raised on the closed connection, or torchrun stopped it
    assert [c["rank"] for c in info["consequences"]] == [0]
    assert "step 8/21" in info["error_tail"]  # the last lines rank 1 wrote
    ev = read_events(out)
    steps1 = sorted({e["step"] for e in ev.to_pylist() if e["rank"] == 1 and e["kind"] == "step"})
    # every event flushed before the kill is kept (flushing after each step here; 1 s by default)
    assert steps1 == list(range(8))
    assert read_telemetry(out).num_rows > 0
    assert not list((out / "events").glob("*.parts"))  # compacted after the crash


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """``n`` busy-looping processes beside the test (a loaded machine), stopped when it ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait(timeout=30)


@pytest.mark.slow
def test_rank_that_raises_fails_the_run_with_its_traceback(tmp_path):
    # Under load (a CPU hog beside the suite's own work), torchrun often stops rank 1 (SIGTERM) before
    # rank 1 notices its peer is gone and raises itself; on a quiet machine rank 1 usually raises first.
    # Either way rank 0 is the cause and rank 1 follows (both orders: the unit test below).
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", layout={}, protocol={"warmup_steps": 1, "measured_steps": 20},
                      profile={"enabled": False})
    with cpu_hogs(1):
        res = powertrain("run", spec, "--out", str(out), env={"POWERTRAIN_FAULT": "0:2"}, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_rank"] == 0
    assert info["reason"] == "rank 0 failed: RuntimeError: injected fault (POWERTRAIN_FAULT) on rank 0 at step 2"
    assert info["failure_cause"]["how"] == "error" and info["failure_cause"]["t_ns"] > 0
    assert "Traceback" in info["error_tail"] and "trainer.py" in info["error_tail"]
    assert "injected fault" in res.stderr  # the terminal shows the error too
    [rank1] = info["consequences"]
    assert rank1["rank"] == 1
    assert rank1["how"] in ("failed after rank 0", "stopped by torchrun (SIGTERM) after rank 0 failed"), rank1


# A real torchrun 2.13 log (trimmed) of the loaded case: rank 0 raised, torchrun then stopped rank 1.
TORN_DOWN = """\
E1130 10:17:27.9 13489 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 13525) of binary: python
W1130 10:17:28.044000 13489 api.py:1028] Sending process 13526 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
powertrain.workload.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_10:17:28
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 13526)  (SIGTERM)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_10:17:28
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 13525)
  error_file: <N/A>
============================================================
"""


def test_a_rank_torchrun_stopped_is_a_consequence_of_the_rank_that_raised(tmp_path):
    from powertrain.launch.local import attribute_failure, torchrun_failures, torchrun_stopped

    log = tmp_path / "torchrun.log"
    log.write_text(TORN_DOWN)
    failures, stopped = torchrun_failures(log), torchrun_stopped(log)
    assert failures == {0: 1, 1: -15} and stopped == {1: "SIGTERM"}
    errors = {0: {"rank": 0, "t_ns": 5, "error": "RuntimeError: boom"}}
    cause, consequences = attribute_failure(errors, failures, stopped)
    assert cause == {"rank": 0, "how": "error", "error": "RuntimeError: boom", "t_ns": 5}
    assert consequences == [{"rank": 1, "how": "stopped by torchrun (SIGTERM) after rank 0 failed",
                             "exit_code": -15, "error": None}]
    # rank 1 got as far as its own report ("connection closed") before the SIGTERM: still a consequence
    errors[1] = {"rank": 1, "t_ns": 9, "error": "RuntimeError: Connection closed by peer"}
    cause, consequences = attribute_failure(errors, failures, stopped)
    assert cause["rank"] == 0 and [c["rank"] for c in consequences] == [1]
    # the same exits without torchrun's tear-down line: rank 1 was killed by something else, first
    cause, consequences = attribute_failure({0: errors[0]}, failures, {})
    assert cause == {"rank": 1, "how": "killed", "error": "killed by SIGTERM", "t_ns": None}
    assert consequences == [{"rank": 0, "how": "failed after rank 1", "exit_code": 1, "error": "RuntimeError: boom"}]
    # powertrain stopped the ranks itself (interrupt, time limit): no rank is blamed for the signal
    cause, consequences = attribute_failure({}, {0: -15, 1: -15}, {}, stopped_from_outside=True)
    assert cause is None and consequences == []
    # a SIGKILLed rank is preferred over a SIGTERMed one when neither came from torchrun
    cause, _ = attribute_failure({}, {0: -15, 1: -9}, {})
    assert cause["rank"] == 1 and cause["error"] == "killed by SIGKILL"


def test_failure_attribution_helpers(tmp_path):
    from powertrain.launch.local import first_error, torchrun_failures

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-0.error.json").write_text(json.dumps({"rank": 0, "t_ns": 20, "error": "echo"}))
    (logs / "rank-3.error.json").write_text(json.dumps({"rank": 3, "t_ns": 10, "error": "ValueError: boom"}))
    assert first_error(tmp_path)["rank"] == 3
    (logs / "rank-5.error.json").write_text(json.dumps({"rank": 5, "error": "no time recorded"}))
    assert first_error(tmp_path)["rank"] == 3  # an unknown time is not an early one
    (logs / "torchrun.log").write_text(
        "Failures:\n[1]:\n  time : x\n  rank      : 1 (local_rank: 1)\n  exitcode  : -15 (pid: 9)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 2 (local_rank: 2)\n  exitcode  : -9 (pid: 8)\n")
    assert torchrun_failures(logs / "torchrun.log") == {1: -15, 2: -9}
