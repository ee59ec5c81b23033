"""Analysis streams telemetry: the same figures whether a run is compacted or left in segments, and
whatever its row groups or the size of the chunks it is read in."""

import json

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

import powertrain.analyze.telemetry as tel
from powertrain.analyze import device_pass
from powertrain.analyze.summary import summarize_run
from powertrain.analyze.synthetic import write_run
from powertrain.schema import TELEMETRY_SCHEMA
from powertrain.store import RunDir
from powertrain.store.tables import StreamingTableWriter, finalize_run_streams, telemetry_files

VOLATILE = {"generated_at", "computed_at", "summarized_at", "powertrain_version", "path"}


def _canon(path):
    s = summarize_run(path, probe_cpu_peak=False)
    return json.dumps({k: v for k, v in s.items() if k not in VOLATILE}, sort_keys=True, default=str)


def _as_segments(src, dst, rows_per_segment):
    """Copy run ``src`` to ``dst`` with its telemetry cut into sampler segments (as a killed sampler leaves it)."""
    import shutil

    shutil.copytree(src, dst)
    for f in list((dst / "telemetry").glob("*.parquet")):
        table = pq.read_table(f)
        f.unlink()
        w = StreamingTableWriter(f.with_suffix(""), TELEMETRY_SCHEMA, flush_s=0, segment_s=0)
        for off in range(0, table.num_rows, rows_per_segment):
            w.append(table.slice(off, rows_per_segment).to_pylist())
            w.flush()
    return dst


def test_segments_and_compacted_file_give_the_same_summary(tmp_path, monkeypatch):
    src = write_run(tmp_path / "run", hosts=2, devices_per_host=2, steps=8, step_s=0.5, rate_hz=20.0)
    whole = _canon(src)
    seg = _as_segments(src, tmp_path / "seg", rows_per_segment=37)
    assert len(telemetry_files(seg)) > 4 and not list((seg / "telemetry").glob("*.parquet"))
    (seg / "telemetry" / "node0.parts" / "seg-009999.parquet").write_bytes(b"PAR1 torn")  # skipped
    assert _canon(seg) == whole
    monkeypatch.setattr("powertrain.store.tables.COMPACT_ROW_GROUP_ROWS", 50)  # many row groups
    finalize_run_streams(seg)
    assert pq.ParquetFile(seg / "telemetry" / "node0.parquet").num_row_groups > 3
    assert _canon(seg) == whole


def test_cluster_series_is_the_same_in_small_chunks(tmp_path, monkeypatch):
    src = write_run(tmp_path / "run", hosts=1, devices_per_host=4, steps=6, step_s=1.0, rate_hz=10.0)
    con = duckdb.connect()
    try:
        tel.open_telemetry(con, src)
        w0, w1 = tel.span(con)
        whole = tel.device_mean_series(con, w0, w1, 100_000_000)
        monkeypatch.setattr(tel, "SERIES_CHUNK_ROWS", 7)
        chunked = tel.device_mean_series(con, w0, w1, 100_000_000)
    finally:
        tel.release(con)
        con.close()
    assert whole.num_rows > 50
    assert chunked.equals(whole)


def test_device_pass_gives_the_same_summary_in_one_second_chunks(tmp_path, monkeypatch):
    """Chunks of whole seconds, each device's state carried: energies, counters, gaps, steady times
    and quantiles are those of one pass over everything, to the last bit."""
    src = write_run(tmp_path / "run", hosts=2, devices_per_host=3, steps=12, step_s=0.7, straggle_s=0.01,
                    rate_hz=20.0)
    whole = _canon(src)
    monkeypatch.setattr(device_pass, "PASS_CHUNK_ROWS", 1)  # one second per chunk
    con = duckdb.connect()
    try:
        tel.open_telemetry(con, src)
        w0, w1 = tel.span(con)
        assert len(list(device_pass.time_chunks(con, "tel", None, None))) >= (w1 - w0) // 1_000_000_000
    finally:
        tel.release(con)
        con.close()
    assert _canon(src) == whole


def test_exact_quantile_keeps_only_its_tail():
    rng = np.random.default_rng(3)
    x = rng.normal(400, 100, 5001)
    for q in (0.99, 0.01):
        qt = device_pass._Quantile(x.size, q)
        for part in np.array_split(x, 17):
            qt.tail.add(part)
        assert qt.tail.values.size <= 0.011 * x.size + 2
        assert qt.value() == pytest.approx(float(np.quantile(x, q)), rel=1e-12)


def test_run_without_telemetry_opens_empty(tmp_path):
    run = RunDir(tmp_path / "run").create()
    con = duckdb.connect()
    try:
        assert tel.open_telemetry(con, run.path) == 0
        assert tel.span(con) is None
        assert list(device_pass.time_chunks(con, "tel", None, None)) == []
    finally:
        tel.release(con)
        con.close()
