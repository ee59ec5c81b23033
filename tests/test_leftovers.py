"""Leftovers of a killed command are removed by the next run, and nothing else (issue 29, item 6).

Fake leftovers are made with a dead pid (a child that has exited and been reaped) and a live one
(this process); ages are set with ``os.utime``, so nothing depends on the clock."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from powertrain.store.leftovers import DEFAULT_MAX_AGE_S, PID_GRACE_S, pid_alive, remove_stale


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: no process has this pid now (until the kernel hands it out again)
    assert not pid_alive(child.pid)
    return child.pid


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    for root, dirs, files in os.walk(path) if path.is_dir() else []:
        for name in (*dirs, *files):
            os.utime(os.path.join(root, name), (t, t), follow_symlinks=False)
    os.utime(path, (t, t), follow_symlinks=False)


def test_a_dead_pid_is_removed_a_live_one_kept(tmp_path: Path, caplog) -> None:
    dead, live = _dead_pid(), os.getpid()
    gone = tmp_path / f".node0.parquet.{dead}.tmp"
    kept = tmp_path / f".node0.parquet.{live}.tmp"
    for p in (gone, kept):
        p.write_bytes(b"PAR1")
        _age(p, PID_GRACE_S + 60)
    with caplog.at_level(logging.INFO, logger="powertrain.store.leftovers"):
        removed = remove_stale(tmp_path, [".node0.parquet.{pid}.tmp"])
    assert removed == [gone] and not gone.exists() and kept.exists()
    assert any(f"process {dead} no longer runs" in r.getMessage() for r in caplog.records)


def test_a_fresh_file_of_a_dead_pid_is_kept_for_the_grace(tmp_path: Path) -> None:
    """Another node of a shared filesystem may be writing it: its pid means nothing on this host."""
    fresh = tmp_path / f".t.parquet.{_dead_pid()}.tmp"
    fresh.write_bytes(b"x")
    assert remove_stale(tmp_path, [".t.parquet.{pid}.tmp"]) == [] and fresh.exists()


def test_staging_folders_without_a_pid_go_by_age(tmp_path: Path) -> None:
    old = tmp_path / ".report.building-abc123"
    new = tmp_path / ".report.building-def456"
    for d in (old, new):
        (d / "figures").mkdir(parents=True)
        (d / "figures" / "a.svg").write_text("<svg/>")
    _age(old, DEFAULT_MAX_AGE_S + 60)
    _age(new, DEFAULT_MAX_AGE_S + 60)
    (new / "figures" / "b.svg").write_text("<svg/>")  # still being filled: its newest entry is fresh
    assert remove_stale(tmp_path, [".report.building-*", ".report.old-*"]) == [old]
    assert not old.exists() and new.is_dir()


def test_max_age_zero_under_the_callers_lock_removes_at_once(tmp_path: Path) -> None:
    tmp = tmp_path / ".sweep.json.k2j3h4g5.tmp"
    tmp.write_text("{")
    assert remove_stale(tmp_path, [".sweep.json.*.tmp"], max_age_s=0) == [tmp]


def test_only_the_callers_patterns_are_touched(tmp_path: Path) -> None:
    dead = _dead_pid()
    others = [tmp_path / "report", tmp_path / "notes.txt", tmp_path / f".other.{dead}.tmp",
              tmp_path / ".report.building-x" / "inner"]
    for p in others:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("mine")
    for p in tmp_path.iterdir():
        _age(p, 10 * DEFAULT_MAX_AGE_S)
    assert remove_stale(tmp_path, [".report.html.{pid}.tmp", ".trace.json.*.tmp"]) == []
    assert all(p.exists() for p in others)


def test_a_link_is_removed_as_a_link_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    work = tmp_path / "work"
    work.mkdir()
    link = work / ".x.importing-abcd"
    link.symlink_to(outside, target_is_directory=True)
    _age(link, 2 * DEFAULT_MAX_AGE_S)
    assert remove_stale(work, [".x.importing-*"]) == [link]
    assert not link.is_symlink() and (outside / "precious").read_text() == "keep"


def test_a_pattern_that_could_reach_a_users_file_is_refused(tmp_path: Path) -> None:
    for bad in ("*", "report*", "../.x.tmp", "a/.b.tmp", ""):
        with pytest.raises(ValueError, match="leftover pattern"):
            remove_stale(tmp_path, [bad])
    assert remove_stale(tmp_path / "missing", [".x.*.tmp"]) == []


def test_a_killed_prediction_leaves_nothing_for_the_next_one(tmp_path: Path) -> None:
    from powertrain.predict.output import write_prediction
    from powertrain.spec.run import RunConfig

    stale = tmp_path / ".p.predicting-zz9"
    (stale / "run").mkdir(parents=True)
    _age(stale, 2 * DEFAULT_MAX_AGE_S)
    config = RunConfig.model_validate({"name": "p", "model": "gpt3-tiny",
                                       "hardware": {"nodes": 1, "devices_per_node": 1, "device": "h100"}})
    write_prediction(tmp_path / "p", config)
    assert (tmp_path / "p" / "run.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_the_control_ledger_clears_a_killed_writers_temporary(tmp_path: Path) -> None:
    from powertrain.control.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger.json")
    stale = tmp_path / f".ledger.json.{_dead_pid()}.tmp"
    stale.write_text("{")
    _age(stale, PID_GRACE_S + 60)
    with ledger.locked() as entries:
        entries.append({"device": "gpu0"})
    assert not stale.exists() and ledger.entries() == [{"device": "gpu0"}]


def test_a_killed_report_and_trace_leave_nothing_for_the_next_one(tmp_path: Path) -> None:
    """What a killed ``report`` (its staging and swap folders) and ``trace`` (its temporary JSON) left is
    removed when the next one writes beside it; a fresh staging folder (a report being built now) stays."""
    from powertrain.analyze.synthetic import write_run
    from powertrain.report.build import build_report
    from powertrain.trace.perfetto import export_trace

    run = write_run(tmp_path / "run", hosts=1, devices_per_host=1, steps=2)
    old = [tmp_path / ".rep.building-ab12", tmp_path / ".rep.old-cd34", tmp_path / ".t.json.x1y2z3.tmp"]
    for p in old[:2]:
        (p / "figures").mkdir(parents=True)
    old[2].write_text("{")
    for p in old:
        _age(p, 2 * DEFAULT_MAX_AGE_S)
    fresh = tmp_path / ".rep.building-now1"
    fresh.mkdir()
    build_report(run, tmp_path / "rep", formats=())
    export_trace(run, tmp_path / "t.json")
    assert not any(p.exists() for p in old)
    assert fresh.is_dir()
