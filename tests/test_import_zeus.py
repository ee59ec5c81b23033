"""Zeus energy windows and power samples (fixtures from ml-energy/zeus), Perseus per-rank iterations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.compute as pc
import pytest

from powertrain.importers import import_sources
from powertrain.importers.common import ImportWarning_, SourceFormatError
from powertrain.store import read_events, read_telemetry

FIX = Path(__file__).parent / "fixtures" / "zeus"
REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real"))


def test_energy_windows_become_events_with_per_gpu_energy(tmp_path):
    with pytest.warns(ImportWarning_, match="monotonic"):
        out = import_sources("auto", [FIX / "A40+resnet50+gpu0,1,2,3.csv"], tmp_path / "run")
    ev = read_events(out)
    assert ev.num_rows == 9
    first = ev.slice(0, 1).to_pylist()[0]
    attrs = json.loads(first["attrs"])
    assert first["name"] == "__GlobalPowerLimitOptimizer_300"
    assert attrs["energy_j"]["gpu0"] == pytest.approx(1067.512999996543)
    assert attrs["energy_total_j"] == pytest.approx(1067.513 + 1072.433 + 1049.198 + 1129.595, rel=1e-6)
    assert (first["t_end_ns"] - first["t_start_ns"]) / 1e9 == pytest.approx(8.226085375994444)
    info = json.loads((out / "run.json").read_text())
    assert "monotonic" in info["time_origin"]


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


def test_perseus_profiles_become_per_rank_steps_with_energy(tmp_path):
    src = REAL / "perseus-sosp24-pipeline-energy" / "a40x16_gpt3-6.7b_dp2pp4tp2" / "0.prof.json"
    if not src.exists():
        pytest.skip(f"real data not found at {src} (set POWERTRAIN_REAL_DATA)")
    out = import_sources("auto", [src], tmp_path / "run")
    ev = read_events(out)
    assert sorted(set(ev.column("rank").to_pylist())) == list(range(16))
    r0 = ev.filter(pc.equal(ev.column("rank"), 0))
    assert r0.num_rows == 10 and set(r0.column("kind").to_pylist()) == {"step"}
    energy = [json.loads(a)["energy_j"] for a in r0.column("attrs").to_pylist()]
    raw = json.loads(src.read_text())[0]
    assert energy == pytest.approx(raw["iter_energy"])
    dur = (r0.column("t_end_ns").to_numpy() - r0.column("t_start_ns").to_numpy()) / 1e9
    assert list(dur) == pytest.approx(raw["iter_time"], abs=1e-6)
    total_j = sum(json.loads(a)["energy_j"] for a in ev.column("attrs").to_pylist()) / 10
    assert 4.0e5 < total_j < 5.2e5  # 460–492 kJ per iteration across the 16 GPUs
