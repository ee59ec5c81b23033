"""Zeus energy windows and power samples (fixtures from ml-energy/zeus), Perseus per-rank iterations."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from powertrain.analyze.summary import summarize_run
from powertrain.importers import import_sources
from powertrain.importers.common import SourceFormatError, parse_anchor
from powertrain.store import read_events, read_telemetry

FIX = Path(__file__).parent / "fixtures" / "zeus"
REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real"))


def test_energy_windows_become_events_with_per_gpu_energy(tmp_path):
    src = FIX / "A40+resnet50+gpu0,1,2,3.csv"
    # start_time is time.monotonic(): not wall-clock, so an anchor is required
    with pytest.raises(SourceFormatError, match=r"monotonic.*pass --anchor TIME"):
        import_sources("auto", [src], tmp_path / "run")
    anchor = parse_anchor("2023-07-07T12:00:00Z")
    out = import_sources("auto", [src], tmp_path / "run", anchor_ns=anchor)
    ev = read_events(out)
    assert ev.num_rows == 9
    first = ev.slice(0, 1).to_pylist()[0]
    attrs = json.loads(first["attrs"])
    assert first["name"] == "__GlobalPowerLimitOptimizer_300"
    assert first["t_start_ns"] == anchor
    assert attrs["monotonic_start_s"] == pytest.approx(13586410.284991832)
    assert attrs["energy_j"]["gpu0"] == pytest.approx(1067.512999996543)
    assert attrs["energy_total_j"] == pytest.approx(1067.513 + 1072.433 + 1049.198 + 1129.595, rel=1e-6)
    assert (first["t_end_ns"] - first["t_start_ns"]) / 1e9 == pytest.approx(8.226085375994444)
    second = ev.slice(1, 1).to_pylist()[0]  # the windows keep their spacing
    assert (second["t_start_ns"] - anchor) / 1e9 == pytest.approx(13586420.690541402 - 13586410.284991832, abs=1e-6)
    info = json.loads((out / "run.json").read_text())
    assert "monotonic" in info["time_origin"] and "--anchor" in info["time_origin"]
    # each window is one step of the import (its iteration count is not recorded), all of them measured
    assert set(ev.column("kind").to_pylist()) == {"step"} and set(ev.column("window").to_pylist()) == {"measured"}
    assert "window's duration" in info["step_unit"] and info["job_device_count"] == 4
    summary = summarize_run(out)
    durations = (np.array(ev.column("t_end_ns").to_pylist()) - np.array(ev.column("t_start_ns").to_pylist())) / 1e9
    assert summary["metrics"]["step_time_mean_s"] == pytest.approx(durations.mean())


def test_power_samples_in_milliwatts(tmp_path):
    out = import_sources("zeus", [FIX / "zeus_monitor_sample_power_mW.csv"], tmp_path / "run", tz="UTC")
    tel = read_telemetry(out)
    assert tel.num_rows == 19
    assert tel.column("power_w")[0].as_py() == pytest.approx(32.402)


def test_malformed_window_row(tmp_path):
    f = tmp_path / "w.csv"
    f.write_text("start_time,window_name,elapsed_time,gpu0_energy\n1.0,a,2.0,3.0\n2.0,b,x,4.0\n")
    with pytest.raises(SourceFormatError, match=r"w\.csv:3: not a number"):
        import_sources("zeus", [f], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _perseus(name: str) -> Path:
    src = REAL / "perseus-sosp24-pipeline-energy" / "a40x16_gpt3-6.7b_dp2pp4tp2" / name
    if not src.exists():
        pytest.skip(f"real data not found at {src} (set POWERTRAIN_REAL_DATA)")
    return src


def test_perseus_profiles_become_per_rank_steps_with_energy(tmp_path):
    src = _perseus("0.prof.json")
    with pytest.raises(SourceFormatError, match="durations, not wall-clock times: pass --anchor TIME"):
        import_sources("auto", [src], tmp_path / "run")
    anchor = parse_anchor("2024-08-20T09:00:00Z")
    out = import_sources("auto", [src], tmp_path / "run", anchor_ns=anchor)
    ev = read_events(out)
    assert sorted(set(ev.column("rank").to_pylist())) == list(range(16))
    assert pc.min(ev.column("t_start_ns")).as_py() == anchor  # first iteration at the anchor, not 1970
    r0 = ev.filter(pc.equal(ev.column("rank"), 0))
    assert r0.num_rows == 10 and set(r0.column("kind").to_pylist()) == {"step"}
    energy = [json.loads(a)["energy_j"] for a in r0.column("attrs").to_pylist()]
    raw = json.loads(src.read_text())[0]
    assert energy == pytest.approx(raw["iter_energy"])
    dur = (r0.column("t_end_ns").to_numpy() - r0.column("t_start_ns").to_numpy()) / 1e9
    assert list(dur) == pytest.approx(raw["iter_time"], abs=1e-6)
    total_j = sum(json.loads(a)["energy_j"] for a in ev.column("attrs").to_pylist()) / 10
    assert 4.0e5 < total_j < 5.2e5  # 460–492 kJ per iteration across the 16 GPUs
    info = json.loads((out / "run.json").read_text())
    assert info["job_device_count"] == 16
    # every iteration is measured, so the summary has the step time: the slowest rank per iteration
    from powertrain.analyze.summary import summarize_run

    s = summarize_run(out, probe_cpu_peak=False)
    assert set(ev.column("window").to_pylist()) == {"measured"}
    slowest = [max(r["iter_time"][i] for r in json.loads(src.read_text())) for i in range(10)]
    assert s["metrics"]["step_time_mean_s"] == pytest.approx(sum(slowest) / 10, rel=1e-6)


def test_several_perseus_plans_follow_one_another_with_steps_numbered_on(tmp_path):
    a, b = _perseus("0.prof.json"), _perseus("24.prof.json")
    out = import_sources("zeus", [a, b], tmp_path / "run", anchor_ns=parse_anchor("1724144400"), warmup_steps=2)
    r0 = read_events(out).filter(pc.equal(read_events(out).column("rank"), 0))
    assert r0.column("step").to_pylist() == list(range(20))
    assert r0.column("window").to_pylist() == ["warmup"] * 2 + ["measured"] * 18
    plans = [json.loads(x)["frequency_plan"] for x in r0.column("attrs").to_pylist()]
    assert plans == ["0"] * 10 + ["24"] * 10
    starts, ends = r0.column("t_start_ns").to_pylist(), r0.column("t_end_ns").to_pylist()
    assert all(s >= e for s, e in zip(starts[1:], ends[:-1], strict=True))  # back to back, no overlap


def test_anchor_for_sources_with_their_own_times_is_refused(tmp_path):
    with pytest.raises(ValueError, match="drop --anchor"):
        import_sources("zeus", [FIX / "zeus_monitor_sample_power_mW.csv"], tmp_path / "run", tz="UTC",
                       anchor_ns=parse_anchor("2024-01-01T00:00:00Z"))


# -- issue 13: folders, the run's window, and summaries that report the windows' own energy -----------


def _real_dir(*parts: str) -> Path:
    p = REAL.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real data not found at {p} (set POWERTRAIN_REAL_DATA)")
    return p


def _summary(out: Path) -> dict:
    from powertrain.analyze.summary import summarize_run

    return summarize_run(out, probe_cpu_peak=False)


@pytest.mark.parametrize("folder", ["a100x4_gpt3-xl_pp4", "a40x16_gpt3-6.7b_dp2pp4tp2"])
def test_perseus_folder_imports_and_summarizes_to_its_windows(tmp_path, folder):
    src = _real_dir("perseus-sosp24-pipeline-energy", folder)
    out = import_sources("zeus", [src], tmp_path / "run", anchor_ns=parse_anchor("2024-08-20T09:00:00Z"))
    info = json.loads((out / "run.json").read_text())
    plans = sorted(src.glob("*.prof.json"), key=lambda p: int(p.name.split(".")[0]))
    assert [s["path"] for s in info["import"]["sources"] if s["role"] == "zeus perseus"] == [str(p.resolve()) for p in plans]
    assert info["perseus"]["config"]["mode"] == "frequency" and info["perseus"]["layout"]["pp"] == "4"
    assert any("sched.json" in d for d in info["import"]["dropped"])
    raw = [json.loads(p.read_text()) for p in plans]
    total = sum(sum(r["iter_energy"]) for d in raw for r in d)
    slowest = [max(r["iter_time"][i] for r in d) for d in raw for i in range(len(d[0]["iter_time"]))]
    w = info["window"]
    assert w["source"].startswith("Perseus") and (w["t1_ns"] - w["t0_ns"]) / 1e9 == pytest.approx(sum(slowest), abs=1e-6)
    m = _summary(out)["metrics"]
    assert m["energy_j"] == pytest.approx(total, rel=1e-3)  # the acceptance bound; in fact exact
    assert m["energy_j"] == pytest.approx(total, rel=1e-9)
    assert m["step_time_mean_s"] == pytest.approx(sum(slowest) / len(slowest), rel=1e-6)


def test_zeus_window_csvs_summarize_to_their_windows(tmp_path):
    folder = _real_dir("zeus-monitor-samples")
    for i, src in enumerate(sorted(folder.glob("*+*.csv"))):
        with open(src) as f:
            rows = list(csv.DictReader(f))
        total = sum(float(v) for r in rows for k, v in r.items() if k.endswith("_energy"))
        out = import_sources("zeus", [src], tmp_path / f"run{i}", anchor_ns=parse_anchor("2023-07-07T12:00:00Z"))
        info = json.loads((out / "run.json").read_text())
        first, last = rows[0], rows[-1]
        span_s = float(last["start_time"]) + float(last["elapsed_time"]) - float(first["start_time"])
        assert (info["window"]["t1_ns"] - info["window"]["t0_ns"]) / 1e9 == pytest.approx(span_s, abs=1e-6)
        assert info["window"]["source"] == "Zeus: first window start → last window end"
        m = _summary(out)["metrics"]
        assert m["energy_j"] == pytest.approx(total, rel=1e-3), src.name
        assert m["step_time_mean_s"] is not None


def test_a_folder_without_zeus_data_names_the_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(SourceFormatError, match=r"no Zeus window CSV.*in this folder") as exc:
        import_sources("zeus", [tmp_path], tmp_path / "run")
    assert exc.value.line is None


def test_implausible_window_energy_leaves_that_device_without_a_counter(tmp_path):
    f = tmp_path / "w.csv"
    f.write_text("start_time,window_name,elapsed_time,gpu0_energy,gpu1_energy\n"
                 "1714557600.0,a,2.0,300.0,-5.0\n1714557602.0,b,2.0,310.0,290.0\n")
    with pytest.warns(UserWarning, match=r"energy_j: 1 implausible.*first at w.csv:2"):
        out = import_sources("zeus", [f], tmp_path / "run")
    info = json.loads((out / "run.json").read_text())
    dq = info["data_quality"]
    assert dq["implausible"]["energy_j"]["kinds"] == {"negative": 1}
    assert "no counter" in next(d for d in dq["devices"] if d["device"] == "gpu1")["why_null"]
    tel = read_telemetry(out)
    assert set(tel.column("device").to_pylist()) == {"gpu0"}
    assert tel.column("energy_j").to_pylist() == [0.0, 300.0, 610.0]
