"""The store's writers remove what a killed write of the same file left (issue 29, item 6).

JSON (``.NAME.XXXXXXXX.tmp``, no pid: removed when untouched for an hour), compacted Parquet and a
sweep's ``summary.parquet`` (``.NAME.PID.tmp``: removed when the pid is gone). A dead pid is a reaped
child's; ages are set with ``os.utime``, so nothing depends on the clock."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pyarrow as pa

from powertrain.analyze.sweep import write_sweep_table
from powertrain.schema import EVENTS_SCHEMA
from powertrain.store import rundir
from powertrain.store.leftovers import DEFAULT_MAX_AGE_S, PID_GRACE_S, pid_alive
from powertrain.store.rundir import write_json_atomic, write_text_atomic
from powertrain.store.tables import StreamingTableWriter, finalize


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    assert not pid_alive(child.pid)
    return child.pid


def _aged(path: Path, seconds: float, text: str = "x") -> Path:
    path.write_text(text)
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def test_json_leftovers_of_the_same_file_are_removed_when_an_hour_old(tmp_path: Path) -> None:
    rundir._CLEANED.clear()
    old = _aged(tmp_path / ".run.json.k3j_9x2a.tmp", DEFAULT_MAX_AGE_S + 60)
    fresh = _aged(tmp_path / ".run.json.q8w2e4r6.tmp", 5)  # a live writer's, maybe on another node
    other = _aged(tmp_path / ".notes.txt.abcd1234.tmp", DEFAULT_MAX_AGE_S + 60)  # not ours to judge
    write_json_atomic(tmp_path / "run.json", {"a": 1})
    assert not old.exists() and fresh.exists() and other.exists()


def test_a_sweeps_per_run_folders_are_left_to_the_sweep(tmp_path: Path) -> None:
    """The sweep cleans ``.specs``/``.launch`` under its lock; listing them at each run's write is quadratic."""
    rundir._CLEANED.clear()
    specs = tmp_path / ".specs"
    specs.mkdir()
    old = _aged(specs / ".r1.yaml.k3j_9x2a.tmp", DEFAULT_MAX_AGE_S + 60)
    write_text_atomic(specs / "r1.yaml", "name: r1\n")
    assert old.exists()


def test_a_killed_compaction_and_summary_are_removed_by_the_next(tmp_path: Path) -> None:
    dead, age = _dead_pid(), PID_GRACE_S + 60
    base = tmp_path / "events" / "rank-0"
    writer = StreamingTableWriter(base, EVENTS_SCHEMA)
    writer.flush()
    stale_seg = _aged(writer.parts / f".seg-000007.parquet.{dead}.tmp", age)
    stale = _aged(base.parent / f".rank-0.parquet.{dead}.tmp", age)
    live = _aged(base.parent / f".rank-0.parquet.{os.getppid()}.tmp", age)  # a live pid: another writer
    StreamingTableWriter(base, EVENTS_SCHEMA)  # a writer started again on the same stream
    assert not stale_seg.exists()
    finalize(base, EVENTS_SCHEMA)
    assert not stale.exists() and live.exists()
    live.unlink()
    sweep_stale = _aged(tmp_path / f".summary.parquet.{dead}.tmp", age)
    write_sweep_table(tmp_path, pa.table({"run": ["r1"]}))
    assert not sweep_stale.exists() and (tmp_path / "summary.parquet").is_file()
