"""Options that change nothing in a combination are refused there, in one line naming the fix, before
anything is read, run or written (project rule: every knob real or refused)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.analyze import synthetic
from powertrain.cli import app

REPO = Path(__file__).resolve().parents[1]
ENGINE = Path(__file__).parent / "fixtures" / "engine_logs"
SPEC = REPO / "examples" / "run-llama-1gpu.yaml"
runner = CliRunner()
T0 = 1_717_000_000  # 2024-05-29T16:26:40Z


def _one_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    return lines[0]


def _study(folder: Path) -> Path:
    """Two ranks of the study's header-less CSVs: rank 9 is node1/gpu1 at 8 GPUs per node."""
    folder.mkdir()
    for rank in (0, 9):
        (folder / f"power_{rank}.csv").write_text("".join(f"{T0 + i * 0.1:.3f},{300 + i}\n" for i in range(5)))
    return folder


def _smi(path: Path) -> Path:
    rows = [f"2024/05/01 10:00:{s:02d}.000, {g}, 500.0 W, 70" for s in range(10) for g in range(2)]
    path.write_text("timestamp, index, power.draw [W], temperature.gpu\n" + "\n".join(rows) + "\n")
    return path


# --- import ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("opt", "reader"), [(["--gpus", "4"], "nvsmi"), (["--host", "nodeA"], "nvsmi"),
                                             (["--gpus-per-node", "2"], "study_csv"), (["--hta"], "kineto"),
                                             (["--seq-len", "2048"], "framework_log")])
def test_import_refuses_an_option_no_source_reads(tmp_path, opt, reader):
    kind, src = ("study_csv", _study(tmp_path / "study")) if reader == "framework_log" else \
        ("framework_log", ENGINE / "torchtitan.log")
    tz = ["--tz", "UTC"] if kind == "framework_log" else []
    res = runner.invoke(app, ["import", kind, str(src), "--out", str(tmp_path / "run"), *tz, *opt])
    assert res.exit_code == 2
    line = _one_line(res.output)
    assert f"{opt[0]} does not apply to {kind} sources (only to {reader}" in line and "drop it" in line
    assert not (tmp_path / "run").exists()


def test_import_names_every_refused_option_in_one_line(tmp_path):
    res = runner.invoke(app, ["import", "framework_log", str(ENGINE / "torchtitan.log"), "--out", str(tmp_path / "run"),
                              "--seq-len", "2048", "--gpus", "4", "--host", "nodeA", "--gpus-per-node", "2", "--hta"])
    assert res.exit_code == 2
    line = _one_line(res.output)
    assert ("--gpus (only nvsmi), --host (only nvsmi), --gpus-per-node (only study_csv), --hta (only kineto) do not "
            "apply to framework_log sources: drop them") in line
    assert not (tmp_path / "run").exists()


def test_import_tz_is_refused_where_nothing_reads_it_and_kept_for_a_window(tmp_path):
    study = _study(tmp_path / "study")
    res = runner.invoke(app, ["import", "study_csv", str(study), "--out", str(tmp_path / "run"), "--tz", "UTC"])
    assert res.exit_code == 2
    line = _one_line(res.output)
    assert "--tz does not apply to study_csv sources" in line and "--anchor and --window" in line
    assert not (tmp_path / "run").exists()
    # the window's times carry no zone: --tz places them, so it is read here
    res = runner.invoke(app, ["import", "study_csv", str(study), "--out", str(tmp_path / "run"), "--tz", "+02:00",
                              "--window", "2024-05-29T18:26:40,2024-05-29T18:26:41"])
    assert res.exit_code == 0, res.output
    window = json.loads((tmp_path / "run" / "run.json").read_text())["window"]
    assert (window["t0_ns"], window["t1_ns"]) == (T0 * 10**9, (T0 + 1) * 10**9)


def test_import_gpus_per_node_is_read_by_study_csv_with_8_by_default(tmp_path):
    study = _study(tmp_path / "study")
    for opts, where in (([], {"host": "node1", "device": "gpu1"}), (["--gpus-per-node", "2"],
                                                                     {"host": "node4", "device": "gpu1"})):
        out = tmp_path / f"run{len(opts)}"
        res = runner.invoke(app, ["import", "study_csv", str(study), "--out", str(out), *opts])
        assert res.exit_code == 0, res.output
        rank_map = json.loads((out / "run.json").read_text())["rank_map"]
        assert {k: v for k, v in rank_map[1].items() if k in ("host", "device")} == where


