"""Time that goes backwards, gaps, implausible values and missing nodes are data quality (issue 29,
Deliver 2–4): each gives a note or a null with its reason, never a wrong number.

Content cases run through the CLI and assert the exit code, the note (in ``summary.json`` /
``run.json`` and, for imports, the printed lines) and that every input file is byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import damage as damaged
from powertrain import monitor
from powertrain.analyze.synthetic import write_run
from powertrain.cli import app
from powertrain.core.energy import (
    counter_window_energy,
    relived_intervals,
    window_energy,
    windows_energy,
)
from powertrain.importers.common import ImportWarning_
from powertrain.telemetry.sampler import Sampler

S = 1_000_000_000
REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real")) / "mlperf-v4.0-smc-h100"
runner = CliRunner()


def _sha(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------------
# core.energy: the rules themselves


def _const(n: int, period_s: float = 1.0, w: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    return (np.arange(n) * int(period_s * S)).astype(np.int64), np.full(n, w)


def _case_gap() -> dict[str, Any]:
    t, p = _const(100)
    t[50:] += 3600 * S  # an hour without readings
    return {"energy": window_energy(t, p, 0, int(t[-1]), period_s=1.0), "null": "no power readings for 3601.0 s"}


def _case_bridged() -> dict[str, Any]:
    t, p = _const(100)
    t[50:] += 9 * S  # 10 periods: bridged (under 15), counted (over 5)
    return {"energy": window_energy(t, p, 0, int(t[-1]), period_s=1.0), "joules": 100.0 * int(t[-1]) / S,
            "bridged": 1}


def _case_step_back_in_order() -> dict[str, Any]:
    t, p = _const(100)
    t[50:] -= 30 * S  # as written: the clock steps back 30 s half-way (from 49 s to 20 s: 29 s before the last)
    return {"energy": window_energy(t, p, 0, int(t.max())), "null": "went backwards by 29.0 s"}


def _case_relived_given() -> dict[str, Any]:
    t, p = _const(100)
    return {"energy": window_energy(t, p, 0, 99 * S, relived=(np.array([40 * S]), np.array([45 * S]))),
            "null": "went backwards by 5.0 s"}


def _case_counter_across_a_gap() -> dict[str, Any]:
    t, _ = _const(100)
    t[50:] += 3600 * S
    counter = 100.0 * t / S  # the hardware kept counting through the hole
    return {"energy": counter_window_energy(t, counter, 0, int(t[-1])), "joules": 100.0 * int(t[-1]) / S}


def _case_counter_stepped_back() -> dict[str, Any]:
    t, p = _const(100)
    counter = np.cumsum(p)
    t[50:] -= 3 * S
    return {"energy": counter_window_energy(t, counter, 0, int(t.max())), "null": "went backwards"}


@pytest.mark.parametrize("case", [_case_gap, _case_bridged, _case_step_back_in_order, _case_relived_given,
                                  _case_counter_across_a_gap, _case_counter_stepped_back],
                         ids=lambda c: c.__name__.removeprefix("_case_"))
def test_energy_rules(case: Callable[[], dict[str, Any]]) -> None:
    c = case()
    e = c["energy"]
    if "null" in c:
        assert e.energy_j is None and c["null"] in (e.why_null or "")
    else:
        assert e.why_null is None and e.energy_j == pytest.approx(c["joules"])
    assert e.bridged_gaps == c.get("bridged", 0)


def test_steps_that_a_gap_or_a_step_back_falls_in_have_no_energy_the_others_keep_theirs() -> None:
    t, p = _const(200)
    t[100:] += 60 * S
    a = np.array([10, 97, 170, 250]) * S  # the second step spans the hole (99 s → 160 s)
    e, why = windows_energy(t, p, a, a + 5 * S, span=(0, int(t[-1])), period_s=1.0)
    assert list(np.isnan(e)) == [False, True, False, False]
    assert e[0] == pytest.approx(500.0) and "1 of 4 sub-window(s)" in (why or "")
    lo, hi = relived_intervals(np.array([0, 5, 10, 4, 6, 12]) * S)
    assert (lo.tolist(), hi.tolist()) == ([4 * S], [10 * S])


# --------------------------------------------------------------------------------------------------
# analysis: a run's telemetry as written


def _tel(run: Path) -> Path:
    return next((run / "telemetry").glob("*.parquet"))


def _edit_tel(run: Path, edit: Callable[[pa.Table], pa.Table]) -> None:
    path = _tel(run)
    pq.write_table(edit(pq.read_table(path)), path)


def _step_back(seconds: float) -> Callable[[pa.Table], pa.Table]:
    def edit(t: pa.Table) -> pa.Table:
        ts = t["t_ns"].to_numpy().copy()
        ts[ts >= ts.min() + 5 * S] -= int(seconds * S)  # the host clock steps back 5 s in, runs on
        return t.set_column(t.column_names.index("t_ns"), "t_ns", pa.array(ts, pa.int64()))
    return edit




def _negative_tokens(run: Path) -> None:
    path = next((run / "events").glob("*.parquet"))
    t = pq.read_table(path)
    tok = [(-v if v else v) for v in t["tokens"].to_pylist()]
    pq.write_table(t.set_column(t.column_names.index("tokens"), "tokens", pa.array(tok, t.schema.field("tokens").type)),
                   path)


def _check_step_back(s: dict[str, Any]) -> None:
    m, dq = s["metrics"], s["data_quality"]
    assert m["energy_j"] is None and "went backwards by" in s["why_null"]["energy_j"]
    assert m["power_peak_w"] == pytest.approx(500.0)  # levels are not time-dependent: kept
    assert dq["time"]["clock_steps_back"] == 1 and dq["time"]["devices_stepped_back"] == ["node0/gpu0"]
    assert dq["devices"][0]["first_step_back"] is not None
    assert any("went backwards on gpu0 (node0)" in n for n in s["notes"])


def _check_hole(s: dict[str, Any]) -> None:
    m = s["metrics"]
    assert m["energy_integral_j"] is None and "no power readings for 80" in s["why_null"]["energy_integral_j"]
    assert m["energy_j"] == pytest.approx(500.0 * 120)  # the energy counter counted through the hole
    assert s["data_quality"]["time"]["long_gaps"] == 1
    assert any("gaps longer than energy bridges" in n for n in s["notes"])
    assert any(r["energy_j"] is not None for r in s["per_step"])  # steps clear of the hole keep theirs


def _check_hole_without_counter(s: dict[str, Any]) -> None:
    assert s["metrics"]["energy_j"] is None and "no power readings for 80" in s["why_null"]["energy_j"]
    assert s["metrics"]["j_per_token"] is None
    assert s["data_quality"]["devices"][0]["long_gap_s"] == pytest.approx(80.2)  # 0.1 s readings around the hole


def _check_nan(s: dict[str, Any]) -> None:
    assert s["metrics"]["power_peak_w"] == pytest.approx(500.0)  # NaN no longer blanks every peak
    assert s["metrics"]["energy_j"] is not None
    assert s["data_quality"]["implausible"]["power_w"]["kinds"]["non_finite"] > 0
    assert any(n.startswith("power_w:") and "implausible" in n for n in s["notes"])


def _check_negative(s: dict[str, Any]) -> None:
    assert s["metrics"]["power_mean_w"] == pytest.approx(500.0)
    assert s["data_quality"]["implausible"]["power_w"]["kinds"]["negative"] > 0
    assert any("implausible" in n for n in s["notes"])


def _check_tokens(s: dict[str, Any]) -> None:
    why = s["why_null"]["j_per_token"]
    assert s["metrics"]["j_per_token"] is None and ("negative" in why or "below zero" in why)


ANALYSIS_CASES = {
    "clock-steps-back-3s": (lambda r: _edit_tel(r, _step_back(3.0)), _check_step_back, {}),
    "hole-80s": (lambda r: _edit_tel(r, damaged.hole(30.0, 80.0)), _check_hole, {"steps": 6, "step_s": 20.0}),
    "hole-80s-no-counter": (lambda r: _edit_tel(r, damaged.hole(30.0, 80.0)), _check_hole_without_counter,
                            {"steps": 6, "step_s": 20.0, "energy_counter": False}),
    "power-nan": (lambda r: _edit_tel(r, damaged.power_every(float("nan"))), _check_nan, {}),
    "power-negative": (lambda r: _edit_tel(r, damaged.power_every(-400.0)), _check_negative, {}),
    "tokens-negative": (_negative_tokens, _check_tokens, {}),
}


@pytest.mark.parametrize("name", list(ANALYSIS_CASES))
def test_summarize_says_what_is_wrong_with_time_and_values(tmp_path: Path, name: str) -> None:
    damage, check, kw = ANALYSIS_CASES[name]
    run = write_run(tmp_path / "run", hosts=1, devices_per_host=1, base_w=500.0, amp_w=0.0,
                    **{"steps": 8, **kw})
    damage(run)
    before = _sha(run)
    res = runner.invoke(app, ["summarize", str(run)])
    assert res.exit_code == 0, res.output
    summ = json.loads((run / "summary.json").read_text())
    check(summ)
    after = _sha(run)
    after.pop("summary.json")
    assert after == before


def test_a_clean_run_still_gives_its_4000_joules(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", hosts=1, devices_per_host=1, base_w=500.0, amp_w=0.0, steps=8)
    res = runner.invoke(app, ["summarize", str(run)])
    assert res.exit_code == 0, res.output
    s = json.loads((run / "summary.json").read_text())
    assert s["metrics"]["energy_j"] == pytest.approx(4000.0)  # 500 W × the 8 s of measured steps
    assert s["data_quality"]["time"]["clock_steps_back"] == 0 and s["data_quality"]["time"]["long_gaps"] == 0
    assert s["data_quality"]["implausible"] == {}


# --------------------------------------------------------------------------------------------------
# imports: nvidia-smi


NVSMI_HEAD = "timestamp, index, power.draw [W]\n"


def _nvsmi(times_s: list[float]) -> str:
    import datetime as dt

    t0 = dt.datetime(2024, 5, 1, 10, 0, 0)
    return NVSMI_HEAD + "".join(f"{(t0 + dt.timedelta(seconds=s)).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, 0, 400.00 W\n"
                                for s in times_s)


NVSMI_CASES = {
    # 120 s of readings; the clock steps back 30 s after the first 60
    "clock-steps-back-30s": ([i * 1.0 for i in range(60)] + [30.0 + i for i in range(60)],
                             "goes backwards 1 time(s)", "went backwards by 29.0 s"),
    "hole-1h": ([i * 1.0 for i in range(30)] + [3630.0 + i for i in range(30)],
                "gap(s) in the readings longer than", "no power readings for 3601.0 s"),
}


@pytest.mark.parametrize("name", list(NVSMI_CASES))
def test_nvsmi_import_names_time_problems_and_energy_is_unknown(tmp_path: Path, name: str) -> None:
    times, warn, why = NVSMI_CASES[name]
    src = tmp_path / "src"
    src.mkdir()
    (src / "gpu.csv").write_text(_nvsmi(times))
    before = _sha(src)
    res = runner.invoke(app, ["import", "nvsmi", str(src / "gpu.csv"), "--tz", "UTC", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert warn in res.output and "energy" in res.output and "unknown" in res.output
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    dev = info["data_quality"]["devices"][0]
    assert any(warn in w for w in info["import"]["warnings"])
    if "backwards" in warn:
        assert dev["clock_steps_back"] == 1 and dev["relived_ns"] and dev["first_step_back"] == "gpu.csv:62"
    else:
        assert dev["long_gaps"] == 1 and dev["first_long_gap"]["seconds"] == pytest.approx(3601.0)
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["metrics"]["energy_j"] is None and why in s["why_null"]["energy_j"]
    assert _sha(src) == before


# --------------------------------------------------------------------------------------------------
# imports: MLPerf


def _mllog(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(":::MLLOG " + json.dumps({"namespace": "", "event_type": "POINT_IN_TIME",
                                                      "metadata": {}, **r}) + "\n" for r in records))


T0_MS = 1_715_000_000_000


def _power_records(n: int = 160, key: str = "power_reading", w: float = 7000.0,
                   hole: tuple[float, float] | None = None) -> list[dict[str, Any]]:
    """Readings every 2 s from T0_MS − 10 s, bracketed by the measurement markers (an optional hole)."""
    recs = [{"key": "power_measurement_start", "time_ms": T0_MS - 10_000, "value": None},
            {"key": "conversion_eff", "time_ms": T0_MS - 10_000, "value": 1.0}]
    for i in range(n):
        t = T0_MS - 10_000 + 2000 * i
        if hole and hole[0] * 1000 <= t - T0_MS < (hole[0] + hole[1]) * 1000:
            continue
        recs.append({"key": key, "time_ms": t, "value": w})
    recs.append({"key": "power_measurement_stop", "time_ms": T0_MS - 10_000 + 2000 * (n - 1), "value": None})
    return recs


def _mlperf_run(root: Path, nodes: list[int], *, system_nodes: int | None = None,
                hole: tuple[float, float] | None = None, switch: str | None = None) -> Path:
    """A flat MLPerf run folder: a result log (run_start → run_stop over 300 s), node logs, a system."""
    root.mkdir(parents=True)
    _mllog(root / "result_0.txt", [{"key": "run_start", "time_ms": T0_MS},
                                   {"key": "run_stop", "time_ms": T0_MS + 300_000, "event_type": "INTERVAL_END",
                                    "metadata": {"status": "success"}}])
    (root / "power").mkdir()
    for i in nodes:
        _mllog(root / "power" / f"node_{i}.txt", _power_records(hole=hole if i == nodes[-1] else None))
    if switch == "readings":
        _mllog(root / "power" / "sw_0.txt", _power_records(w=500.0))
    elif switch == "estimate":
        _mllog(root / "power" / "sw_0.txt", [{"key": "interconnect_power_est", "time_ms": T0_MS, "value": 500.0}])
    if system_nodes is not None:
        (root / "system_x.json").write_text(json.dumps({"number_of_nodes": system_nodes, "accelerators_per_node": 8}))
    return root


def _check_ml_hole(ml: dict[str, Any], info: dict[str, Any], s: dict[str, Any]) -> None:
    assert ml["energy_run_j"] is None and "no power readings for 82.0 s" in ml["why_null"]["energy_run_nodes_j"]
    assert info["data_quality"]["time"]["long_gaps"] == 1
    assert s["metrics"]["energy_j"] is None and "no power readings for 82.0 s" in s["why_null"]["energy_j"]


def _check_ml_missing(ml: dict[str, Any], info: dict[str, Any], s: dict[str, Any]) -> None:
    assert ml["nodes_missing"] == ["node_3"] and ml["nodes_expected"] == 3
    assert ml["energy_run_j"] is None and "node_3 without a power log" in ml["why_null"]["energy_run_j"]
    assert ml["energy_run_measured_nodes_j"] == pytest.approx(2 * 7000.0 * 300)
    assert ml["score_j"] is None and "node_3" in ml["why_null"]["score_j"]
    assert info["data_quality"]["missing_devices"]["names"] == ["node_3"]
    assert info["job_device_count"] == 24  # the job's (throughput is the job's too)
    assert s["metrics"]["energy_j"] is None and "node_3 without a power log" in s["why_null"]["energy_j"]
    assert s["metrics"]["power_mean_w"] == pytest.approx(7000.0)  # per device: over what was measured
    assert s["data_quality"]["missing_devices"]["names"] == ["node_3"]
    assert any("node_3 without a power log" in n for n in s["notes"])


def _check_ml_switch_readings(ml: dict[str, Any], info: dict[str, Any], s: dict[str, Any]) -> None:
    assert ml["energy_run_parts_j"]["switch"] == pytest.approx(500.0 * 300)
    assert ml["energy_run_j"] == pytest.approx((7000.0 + 500.0) * 300)
    assert ml["score_parts_j"]["switch"] == pytest.approx(500.0 * 300)  # the node rule × time-to-train
    assert any(d["device"] == "switch" and d["name"] == "interconnect power meter" for d in info["devices"])
    assert s["metrics"]["energy_j"] == pytest.approx((7000.0 + 500.0) * 300)


def _check_ml_switch_estimate(ml: dict[str, Any], info: dict[str, Any], s: dict[str, Any]) -> None:
    assert ml["score_parts_j"]["switch"] == pytest.approx(500.0 * 300)


MLPERF_CASES = {
    "node-log-hole-80s": ({"nodes": [1, 2], "hole": (100.0, 80.0)}, "gap(s) in the readings longer than",
                          _check_ml_hole),
    "node-log-missing": ({"nodes": [1, 2], "system_nodes": 3}, "node_3 without a power log", _check_ml_missing),
    "switch-measured-with-readings": ({"nodes": [1], "switch": "readings"}, "imported", _check_ml_switch_readings),
    "switch-estimate": ({"nodes": [1], "switch": "estimate"}, "imported", _check_ml_switch_estimate),
}


@pytest.mark.parametrize("name", list(MLPERF_CASES))
def test_mlperf_import_names_holes_missing_nodes_and_reads_both_switch_forms(tmp_path: Path, name: str) -> None:
    kw, said, check = MLPERF_CASES[name]
    src = _mlperf_run(tmp_path / "src", **kw)
    before = _sha(src)
    res = runner.invoke(app, ["import", "mlperf", str(src), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert said in res.output
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    check(info["mlperf"], info, json.loads((tmp_path / "out" / "summary.json").read_text()))
    assert _sha(src) == before


def test_a_real_8_node_submission_with_one_node_log_missing_names_it(tmp_path: Path) -> None:
    real = REAL / "llama2-70b-lora_8node_64gpu"
    if not real.is_dir():
        pytest.skip(f"real MLPerf data not found at {real} (set POWERTRAIN_REAL_DATA)")
    src = tmp_path / "run"
    shutil.copytree(real, src)
    (src / "power_ac" / "node_5.txt").unlink()
    before = _sha(src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImportWarning_)
        res = runner.invoke(app, ["import", "mlperf", str(src), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "node_5 without a power log: the job had 8 nodes" in res.output
    ml = json.loads((tmp_path / "out" / "run.json").read_text())["mlperf"]
    assert ml["nodes_missing"] == ["node_5"] and ml["energy_run_j"] is None
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    # before: 12.6 % less energy and "64 devices" with no word; now the run's energy is unknown, saying why
    assert s["metrics"]["energy_j"] is None and "node_5" in s["why_null"]["energy_j"]
    assert s["metrics"]["cluster_power_mean_w"] is None and "node_5" in s["why_null"]["cluster_power_mean_w"]
    assert s["metrics"]["power_mean_w"] is not None  # per device: over the 7 nodes measured
    assert _sha(src) == before


# --------------------------------------------------------------------------------------------------
# the sampler's and the monitor's own clocks


class _Clock:
    """A wall clock that can be stepped and a monotonic clock that only moves forward."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_700_000_000 * S, 5 * S

    def advance(self, s: float, wall_step_s: float = 0.0) -> None:
        self.mono += int(s * S)
        self.wall += int((s + wall_step_s) * S)


