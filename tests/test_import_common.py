"""The run-directory builder every importer uses, and the energy integration rule."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from powertrain.importers.common import RunBuilder, SourceFormatError, events_table, telemetry_table
from powertrain.importers.energy import energy_between_j, total_energy_j
from powertrain.schema import EVENTS_SCHEMA, TELEMETRY_SCHEMA
from powertrain.store import read_events, read_telemetry


def _builder(tmp_path):
    src = tmp_path / "src.csv"
    src.write_text("whatever\n")
    b = RunBuilder(format="test")
    b.add_source(src)
    t = np.array([0, 1, 2], dtype=np.int64) * 1_000_000_000 + 1_700_000_000_000_000_000
    b.add_telemetry(telemetry_table(t, "node0", "gpu0", {"power_w": np.array([100.0, np.nan, 300.0])}))
    b.add_telemetry(telemetry_table(t, "node1", ["gpu0", "gpu1", "gpu0"], {"temp_c": [50.0, None, 52.0]}))
    b.add_events(events_table([{"rank": 0, "kind": "step", "step": 1, "t_start_ns": int(t[0]), "t_end_ns": int(t[2]),
                                "attrs": {"energy_j": 400.0}}]))
    return b, src


def test_run_dir_is_standard_and_records_provenance(tmp_path):
    b, src = _builder(tmp_path)
    b.mapped["power"] = "power_w"
    b.drop("fan: no column")
    out = b.write(tmp_path / "run")
    info = json.loads((out / "run.json").read_text())
    assert info["kind"] == "import" and info["status"] == "ok"
    assert info["hosts"] == ["node0", "node1"]
    assert info["import"]["sources"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert info["import"]["mapped"] == {"power": "power_w"}
    assert info["import"]["dropped"] == ["fan: no column"]
    assert set(info["fields_supported"]) == {"power_w", "temp_c"}
    tel = read_telemetry(out)
    assert tel.schema.equals(TELEMETRY_SCHEMA, check_metadata=False)
    assert tel.num_rows == 6
    # unknown stays null, never 0
    assert tel.filter(tel.column("host").to_numpy(zero_copy_only=False) == "node0").column("power_w").to_pylist() == [
        100.0, None, 300.0]
    ev = read_events(out)
    assert ev.schema.equals(EVENTS_SCHEMA, check_metadata=False)
    assert json.loads(ev.column("attrs")[0].as_py()) == {"energy_j": 400.0}
    meta = json.loads((out / "telemetry" / "node1.meta.json").read_text())
    assert [d["device"] for d in meta["devices"]] == ["gpu0", "gpu1"]
    assert pq.read_table(out / "telemetry" / "node0.parquet").num_rows == 3


def test_a_failure_never_leaves_a_half_run_dir(tmp_path, monkeypatch):
    b, _ = _builder(tmp_path)
    calls = []

    def failing_write(table, path, **kw):
        calls.append(path)
        if len(calls) == 2:  # the second file: one is already on disk in the temporary folder
            raise OSError("disk full")
        return real_write(table, path, **kw)

    real_write = pq.write_table
    monkeypatch.setattr("powertrain.importers.common.pq.write_table", failing_write)
    with pytest.raises(OSError, match="disk full"):
        b.write(tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src.csv"]  # no hidden temporary sibling either


def test_refuses_to_overwrite_a_run(tmp_path):
    b, _ = _builder(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    with pytest.raises(FileExistsError, match="choose a new --out"):
        b.write(tmp_path / "run")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (b.write(empty) / "run.json").is_file()  # an existing empty folder is fine


def test_source_format_error_names_file_line_and_problem():
    e = SourceFormatError("/x/gpu.csv", 17, "expected 4 values, found 3")
    assert str(e) == "/x/gpu.csv:17: expected 4 values, found 3"
    assert (e.path, e.line) == ("/x/gpu.csv", 17)


def test_energy_is_the_trapezoid_integral_with_interpolated_window_edges():
    s = 1_000_000_000
    t = np.array([0, 10, 20]) * s
    p = np.array([100.0, 200.0, 200.0])  # ramp then flat
    e, why = energy_between_j(t, p, 0, 20 * s)
    assert e[0] == pytest.approx(1500.0 + 2000.0) and why is None
    # a window inside one interval: exact for linear power (5..15 s: ramp 150→200 then flat)
    e, _ = energy_between_j(t, p, 5 * s, 15 * s)
    assert e[0] == pytest.approx((150 + 200) / 2 * 5 + 200 * 5)
    # back-to-back windows add up to the window that spans them
    edges = np.array([0, 3, 7, 12, 20]) * s
    parts, _ = energy_between_j(t, p, edges[:-1], edges[1:])
    assert parts.sum() == pytest.approx(3500.0)
    # readings that stop short of an edge: the nearest reading is held up to 5 s (core.energy) ...
    e1, cov = total_energy_j(t, p, -3 * s, 24 * s)
    assert e1 == pytest.approx(3500.0 + 3 * 100.0 + 4 * 200.0) and cov == 20.0
    # ... and beyond that the energy is unknown (None), never an under-count
    e2, cov = total_energy_j(t, p, -10 * s, 30 * s)
    assert e2 is None and cov == 20.0
    parts, why = energy_between_j(t, p, edges[:-1], edges[1:], span=(-10 * s, 20 * s))
    assert np.isnan(parts).all() and why is not None and "start 10.0 s after" in why
    # unknown samples are skipped, not read as 0 W
    e3, _ = total_energy_j(t, np.array([100.0, np.nan, 300.0]), 0, 20 * s)
    assert e3 == pytest.approx(4000.0)


def test_set_window_and_data_quality_reach_run_json(tmp_path):
    b, _ = _builder(tmp_path)
    b.set_window(1_700_000_000_000_000_000, 1_700_000_002_000_000_000, "test start → stop")
    with pytest.raises(ValueError, match="ends before"):
        b.set_window(2, 1, "bad")
    b.count_quality("duplicate_readings_dropped", 3)
    b.count_quality("duplicate_readings_dropped", 2)
    b.device_quality("node0", "gpu0", duplicate_readings_dropped=1, edge_held_s=0.5)
    b.device_quality("node0", "gpu0", duplicate_readings_dropped=2, edge_held_s=0.7)
    info = json.loads((b.write(tmp_path / "run") / "run.json").read_text())
    assert info["window"] == {"t0_ns": 1_700_000_000_000_000_000, "t1_ns": 1_700_000_002_000_000_000,
                              "source": "test start → stop"}
    assert info["data_quality"]["readings"] == {"duplicate_readings_dropped": 5}
    assert info["data_quality"]["devices"] == [{"host": "node0", "device": "gpu0",
                                                "duplicate_readings_dropped": 3, "edge_held_s": 0.7}]
