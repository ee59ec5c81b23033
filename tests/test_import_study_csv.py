"""The study's header-less ``<metric>_<rank>.csv`` files: -1 as unknown, 32-bit counters, rank → node."""

from __future__ import annotations

import itertools
import json

import pyarrow.compute as pc
import pytest

from powertrain.importers import import_sources
from powertrain.importers.common import SourceFormatError
from powertrain.schema import Throttle
from powertrain.store import read_telemetry

T0 = 1_717_000_000.0
WRAP = 2**32


def _write(folder, metric, rank, rows):
    (folder / f"{metric}_{rank}.csv").write_text("".join(f"{t:.3f},{v}\n" for t, v in rows))


@pytest.fixture
def study(tmp_path):
    d = tmp_path / "artifact"
    d.mkdir()
    for rank in (0, 9):  # rank 9 → node1, gpu1 (8 GPUs per node)
        _write(d, "power", rank, [(T0 + i * 0.1, 300 + rank + i) for i in range(5)])
        _write(d, "temp", rank, [(T0, 60), (T0 + 0.1, -1), (T0 + 0.2, 62), (T0 + 0.3, 63), (T0 + 0.4, 64)])
        # a 32-bit link byte counter that wraps between the 3rd and 4th sample
        raw = [WRAP - 3000, WRAP - 2000, WRAP - 1000, 500, 1500]
        _write(d, "nvlink_tx", rank, [(T0 + i * 0.1, v) for i, v in enumerate(raw)])
    _write(d, "throttle", 0, [(T0, 4), (T0 + 0.2, 0)])
    _write(d, "sm_clock", 0, [(T0 + 0.05, 1980)])  # a metric sampled at its own instants
    _write(d, "gpu_serial", 0, [(T0, 1)])  # no telemetry column: dropped, listed
    return d


def test_study_layout_imports_with_nulls_unwrapped_counters_and_rank_map(study, tmp_path):
    out = import_sources("study_csv", [study], tmp_path / "run")
    tel = read_telemetry(out)
    assert sorted(set(zip(tel.column("host").to_pylist(), tel.column("device").to_pylist(), strict=True))) == [
        ("node0", "gpu0"), ("node1", "gpu1")]
    r9 = tel.filter(pc.equal(tel.column("host"), "node1"))
    assert r9.column("temp_c").to_pylist() == [60.0, None, 62.0, 63.0, 64.0]  # -1 → unknown
    link = r9.column("link_tx_bytes").to_pylist()
    assert link == [WRAP - 3000, WRAP - 2000, WRAP - 1000, WRAP + 500, WRAP + 1500]
    assert all(b > a for a, b in itertools.pairwise(link))
    r0 = tel.filter(pc.equal(tel.column("host"), "node0"))
    assert r0.num_rows == 6  # 5 shared instants + the sm_clock instant
    assert r0.column("clock_sm_mhz").drop_null().to_pylist() == [1980.0]
    assert Throttle(r0.column("throttle").drop_null()[0].as_py()) == Throttle.POWER_CAP
    info = json.loads((out / "run.json").read_text())
    assert {"rank": 9, "host": "node1", "local_rank": 1, "device": "gpu1"} in info["rank_map"]
    assert info["study_csv"]["counter_wraps_unwrapped"] == 2
    assert any("gpu_serial" in d for d in info["import"]["dropped"])
    assert len(info["import"]["sources"]) == 8


def test_auto_detects_the_study_layout(study, tmp_path):
    assert import_sources("auto", [study / "power_0.csv", study / "temp_0.csv"], tmp_path / "run").is_dir()


def test_malformed_line_is_named(study, tmp_path):
    (study / "power_9.csv").write_text(f"{T0},300\n{T0 + 0.1};301\n")
    with pytest.raises(SourceFormatError, match=r"power_9\.csv:2: expected '<epoch seconds>,<value>'"):
        import_sources("study_csv", [study], tmp_path / "run")
    (study / "power_9.csv").write_text("time,power\n1,2\n")
    with pytest.raises(SourceFormatError, match=r"power_9\.csv:1: the study's CSVs have no header"):
        import_sources("study_csv", [study], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_summary_of_telemetry_only_import_shows_power_and_says_why_no_step_time(study, tmp_path):
    """The study's CSVs hold telemetry, no steps: power and energy over the whole span, step time null."""
    from powertrain.analyze.summary import summarize_run

    out = import_sources("study_csv", [study], tmp_path / "run")
    s = summarize_run(out, probe_cpu_peak=False)
    assert s["metrics"]["power_mean_w"] is not None and s["metrics"]["energy_integral_j"] is not None
    assert s["metrics"]["step_time_mean_s"] is None and s["why_null"]["step_time_mean_s"]
    assert "measured_window" not in json.loads((out / "run.json").read_text())


def test_units_in_metric_names_and_implausible_readings(tmp_path):
    import json

    import pytest

    from powertrain.importers import import_sources
    from powertrain.store import read_telemetry

    (tmp_path / "power_kw_0.csv").write_text("1714557600,0.3\n1714557601,-0.1\n1714557602,1e308\n1714557603,0.31\n")
    (tmp_path / "energy_0.csv").write_text("1714557600,100\n1714557601,400\n1714557602,350\n1714557603,1000\n")
    (tmp_path / "temp_0.csv").write_text("1714557600,40\n1714557601,-1\n1714557602,200\n1714557603,41\n")
    with pytest.warns(UserWarning) as rec:
        out = import_sources("study_csv", [tmp_path], tmp_path / "run")
    assert len([w for w in rec if "implausible" in str(w.message)]) == 3
    tel = read_telemetry(out).sort_by("t_ns")
    assert tel.column("power_w").to_pylist() == [pytest.approx(300.0), None, None, pytest.approx(310.0)]
    assert tel.column("energy_j").to_pylist() == [100.0, 400.0, None, 1000.0]  # backwards: kept out
    assert tel.column("temp_c").to_pylist() == [40.0, None, None, 41.0]  # -1 is the study's null, 200 implausible
    dq = json.loads((out / "run.json").read_text())["data_quality"]["implausible"]
    assert dq["power_w"]["kinds"] == {"negative": 1, "too_high": 1} and dq["power_w"]["first"] == "power_kw_0.csv:2"
    assert dq["energy_j"]["kinds"] == {"backwards": 1} and dq["energy_j"]["first"] == "energy_0.csv:3"
    assert dq["temp_c"]["count"] == 1
