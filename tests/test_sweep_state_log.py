"""sweep.json is written whole at the start and end of a sweep; each change in between is one line of
``sweep.state.jsonl``, replayed by every reader (issue 29, item 6: "sweep.json sized by what changed").

Asserted on bytes and contents only: the plan file is untouched by a run's changes, a change costs a
line whatever the grid's size, a torn or stale line never loses or re-applies state."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest

from powertrain.analyze.sweep import load_sweep
from powertrain.launch.sweep import SweepOptions, SweepRunner
from powertrain.plan.planner import plan
from powertrain.plan.state import SweepState
from powertrain.plan.sweep_spec import expand, iter_expand, parse_sweep_spec
from powertrain.store.rundir import file_mode
from powertrain.store.sweep_log import GENERATION, INDENT_MAX_RUNS, LOG_FILE, read_sweep

BASE = {"model": "gpt3-tiny", "hardware": {"nodes": 1, "devices_per_node": 1, "device": "cpu"},
        "knobs": {"global_batch": 8, "micro_batch": 1}, "protocol": {"warmup_steps": 1, "measured_steps": 2}}


def _plan(seeds: int):
    return plan(parse_sweep_spec({"name": "log", "base": BASE, "grid": [{"knobs.seed": list(range(seeds))}]}))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_change_is_one_line_and_the_plan_file_is_not_rewritten(tmp_path: Path) -> None:
    state = SweepState.create_or_merge(tmp_path, _plan(3))
    before = _sha(tmp_path / "sweep.json")
    assert not (tmp_path / LOG_FILE).exists()
    rid = state.runs[1]["id"]
    state.set(rid, status="running", attempts=1, started=1.0)
    state.set(rid, status="ok", ended=2.0)
    assert _sha(tmp_path / "sweep.json") == before
    lines = (tmp_path / LOG_FILE).read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["set"] == {"status": "ok", "ended": 2.0}
    again = SweepState.load(tmp_path)
    assert again is not None and again.run(rid)["status"] == "ok" and again.run(rid)["attempts"] == 1
    assert read_sweep(tmp_path)["runs"][1]["ended"] == 2.0
    assert _mode(tmp_path / LOG_FILE) == file_mode()  # the project's 0640, less a stricter umask


def _mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def test_a_change_costs_the_same_whatever_the_grids_size(tmp_path: Path) -> None:
    sizes = {}
    for n in (2, 600):
        folder = tmp_path / str(n)
        state = SweepState.create_or_merge(folder, _plan(n))
        state.set(state.runs[0]["id"], status="running", attempts=1, started=1.0, reason=None)
        sizes[n] = (folder / LOG_FILE).stat().st_size
    assert sizes[600] == sizes[2] < 400  # bytes of one line, not of the plan


def test_save_folds_the_log_in_and_a_stale_log_is_never_replayed(tmp_path: Path) -> None:
    state = SweepState.create_or_merge(tmp_path, _plan(2))
    rid = state.runs[0]["id"]
    state.set(rid, status="running")
    stale = (tmp_path / LOG_FILE).read_bytes()
    state.set(rid, status="ok")
    state.save()
    assert not (tmp_path / LOG_FILE).exists()
    assert json.loads((tmp_path / "sweep.json").read_text())["runs"][0]["status"] == "ok"
    # a crash after sweep.json was written and before the log was removed: its lines are of the old generation
    (tmp_path / LOG_FILE).write_bytes(stale)
    assert SweepState.load(tmp_path).run(rid)["status"] == "ok"
    state = SweepState.load(tmp_path)
    state.set(rid, status="failed")  # a new change after the stale lines is replayed
    assert SweepState.load(tmp_path).run(rid)["status"] == "failed"


def test_a_torn_last_line_is_ignored_with_a_note_and_earlier_state_kept(tmp_path: Path, caplog) -> None:
    state = SweepState.create_or_merge(tmp_path, _plan(3))
    a, b, c = (r["id"] for r in state.runs)
    state.set(a, status="ok")
    gen = state.data[GENERATION]
    with open(tmp_path / LOG_FILE, "ab") as f:  # a crash mid-append
        f.write(json.dumps({"gen": gen, "id": b, "set": {"status": "ok"}}).encode()[:20])
    with caplog.at_level(logging.WARNING, logger="powertrain.store.sweep_log"):
        seen = SweepState.load(tmp_path)
    assert seen.run(a)["status"] == "ok" and seen.run(b)["status"] == "planned"
    assert any("torn last line" in r.getMessage() for r in caplog.records)
    seen.set(c, status="failed")  # the next append cuts the torn fragment off first
    last = SweepState.load(tmp_path)
    assert [last.run(x)["status"] for x in (a, b, c)] == ["ok", "planned", "failed"]
    assert all(json.loads(line) for line in (tmp_path / LOG_FILE).read_text().splitlines())


def test_a_line_that_is_not_json_is_skipped_with_a_note(tmp_path: Path, caplog) -> None:
    state = SweepState.create_or_merge(tmp_path, _plan(2))
    state.set(state.runs[0]["id"], status="ok")
    with open(tmp_path / LOG_FILE, "ab") as f:
        f.write(b"garbage\n")
    state.set(state.runs[1]["id"], status="oom")
    with caplog.at_level(logging.WARNING, logger="powertrain.store.sweep_log"):
        seen = read_sweep(tmp_path)
    assert [r["status"] for r in seen["runs"]] == ["ok", "oom"]
    assert any(f"{LOG_FILE}:2: not a JSON line" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_at_the_log_is_not_read(tmp_path: Path, caplog) -> None:
    SweepState.create_or_merge(tmp_path, _plan(1))
    os.mkfifo(tmp_path / LOG_FILE)
    with caplog.at_level(logging.WARNING, logger="powertrain.store.sweep_log"):
        assert read_sweep(tmp_path)["runs"][0]["status"] == "planned"  # and it did not block
    assert any("not a regular file" in r.getMessage() for r in caplog.records)


def test_a_big_plan_is_written_a_run_per_line_and_reads_back(tmp_path: Path) -> None:
    runs = [{"id": f"r{i}", "status": "planned", "config": {"knobs": {"seed": i}}} for i in range(INDENT_MAX_RUNS + 1)]
    SweepState(tmp_path, {"schema": "powertrain.sweep/1", "name": "big", "runs": runs}).save()
    text = (tmp_path / "sweep.json").read_text()
    assert len(text.splitlines()) == len(runs) + 2
    assert json.loads(text)["runs"] == runs and json.loads(text)["name"] == "big"


def test_the_sweep_table_reads_the_logged_statuses(tmp_path: Path) -> None:
    state = SweepState.create_or_merge(tmp_path, _plan(2))
    state.set(state.runs[0]["id"], status="failed", reason="it broke")
    rows, _ = load_sweep(tmp_path)
    assert (rows[0]["status"], rows[0]["reason"]) == ("failed", "it broke")


def test_a_finished_sweep_leaves_one_compact_sweep_json_and_no_leftovers(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    (folder / ".specs").mkdir(parents=True)
    killed = [folder / ".sweep.json.k1ll3d00.tmp", folder / ".specs" / ".x.yaml.k1ll3d00.tmp"]
    for p in killed:  # what a sweep killed mid-write leaves
        p.write_text("{")
    p = _plan(2)
    # /bin/true as the python: each run "exits 0 before creating the run", a failure, at once
    state = SweepRunner(p, folder, SweepOptions(python="/bin/true", poll_s=0.01)).run()
    assert [r["status"] for r in state.runs] == ["failed", "failed"]
    assert not (folder / LOG_FILE).exists() and not any(k.exists() for k in killed)
    on_disk = json.loads((folder / "sweep.json").read_text())
    assert [r["status"] for r in on_disk["runs"]] == ["failed", "failed"]
    assert on_disk["runs"][0]["attempts"] == 1


def test_iter_expand_is_expand_one_point_at_a_time() -> None:
    spec = parse_sweep_spec({"name": "e", "base": BASE, "grid": [{"knobs.seed": [1, 2]}, {"layout.tp": [1, 2]}]})
    lazy, eager = list(iter_expand(spec)), expand(spec)
    assert [(e.index, e.settings, e.error) for e in lazy] == [(e.index, e.settings, e.error) for e in eager]
    assert lazy[0].raw is not eager[0].raw and lazy[0].raw == eager[0].raw
    lazy[0].raw["knobs"]["global_batch"] = 99  # each merged dict is a copy: nothing is shared with the spec
    assert spec.base["knobs"]["global_batch"] == 8 and lazy[1].raw["knobs"]["global_batch"] == 8
