"""`powertrain trace`: valid Chrome/Perfetto JSON with the right tracks on one time base."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from powertrain.analyze import synthetic
from powertrain.cli import app
from powertrain.trace import export_trace


def test_trace_tracks(tmp_path):
    run = synthetic.write_run(tmp_path / "run", hosts=2, devices_per_host=2, steps=3, link_bps=1e9,
                              base_w=300.0, amp_w=0.0)
    result = CliRunner().invoke(app, ["trace", str(run), "-o", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "t.json").read_text())
    evs = doc["traceEvents"]
    counters = [e for e in evs if e["ph"] == "C"]
    slices = [e for e in evs if e["ph"] == "X"]
    # one counter track per (host, device, field): 4 devices × measured fields, link bytes as a rate
    tracks = {(e["pid"], e["name"]) for e in counters}
    names = {n for _, n in tracks}
    assert {"gpu0 power_w", "gpu1 temp_c", "gpu0 clock_sm_mhz", "gpu1 link_tx_bytes/s"} <= names
    assert len({p for p, _ in tracks}) == 2  # one process per host
    assert not any("pcie" in n or "fan_pct" in n for n in names)  # null fields get no track
    assert all(len(e["args"]) == 1 for e in counters)
    rate = [e["args"]["link_tx_bytes"] for e in counters if e["name"] == "gpu0 link_tx_bytes/s"]
    assert abs(sum(rate) / len(rate) - 1e9) < 1e6
    power = [e["args"]["power_w"] for e in counters if e["name"] == "gpu0 power_w"]
    assert all(abs(p - 300.0) < 1e-9 for p in power)
    # one slice track per rank; steps with their phases nested inside
    assert {e["tid"] for e in slices} == {0, 1, 2, 3}
    steps = [e for e in slices if e["cat"] == "step" and e["tid"] == 0]
    assert len(steps) == 4 and steps[1]["args"]["window"] == "measured"
    fwd = next(e for e in slices if e["cat"] == "forward" and e["tid"] == 0)
    assert steps[0]["ts"] <= fwd["ts"] and fwd["ts"] + fwd["dur"] <= steps[0]["ts"] + steps[0]["dur"]
    thread_names = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"rank 0", "rank 3"} <= thread_names
    # one time base: telemetry starts at 0 and the first step starts 0.5 s later (the synthetic pad)
    assert min(e["ts"] for e in counters) == 0
    assert steps[0]["ts"] == 500_000


def test_trace_buckets_long_runs(tmp_path):
    run = synthetic.write_run(tmp_path / "run", hosts=1, devices_per_host=1, steps=3)
    counts = export_trace(run, tmp_path / "t.json", max_points=10)
    doc = json.loads((tmp_path / "t.json").read_text())
    power = [e for e in doc["traceEvents"] if e.get("name") == "gpu0 power_w"]
    assert 5 <= len(power) <= 11
    assert counts["X"] > 0


def test_trace_rejects_non_run(tmp_path):
    result = CliRunner().invoke(app, ["trace", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output
