"""Never overwrite data (issue 14, item 3): every writing command refuses to write into or over a
run's files or another kind of output, --force only replaces the same kind, names are one path
component, and failures leave neither temporary files nor empty folders. Each case checks the exit
code, one line on stderr, no traceback, and the sha256 of every file that was there before."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.analyze.synthetic import write_run
from powertrain.cli import app
from powertrain.store.rundir import current_umask
from powertrain.store.targets import WriteRefused, check_name, check_run_target

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "examples" / "run-llama-1gpu.yaml"
runner = CliRunner()


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _invoke(args: list[str]) -> tuple[int, str]:
    res = runner.invoke(app, args)
    return res.exit_code, res.output


def _one_line_error(output: str) -> None:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert "Traceback" not in output, output
    assert len([ln for ln in lines if "error" in ln]) == 1, output


@pytest.fixture
def measured(tmp_path: Path) -> Path:
    return write_run(tmp_path / "measured", hosts=1, devices_per_host=2, steps=3)


def test_predict_out_over_a_measured_run_is_refused_even_with_force(measured: Path, tmp_path: Path) -> None:
    before = _hashes(tmp_path)
    for extra in ([], ["--force"]):
        code, out = _invoke(["predict", str(SPEC), "--out", str(measured), *extra])
        assert code == 2, out
        _one_line_error(out)
        assert "measured run" in out and "never replaced" in out
    assert _hashes(tmp_path) == before


def test_predict_out_replaces_a_prediction_only_with_force(tmp_path: Path) -> None:
    out = tmp_path / "pred"
    code, text = _invoke(["predict", str(SPEC), "--out", str(out), "--json"])
    assert code == 0, text
    before = _hashes(tmp_path)
    code, text = _invoke(["predict", str(SPEC), "--out", str(out), "--json"])
    assert code == 2 and "--force" in text, text
    assert _hashes(tmp_path) == before
    code, text = _invoke(["predict", str(SPEC), "--out", str(out), "--json", "--force"])
    assert code == 0, text
    assert json.loads((out / "run.json").read_text())["kind"] == "prediction"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_predict_out_inside_a_run_is_refused(measured: Path, tmp_path: Path) -> None:
    before = _hashes(tmp_path)
    code, out = _invoke(["predict", str(SPEC), "--out", str(measured / "pred"), "--force"])
    assert code == 2 and "inside the run directory" in out, out
    assert _hashes(tmp_path) == before and not (measured / "pred").exists()


def test_trace_over_the_runs_own_files_is_refused(measured: Path, tmp_path: Path) -> None:
    before = _hashes(tmp_path)
    for target in ("run.json", "summary.json", "telemetry/host0.parquet", "events/rank-0.parquet"):
        for extra in ([], ["--force"]):
            code, out = _invoke(["trace", str(measured), "-o", str(measured / target), *extra])
            assert code == 2, (target, out)
            _one_line_error(out)
            assert "part of the run" in out
    assert _hashes(tmp_path) == before


def test_trace_replaces_only_a_trace_with_force(measured: Path, tmp_path: Path) -> None:
    other = tmp_path / "notes.json"
    other.write_text('{"mine": true}\n')
    before = _hashes(tmp_path)
    for extra in ([], ["--force"]):
        code, out = _invoke(["trace", str(measured), "-o", str(other), *extra])
        assert code == 2, out
        _one_line_error(out)
    assert _hashes(tmp_path) == before
    trace = tmp_path / "t.json"
    assert _invoke(["trace", str(measured), "-o", str(trace)])[0] == 0
    code, out = _invoke(["trace", str(measured), "-o", str(trace)])
    assert code == 2 and "--force" in out
    assert _invoke(["trace", str(measured), "-o", str(trace), "--force"])[0] == 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_report_out_never_writes_into_a_run_or_a_foreign_folder(measured: Path, tmp_path: Path) -> None:
    other = write_run(tmp_path / "other", hosts=1, devices_per_host=1, steps=2)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me\n")
    before = _hashes(tmp_path)
    for target in (other, measured, measured / "telemetry", mine):
        for extra in ([], ["--force"]):
            code, out = _invoke(["report", str(measured), "--out", str(target), "--formats", "png", *extra])
            assert code == 2, (target, out)
            _one_line_error(out)
    assert _hashes(tmp_path) == before


def test_report_default_folder_is_rewritten_and_failures_leave_nothing(measured: Path, tmp_path: Path) -> None:
    assert _invoke(["report", str(measured), "--formats", "png"])[0] == 0
    assert _invoke(["report", str(measured), "--formats", "png"])[0] == 0  # the command's own folder
    assert (measured / "report" / "report.html").is_file()
    out = tmp_path / "rep"
    assert _invoke(["report", str(measured), "--out", str(out), "--formats", "png"])[0] == 0
    code, text = _invoke(["report", str(measured), "--out", str(out), "--formats", "png"])
    assert code == 2 and "--force" in text
    assert _invoke(["report", str(measured), "--out", str(out), "--formats", "png", "--force"])[0] == 0
    # a damaged run: one line, and no empty report folder or staging folder left behind
    broken = write_run(tmp_path / "broken", hosts=1, devices_per_host=1, steps=2)
    (broken / "run.json").write_text("{not json")
    code, text = _invoke(["report", str(broken), "--formats", "png"])
    assert code == 2 and "broken: run.json: not JSON" in text, text
    assert not (broken / "report").exists()
    assert not [p for p in broken.iterdir() if p.name.startswith(".")]


def test_import_out_over_another_kind_or_inside_a_run_is_refused(measured: Path, tmp_path: Path) -> None:
    src = tmp_path / "gpu.csv"
    src.write_text("timestamp, index, power.draw [W]\n2024/05/01 10:00:00.000, 0, 100.0\n"
                   "2024/05/01 10:00:01.000, 0, 110.0\n")
    before = _hashes(tmp_path)
    for target, extra in ((measured, ["--force"]), (measured / "sub", []), (measured / "telemetry", ["--force"])):
        code, out = _invoke(["import", "nvsmi", str(src), "--tz", "UTC", "--out", str(target), *extra])
        assert code == 2, (target, out)
        _one_line_error(out)
    assert _hashes(tmp_path) == before
    imp = tmp_path / "imp"
    assert _invoke(["import", "nvsmi", str(src), "--tz", "UTC", "--out", str(imp)])[0] == 0
    code, out = _invoke(["import", "nvsmi", str(src), "--tz", "UTC", "--out", str(imp)])
    assert code == 2 and "--force" in out
    code, out = _invoke(["import", "nvsmi", str(src), "--tz", "UTC", "--out", str(imp), "--force"])
    assert code == 0, out
    assert json.loads((imp / "run.json").read_text())["kind"] == "import"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("name", ["../..", "..", ".", "a/b", "", "x\ny", "/etc/passwd"])
def test_calibrate_name_must_be_one_plain_name(name: str, measured: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POWERTRAIN_PROFILES", str(tmp_path / "profiles"))
    before = _hashes(tmp_path)
    code, out = _invoke(["calibrate", str(measured), "--name", name])
    assert code == 2, out
    _one_line_error(out)
    assert "--name" in out
    assert _hashes(tmp_path) == before and not (tmp_path / "profiles").exists()


def test_calibrate_output_over_a_run_file_is_refused(measured: Path, tmp_path: Path) -> None:
    before = _hashes(tmp_path)
    code, out = _invoke(["calibrate", str(measured), "--name", "x", "--output", str(measured / "run.json"),
                         "--force"])
    assert code == 2 and "part of the run" in out, out
    assert _hashes(tmp_path) == before


def test_monitor_out_empty_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _invoke(["monitor", "--out", "", "--", "true"])
    assert code == 2, out
    assert "--out" in out and "Traceback" not in out
    assert list(tmp_path.iterdir()) == []


def test_names_and_targets_library_level(tmp_path: Path) -> None:
    for bad in ("..", "a/b", "", "x\x00"):
        with pytest.raises(WriteRefused):
            check_name(bad, "--name")
    assert check_name("cpu-laptop.v2", "--name") == "cpu-laptop.v2"
    assert check_run_target(tmp_path / "new", "prediction", force=False) == tmp_path / "new"
    (tmp_path / "file").write_text("x")
    with pytest.raises(WriteRefused, match="not a folder"):
        check_run_target(tmp_path / "file", "import", force=True)


def test_one_mode_policy_for_json_and_parquet(tmp_path: Path) -> None:
    """Run folders 0750, files 0640 (JSON and Parquet alike), narrowed by the umask when stricter."""
    old = os.umask(0o022)
    try:
        run = write_run(tmp_path / "r", hosts=1, devices_per_host=1, steps=2)
        src = tmp_path / "gpu.csv"
        src.write_text("timestamp, index, power.draw [W]\n2024/05/01 10:00:00.000, 0, 100.0\n")
        assert _invoke(["import", "nvsmi", str(src), "--tz", "UTC", "--out", str(tmp_path / "imp")])[0] == 0
        os.umask(0o077)  # stricter: group loses read
        assert current_umask() == 0o077
        assert _invoke(["import", "nvsmi", str(src), "--tz", "UTC", "--out", str(tmp_path / "strict")])[0] == 0
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "imp").rglob("*")}
    modes[tmp_path / "imp"] = stat.S_IMODE((tmp_path / "imp").stat().st_mode)
    for p, m in modes.items():
        assert m == (0o750 if p.is_dir() else 0o640), (p, oct(m))
    assert {p.suffix for p in modes if p.is_file()} >= {".json", ".parquet"}
    for p in [tmp_path / "strict", *(tmp_path / "strict").rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
    for p in run.rglob("*.json"):  # write_json_atomic: 0640 (it was 0600)
        assert stat.S_IMODE(p.stat().st_mode) == 0o640, p
