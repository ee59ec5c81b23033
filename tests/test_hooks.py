"""Step/phase markers: rows a user's loop writes, crash safety, and the no-run-dir no-op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from powertrain import hooks
from powertrain.store import read_events


def test_step_and_phases_write_event_rows(tmp_path):
    rec = hooks.Recorder(tmp_path, rank=3)
    rec.set_window("warmup")
    with rec.step(0, tokens=128, samples=2) as s:
        with rec.phase("forward", microbatch=0):
            pass
        with rec.phase("backward", microbatch=0):
            pass
        s.loss = 2.5
    rec.set_window("measured")
    rec.begin_step(1, tokens=128, samples=2)
    rec.begin("optimizer")
    rec.end()
    rec.end_step(loss=2.25, lr=1e-3)
    rec.close()
    ev = read_events(tmp_path).to_pylist()
    assert (tmp_path / "events" / "rank-3.parquet").is_file()
    kinds = [(e["kind"], e["step"], e["window"]) for e in ev]
    assert ("step", 0, "warmup") in kinds and ("forward", 0, "warmup") in kinds
    assert ("optimizer", 1, "measured") in kinds and ("step", 1, "measured") in kinds
    steps = {e["step"]: e for e in ev if e["kind"] == "step"}
    assert steps[0]["loss"] == 2.5 and steps[0]["tokens"] == 128 and steps[0]["samples"] == 2
    assert steps[1]["loss"] == 2.25 and json.loads(steps[1]["attrs"]) == {"lr": 1e-3}
    assert all(e["rank"] == 3 and e["t_end_ns"] >= e["t_start_ns"] for e in ev)
    assert steps[0]["mem_peak_bytes"] is None  # unknown stays null
    fwd = next(e for e in ev if e["kind"] == "forward")
    assert steps[0]["t_start_ns"] <= fwd["t_start_ns"] <= fwd["t_end_ns"] <= steps[0]["t_end_ns"]


def test_bad_usage_is_named(tmp_path):
    rec = hooks.Recorder(tmp_path)
    with pytest.raises(ValueError, match="window"):
        rec.set_window("cooldown")
    with pytest.raises(ValueError, match="event kind"):
        rec.begin("lunch")
    rec.begin_step(0)
    with pytest.raises(RuntimeError, match="still open"):
        rec.begin_step(1)


def test_without_run_dir_hooks_are_noops_and_say_so_once(tmp_path):
    code = textwrap.dedent("""
        from powertrain import hooks
        for i in range(3):
            with hooks.step(i, tokens=10) as s:
                with hooks.phase("forward"):
                    pass
                s.loss = 1.0
        print("done", hooks.get().enabled)
    """)
    env = {k: v for k, v in os.environ.items() if k != hooks.RUN_DIR_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done False"
    assert out.stderr.count("not recorded") == 1
    assert not list(tmp_path.rglob("*.parquet"))


def test_env_run_dir_and_killed_process_keeps_rows(tmp_path):
    # A loop killed with SIGKILL keeps the rows flushed before the kill (segments on disk).
    code = textwrap.dedent("""
        import os, signal, time
        from powertrain import hooks
        hooks.configure(flush_s=0.0)
        for i in range(5):
            with hooks.step(i, tokens=10):
                pass
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, hooks.RUN_DIR_ENV: str(tmp_path), "RANK": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == -9
    assert (tmp_path / "events" / "rank-1.parts").is_dir()
    ev = read_events(tmp_path)
    assert ev.column("step").to_pylist() == [0, 1, 2, 3, 4]
