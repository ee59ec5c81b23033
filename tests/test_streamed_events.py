"""Step events read where they lie: the streamed analysis, report and trace give what the one-table
definitions give, in chunks of any size; negative counts are kept out and counted; a rank without its
events file is named, and tokens/s never divides by part of the job."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from powertrain.analyze import events as events_mod
from powertrain.analyze import steps
from powertrain.analyze.events import RunEvents
from powertrain.analyze.synthetic import T0_NS, events_table, step_events, write_run
from powertrain.schema import EVENTS_SCHEMA
from powertrain.store.tables import read_events

S = 1_000_000_000


def _rows(run: Path, rank: int) -> list[dict]:
    return pq.read_table(run / "events" / f"rank-{rank}.parquet").to_pylist()


def _write(run: Path, rank: int, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), run / "events" / f"rank-{rank}.parquet")


def _messy_run(tmp_path: Path) -> Path:
    """Two ranks with what the definitions care about: an epoch loop's reused numbers, impossible steps, ties
    at equal starts, overlapping communication, a pipeline phase holding stage calls, rows out of order, and
    one rank left in segments whose compacted file holds the first half."""
    run = write_run(tmp_path / "messy", devices_per_host=2, warmup=2, steps=8)
    for k in range(2):
        rows = _rows(run, k)
        for e in rows:  # steps 0..4 then 0..4 again: the second epoch reuses the numbers
            if e["step"] is not None and e["step"] >= 5:
                e["step"] -= 5
        st = [e for e in rows if e["kind"] == "step"]
        st[3]["t_end_ns"] = st[3]["t_start_ns"] - 5  # negative duration: dropped
        rows.append({**st[6], "t_end_ns": st[6]["t_end_ns"] - 1000})  # a tie at the same start and number
        for name in ("allreduce", "allgather"):  # equal intervals: the files' order decides
            rows.append({**st[7], "kind": "comm", "name": name, "t_start_ns": st[7]["t_start_ns"] + S // 10,
                         "t_end_ns": st[7]["t_start_ns"] + 9 * S // 10, "tokens": None, "samples": None})
        a = st[8]["t_start_ns"]
        rows.append({**st[8], "kind": "phase", "name": "pipeline", "t_start_ns": a, "t_end_ns": a + 7 * S // 10,
                     "tokens": None, "samples": None})
        for mb in range(2):
            for j, kind in enumerate(("forward", "backward")):
                x = a + S // 100 + (mb * 2 + j) * 15 * S // 100
                rows.append({**st[8], "kind": kind, "name": f"stage{k}.mb{mb}", "microbatch": mb,
                             "attrs": json.dumps({"stage": k}), "t_start_ns": x, "t_end_ns": x + S // 10,
                             "tokens": None, "samples": None})
        rows.append({**st[4], "kind": "phase", "name": "data", "mem_peak_bytes": 1234 + k, "tokens": None,
                     "samples": None})
        random.Random(k).shuffle(rows)
        _write(run, k, rows)
    rows = _rows(run, 1)
    (run / "events" / "rank-1.parquet").unlink()
    parts = run / "events" / "rank-1.parts"
    parts.mkdir()
    half = len(rows) // 2
    _write(run, 1, rows[:half])
    pq.write_table(pa.Table.from_pylist(rows[half:half + 7], schema=EVENTS_SCHEMA), parts / "seg-000000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[half + 7:] + rows[half:half + 3], schema=EVENTS_SCHEMA),
                   parts / "seg-000001.parquet")
    return run


def _fields(sd: steps.StepData | None) -> dict:
    assert sd is not None
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in vars(sd).items()}


def test_steps_from_the_files_are_the_steps_of_the_one_table(tmp_path, monkeypatch):
    run = _messy_run(tmp_path)
    table = read_events(run)
    rank_map = json.loads((run / "run.json").read_text())["rank_map"]
    whole = _fields(steps.measured_steps(table, rank_map))
    with RunEvents.open(run) as ev:
        assert _fields(steps.measured_steps(ev, rank_map)) == whole
        monkeypatch.setattr(events_mod, "CHUNK_ROWS", 3)  # the walk in chunks of three rows
        assert _fields(steps.measured_steps(ev, rank_map)) == whole
        assert steps.screen_steps(ev)[1] == steps.screen_steps(table)[1]
        assert ev.mem_peak_max() == 1235 and ev.ranks_seen() == 2 and ev.num_rows == table.num_rows
    assert whole["dropped"]["count"] == 2 and whole["repeated"]["count"] > 0
    assert any(p["kind"] == "pipeline bubble + p2p wait" for p in whole["phases"])


def test_phase_walk_restarts_only_where_no_earlier_event_can_contain_a_later_one(monkeypatch):
    # one long phase over every step (nothing can be cut inside it), then steps with nested phases
    ev = pa.concat_tables([events_table(0, warmup=0, steps=30), events_table(1, warmup=0, steps=30, step_s=0.5)])
    rows = ev.to_pylist()
    rows.append({**rows[0], "kind": "phase", "name": "epoch", "t_end_ns": rows[0]["t_start_ns"] + 20 * S})
    rows.append({**rows[1], "kind": "phase", "name": "epoch", "t_start_ns": rows[1]["t_start_ns"] + 25 * S,
                 "t_end_ns": rows[1]["t_start_ns"] + 25 * S})  # empty interval at a step's start
    table = pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)
    every = set(range(30))
    whole = steps.self_phases(table, every)
    monkeypatch.setattr(events_mod, "CHUNK_ROWS", 2)
    assert steps.self_phases(table, every) == whole
    got = {(p["rank"], p["kind"]): p["seconds"] for p in whole}
    assert got[(0, "epoch (rest)")] == pytest.approx(0.0, abs=1e-9)  # its 20 s are all in its children
    assert got[(0, "forward")] == pytest.approx(30 * 0.3)


def test_screen_of_the_files_is_the_screen_of_the_table():
    big = 2**62
    rows = [{"rank": 0, "kind": "step", "step": 0, "t_start_ns": -big, "t_end_ns": big},
            {"rank": 0, "kind": "step", "step": 1, "t_start_ns": T0_NS, "t_end_ns": T0_NS + 1},
            {"rank": 1, "kind": "step", "step": 1, "t_start_ns": T0_NS, "t_end_ns": T0_NS},
            {"rank": 1, "kind": "step", "step": 2, "t_start_ns": T0_NS + 7 * 86400 * S, "t_end_ns": T0_NS},
            {"rank": 0, "kind": "step", "step": 3, "t_start_ns": T0_NS, "t_end_ns": T0_NS + 7 * 86400 * S},
            {"rank": 0, "kind": "step", "step": 4, "t_start_ns": T0_NS, "t_end_ns": T0_NS + 7 * 86400 * S + 1},
            {"rank": 0, "kind": "forward", "step": 1, "t_start_ns": T0_NS + 5, "t_end_ns": T0_NS}]
    table = pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)
    kept, dropped = steps.screen_steps(table)
    with RunEvents.from_table(table) as ev:
        assert steps.screened(ev) == dropped
    assert dropped["reasons"] == {"negative duration": 1, "zero duration": 1, "longer than 7 days": 2}
    assert kept["step"].to_pylist() == [1, 3, 1]


def test_negative_counts_are_kept_out_counted_and_noted(tmp_path):
    from powertrain.analyze.summary import summarize_run

    run = write_run(tmp_path / "r", devices_per_host=2, warmup=0, steps=4)
    good = summarize_run(run, probe_cpu_peak=False)["metrics"]["tokens_per_s"]
    rows = _rows(run, 0)
    next(e for e in rows if e["kind"] == "step" and e["step"] == 2)["tokens"] = -4096
    _write(run, 0, rows)
    with RunEvents.open(run) as ev:
        sd = steps.measured_steps(ev, json.loads((run / "run.json").read_text())["rank_map"])
        assert sd is not None and np.isnan(sd.tokens[2]) and not np.isnan(sd.tokens[[0, 1, 3]]).any()
        assert not (sd.tokens < 0).any()  # never a negative mean
    s = summarize_run(run, probe_cpu_peak=False)
    neg = s["data_quality"]["dropped_steps"]["negative_counts"]
    assert neg == {"count": 1, "fields": {"tokens": 1}, "first": "rank 0 step 2: tokens -4096"}
    assert good is not None and s["metrics"]["tokens_per_s"] is None
    assert "below zero" in s["why_null"]["tokens_per_s"]
    assert any("count below zero" in n for n in s["notes"]), s["notes"]


def test_a_rank_without_its_events_file_is_named_and_tokens_are_not_halved(tmp_path):
    from powertrain.analyze.summary import summarize_run

    run = write_run(tmp_path / "dp", devices_per_host=2, warmup=0, steps=4)
    assert summarize_run(run, probe_cpu_peak=False)["metrics"]["tokens_per_s"] is not None
    (run / "events" / "rank-1.parquet").unlink()
    s = summarize_run(run, probe_cpu_peak=False)
    assert s["metrics"]["tokens_per_s"] is None and s["metrics"]["step_time_mean_s"] is not None
    assert "rank 1 of the rank map recorded no measured step" in s["why_null"]["tokens_per_s"]
    note = next(n for n in s["notes"] if "data_quality.missing_ranks" in n)
    assert "events/rank-1.parquet" in note
    # tensor parallel: rank 1 shares rank 0's replica, whose tokens rank 0 still counts
    run = write_run(tmp_path / "tp", devices_per_host=2, warmup=0, steps=4, layout={"tp": 2})
    full = summarize_run(run, probe_cpu_peak=False)["metrics"]["tokens_per_s"]
    (run / "events" / "rank-1.parquet").unlink()
    s = summarize_run(run, probe_cpu_peak=False)
    assert s["metrics"]["tokens_per_s"] == pytest.approx(full)
    assert any("replicas' other ranks" in n for n in s["notes"])
    with RunEvents.open(run) as ev:
        sd = steps.measured_steps(ev, json.loads((run / "run.json").read_text())["rank_map"])
        assert sd is not None and sd.missing == {"count": 1, "ranks": [1], "no_events": [1], "replicas_unknown": False}


def _no_events_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make reading the events as one table (store.tables.read_stream of an events stream) an error."""
    from powertrain.store import tables

    real = tables.read_stream

    def guarded(base: Path, schema: pa.Schema) -> pa.Table:
        if schema is EVENTS_SCHEMA:
            raise AssertionError(f"{base}: every event loaded as one table")
        return real(base, schema)

    monkeypatch.setattr(tables, "read_stream", guarded)


