"""Step/phase markers: rows a user's loop writes, crash safety, and the no-run-dir no-op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from powertrain import hooks
from powertrain.hooks import markers
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
    # logged (no logging configured: Python shows warnings on stderr, message text only)
    assert out.stderr.startswith("powertrain.hooks: $POWERTRAIN_RUN_DIR is not set, step markers are not recorded")
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
    (tmp_path / "run.json").write_text('{"status": "running"}')  # $POWERTRAIN_RUN_DIR must be a running run
    env = {**os.environ, hooks.RUN_DIR_ENV: str(tmp_path), "RANK": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == -9
    assert (tmp_path / "events" / "rank-1.parts").is_dir()
    ev = read_events(tmp_path)
    assert ev.column("step").to_pylist() == [0, 1, 2, 3, 4]


def test_automatic_windows_count_steps_until_the_loop_chooses(tmp_path):
    rec = hooks.Recorder(tmp_path, warmup_steps=2)
    for i in range(3):
        with rec.step(i), rec.phase("forward"):
            pass
    with rec.in_window("warmup"):  # a block the loop declares itself; automatic again after it
        rec.record("step", 1, 2, step=3)
    rec.record("step", 3, 4, step=4)  # a step measured elsewhere counts like any other
    rec.set_window(None)  # an explicit choice ends the automatic windows for good
    with rec.step(5):
        pass
    rec.close()
    ev = read_events(tmp_path).to_pylist()
    by_step = {e["step"]: e["window"] for e in ev if e["kind"] == "step"}
    assert by_step == {0: "warmup", 1: "warmup", 2: "measured", 3: "warmup", 4: "measured", 5: None}
    assert [e["window"] for e in ev if e["kind"] == "forward"] == ["warmup", "warmup", "measured"]


def test_without_warmup_steps_the_window_stays_as_set(tmp_path):
    rec = hooks.Recorder(tmp_path)  # configure() / $POWERTRAIN_RUN_DIR recorders: no automatic windows
    with rec.step(0):
        pass
    rec.close()
    assert read_events(tmp_path)["window"].to_pylist() == [None]
    with pytest.raises(ValueError, match="warmup_steps"):
        hooks.Recorder(tmp_path, warmup_steps=-2)


def test_bind_is_lazy_and_unbind_restores_and_compacts(tmp_path, monkeypatch):
    monkeypatch.setattr(markers, "_recorder", None)
    before = hooks.Recorder(None)
    monkeypatch.setattr(markers, "_recorder", before)
    empty = hooks.bind(tmp_path / "a", rank=0)
    assert hooks.get() is empty.recorder
    assert hooks.unbind(empty) is None  # nothing marked: no events file at all
    assert not (tmp_path / "a").exists()
    assert hooks.get() is before

    b = hooks.bind(tmp_path / "b", rank=2, warmup_steps=1)
    for i in range(3):
        with hooks.step(i, tokens=5):
            pass
    path = hooks.unbind(b)
    assert path == tmp_path / "b" / "events" / "rank-2.parquet" and path.is_file()
    assert not (tmp_path / "b" / "events" / "rank-2.parts").exists()
    assert read_events(tmp_path / "b")["window"].to_pylist() == ["warmup", "measured", "measured"]


def test_a_recorder_configured_inside_a_binding_stays(tmp_path, monkeypatch):
    # A trainer callback inside a Monitor block calls configure(); the Monitor's end must not undo it.
    monkeypatch.setattr(markers, "_recorder", None)
    b = hooks.bind(tmp_path, rank=0)
    mine = hooks.configure(tmp_path, rank=1)
    hooks.unbind(b)
    assert hooks.get() is mine and mine.enabled
    mine.close()


def test_nested_bindings_ended_out_of_order_do_not_restore_a_closed_recorder(tmp_path, monkeypatch):
    monkeypatch.setattr(markers, "_recorder", None)
    outer = hooks.bind(tmp_path / "outer")
    inner = hooks.bind(tmp_path / "inner")
    hooks.unbind(outer)
    hooks.unbind(inner)
    assert markers._recorder is None  # the next marker starts from the environment again


def test_an_open_step_at_close_is_named_not_written(tmp_path, caplog):
    rec = hooks.Recorder(tmp_path)
    with rec.step(0):
        pass
    rec.begin_step(1)
    rec.close()
    assert "step 1 was still open" in caplog.text  # a warning: on stderr unless logging says otherwise
    assert read_events(tmp_path)["step"].to_pylist() == [0]
