"""``powertrain import``: what a user sees — a summary, one red line on bad input (exit 2), joined imports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.store import read_events, read_telemetry

FIX = Path(__file__).parent / "fixtures"
runner = CliRunner()


def _smi(path: Path, seconds: int = 30) -> Path:
    lines = ["timestamp, index, power.draw [W], temperature.gpu"]
    for s in range(seconds * 10):
        for g in range(2):
            lines.append(f"2024/05/01 10:{s // 600:02d}:{(s // 10) % 60:02d}.{(s % 10) * 100:03d}, {g}, 500.0 W, 70")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_import_prints_a_summary_and_writes_a_run(tmp_path):
    res = runner.invoke(app, ["import", "mlperf", str(FIX / "mlperf" / "llama2-70b-lora_1node_8gpu_excerpt"),
                              "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "imported 2 source(s) as mlperf" in res.output
    assert "warning:" in res.output and "power_measurement_stop" in res.output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["kind"] == "import"


def test_bad_input_is_one_red_line_and_exit_2(tmp_path):
    bad = tmp_path / "gpu.csv"
    bad.write_text("timestamp, power.draw [W]\n2024/01/01 00:00:00.000, 10 W, 5\n")
    res = runner.invoke(app, ["import", "nvsmi", str(bad), "--out", str(tmp_path / "run"), "--tz", "UTC"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {bad}:2: expected 2 comma-separated values")
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.csv"]


def test_unknown_format_and_existing_out_are_clear(tmp_path):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\n")
    res = runner.invoke(app, ["import", "auto", str(odd), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "name it: powertrain import KIND" in res.output
    res = runner.invoke(app, ["import", "csv", str(odd), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "unknown import kind 'csv'" in res.output
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    res = runner.invoke(app, ["import", "zeus", str(FIX / "zeus" / "zeus_monitor_sample_power_mW.csv"),
                              "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "already exists" in res.output


def test_hta_cross_check_asks_for_the_extra_when_missing(tmp_path):
    try:
        import hta  # noqa: F401
        pytest.skip("HolisticTraceAnalysis is installed here")
    except ImportError:
        pass
    res = runner.invoke(app, ["import", "kineto", str(FIX / "kineto"), "--out", str(tmp_path / "run"), "--hta"])
    assert res.exit_code == 2
    assert "pip install 'powertrain[kineto]'" in res.output


def test_telemetry_and_step_log_join_into_one_run(tmp_path):
    smi = _smi(tmp_path / "gpu.csv")
    log = tmp_path / "train.log"
    log.write_text("".join(
        f" [2024-05-01 10:00:{s:02d}] iteration {i:8d}/     100 | elapsed time per iteration (ms): 1000.0 | "
        f"global batch size:     8 | lm loss: 1.0E+00 |\n" for i, s in enumerate(range(5, 15), start=1)))
    res = runner.invoke(app, ["import", "auto", str(smi), str(log), "--out", str(tmp_path / "run"), "--tz", "UTC"])
    assert res.exit_code == 0, res.output
    tel, ev = read_telemetry(tmp_path / "run"), read_events(tmp_path / "run")
    assert sorted(set(tel.column("device").to_pylist())) == ["gpu0", "gpu1"]
    assert ev.column("kind").to_pylist() == ["step"] * 10
    # same clock: the steps lie inside the telemetry span
    assert tel.column("t_ns")[0].as_py() <= ev.column("t_start_ns")[0].as_py()
    assert ev.column("t_end_ns")[-1].as_py() <= tel.column("t_ns")[-1].as_py()
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["import"]["format"] == "nvsmi+framework_log"
    assert info["detected_events"] == []  # a step log came along: no guessing from power
    assert len(info["import"]["sources"]) == 2


def _nemo_log(path: Path, steps: int = 5) -> Path:
    path.write_text("".join(f"Training epoch 0, iteration {i}/{steps} | global_batch_size: 8 | global_step: {i} | "
                            f"reduced_train_loss: 10.0 | train_step_timing in s: 2.0\n" for i in range(steps)))
    return path


def test_log_without_times_needs_anchor_and_lands_on_the_gpu_csv(tmp_path):
    smi = _smi(tmp_path / "gpu.csv")  # 2024-05-01 10:00:00 → 10:00:30 UTC
    log = _nemo_log(tmp_path / "train.log")
    res = runner.invoke(app, ["import", "auto", str(smi), str(log), "--out", str(tmp_path / "run"), "--tz", "UTC"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no wall-clock times" in lines[0] and "--anchor TIME" in lines[0]
    assert not (tmp_path / "run").exists()
    res = runner.invoke(app, ["import", "auto", str(smi), str(log), "--out", str(tmp_path / "run"), "--tz", "UTC",
                              "--anchor", "2024-05-01 10:00:05", "--warmup-steps", "1"])
    assert res.exit_code == 0, res.output
    assert "warning" not in res.output  # the steps lie inside the GPU CSV
    assert "measured window: 4 step(s) from step 1 (1 warm-up)" in res.output
    ev = read_events(tmp_path / "run")
    steps = [r for r in ev.to_pylist() if r["kind"] == "step"]
    assert steps[0]["t_start_ns"] == 1714557605 * 10**9  # 2024-05-01T10:00:05Z, not 1970
    from powertrain.analyze.summary import summarize_run

    s = summarize_run(tmp_path / "run", probe_cpu_peak=False)
    assert s["metrics"]["step_time_mean_s"] == pytest.approx(2.0)
    assert s["metrics"]["energy_integral_j"] == pytest.approx(2 * 500.0 * 8.0, rel=0.02)  # 2 GPUs × 500 W × 8 s


def test_anchor_outside_the_gpu_csv_is_a_warning_and_bad_anchor_one_line(tmp_path):
    smi = _smi(tmp_path / "gpu.csv")
    log = _nemo_log(tmp_path / "train.log")
    res = runner.invoke(app, ["import", "auto", str(smi), str(log), "--out", str(tmp_path / "run"), "--tz", "UTC",
                              "--anchor", "2024-05-01T11:00:00"])
    assert res.exit_code == 0 and "not inside the telemetry" in res.output and "check --anchor" in res.output
    res = runner.invoke(app, ["import", "auto", str(log), "--out", str(tmp_path / "run2"), "--anchor", "noon"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--anchor 'noon' is neither ISO-8601" in lines[0]


def test_step_options_for_sources_without_steps_are_refused(tmp_path):
    smi = _smi(tmp_path / "gpu.csv")
    for opt in (["--warmup-steps", "2"], ["--anchor", "1714557600"]):
        res = runner.invoke(app, ["import", "nvsmi", str(smi), "--out", str(tmp_path / "run"), "--tz", "UTC", *opt])
        assert res.exit_code == 2 and f"{opt[0]} does not apply to nvsmi sources" in res.output, res.output


def test_help_says_how_to_pick_the_anchor():
    res = runner.invoke(app, ["import", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "--anchor" in text and "GPU power first rises" in text and "--warmup-steps" in text


def test_window_option_is_the_runs_window(tmp_path):
    import datetime as dt

    smi = _smi(tmp_path / "gpu.csv", seconds=30)  # 2 GPUs at 500 W, 10:00:00.0 → 10:00:29.9 UTC
    t0 = dt.datetime(2024, 5, 1, 10, 0, 10, tzinfo=dt.UTC).timestamp()
    res = runner.invoke(app, ["import", "nvsmi", str(smi), "--tz", "UTC", "--out", str(tmp_path / "run"),
                              "--window", f"2024-05-01T10:00:10,{t0 + 10:.0f}"])
    assert res.exit_code == 0, res.output
    w = json.loads((tmp_path / "run" / "run.json").read_text())["window"]
    assert w == {"t0_ns": round(t0 * 1e9), "t1_ns": round((t0 + 10) * 1e9), "source": "user --window"}
    from powertrain.analyze.summary import summarize_run

    m = summarize_run(tmp_path / "run", probe_cpu_peak=False)["metrics"]
    assert m["energy_j"] == pytest.approx(2 * 500.0 * 10.0, rel=1e-9)  # 10 s of the 30, both GPUs


@pytest.mark.parametrize(("value", "msg"), [("2024-05-01T10:00:10", "START,END"), ("5,4", "before 2001"),
                                            ("1714557620,1714557610", "ends before it starts"),
                                            ("yesterday,today", "--window 'yesterday'")])
def test_bad_window_is_one_red_line(tmp_path, value, msg):
    smi = _smi(tmp_path / "gpu.csv", seconds=2)
    res = runner.invoke(app, ["import", "nvsmi", str(smi), "--tz", "UTC", "--out", str(tmp_path / "run"),
                              "--window", value])
    assert res.exit_code == 2 and msg in res.output, res.output
    assert not (tmp_path / "run").exists()


def test_window_replaces_a_declared_one_and_keeps_it(tmp_path):
    from powertrain.importers.registry import build, parse_window

    f = tmp_path / "w.csv"
    f.write_text("start_time,window_name,elapsed_time,gpu0_energy\n1714557600.0,a,2.0,300.0\n1714557602.0,b,2.0,310.0\n")
    b = build("zeus", [f], window_ns=parse_window("1714557601,1714557603"))
    assert b.info["window"]["source"] == "user --window"
    assert b.info["window_from_source"]["source"] == "Zeus: first window start → last window end"


def test_perseus_folder_imports_from_the_command_line(tmp_path):
    import os

    src = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real")) / "perseus-sosp24-pipeline-energy" \
        / "a100x4_gpt3-xl_pp4"
    if not src.exists():
        pytest.skip(f"real data not found at {src} (set POWERTRAIN_REAL_DATA)")
    res = runner.invoke(app, ["import", "auto", str(src), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "pass --anchor TIME" in res.output and ":1:" not in res.output
    res = runner.invoke(app, ["import", "auto", str(src), "--anchor", "2024-08-20T09:00:00Z", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "imported 5 source(s) as zeus" in res.output  # 3 plans + perseus.json + models_A100.csv
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["window"]["source"] == "Perseus: first iteration start → last iteration end"


def test_a_folder_of_one_run_per_file_names_its_files_and_the_command(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    for name in ("a.csv", "b.csv"):
        _smi(folder / name)
    for kind in ("auto", "nvsmi"):
        res = runner.invoke(app, ["import", kind, str(folder), "--out", str(tmp_path / f"run-{kind}"), "--tz", "UTC"])
        assert res.exit_code == 2, res.output
        text = " ".join(res.output.split())
        assert "a folder of 2 nvsmi file(s) (a.csv, b.csv)" in text and "e.g. powertrain import nvsmi" in text
        assert "".join(res.output.split()).count("/logs/a.csv--outDIR") == 1  # the path, however it wraps
        assert not (tmp_path / f"run-{kind}").exists()
    res = runner.invoke(app, ["import", "powertraces", str(folder), "--out", str(tmp_path / "run-pt")])
    assert res.exit_code == 2 and "a folder, and powertraces sources are files" in " ".join(res.output.split())