class _Backend:
    name = "fake"

    def __init__(self, clock: _Clock) -> None:
        self.clock, self.incidents = clock, []
        self.software: dict[str, str] = {}

    def devices(self) -> list[Any]:
        return []

    def sample(self, host: str) -> list[dict[str, Any]]:
        return [{"t_ns": self.clock.wall, "host": host, "device": "gpu0", "power_w": 100.0}]

    def close(self) -> None:
        pass


class _Sink:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.rows += rows

    def maybe_flush(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_sampler_rows_never_go_backwards_when_the_system_clock_steps_back(tmp_path: Path) -> None:
    clock = _Clock()
    sink = _Sink()
    sampler = Sampler(tmp_path / "run", backends=[_Backend(clock)], host="h", sinks=[sink],  # type: ignore[list-item]
                      clocks=(lambda: clock.wall, lambda: clock.mono))
    for i in range(6):
        sampler._sample_once()
        clock.advance(0.05, wall_step_s=-60.0 if i == 2 else 0.0)
    t = np.array([r["t_ns"] for r in sink.rows])
    assert np.all(np.diff(t) == int(0.05 * S))  # one time line, the sampler's own
    meta = sampler.meta(final=True)["clock"]
    assert meta["steps_back"] == 1 and meta["stepped_back_s"] == pytest.approx(59.95)
    assert meta["wall_minus_sampler_ns"] == -60 * S


def test_monitor_duration_is_monotonic_when_the_wall_clock_steps_back(tmp_path: Path, monkeypatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(monitor, "_wall_ns", lambda: clock.wall)
    monkeypatch.setattr(monitor, "_mono_ns", lambda: clock.mono)
    mon = monitor.Monitor(tmp_path / "run")
    mon.run.create()
    mon._write_start()
    clock.advance(15.0, wall_step_s=-60.0)  # before: end − start = 15 − 60 = −45 s
    info = mon._finish("ok", None)
    assert info["end_ns"] - info["start_ns"] == 15 * S and info["duration_s"] == pytest.approx(15.0)
    assert info["clock"]["wall_clock_step_s"] == pytest.approx(-60.0)
    assert any("stepped back by 60.0 s" in n for n in info["data_quality"]["notes"])
    on_disk = json.loads((tmp_path / "run" / "run.json").read_text())
    assert on_disk["end_ns"] - on_disk["start_ns"] == 15 * S
