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


def _segments(run, n_segments, rows_per_segment):
    w = StreamingTableWriter(run.telemetry_dir / "h", TELEMETRY_SCHEMA, flush_s=0, segment_s=0)
    for k in range(n_segments):
        w.append(_rows(rows_per_segment, t0=rows_per_segment * k))
        w.flush()
    return w


def test_compaction_streams_row_groups_of_bounded_size(tmp_path, monkeypatch):
    import powertrain.store.tables as tables

    monkeypatch.setattr(tables, "COMPACT_ROW_GROUP_ROWS", 10)
    run = RunDir(tmp_path / "run").create()
    _segments(run, 12, 4)  # 48 rows in 12 segments, never closed (a killed sampler)
    finalize_run_streams(run.path)
    pf = pq.ParquetFile(run.telemetry_file("h"))
    sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
    assert sum(sizes) == 48
    assert max(sizes) <= 10 + 4  # a row group's worth plus at most one segment held at once
    assert pf.num_row_groups >= 4
    t = pf.read()
    assert t.column("t_ns").to_pylist() == list(range(48))  # segments in order, each row once
    assert t.schema.equals(TELEMETRY_SCHEMA)
    assert not (run.telemetry_dir / "h.parts").exists()
    assert not list(run.telemetry_dir.glob(".*.tmp"))


def test_compaction_after_a_crashed_compaction_keeps_both_once(tmp_path, monkeypatch):
    import powertrain.store.tables as tables

    monkeypatch.setattr(tables, "COMPACT_ROW_GROUP_ROWS", 5)
    run = RunDir(tmp_path / "run").create()
    _segments(run, 3, 4)
    finalize_run_streams(run.path)
    # new segments next to a compacted file (a sampler restarted on that host): appended after it
    w = StreamingTableWriter(run.telemetry_dir / "h", TELEMETRY_SCHEMA, flush_s=0, segment_s=0)
    w.append(_rows(4, t0=12))
    w.flush()
    (run.telemetry_dir / "h.parts" / "seg-000099.parquet").write_bytes(b"PAR1 torn")
    finalize_run_streams(run.path)
    assert pq.read_table(run.telemetry_file("h")).column("t_ns").to_pylist() == list(range(16))


def test_failed_compaction_leaves_segments_and_no_temporary(tmp_path):
    import pyarrow as pa

    run = RunDir(tmp_path / "run").create()
    _segments(run, 2, 3)
    bad = pa.table({"t_ns": pa.array([99], pa.int64())})  # a readable segment of another schema
    pq.write_table(bad, run.telemetry_dir / "h.parts" / "seg-000050.parquet")
    with pytest.raises(KeyError):
        finalize_run_streams(run.path)
    assert len(list((run.telemetry_dir / "h.parts").glob("seg-*.parquet"))) == 3  # nothing removed
    assert not run.telemetry_file("h").exists()
    assert not list(run.telemetry_dir.glob(".*.tmp"))
