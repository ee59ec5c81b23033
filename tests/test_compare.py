"""`powertrain compare`: run vs run (measured or predicted) and sweep vs sweep, with ratios."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from powertrain.analyze import synthetic
from powertrain.analyze.compare import compare
from powertrain.cli import app
from powertrain.store.rundir import RunDir


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    a = synthetic.write_run(root / "a", hosts=1, devices_per_host=2, steps=2, base_w=400.0, step_s=1.0)
    b = synthetic.write_run(root / "b", hosts=1, devices_per_host=2, steps=2, base_w=500.0, step_s=0.5)
    return a, b


def test_runs_side_by_side_with_ratios(two_runs):
    a, b = two_runs
    res = compare(a, b)
    rows = {r["metric"]: r for r in res["rows"]}
    assert rows["power_mean_w"]["ratio"] == pytest.approx(1.25, rel=1e-3)
    assert rows["step_time_mean_s"]["ratio"] == pytest.approx(0.5)
    assert rows["step_time_mean_s"]["better"] == "B"  # lower is better
    assert rows["tokens_per_s"]["ratio"] == pytest.approx(2.0) and rows["tokens_per_s"]["better"] == "B"
    assert "pcie_bytes_per_step" not in rows  # null on both sides: left out unless --all
    result = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "power_mean_w" in result.output and "1.250×" in result.output


def test_prediction_against_measurement(two_runs, tmp_path):
    a, _ = two_runs
    pred = RunDir(tmp_path / "pred").create()
    pred.write({"kind": "prediction", "name": "pred", "status": "ok"})
    (pred.path / "summary.json").write_text(json.dumps({
        "kind": "prediction", "run": "pred", "status": "ok", "metrics": {"step_time_mean_s": 1.1}}))
    result = CliRunner().invoke(app, ["compare", str(a), str(pred.path)])
    assert result.exit_code == 0, result.output
    assert "PREDICTION" in result.output and "1.100×" in result.output
    rows = compare(a, pred.path)["rows"]
    assert rows and all(r["better"] == "" for r in rows)  # B/A is the prediction's error, not a winner


def test_sweeps_matched_by_run(tmp_path):
    sa = synthetic.write_sweep(tmp_path / "sa")
    sb = tmp_path / "sb"
    shutil.copytree(sa, sb)
    shutil.rmtree(sb / "tp2pp1")
    res = compare(sa, sb)
    assert res["kind"] == "sweeps"
    ids = {p["id_a"] for p in res["pairs"]}
    assert "tp1pp1" in ids and "bad-heads" in ids
    pair = next(p for p in res["pairs"] if p["id_a"] == "tp1pp1")
    assert next(r for r in pair["rows"] if r["metric"] == "power_mean_w")["ratio"] == pytest.approx(1.0)
    # tp2pp1 is still listed in B's sweep.json, but as a run without its folder
    assert next(p for p in res["pairs"] if p["id_a"] == "tp2pp1")["status_b"] == "ok"
    result = CliRunner().invoke(app, ["compare", str(sa), str(sb)])
    assert result.exit_code == 0, result.output


def test_run_vs_sweep_is_an_error(two_runs, tmp_path):
    a, _ = two_runs
    sweep = synthetic.write_sweep(tmp_path / "s")
    result = CliRunner().invoke(app, ["compare", str(a), str(sweep)])
    assert result.exit_code == 2 and "two run directories or two sweep folders" in result.output


def test_sweeps_hide_metrics_null_on_both_sides_unless_all(tmp_path):
    sa = synthetic.write_sweep(tmp_path / "sa")
    sb = tmp_path / "sb"
    shutil.copytree(sa, sb)
    res = compare(sa, sb)
    rejected = next(p for p in res["pairs"] if p["id_a"] == "bad-heads")
    assert rejected["rows"] == []  # a rejected run has no metric on either side
    ok = next(p for p in res["pairs"] if p["id_a"] == "tp1pp1")
    assert {r["metric"] for r in ok["rows"]} >= {"step_time_mean_s", "power_mean_w"}
    full = compare(sa, sb, keep_null=True)
    rejected_all = next(p for p in full["pairs"] if p["id_a"] == "bad-heads")
    assert {r["metric"] for r in rejected_all["rows"]} >= {"step_time_mean_s", "power_mean_w"}
    assert all(r["a"] is None and r["b"] is None for r in rejected_all["rows"])

    short = CliRunner().invoke(app, ["compare", str(sa), str(sb)])
    assert short.exit_code == 0, short.output
    assert "(no metric on either side)" in short.output  # the pair stays visible, its null rows do not
    assert "hidden" in short.output and "--all" in short.output
    longer = CliRunner().invoke(app, ["compare", str(sa), str(sb), "--all"])
    assert longer.exit_code == 0, longer.output
    assert "(no metric on either side)" not in longer.output
    assert longer.output.count("\n") > short.output.count("\n")


def test_runs_hidden_metrics_are_counted(two_runs):
    a, b = two_runs
    result = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "null on both sides hidden" in result.output
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--all"])
    assert "pcie_bytes_per_step" in result.output and "hidden" not in result.output
