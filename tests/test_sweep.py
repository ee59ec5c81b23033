"""Sweeps for real: local runs, kill + resume, the folder lock, and Slurm on localhost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from powertrain.launch.sweep import apply_gate, classify_failure
from powertrain.plan.state import SweepState, sweep_lock
from powertrain.spec.run import Protocol
from powertrain.store import RunDir
from powertrain.store.sweep_log import read_sweep

REPO = Path(__file__).resolve().parent.parent

# Two one-rank runs: what these tests exercise is the sweep around the runs (kill, resume, retry,
# the folder lock), and each rank more is seconds of start-up on a busy 2-core host.
TINY = {
    "name": "tiny",
    "base": {
        "model": "llama3-tiny",
        "hardware": {"devices_per_node": 1},
        "knobs": {"global_batch": 4, "micro_batch": 1},
        "protocol": {"warmup_steps": 1, "measured_steps": 2},
    },
    "grid": [{"cases": [{"knobs": {"micro_batch": 1}}, {"knobs": {"micro_batch": 2}}]}],
    "launch": {"time_limit_min": 5},
}


def _sweep(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "powertrain.cli", "sweep", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _state(folder: Path) -> dict:
    """sweep.json and the changes logged since (what every reader sees while the sweep runs)."""
    return read_sweep(folder) or {"runs": []}


def _run_dirs(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")}


@pytest.mark.slow
def test_kill_then_resume_keeps_finished_runs_and_ends_with_the_planned_set(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "sweep"
    proc = _sweep(str(spec), "--out", str(out))
    deadline = time.monotonic() + 300
    while True:  # wait until the first run finished and the second is running, then kill -9
        runs = _state(out)["runs"]
        if len(runs) == 2 and runs[0].get("status") == "ok" and runs[1].get("status") == "running" \
                and (out / runs[1]["id"] / "run.json").exists():
            break
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "first run did not finish"
        time.sleep(0.2)
    first, second = runs[0]["id"], runs[1]["id"]
    first_start = RunDir(out / first).read()["start_ns"]
    proc.kill()
    proc.wait()
    # The orphaned run dies with the sweep (PR_SET_PDEATHSIG): it records its end, or its owner is gone.
    deadline = time.monotonic() + 60
    while RunDir(out / second).effective_status() == "running":
        assert time.monotonic() < deadline, "the interrupted run did not stop"
        time.sleep(0.2)

    # Resume, choosing to mark the interrupted run failed.
    res = _sweep(str(spec), "--out", str(out), "--resume", "--interrupted", "fail")
    _, err = res.communicate(timeout=120)
    assert res.returncode == 1, err  # a failed run remains
    st = {r["id"]: r for r in _state(out)["runs"]}
    assert st[first]["status"] == "ok" and st[second]["status"] == "failed"
    assert "interrupted" in st[second]["reason"]

    # Retry the failure: only the second run runs again; the first is untouched.
    res = _sweep(str(spec), "--out", str(out), "--resume", "--retry-failed")
    _, err = res.communicate(timeout=300)
    assert res.returncode == 0, err
    st = {r["id"]: r for r in _state(out)["runs"]}
    assert st[first]["status"] == "ok" and st[second]["status"] == "ok"
    assert RunDir(out / first).read()["start_ns"] == first_start
    assert _run_dirs(out) == {first, second}
    assert list((out / ".attempts").iterdir())  # the cut-off attempt is kept as evidence

    # Without --resume a folder holding runs is refused, naming the fix.
    res = _sweep(str(spec), "--out", str(out))
    _, err = res.communicate(timeout=60)
    assert res.returncode == 2 and "--resume" in err


def test_a_second_sweep_on_the_same_folder_is_refused(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "sweep"
    with sweep_lock(out):
        res = _sweep(str(spec), "--out", str(out))
        _, err = res.communicate(timeout=60)
    assert res.returncode == 2 and "another sweep is already running" in err
    assert not _run_dirs(out)


def test_bad_spec_is_refused_before_anything_runs(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ngrid: [{zip: {layout.tp: [1, 2], layout.pp: [1]}}]\n")
    res = _sweep(str(spec), "--out", str(tmp_path / "o"))
    _, err = res.communicate(timeout=60)
    assert res.returncode == 2 and "differ in length" in err
    assert not (tmp_path / "o").exists()


def test_temperature_gate_waits_until_cool_or_timeout():
    temps = iter([80.0, 75.0, 69.0])
    slept = []
    out = apply_gate(Protocol(cooldown_s=30, cooldown_until_temp_c=70), read_temp=lambda: next(temps),
                     sleep=slept.append)
    assert out["temp_c"] == 69.0 and "≤ 70" in out["reason"]
    out = apply_gate(Protocol(cooldown_s=0.05, cooldown_until_temp_c=70), read_temp=lambda: None,
                     sleep=lambda s: None)
    assert "no temperature sensor" in out["reason"] and out["temp_c"] is None
    assert apply_gate(Protocol())["waited_s"] == 0.0


def test_failures_are_told_apart_from_out_of_memory(tmp_path):
    oom, crash = RunDir(tmp_path / "a").create(), RunDir(tmp_path / "b").create()
    oom.write({"status": "failed", "reason": "rank 1: torch.OutOfMemoryError: CUDA out of memory."})
    crash.write({"status": "failed", "reason": "rank 0 exited with code 1"})
    (crash.logs_dir / "rank-0.log").write_text("ValueError: bad shape\n")
    assert classify_failure(oom.path) == "oom"
    assert classify_failure(crash.path) == "failed"


@pytest.mark.slow
@pytest.mark.slurm
def test_example_cpu_sweep_through_local_slurm(slurm_conf, tmp_path):
    out = tmp_path / "cpu-sweep"
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    # A quarter of the example sweep (both layouts at micro-batch 2, recompute none) keeps the suite
    # inside its time budget on 2 busy cores: every run takes the same sbatch path, two jobs queue.
    res = _sweep(str(REPO / "examples" / "cpu-sweep.yaml"), "--out", str(out), "--backend", "slurm",
                 "--only", "*mb2.rcnone", env=env)
    _, err = res.communicate(timeout=1200)
    assert res.returncode == 0, err
    state = SweepState.load(out)
    assert state is not None and len(state.runs) == 8
    chosen = [r for r in state.runs if r["id"].endswith("mb2.rcnone")]
    assert len(chosen) == 2 and {r["status"] for r in chosen} == {"ok"}
    assert {r["status"] for r in state.runs if r not in chosen} == {"planned"}  # --only left them alone
    assert _run_dirs(out) == {r["id"] for r in chosen}
    for r in chosen:
        info = RunDir(out / r["id"]).read()
        assert info["status"] == "ok" and info["sweep"]["id"] == r["id"]
        assert (out / ".launch" / f"{r['id']}.jobid").exists()  # really went through sbatch
        assert list((out / r["id"] / "events").glob("rank-*.parquet"))
        assert list((out / r["id"] / "telemetry").glob("*.parquet"))