def test_trace_and_report_read_no_events_table(tmp_path, monkeypatch):
    """The trace is written, and the report's step figures drawn, from queries; a trace in chunks of two
    rows is the trace in one."""
    from powertrain.analyze import load_summary
    from powertrain.report.build import build_report
    from powertrain.trace.perfetto import export_trace

    run = _messy_run(tmp_path)
    n_events = read_events(run).num_rows
    export_trace(run, tmp_path / "one.json")
    load_summary(run)  # written here: the report reads it
    _no_events_table(monkeypatch)
    monkeypatch.setattr(events_mod, "CHUNK_ROWS", 2)
    export_trace(run, tmp_path / "chunks.json")
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "chunks.json").read_bytes()
    trace = json.loads((tmp_path / "one.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in trace) == n_events
    page = build_report(run, tmp_path / "rep", formats=("png",)).read_text()
    assert "Per pipeline stage" in page and "fig-phases" in page and "fig-pipeline_schedule" in page


def test_summarize_reads_no_events_table(tmp_path, monkeypatch):
    from powertrain.analyze.families import context
    from powertrain.analyze.summary import summarize_run

    if hasattr(context, "read_events"):
        pytest.skip("families.context still reads the events as one table (open them as RunEvents)")
    run = _messy_run(tmp_path)
    whole = summarize_run(run, probe_cpu_peak=False)
    _no_events_table(monkeypatch)
    monkeypatch.setattr(events_mod, "CHUNK_ROWS", 2)
    assert summarize_run(run, probe_cpu_peak=False)["phases"] == whole["phases"]


def test_step_events_helper_lays_out_events_table_rows():
    assert step_events(3, 0, 4, warmup=2, period_s=1.0).equals(
        events_table(3, warmup=2, steps=2, step_s=1.0, tokens=8192, samples=4))


def test_long_runs_shade_step_windows_as_bands():
    from powertrain.report.figures import MAX_SHADED_SPANS, merge_spans

    spans = [(i * 2.0, i * 2.0 + 1.98, "warmup" if i < 5 else "measured") for i in range(43_200)]
    bands = merge_spans(spans)
    assert len(bands) <= MAX_SHADED_SPANS
    assert [(b[2], b[3]) for b in bands] == [("warmup", 5), ("measured", 43_195)]
    assert merge_spans(spans[:3], pixels=10**9) == [(a, b, w, 1) for a, b, w in spans[:3]]  # far apart: kept
