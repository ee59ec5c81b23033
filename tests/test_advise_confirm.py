"""advise.confirm on recorded sweeps: the measured order against the advised (case) order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powertrain.advise.confirm import confirm
from powertrain.analyze import synthetic


def _sweep(root: Path, step_s: dict[str, list[float]]) -> Path:
    """A sweep folder whose runs (advised order = dict order) have these measured step times."""
    runs = []
    for i, (rid, steps) in enumerate(step_s.items()):
        synthetic.write_run(root / rid, hosts=1, devices_per_host=2, steps=len(steps), step_s=steps[0])
        _set_measured_steps(root / rid, steps)
        runs.append({"id": rid, "index": i, "status": "ok", "config": {}, "axes": {}})
    (root / "sweep.json").write_text(json.dumps({"name": "confirm", "runs": runs}))
    return root


def _set_measured_steps(run: Path, steps: list[float]) -> None:
    import pyarrow.parquet as pq

    for f in sorted((run / "events").glob("rank-*.parquet")):
        t = pq.read_table(f).to_pylist()
        measured = [e for e in t if e["kind"] == "step" and e["window"] == "measured"]
        for e, s in zip(measured, steps, strict=True):
            e["t_end_ns"] = e["t_start_ns"] + int(s * 1e9)
        pq.write_table(pq.read_table(f).from_pylist(t, schema=pq.read_schema(f)), f)


def test_agreeing_order_and_the_fastest_first(tmp_path):
    conf = confirm(_sweep(tmp_path / "s", {"a": [1.0, 1.0, 1.0], "b": [1.2, 1.2, 1.2], "c": [1.5, 1.5, 1.5]}))
    assert conf.agree and conf.top1_gap == pytest.approx(0.0)
    assert [r["measured"] for r in conf.rows] == [1, 2, 3]
    assert "measured order agrees with the advised order" in conf.lines()


def test_a_disagreement_is_reported_with_the_gap(tmp_path):
    conf = confirm(_sweep(tmp_path / "s", {"a": [1.25] * 3, "b": [1.0] * 3, "c": [1.5] * 3}))
    assert not conf.agree and conf.top1_gap == pytest.approx(0.25)
    assert any(x.startswith("DISAGREEMENT") for x in conf.lines())


def test_the_fastest_step_ignores_a_step_a_neighbour_slowed(tmp_path):
    steps = {"a": [1.0, 3.0, 3.0], "b": [1.1, 1.1, 1.1]}  # a's last two steps slowed by interference
    assert not confirm(_sweep(tmp_path / "m", steps)).agree  # the median sees a as slow
    assert confirm(_sweep(tmp_path / "f", steps), statistic="min").agree


def test_a_folder_without_sweep_json_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match="powertrain sweep"):
        confirm(tmp_path)


def test_a_repeated_sweep_counts_each_configuration_at_its_faster_run(tmp_path):
    first = _sweep(tmp_path / "1", {"a": [1.5] * 3, "b": [1.2] * 3})  # a's whole run slowed by a neighbour
    again = _sweep(tmp_path / "2", {"a": [1.0] * 3, "b": [1.3] * 3})
    alone = confirm(first, statistic="min")
    assert not alone.agree and alone.top1_gap == pytest.approx(0.25)
    both = confirm(first, statistic="min", repeats=[again])
    assert both.agree and both.top1_gap == pytest.approx(0.0)
    assert [r["runs"] for r in both.rows] == [2, 2]
    assert [r["step_s"] for r in both.rows] == pytest.approx([1.0, 1.2])
    assert "the faster of 2 runs" in both.lines()[0]


def test_a_repeat_of_another_sweep_is_noted(tmp_path):
    first = _sweep(tmp_path / "1", {"a": [1.0] * 3})
    other = _sweep(tmp_path / "2", {"z": [1.0] * 3})
    conf = confirm(first, repeats=[other])
    assert conf.rows[0]["runs"] == 1 and any("must run the same emitted sweep" in n for n in conf.notes)
