"""`powertrain report`: a self-contained HTML page and figure files, for runs, sweeps and predictions."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from powertrain.analyze import synthetic
from powertrain.cli import app
from powertrain.report import build_report
from powertrain.report.figures import TIME_AXIS_GID, pareto_front
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


def test_an_empty_formats_list_writes_the_page_and_no_figure_files(tmp_path):
    """`--formats ""` used to mean png quietly; it means what it says: the page (its figures embedded) only."""
    run = synthetic.write_run(tmp_path / "run", hosts=1, devices_per_host=1, steps=3)
    result = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "out"), "--formats", ""])
    assert result.exit_code == 0, result.output
    assert _images((tmp_path / "out" / "report.html").read_text())
    assert not [p for p in (tmp_path / "out").rglob("*") if p.suffix in (".png", ".svg", ".pdf")]


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


def test_imported_run_speaks_of_the_records_not_of_here(tmp_path):
    from pathlib import Path

    from powertrain.importers import import_sources

    src = Path(__file__).parent / "fixtures" / "zeus" / "zeus_monitor_sample_power_mW.csv"
    run = import_sources("zeus", [src], tmp_path / "run", tz="UTC")  # power only: no temperature, no clocks
    html = build_report(run, tmp_path / "o", ("png", "svg")).read_text()
    assert "not in the imported records" in html and "Imported run" in html
    assert "measured here" not in html and "this machine" not in html
    svg = (tmp_path / "o" / "figures" / "timelines.svg").read_text()
    assert "Not in the imported records" in svg and "the imported source did not record temp_c" in svg
    assert "not measured" not in svg.lower()


def test_timelines_label_the_time_axis_below_a_not_measured_panel(tmp_path):
    run = synthetic.write_run(tmp_path / "run", hosts=1, devices_per_host=2, fields=["util_pct", "mem_used_bytes"],
                              steps=3)
    build_report(run, tmp_path / "o", ("svg",))
    svg = (tmp_path / "o" / "figures" / "timelines.svg").read_text()
    axis = svg[svg.index(f'id="{TIME_AXIS_GID}"'):]
    axis = axis[:axis.index('id="matplotlib.axis_')]
    ticks = [t for t in re.findall(r"<text[^>]*>([^<]*)</text>", axis) if re.fullmatch(r"[\d.]+", t.strip())]
    assert len(ticks) >= 3 and "time since run start" in axis
    assert "Not measured in this run" in svg


def _visible_tick_labels(ax, axis: str = "x") -> list[str]:
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in ticks if t.get_visible() and t.get_text()]


def test_long_runs_get_a_readable_number_of_tick_labels():
    import matplotlib.pyplot as plt
    import numpy as np

    from powertrain.report import figures as F

    steps, ranks = list(range(10, 298)), list(range(64))
    fig = F.rank_heatmap(np.random.default_rng(0).random((64, 288)), ranks, steps, "288 steps")
    ax = fig.axes[0]
    xs, ys = _visible_tick_labels(ax), _visible_tick_labels(ax, "y")
    assert 5 <= len(xs) <= F.MAX_TICK_LABELS and xs[:3] == ["10", "30", "50"]  # every 20th step: round numbers
    # each label still sits on its own step's column
    assert all(str(steps[round(p)]) == t.get_text() for p, t in zip(ax.get_xticks(), ax.get_xticklabels(),
                                                                           strict=True))
    assert 5 <= len(ys) <= 32
    plt.close(fig)
    fig = F.step_distribution(np.ones(5), np.ones((40, 5)), list(range(100, 140)), "40 ranks")
    box = fig.axes[1]
    assert all(t.get_text() == str(100 + int(p) - 1) for p, t in zip(box.get_xticks(), box.get_xticklabels(),
                                                                      strict=True))
    assert len(_visible_tick_labels(box)) <= 16
    plt.close(fig)


def test_sweep_legends_do_not_cover_the_data():
    import matplotlib.pyplot as plt

    from powertrain.report import figures as F

    rows = [{"label": f"tp{t}pp{8 // t}", "status": "ok" if t != 4 else "oom", "model": "m", "kind": "measured",
             "temp_mean_c": 60.0 + t, "temp_peak_c": 70.0 + t, "power_mean_w": 400.0 + t, "power_peak_w": 600.0,
             "clock_sm_mean_mhz": 1700.0, "tokens_per_j": 3.0, "step_time_mean_s": 1.0 + t, "step_time_p99_s": 1.5 + t,
             "tokens_per_s": 1000.0 / t, "mfu": 0.3, "util_mean_pct": 90.0, "j_per_token": 0.2 * t}
            for t in (1, 2, 4, 8)]
    for fig in (F.study_panels("m", rows, "tokens_per_j", "tokens/J"), F.performance_panels("m", rows),
                F.throughput_energy(rows), F.phase_breakdown(["a", "b"], {"forward": [1, 2], "backward": [2, 3]},
                                                             "t", "x")):
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
        assert legends
        for leg in legends:
            box = leg.get_window_extent(r)
            for ax in fig.axes:
                assert not box.overlaps(ax.get_window_extent(r)), (fig.axes[0].get_title(), leg)
        plt.close(fig)


def test_self_phases_take_nested_intervals_out_of_their_parent():
    import pyarrow as pa

    from powertrain.analyze.steps import self_phases
    from powertrain.schema import EVENTS_SCHEMA

    def ev(kind, a, b, name=None, rank=0, step=1):
        return {"rank": rank, "kind": kind, "name": name, "step": step, "t_start_ns": a, "t_end_ns": b}

    rows = [ev("step", 0, 100), ev("phase", 10, 90, "pipeline"), ev("forward", 10, 30), ev("backward", 40, 70),
            ev("comm", 45, 50), ev("optimizer", 90, 100),
            ev("phase", 0, 50, "pipeline", rank=1),  # a rank whose pipeline was not split by stage
            ev("forward", 0, 5, step=0)]  # not a selected step
    table = pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)
    got = {(p["rank"], p["kind"]): round(p["seconds"] * 1e9) for p in self_phases(table, {1})}
    assert got == {(0, "pipeline bubble + p2p wait"): 30, (0, "forward"): 20, (0, "backward"): 25, (0, "comm"): 5,
                   (0, "optimizer"): 10, (1, "pipeline"): 50}