def test_import_option_read_by_one_of_the_sources_is_kept(tmp_path):
    smi = _smi(tmp_path / "gpu.csv")
    log = tmp_path / "train.log"
    log.write_text("".join(f" [2024-05-01 10:00:{s:02d}] iteration {s:8d}/     100 | elapsed time per iteration "
                           f"(ms): 1000.0 | global batch size:     8 | lm loss: 1.0E+00 |\n" for s in range(1, 8)))
    res = runner.invoke(app, ["import", "auto", str(smi), str(log), "--out", str(tmp_path / "run"), "--tz", "UTC",
                              "--host", "nodeA"])
    assert res.exit_code == 0, res.output
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert {d["host"] for d in info["devices"]} == {"nodeA"}


@pytest.mark.parametrize("opt", ["--gpus", "--gpus-per-node"])
def test_import_zero_gpus_is_refused_not_ignored(tmp_path, opt):
    # each given to the kind that reads it: 0 would be taken as "infer" (--gpus) or divide by zero
    kind, src = ("nvsmi", _smi(tmp_path / "gpu.csv")) if opt == "--gpus" else ("study_csv", _study(tmp_path / "s"))
    res = runner.invoke(app, ["import", kind, str(src), "--out", str(tmp_path / "run"), opt, "0"])
    assert res.exit_code == 2 and opt in res.output and "does not apply" not in res.output
    assert not (tmp_path / "run").exists()


# --- predict --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    ([str(SPEC), "--figure", "{tmp}/fig"], "--figure draws the --study comparison: add --study"),
    ([str(SPEC), "--force"], "--force applies to --out"),
    ([str(SPEC), "--study"], "--study predicts the study's matrices, not a spec"),
])
def test_predict_refuses_options_that_would_do_nothing(tmp_path, args, says):
    res = runner.invoke(app, ["predict", *(a.replace("{tmp}", str(tmp_path)) for a in args)])
    assert res.exit_code == 2
    assert says in _one_line(res.output)
    assert list(tmp_path.iterdir()) == []


# --- monitor --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("opts", "says"), [
    (["--seq-len", "4096"], "--seq-len counts tokens of --parse step lines: add --parse ENGINE"),
    (["--prometheus-public"], "--prometheus-public opens the --prometheus endpoint"),
])
def test_monitor_refuses_an_option_without_the_one_it_belongs_to(tmp_path, monkeypatch, opts, says):
    from powertrain.live.prometheus import PUBLIC_ENV

    monkeypatch.delenv(PUBLIC_ENV, raising=False)
    marker = tmp_path / "ran"
    res = runner.invoke(app, ["monitor", "--out", str(tmp_path / "run"), "-q", *opts, "--",
                              sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    assert res.exit_code == 2
    assert says in _one_line(res.output)
    assert not marker.exists() and not (tmp_path / "run").exists()
    assert PUBLIC_ENV not in os.environ


# --- restore, summarize ---------------------------------------------------------------------------


def test_restore_refuses_list_with_force(tmp_path, monkeypatch):
    from powertrain.control.ledger import LEDGER_ENV

    ledger = tmp_path / "ledger.json"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    res = runner.invoke(app, ["restore", "--list", "--force"])
    assert res.exit_code == 2
    assert "--list changes nothing" in _one_line(res.output) and "drop one of them" in res.output
    assert not ledger.exists()


def test_summarize_refuses_all_with_quiet(tmp_path):
    run = synthetic.write_run(tmp_path / "r", hosts=1, devices_per_host=1, steps=2)
    res = runner.invoke(app, ["summarize", str(run), "--all", "--quiet"])
    assert res.exit_code == 2
    assert "--all shows more of the printed table and --quiet prints none" in _one_line(res.output)
    assert not (run / "summary.json").exists()
    res = runner.invoke(app, ["summarize", str(run), "--quiet"])
    assert res.exit_code == 0 and res.output.strip() == str(run / "summary.json"), res.output



def test_report_refuses_force_without_out(tmp_path):
    from typer.testing import CliRunner

    from powertrain.cli import app

    res = CliRunner().invoke(app, ["report", str(tmp_path), "--force"])
    assert res.exit_code == 2 and "--force applies to --out" in res.stderr


def test_a_posix_tz_path_reads_as_that_zone_file_and_a_bad_tz_is_named_as_the_source(monkeypatch):
    import os

    import pytest

    from powertrain.importers.common import local_zone_name, resolve_zone

    target = os.path.realpath("/etc/localtime")
    if "zoneinfo/" not in target:
        pytest.skip("this machine's /etc/localtime is not a zoneinfo file")
    monkeypatch.setenv("TZ", ":/etc/localtime")
    assert local_zone_name() == target.split("zoneinfo/", 1)[1]
    monkeypatch.setenv("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")
    with pytest.raises(ValueError, match=r"from \$TZ='CET-1CEST.*pass --tz, or set TZ to an IANA name"):
        resolve_zone(None)
    assert resolve_zone("UTC")[1] == "UTC"  # --tz wins over a bad $TZ
