"""`import --tz` is refused where no source holds a local wall-clock time for it to place (Perseus
profiles, NeMo progress lines, Megatron lines without stamps, Zeus windows, MLLOG, ISO stamps that carry
their own zone), unless --tz places a time of --anchor / --window written without a zone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.cli import app

runner = CliRunner()
ENGINE = Path(__file__).parent / "fixtures" / "engine_logs"
ZEUS = Path(__file__).parent / "fixtures" / "zeus"
EPOCH = "1714557600"  # 2024-05-01T10:00:00Z as epoch seconds: no zone to apply


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _perseus(path: Path) -> Path:
    path.write_text(json.dumps([{"rank": r, "iter_time": [1.0, 1.1], "iter_energy": [200.0, 210.0]} for r in (0, 1)]))
    return path


def _powertraces(path: Path, stamp: str) -> Path:
    path.write_text("timestamp,gpu_id,power_w\n" + "".join(f"2024-05-01T10:00:0{s}{stamp},0,300\n" for s in range(4)))
    return path


def _import(tmp_path: Path, kind: str, *args: str):
    out = tmp_path / "run"
    return runner.invoke(app, ["import", kind, *args, "--out", str(out)]), out


@pytest.mark.parametrize(("kind", "source", "why"), [
    ("framework_log", lambda d: ENGINE / "nemo1.log", "nemo1.log: NeMo progress lines hold durations only"),
    ("framework_log", lambda d: ENGINE / "nemo2.log", "nemo2.log: NeMo progress lines hold durations only"),
    ("zeus", lambda d: _perseus(d / "plan.prof.json"), "plan.prof.json: a Perseus profile holds durations only"),
    ("zeus", lambda d: ZEUS / "A40+resnet50+gpu0,1,2,3.csv", "Zeus window start times are time.monotonic() seconds"),
])
def test_tz_is_refused_for_sources_without_wall_clock_times(tmp_path, kind, source, why):
    res, out = _import(tmp_path, kind, str(source(tmp_path)), "--anchor", EPOCH, "--tz", "Europe/Berlin")
    assert res.exit_code == 2, res.output
    line = _one_line(res.output)
    assert "--tz does not apply: no time in these sources is local wall-clock" in line and why in line, line
    assert line.endswith("drop --tz") or "drop --tz" in line
    assert not out.exists()
    # without --tz the same import is fine: the refusal is about --tz alone
    res, out = _import(tmp_path, kind, str(source(tmp_path)), "--anchor", EPOCH)
    assert res.exit_code == 0, res.output


def test_tz_is_kept_where_it_places_the_anchor(tmp_path):
    res, out = _import(tmp_path, "framework_log", str(ENGINE / "nemo1.log"), "--anchor", "2024-05-01T12:00:00",
                       "--tz", "Europe/Berlin")
    assert res.exit_code == 0, res.output
    from powertrain.store import read_events

    starts = [e["t_start_ns"] for e in read_events(out).to_pylist() if e["kind"] == "step"]
    assert min(starts) == int(EPOCH) * 10**9  # 12:00 in Berlin (CEST) is 10:00 UTC


def test_tz_is_kept_for_stamped_logs_and_local_iso_times(tmp_path):
    res, _ = _import(tmp_path, "framework_log", str(ENGINE / "megatron.log"), "--tz", "UTC")
    assert res.exit_code == 0, res.output
    res, _ = _import(tmp_path / "a", "powertraces", str(_powertraces(tmp_path / "local.csv", "")), "--tz", "UTC")
    assert res.exit_code == 0, res.output


def test_tz_is_refused_when_every_iso_stamp_carries_its_zone(tmp_path):
    res, out = _import(tmp_path, "powertraces", str(_powertraces(tmp_path / "zoned.csv", "+00:00")), "--tz", "UTC")
    assert res.exit_code == 2, res.output
    assert "zoned.csv: every timestamp carries its own zone" in _one_line(res.output)
    assert not out.exists()


def test_python_api_refuses_tz_no_source_reads(tmp_path):
    from powertrain.importers import import_sources
    from powertrain.importers.common import parse_anchor

    with pytest.raises(ValueError, match=r"--tz does not apply: .*Perseus profile holds durations only.*drop --tz"):
        import_sources("zeus", [_perseus(tmp_path / "p.prof.json")], tmp_path / "run", tz="UTC",
                       anchor_ns=parse_anchor("2024-05-01T10:00:00Z"))
