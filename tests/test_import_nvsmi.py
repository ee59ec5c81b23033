"""nvidia-smi CSV logs (any query field set) and long per-GPU CSV exports, on synthetic and real logs."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import zoneinfo
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from powertrain.importers import import_sources
from powertrain.importers.common import SourceFormatError
from powertrain.importers.nvsmi import import_nvsmi, nvml_reasons_to_throttle
from powertrain.schema import Throttle
from powertrain.store import read_events, read_telemetry

REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real"))


def real(sub: str) -> Path:
    p = REAL / sub
    if not p.exists():
        pytest.skip(f"real data not found at {p} (set POWERTRAIN_REAL_DATA)")
    return p


def _rows(tel, device):
    return tel.filter(pc.equal(tel.column("device"), device))


def test_full_header_with_units_index_na_and_throttle(tmp_path):
    f = tmp_path / "smi.csv"
    f.write_text(
        "timestamp, index, uuid, name, power.draw [W], power.draw.instant [W], enforced.power.limit [W], "
        "temperature.gpu, temperature.memory, clocks.current.sm [MHz], clocks.mem [MHz], utilization.gpu [%], "
        "memory.used [MiB], fan.speed [%], clocks_event_reasons.active, pstate\n"
        "2024/05/01 10:00:00.100, 0, GPU-aaa, NVIDIA H100 80GB HBM3, 650.10 W, 699.00 W, 700.00 W, 71, 80, "
        "1980 MHz, 2619 MHz, 100 %, 70000 MiB, [N/A], 0x0000000000000004, P0\n"
        "2024/05/01 10:00:00.100, 1, GPU-bbb, NVIDIA H100 80GB HBM3, 640.00 W, [Not Supported], 700.00 W, 73, "
        "N/A, 1755 MHz, 2619 MHz, 99 %, 69000 MiB, [N/A], 0x0000000000000060, P0\n"
        "2024/05/01 10:00:00.200, 0, GPU-aaa, NVIDIA H100 80GB HBM3, 651.00 W, 30.00 W, 700.00 W, 72, 81, "
        "1980 MHz, 2619 MHz, 100 %, 70000 MiB, [N/A], 0x0000000000000001, P0\n"
    )
    b = import_nvsmi([f], tz="UTC")
    tel = b.telemetry()
    g0, g1 = _rows(tel, "gpu0"), _rows(tel, "gpu1")
    # power.draw.instant is the instantaneous reading; power.draw (1 s average on new drivers) → power_avg_w
    assert g0.column("power_w").to_pylist() == [699.0, 30.0]
    assert g0.column("power_avg_w").to_pylist() == [650.1, 651.0]
    assert g1.column("power_w").to_pylist() == [None]  # [Not Supported] is unknown, not 0
    assert g1.column("temp_mem_c").to_pylist() == [None]
    assert g0.column("clock_sm_mhz").to_pylist() == [1980.0, 1980.0]
    assert g0.column("mem_used_bytes").to_pylist()[0] == 70000 * 2**20
    assert g0.column("fan_pct").null_count == 2
    assert Throttle(g0.column("throttle")[0].as_py()) == Throttle.POWER_CAP
    assert Throttle(g1.column("throttle")[0].as_py()) == Throttle.THERMAL_SW | Throttle.THERMAL_HW
    assert g0.column("power_limit_w").to_pylist() == [700.0, 700.0]
    assert g0.column("t_ns")[0].as_py() == int(dt.datetime(2024, 5, 1, 10, 0, 0, 100000, tzinfo=dt.UTC).timestamp() * 1e9)
    assert any("pstate" in d for d in b.dropped)
    dev = {d["device"]: d for d in b.devices}
    assert dev["gpu1"]["name"] == "NVIDIA H100 80GB HBM3"


def test_nounits_no_index_rows_in_gpu_order_and_time_zone(tmp_path):
    f = tmp_path / "smi.csv"
    lines = ["timestamp, power.draw [W], utilization.gpu [%]"]
    t0 = dt.datetime(2025, 7, 27, 0, 47, 9)
    for s in range(20):  # 3 GPUs, rows a few ms apart, samples 100 ms apart
        for g in range(3):
            ts = t0 + dt.timedelta(milliseconds=100 * s + 2 * g)
            lines.append(f"{ts:%Y/%m/%d %H:%M:%S}.{ts.microsecond // 1000:03d}, {100 + g}.5, {g}")
    f.write_text("\n".join(lines) + "\n")
    b = import_nvsmi([f], tz="Europe/Berlin")
    tel = b.telemetry()
    assert sorted(set(tel.column("device").to_pylist())) == ["gpu0", "gpu1", "gpu2"]
    assert set(_rows(tel, "gpu2").column("power_w").to_pylist()) == {102.5}
    first = tel.column("t_ns")[0].as_py()
    berlin = t0.replace(tzinfo=zoneinfo.ZoneInfo("Europe/Berlin"))
    assert first == int(berlin.timestamp()) * 10**9  # local time, CEST = UTC+2
    assert b.info["import_timezone"]["zone"] == "Europe/Berlin"


def test_uuid_column_numbers_gpus_in_order_of_appearance(tmp_path):
    f = tmp_path / "smi.csv"
    f.write_text("timestamp, uuid, power.draw\n2024/01/01 00:00:00.000, GPU-z, 10\n"
                 "2024/01/01 00:00:00.000, GPU-a, 20\n2024/01/01 00:00:01.000, GPU-z, 11\n")
    tel = import_nvsmi([f], tz="UTC").telemetry()
    assert _rows(tel, "gpu0").column("power_w").to_pylist() == [10.0, 11.0]
    assert _rows(tel, "gpu1").column("power_w").to_pylist() == [20.0]


def test_gpus_checks_a_log_that_names_its_gpus_and_a_disagreeing_count_is_refused(tmp_path):
    f = tmp_path / "smi.csv"
    f.write_text("timestamp, uuid, power.draw\n2024/01/01 00:00:00.000, GPU-z, 10\n"
                 "2024/01/01 00:00:00.000, GPU-a, 20\n2024/01/01 00:00:01.000, GPU-z, 11\n")
    assert import_nvsmi([f], tz="UTC", gpus=2).telemetry().num_rows == 3  # agrees with the log: read as a check
    with pytest.raises(ValueError, match=r"smi\.csv: --gpus 4, but the log's uuid column names 2 GPU\(s\); drop --gpus"):
        import_nvsmi([f], tz="UTC", gpus=4)


def test_malformed_rows_name_file_line_and_problem(tmp_path):
    f = tmp_path / "smi.csv"
    f.write_text("timestamp, power.draw [W]\n2024/01/01 00:00:00.000, 10 W\n2024/01/01 00:00:00.100\n")
    with pytest.raises(SourceFormatError, match=r"smi\.csv:3: expected 2 comma-separated values"):
        import_sources("nvsmi", [f], tmp_path / "run", tz="UTC")
    f.write_text("timestamp, power.draw [W]\n2024/01/01 00:00:00.000, ten W\n")
    with pytest.raises(SourceFormatError, match=r"smi\.csv:2: power\.draw value 'ten W' is not a number"):
        import_sources("nvsmi", [f], tmp_path / "run", tz="UTC")
    assert not (tmp_path / "run").exists()


def test_nvml_reason_mapping_keeps_unknown_bits():
    assert nvml_reasons_to_throttle(0) == 0
    assert Throttle(nvml_reasons_to_throttle(0x4 | 0x80)) == Throttle.POWER_CAP | Throttle.POWER_BRAKE
    assert Throttle(nvml_reasons_to_throttle(0x10000)) == Throttle.OTHER


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    src = real("wilkins-nvsmi-h100x8-titanx2/h100x8_gpt8b_ddp")
    out = tmp_path_factory.mktemp("nvsmi") / "h100"
    import_sources("nvsmi", [src / "ckpt1000.csv"], out, tz="UTC")
    return src, out


def test_h100_log_imports_8_gpus_at_10hz_and_matches_the_authors_sum(h100):
    src, out = h100
    tel = read_telemetry(out)
    assert sorted(set(tel.column("device").to_pylist())) == [f"gpu{i}" for i in range(8)]
    g3 = _rows(tel, "gpu3")
    period = np.median(np.diff(g3.column("t_ns").to_numpy())) / 1e9
    assert period == pytest.approx(0.1, abs=0.01)
    with open(src / "aggregated_power_data.csv") as f:
        authors = sum(float(r["power_watts"]) for r in csv.DictReader(f) if r["power_watts"])
    ours = float(pc.sum(tel.column("power_w")).as_py())
    assert abs(ours / authors - 1) < 0.005


def test_h100_checkpoint_dip_stall_and_kill_are_detected(h100):
    _, out = h100
    info = json.loads((out / "run.json").read_text())
    det = info["detected_events"]
    names = [d["name"] for d in det]
    assert names.count("activity_start") == 1 and names.count("activity_end") == 1
    dips = [d for d in det if d["kind"] in ("checkpoint", "phase") and "dip" in d["name"]]
    t0 = read_telemetry(out).column("t_ns")[0].as_py()
    starts = sorted((d["t_start_ns"] - t0) / 1e9 for d in dips)
    # one checkpoint save (~345 s) and the injected SIGSTOP 600 s after the logger started
    assert len(starts) == 2
    assert 330 < starts[0] < 360 and 595 < starts[1] < 610
    assert all(d["waiting_on"] == "gpu0" for d in dips)  # the other 7 GPUs spin in NCCL, waiting
    end = next(d for d in det if d["name"] == "activity_end")
    assert 655 < (end["t_start_ns"] - t0) / 1e9 < 675  # SIGKILL 60 s after the stall
    ev = read_events(out)
    assert set(ev.column("rank").to_pylist()) == {-1}  # the detector's pseudo-rank


def test_h100_with_checkpoint_every_100_steps_labels_recurring_dips(tmp_path):
    src = real("wilkins-nvsmi-h100x8-titanx2/h100x8_gpt8b_ddp/ckpt100.csv")
    out = import_sources("nvsmi", [src], tmp_path / "run", tz="UTC")
    det = json.loads((out / "run.json").read_text())["detected_events"]
    assert sum(d["kind"] == "checkpoint" for d in det) >= 6


def test_titan_x_values_without_units(tmp_path):
    src = real("wilkins-nvsmi-h100x8-titanx2/titanx2_gpt_ddp/power-trace_2gpu_2025-12-05-02-37-06.csv")
    tel = import_nvsmi([src], tz="UTC").telemetry()
    assert sorted(set(tel.column("device").to_pylist())) == ["gpu0", "gpu1"]
    assert tel.column("power_w").null_count == 0


def test_powertraces_long_csv_imports_power_and_sm_clock(tmp_path):
    d = real("powertraces-4gpu-lora-nvsmi")
    src = next(d.glob("*pt017*.csv"))
    out = import_sources("auto", [src], tmp_path / "run")
    tel = read_telemetry(out)
    assert sorted(set(tel.column("device").to_pylist())) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    clocks = tel.column("clock_sm_mhz").to_numpy(zero_copy_only=False)
    assert np.nanmin(clocks) == 345 and np.nanmax(clocks) == 1980
    assert tel.column("temp_c").null_count == tel.num_rows  # empty in the export: unknown
    meta = json.loads(src.with_name(src.name.replace(".csv", ".meta.json")).read_text())
    from powertrain.importers.energy import total_energy_j

    wh = 0.0
    for g in range(4):
        sub = _rows(tel, f"gpu{g}")
        t = sub.column("t_ns").to_numpy()
        wh += total_energy_j(t, sub.column("power_w").to_numpy(), t[0], t[-1])[0] / 3600
    assert wh == pytest.approx(meta["total_energy_wh"], rel=0.005)


def test_powertraces_malformed_row_is_named(tmp_path):
    f = tmp_path / "pt.csv"
    f.write_text("run_id,timestamp,gpu_id,power_w,sm_clock_mhz\n"
                 "r,2026-05-07T10:02:32.506Z,0,75.27,345\n"
                 "r,2026-05-07T10:02:32.606Z,one,75.30,345\n")
    with pytest.raises(SourceFormatError, match=r"pt\.csv:3: gpu_id 'one' is not a GPU index"):
        import_sources("powertraces", [f], tmp_path / "run")
    assert not (tmp_path / "run").exists()


# -- issue 13: implausible readings and units ---------------------------------------------------------


def _hostile(tmp_path):
    f = tmp_path / "hostile.csv"
    f.write_text(
        "timestamp, index, name, power.draw [W], temperature.gpu, memory.used [MiB]\n"
        "2024/05/01 10:00:00.000, 0, NVIDIA H100 80GB HBM3, 300.00 W, 40, 100 MiB\n"  # line 2
        "2024/05/01 10:00:01.000, 0, NVIDIA H100 80GB HBM3, 1e308, 41, 100 MiB\n"  # line 3: too high
        "2024/05/01 10:00:02.000, 0, NVIDIA H100 80GB HBM3, inf, 42, 100 MiB\n"  # line 4: non-finite
        "2024/05/01 10:00:03.000, 0, NVIDIA H100 80GB HBM3, -500 W, -273, 1 GiB\n"  # line 5: negative, too cold
        "2024/05/01 10:00:04.000, 0, NVIDIA H100 80GB HBM3, 0.5 kW, 43, 100 MiB\n"  # line 6: 500 W
        "2024/05/01 10:00:05.000, 0, NVIDIA H100 80GB HBM3, 500 mW, 44, [N/A]\n"  # line 7: 0.5 W
    )
    return f


def test_hostile_values_are_counted_kept_out_and_warned_once_each(tmp_path):
    import warnings

    from powertrain.importers.common import ImportWarning_

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = import_nvsmi([_hostile(tmp_path)], tz="UTC").write(tmp_path / "run")
    lines = [str(w.message) for w in caught if issubclass(w.category, ImportWarning_)]
    assert len(lines) == 2 and all("\n" not in m for m in lines)  # one line per field
    assert any(m.startswith("power_w: 3 implausible") and "hostile.csv:3" in m for m in lines)
    assert any(m.startswith("temp_c: 1 implausible") and "hostile.csv:5" in m for m in lines)
    tel = read_telemetry(out).sort_by("t_ns")
    p = tel.column("power_w").to_pylist()
    assert p == [300.0, None, None, None, 500.0, 0.5]  # kept out; 0.5 kW is 500 W, 500 mW is 0.5 W
    assert tel.column("temp_c").to_pylist() == [40.0, 41.0, 42.0, None, 43.0, 44.0]
    assert tel.column("mem_used_bytes").to_pylist()[3] == 1 << 30
    dq = json.loads((out / "run.json").read_text())["data_quality"]["implausible"]
    assert dq["power_w"]["count"] == 3
    assert dq["power_w"]["kinds"] == {"negative": 1, "too_high": 1, "non_finite": 1}
    assert dq["power_w"]["first_of_kind"] == {"negative": "hostile.csv:5", "too_high": "hostile.csv:3",
                                              "non_finite": "hostile.csv:4"}
    assert dq["power_w"]["limits"] == [0.0, 2100.0] and "TDP" in dq["power_w"]["limits_source"]
    assert dq["temp_c"] == {**dq["temp_c"], "count": 1, "first": "hostile.csv:5", "kinds": {"too_low": 1}}


@pytest.mark.parametrize(("header", "cell", "watts"), [
    ("power.draw [kW]", "0.5", 500.0), ("power.draw [mW]", "500", 0.5), ("power.draw [W]", "250.00 W", 250.0),
    ("power.draw", "250.00 W", 250.0), ("power.draw [W]", "0.25 kW", 250.0),
])
def test_units_in_header_and_cells_are_honoured(tmp_path, header, cell, watts):
    f = tmp_path / "u.csv"
    f.write_text(f"timestamp, index, {header}, clocks.sm [GHz], temperature.gpu [K]\n"
                 f"2024/05/01 10:00:00.000, 0, {cell}, 1.41, 313.15\n")
    tel = read_telemetry(import_nvsmi([f], tz="UTC").write(tmp_path / "run"))
    assert tel.column("power_w").to_pylist() == [pytest.approx(watts)]
    assert tel.column("clock_sm_mhz").to_pylist() == [pytest.approx(1410.0)]
    assert tel.column("temp_c").to_pylist() == [pytest.approx(40.0)]


@pytest.mark.parametrize(("header", "cell", "line"), [
    ("power.draw [furlongs]", "300", 1), ("power.draw [W]", "300 hp", 2), ("memory.used [MiB]", "3 parsecs", 2),
])
def test_an_unknown_unit_is_an_error_naming_the_column(tmp_path, header, cell, line):
    f = tmp_path / "bad.csv"
    f.write_text(f"timestamp, index, {header}\n2024/05/01 10:00:00.000, 0, {cell}\n")
    with pytest.raises(SourceFormatError, match=rf"bad.csv:{line}: column '{header.split(' [')[0]}.*unknown unit"):
        import_nvsmi([f], tz="UTC")


def test_powertraces_units_in_column_names_and_hostile_values(tmp_path):
    from powertrain.importers.powertraces import import_powertraces

    f = tmp_path / "pt.csv"
    f.write_text("timestamp,gpu_id,power_kw,temperature [K],memory_used_gib,sm_clock_mhz,stage\n"
                 "2024-05-01T10:00:00Z,0,0.25,313.15,1,1410,train\n"
                 "2024-05-01T10:00:01Z,0,-0.5,100,2,1410,train\n"  # -500 W, -173 degC
                 "2024-05-01T10:00:02Z,0,300 W,320,1,inf,train\n")
    with pytest.warns(UserWarning) as rec:
        out = import_powertraces([f], tz="UTC").write(tmp_path / "run")
    assert len([w for w in rec if "implausible" in str(w.message)]) == 3  # power, temp, clock
    tel = read_telemetry(out).sort_by("t_ns")
    assert tel.column("power_w").to_pylist() == [pytest.approx(250.0), None, pytest.approx(300.0)]
    assert tel.column("temp_c").to_pylist() == [pytest.approx(40.0), None, pytest.approx(46.85)]
    assert tel.column("mem_used_bytes").to_pylist() == [1 << 30, 2 << 30, 1 << 30]
    dq = json.loads((out / "run.json").read_text())["data_quality"]["implausible"]
    assert dq["power_w"]["first"] == "pt.csv:3" and dq["clock_sm_mhz"]["kinds"] == {"non_finite": 1}
    g = tmp_path / "bad.csv"
    g.write_text("timestamp,gpu_id,power [hp]\n2024-05-01T10:00:00Z,0,1\n")
    with pytest.raises(SourceFormatError, match=r"bad.csv:1: column 'power \[hp\]'.*unknown unit"):
        import_powertraces([g], tz="UTC")


def test_real_powertraces_import_clean():
    from powertrain.importers.powertraces import import_powertraces

    for f in sorted(real("powertraces-4gpu-lora-nvsmi").glob("*.csv")):
        b = import_powertraces([f])
        assert "data_quality" not in b.info, f.name  # nothing implausible in a real export
        assert b.telemetry().num_rows > 6000
