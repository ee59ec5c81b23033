"""The report's phase breakdown and pipeline view name a step as the analysis does, (repeat, number):
a step number a rank used again (an epoch loop's index restarting) must not merge the warm-up use of
the number with the measured one, nor two measured uses with each other."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from powertrain.analyze import synthetic
from powertrain.analyze.steps import event_repeats, measured_steps
from powertrain.report import build_report
from powertrain.report import figures as F
from powertrain.schema import EVENTS_SCHEMA
from powertrain.store import read_events


def _restarting_pipeline_run(path: Path) -> Path:
    """One rank, three warm-up steps 0..2, then three measured steps numbered 0..2 again; every
    forward / backward is a stage-0 call of micro-batch 0 inside a ``pipeline`` phase."""
    run = synthetic.write_run(path, devices_per_host=1, warmup=3, steps=3, step_s=1.0)
    rows = []
    for e in read_events(run).to_pylist():
        if e["step"] >= 3:
            e["step"] -= 3  # the second epoch's index starts at 0 again
        if e["kind"] in ("forward", "backward"):
            e.update(microbatch=0, attrs=json.dumps({"stage": 0}))
        rows.append(e)
        if e["kind"] == "step":
            rows.append({**e, "kind": "phase", "name": "pipeline", "tokens": None, "samples": None,
                         "t_end_ns": e["t_start_ns"] + 800_000_000})  # forward + backward
    f = run / "events" / "rank-0.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), f)
    return run


def test_event_repeats_follow_the_step_event_each_event_falls_in(tmp_path):
    ev = read_events(_restarting_pipeline_run(tmp_path / "r"))
    got = {(e["kind"], e["step"], e["t_start_ns"]): r for e, r in zip(ev.to_pylist(), event_repeats(ev), strict=True)}
    first, second = sorted(t for k, s, t in got if k == "forward" and s == 1)
    assert got[("forward", 1, first)] == 0 and got[("forward", 1, second)] == 1
    assert got[("step", 1, second)] == 1 and got[("phase", 1, second)] == 1
    sd = measured_steps(ev)
    assert sd is not None and sd.steps.tolist() == [0, 1, 2] and sd.repeats.tolist() == [1, 1, 1]


def test_repeated_step_numbers_do_not_merge_in_the_report(tmp_path, monkeypatch):
    run = _restarting_pipeline_run(tmp_path / "r")
    seen: dict[str, tuple] = {}

    def capture(name, fn):
        def wrapped(*args, **kw):
            seen[name] = args
            return fn(*args, **kw)
        monkeypatch.setattr(F, name, wrapped)

    capture("phase_breakdown", F.phase_breakdown)
    capture("pipeline_schedule", F.pipeline_schedule)
    html = build_report(run, tmp_path / "rep", ("svg",)).read_text()

    _labels, per_phase, *_ = seen["phase_breakdown"]
    # seconds per measured step: the measured uses' 0.3 s forwards, not the warm-up ones with the same numbers too
    assert per_phase["forward"] == pytest.approx([0.3])
    assert per_phase["backward"] == pytest.approx([0.5])

    rows, title = seen["pipeline_schedule"]
    (_label, boxes, span), = rows
    assert [(kind, mb) for kind, mb, _a, _b in boxes] == [("forward", 0), ("backward", 0)]  # one step's calls
    assert span == pytest.approx((0.0, 800.0))
    assert "measured step 2 (use 2 of that number)" in title
    # the stage table: one forward and one backward per measured step (the warm-up uses are not counted)
    assert "<tr><td>0</td><td>0</td><td>1</td><td>1</td>" in html
