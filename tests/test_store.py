"""Crash-safe Parquet streams: readable at every moment, compacted on close or after a crash."""

import pyarrow.parquet as pq
import pytest

from powertrain.schema import TELEMETRY_SCHEMA, empty_telemetry_row
from powertrain.store import RunDir, read_telemetry
from powertrain.store.tables import StreamingTableWriter, finalize_run_streams


def _rows(n, t0=0, device="cpu"):
    out = []
    for i in range(n):
        r = empty_telemetry_row(t0 + i, "h", device)
        r["cpu_util_pct"] = float(i)
        out.append(r)
    return out


def test_rows_are_on_disk_after_each_flush_and_compacted_on_close(tmp_path):
    run = RunDir(tmp_path / "run").create()
    w = StreamingTableWriter(run.telemetry_dir / "h", TELEMETRY_SCHEMA, flush_s=0, segment_s=3600)
    w.append(_rows(5))
    w.flush()
    assert read_telemetry(run.path).num_rows == 5  # readable before close: no footer missing
    w.append(_rows(3, t0=5))
    w.flush()
    assert read_telemetry(run.path).num_rows == 8  # the segment was rewritten, not duplicated
    w.close()
    assert run.telemetry_file("h").is_file()
    assert not (run.telemetry_dir / "h.parts").exists()
    assert pq.read_table(run.telemetry_file("h")).num_rows == 8


def test_new_segment_after_segment_time_and_no_loss(tmp_path):
    run = RunDir(tmp_path / "run").create()
    w = StreamingTableWriter(run.telemetry_dir / "h", TELEMETRY_SCHEMA, flush_s=0, segment_s=0)
    for k in range(4):
        w.append(_rows(2, t0=10 * k))
        w.flush()
    assert len(list((run.telemetry_dir / "h.parts").glob("seg-*.parquet"))) == 4
    # Simulate kill -9: no close. Readers see every flushed row; finalize compacts them once.
    assert read_telemetry(run.path).num_rows == 8
    finalize_run_streams(run.path)
    assert read_telemetry(run.path).num_rows == 8
    finalize_run_streams(run.path)  # idempotent
    assert read_telemetry(run.path).num_rows == 8


def test_torn_segment_is_skipped_not_fatal(tmp_path):
    run = RunDir(tmp_path / "run").create()
    w = StreamingTableWriter(run.telemetry_dir / "h", TELEMETRY_SCHEMA, flush_s=0, segment_s=0)
    w.append(_rows(3))
    w.flush()
    (run.telemetry_dir / "h.parts" / "seg-000099.parquet").write_bytes(b"PAR1 torn")
    assert read_telemetry(run.path).num_rows == 3


def test_unflushed_rows_are_what_a_crash_loses(tmp_path):
    run = RunDir(tmp_path / "run").create()
    w = StreamingTableWriter(run.telemetry_dir / "h", TELEMETRY_SCHEMA, flush_s=3600)
    w.append(_rows(3))
    w.flush()
    w.append(_rows(2, t0=3))
    assert not w.maybe_flush()
    assert read_telemetry(run.path).num_rows == 3


def test_rundir_refuses_non_run_folder_with_a_hint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        RunDir(tmp_path).read()
