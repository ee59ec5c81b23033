"""Which steps are measured: the marks when a run has any, else every step less the declared warm-up."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from powertrain.analyze import synthetic
from powertrain.analyze.steps import measured_steps, step_stats
from powertrain.analyze.summary import summarize_run
from powertrain.schema import EVENTS_SCHEMA


def _unmarked(ev: pa.Table) -> pa.Table:
    return ev.set_column(ev.schema.get_field_index("window"), "window", pa.nulls(ev.num_rows, pa.string()))


def _two_ranks(unmarked: bool) -> pa.Table:
    # rank 1 starts its steps later than rank 0 and is written first: order on disk must not matter
    evs = [synthetic.events_table(1, warmup=2, steps=4, start_offset_s=0.3),
           synthetic.events_table(0, warmup=2, steps=4)]
    ev = pa.concat_tables(evs)
    return _unmarked(ev) if unmarked else ev


def test_unmarked_steps_are_all_measured_by_default():
    sd = measured_steps(_two_ranks(unmarked=True))
    assert sd is not None and sd.steps.tolist() == [0, 1, 2, 3, 4, 5]
    assert sd.ranks == [0, 1] and "every step counts as measured" in sd.window_rule
    m, _ = step_stats(sd)
    assert m["step_time_mean_s"] == pytest.approx(1.0) and m["tokens_per_s"] == pytest.approx(2 * 1024)


def test_declared_warmup_drops_the_first_steps_of_each_rank_by_start_time():
    ev = _two_ranks(unmarked=True)
    # rank 0 numbers its steps from 100 (a resumed loop): the warm-up is its first two, not 0 and 1
    r0 = pc.equal(ev["rank"], 0)
    ev = ev.set_column(ev.schema.get_field_index("step"), "step",
                       pc.if_else(r0, pc.add(ev["step"], 100), ev["step"]))
    sd = measured_steps(ev, warmup_steps=2)
    assert sd is not None
    assert sd.steps.tolist() == [2, 3, 4, 5, 102, 103, 104, 105]
    assert "after the first 2 of each rank" in sd.window_rule
    assert measured_steps(ev, warmup_steps=6) is None  # every step is warm-up: nothing measured


def test_marked_runs_keep_their_marks_whatever_the_declared_warmup():
    # the built-in trainer's runs mark every step: the rule must not touch them
    ev = _two_ranks(unmarked=False)
    for warmup in (None, 0, 3):
        sd = measured_steps(ev, warmup_steps=warmup)
        assert sd is not None and sd.steps.tolist() == [2, 3, 4, 5] and sd.window_rule is None
    # one marked step is enough: unmarked ones are then outside the protocol, as before
    rows = ev.to_pylist()
    for r in rows:
        if r["window"] == "warmup":
            r["window"] = None
    rows[0]["window"] = "warmup"
    sd = measured_steps(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA))
    assert sd is not None and sd.steps.tolist() == [2, 3, 4, 5]


def test_bad_declared_warmup_is_a_clear_error():
    with pytest.raises(ValueError, match=r"run\.json's warmup_steps"):
        measured_steps(_two_ranks(unmarked=True), warmup_steps=-1)


def test_summary_uses_run_json_warmup_and_says_which_rule(tmp_path):
    path = synthetic.write_run(tmp_path / "r", devices_per_host=2, warmup=1, steps=4)
    marked = summarize_run(path, probe_cpu_peak=False)
    for f in (path / "events").glob("rank-*.parquet"):
        pq.write_table(_unmarked(pq.read_table(f)), f)
    info = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**info, "warmup_steps": 1}))
    s = summarize_run(path, probe_cpu_peak=False)
    assert s["window"]["measured_steps"] == marked["window"]["measured_steps"] == 4
    assert s["metrics"]["step_time_mean_s"] == marked["metrics"]["step_time_mean_s"]
    assert any("after the first 1 of each rank" in n for n in s["notes"])
    # marked steps: no note about the rule (the power coverage notes may name the field's averaging window)
    assert not any("carries a window" in n for n in marked["notes"])
