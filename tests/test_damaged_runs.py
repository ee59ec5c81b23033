"""Damaged run directories (issue 14, item 4): one check (``store.validate``) behind every reader, one
line ``RUN: file: problem`` from every command, and sweep-level summarize/report skip a damaged run
and go on (exit code 1 with the count). Every case also checks that no file changed (sha256)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from powertrain.analyze.synthetic import write_run, write_sweep
from powertrain.cli import app
from powertrain.store import RunDir
from powertrain.store.validate import DamagedRun, check_run, validate_run

runner = CliRunner()


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _wrong_schema(p: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2, 3]}), p)


def _wrong_type(p: Path) -> None:
    t = pq.read_table(p)
    i = t.schema.get_field_index("host")
    pq.write_table(t.set_column(i, pa.field("host", pa.list_(pa.int64())), pa.array([[1]] * t.num_rows)), p)


def _dir_in_place(p: Path) -> None:
    p.unlink()
    p.mkdir()
    (p / "x").write_text("x")


# (name, damage(run), file named in the line, words in the line)
DAMAGE: list[tuple[str, Callable[[Path], None], str, str]] = [
    ("garbage run.json", lambda r: (r / "run.json").write_bytes(b"\x00\xffgarbage"), "run.json", "not UTF-8"),
    ("not json", lambda r: (r / "run.json").write_text("{status: ok"), "run.json", "not JSON"),
    ("empty run.json", lambda r: (r / "run.json").write_text(""), "run.json", "empty file"),
    ("list run.json", lambda r: (r / "run.json").write_text("[1, 2]"), "run.json", "not a JSON object"),
    ("wrong status", lambda r: (r / "run.json").write_text(json.dumps({"status": "great"})), "run.json",
     "status 'great'"),
    ("wrong type", lambda r: (r / "run.json").write_text(json.dumps({"status": "ok", "devices": "gpu0"})),
     "run.json", "devices is str"),
    ("run.json a folder", lambda r: _dir_in_place(r / "run.json"), "run.json", "unreadable"),
    ("truncated telemetry", lambda r: _truncate(next((r / "telemetry").glob("*.parquet"))), "telemetry/",
     "not a Parquet file"),
    ("wrong-schema telemetry", lambda r: _wrong_schema(next((r / "telemetry").glob("*.parquet"))), "telemetry/",
     "wrong schema: no column"),
    ("wrong-type telemetry", lambda r: _wrong_type(next((r / "telemetry").glob("*.parquet"))), "telemetry/",
     "column host"),
    ("truncated events", lambda r: _truncate(r / "events" / "rank-0.parquet"), "events/rank-0.parquet",
     "not a Parquet file"),
    ("events file a folder", lambda r: _dir_in_place(r / "events" / "rank-0.parquet"), "events/rank-0.parquet",
     "unreadable"),
    ("garbage events", lambda r: (r / "events" / "rank-0.parquet").write_bytes(b"PAR1" + b"\x00" * 100),
     "events/rank-0.parquet", "not a Parquet file"),
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "good", hosts=1, devices_per_host=2, steps=3)


def _damaged_copy(pristine: Path, tmp_path: Path, damage: Callable[[Path], None]) -> Path:
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    damage(run)
    return run


@pytest.mark.parametrize(("case", "damage", "file", "words"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_validate_run_names_the_file_and_problem(case, damage, file, words, pristine, tmp_path) -> None:
    run = _damaged_copy(pristine, tmp_path, damage)
    problems = validate_run(run)
    assert problems, case
    assert problems[0].file.startswith(file.rstrip("/")) and words in problems[0].problem, problems
    with pytest.raises(DamagedRun) as exc:
        check_run(run)
    line = str(exc.value)
    assert line.startswith(f"{run}: {problems[0].file}: ") and "\n" not in line


@pytest.mark.parametrize("command", ["summarize", "report", "trace", "compare"])
@pytest.mark.parametrize(("case", "damage", "file", "words"), DAMAGE[::3] + DAMAGE[7:9],
                         ids=[d[0] for d in DAMAGE[::3] + DAMAGE[7:9]])
def test_commands_say_one_line(command, case, damage, file, words, pristine, tmp_path) -> None:
    run = _damaged_copy(pristine, tmp_path, damage)
    before = _hashes(tmp_path)
    args = {"summarize": ["summarize", str(run)], "report": ["report", str(run), "--formats", "png"],
            "trace": ["trace", str(run), "-o", str(tmp_path / "t.json")],
            "compare": ["compare", str(pristine), str(run)]}[command]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{run}: {file.rstrip('/')}" in lines[0] and words in lines[0], res.output
    assert _hashes(tmp_path) == before  # nothing written: no summary, no report folder, no trace
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_torn_segment_of_an_unfinished_stream_is_not_damage(pristine, tmp_path) -> None:
    run = _damaged_copy(pristine, tmp_path, lambda r: None)
    parts = run / "events" / "rank-9.parts"
    parts.mkdir()
    (parts / "seg-000000.parquet").write_bytes(b"PAR1 torn")
    assert validate_run(run) == []
    _wrong_schema(parts / "seg-000001.parquet")
    assert [p.file for p in validate_run(run)] == ["events/rank-9.parts/seg-000001.parquet"]


def test_rundir_read_is_validated(pristine, tmp_path) -> None:
    run = _damaged_copy(pristine, tmp_path, lambda r: (r / "run.json").write_text("[]"))
    with pytest.raises(DamagedRun, match=r"run\.json: not a JSON object"):
        RunDir(run).read()


@pytest.mark.parametrize("command", ["summarize", "report"])
def test_sweep_skips_a_damaged_run_and_goes_on(command, tmp_path) -> None:
    sweep = write_sweep(tmp_path / "sweep")
    (sweep / "crash" / "run.json").write_text("{oops")
    _truncate(next((sweep / "tp2pp1" / "telemetry").glob("*.parquet")))
    before = {k: v for k, v in _hashes(tmp_path).items() if "summary" not in k and "report" not in k}
    args = ["summarize", str(sweep), "-q"] if command == "summarize" else ["report", str(sweep), "--formats", "png"]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    skipped = [ln for ln in res.output.splitlines() if ln.startswith("skipped damaged run: ")]
    assert len(skipped) == 2, res.output
    assert any(f"{sweep / 'crash'}: run.json: not JSON" in ln for ln in skipped)
    assert any(f"{sweep / 'tp2pp1'}: telemetry/" in ln and "not a Parquet file" in ln for ln in skipped)
    assert "2 damaged run(s) skipped" in res.output
    ids = pq.read_table(sweep / "summary.parquet").column("id").to_pylist()
    assert "tp1pp1" in ids and "crash" not in ids and "tp2pp1" not in ids  # the others are there
    if command == "report":
        assert (sweep / "report" / "report.html").is_file()
    after = {k: v for k, v in _hashes(tmp_path).items() if k in before}
    assert after == before  # the runs' own files untouched
