"""`powertrain report`: a self-contained HTML page and figure files, for runs, sweeps and predictions."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from powertrain.analyze import synthetic
from powertrain.cli import app
from powertrain.report import build_report
from powertrain.report.figures import pareto_front
from powertrain.store.rundir import RunDir


def _images(html: str) -> list[str]:
    return re.findall(r'<img [^>]*src="([^"]+)"', html)


def test_run_report_is_self_contained_with_all_formats(tmp_path):
    run = synthetic.write_run(tmp_path / "run", hosts=1, devices_per_host=2, steps=3)
    result = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    html_path = tmp_path / "out" / "report.html"
    assert str(html_path) in result.output
    html = html_path.read_text()
    imgs = _images(html)
    assert len(imgs) >= 4 and all(src.startswith("data:image/png;base64,") for src in imgs)
    # no network: nothing fetched from http(s) or a file next to the page
    assert not re.search(r'(src|href)="(https?:|//|[^"d#])', html)
    for name in ("timelines", "step_time", "rank_heatmap"):
        for fmt in ("png", "svg", "pdf"):
            assert (tmp_path / "out" / "figures" / f"{name}.{fmt}").stat().st_size > 1000
    assert "SYNTHETIC" in html and "Data quality" in html


def test_cpu_run_states_what_is_not_measured(tmp_path):
    run = synthetic.write_run(tmp_path / "cpu", hosts=1, devices_per_host=1, kind="cpu", device_type="cpu",
                              fields=["cpu_util_pct", "cgroup_mem_bytes"], steps=2)
    html = build_report(run, tmp_path / "o", ("png",)).read_text()
    assert "not measured" in html.lower()
    assert "no power field on these devices" in html  # the why-null of power metrics


def test_sweep_report_marks_statuses(tmp_path):
    sweep = synthetic.write_sweep(tmp_path / "sweep")
    (sweep / "tp1pp1" / "profiles").mkdir()
    (sweep / "tp1pp1" / "profiles" / "rank-0-step-1.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "name": "c10d::allreduce_", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]}))
    html = build_report(sweep, None, ("png",)).read_text()
    assert "from profiler traces" in html
    assert (sweep / "report" / "report.html").is_file() and (sweep / "summary.parquet").is_file()
    for label in ("OOM", "FAILED", "REJECTED", "NOT RUN"):
        assert label in html
    for fig in ("perf_0_gpt3-tiny", "study_0_gpt3-tiny", "slots_temp_mean_c", "slots_power_mean_w", "throughput_energy",
                "rank_power_peak_w", "stage_breakdown"):
        assert f'id="fig-{fig}"' in html, fig
    assert all(s.startswith("data:image/png;base64,") for s in _images(html))


def test_prediction_is_labelled(tmp_path):
    run = RunDir(tmp_path / "pred").create()
    run.write({"kind": "prediction", "name": "pred", "status": "ok"})
    (run.path / "summary.json").write_text(json.dumps({"kind": "prediction", "run": "pred", "status": "ok",
                                                       "metrics": {"step_time_mean_s": 2.0}}))
    html = build_report(run.path, tmp_path / "o", ("png",)).read_text()
    assert "PREDICTION" in html


def test_report_on_missing_path_names_the_fix(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "neither a run directory" in result.output


@pytest.mark.parametrize(("pts", "front"), [
    ([(1, 1), (2, 2), (3, 1.5), (0.5, 0.5)], [3, 0, 2]),
    ([(1, 1), (1, 1)], [0, 1]),
])
def test_pareto_front(pts, front):
    assert pareto_front(pts) == front


def test_sweep_with_a_prediction_labels_it(tmp_path):
    sweep = tmp_path / "mixed"
    synthetic.write_run(sweep / "measured", hosts=1, devices_per_host=2, steps=2)
    pred = RunDir(sweep / "predicted").create()
    pred.write({"kind": "prediction", "name": "predicted", "status": "ok",
                "config": {"model": "gpt3-tiny", "layout": {"tp": 2}}})
    (pred.path / "summary.json").write_text(json.dumps({"kind": "prediction", "metrics": {
        "step_time_mean_s": 0.9, "tokens_per_s": 9000.0, "j_per_token": 0.4, "power_mean_w": 480.0,
        "power_peak_w": 560.0, "temp_peak_c": 60.0}}))
    html = build_report(sweep, tmp_path / "o", ("png",)).read_text()
    assert "contains PREDICTIONS" in html
    assert ">prediction<" in html  # the kind column of the sweep table
