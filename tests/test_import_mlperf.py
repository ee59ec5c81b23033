"""MLPerf MLLOG power and result logs: the energy of a 512-GPU run, per-step energy, real quirks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from powertrain.importers import import_sources
from powertrain.importers.common import ImportWarning_, SourceFormatError
from powertrain.importers.mlperf import import_mlperf
from powertrain.store import read_events, read_telemetry

FIXTURE = Path(__file__).parent / "fixtures" / "mlperf" / "llama2-70b-lora_1node_8gpu_excerpt"
REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real")) / "mlperf-v4.0-smc-h100"


def real(sub: str) -> Path:
    p = REAL / sub
    if not p.exists():
        pytest.skip(f"real MLPerf data not found at {p} (set POWERTRAIN_REAL_DATA)")
    return p


@pytest.fixture(scope="module")
def gpt3(build_once):
    src = real("gpt3-175b_64node_512gpu")
    out = Path(build_once("mlperf-gpt3", lambda folder: str(import_sources("mlperf", [src], folder / "gpt3"))))
    return src, out


def test_gpt3_512gpu_energy_matches_the_submitter_within_0_1_percent(gpt3):
    src, out = gpt3
    info = json.loads((out / "run.json").read_text())
    reported = float((src / "power_ac" / "total_power.txt").read_text().split(":")[1].split()[0])
    assert reported == 415.22
    ml = info["mlperf"]
    assert ml["reported_energy_kwh"] == reported
    assert abs(ml["energy_run_kwh"] / reported - 1) < 1e-3
    # recompute from what was written to disk (not from the importer's memory)
    tel = read_telemetry(out)
    assert set(tel.column("device").to_pylist()) == {"node"}
    hosts = sorted(set(tel.column("host").to_pylist()))
    assert len(hosts) == 64 and "node_1" in hosts and "node_64" in hosts
    from powertrain.importers.energy import total_energy_j

    a, b = ml["run_start_ms"] * 1_000_000, ml["run_stop_ms"] * 1_000_000
    total = 0.0
    for h in hosts:
        sub = tel.filter(pc.equal(tel.column("host"), h))
        total += total_energy_j(sub.column("t_ns").to_numpy(), sub.column("power_w").to_numpy(), a, b)[0]
    assert abs(total / 3.6e6 / reported - 1) < 1e-3
    # ~2 s node power: ~1700 readings per node, 6.8 kW mean
    assert 1600 < tel.num_rows / 64 < 1800
    assert 6000 < np.mean(tel.column("power_w").to_numpy()) < 7500


def test_gpt3_has_288_steps_with_per_step_energy(gpt3):
    _, out = gpt3
    ev = read_events(out)
    steps = ev.filter(pc.equal(ev.column("kind"), "step"))
    assert steps.num_rows == 288
    assert set(steps.column("rank").to_pylist()) == {0}
    assert steps.column("step").to_pylist() == list(range(1, 289))  # cumulative tokens / (2048 × 2048)
    dur = (steps.column("t_end_ns").to_numpy() - steps.column("t_start_ns").to_numpy()) / 1e9
    assert 10.3 < np.median(dur) < 10.7
    attrs = [json.loads(a) for a in steps.column("attrs").to_pylist()]
    energy = np.array([a["energy_j"] for a in attrs])
    assert np.all(np.isfinite(energy))
    # energy of a step ≈ Σ nodes mean power × step time (64 × ~7 kW × ~10.6 s ≈ 4.7 MJ)
    assert 4.0e6 < np.median(energy) < 5.5e6
    info = json.loads((out / "run.json").read_text())
    assert energy.sum() < info["mlperf"]["energy_run_j"]  # steps cover the run minus evals
    assert steps.column("tokens").to_pylist()[0] == 2048 * 2048
    evals = ev.filter(pc.equal(ev.column("kind"), "eval"))
    assert evals.num_rows == 24


def test_helper_agrees_with_the_analysis_integral(gpt3):
    """The vectorised per-step rule equals powertrain.analyze.signal's window integral."""
    signal = pytest.importorskip("powertrain.analyze.signal")
    _, out = gpt3
    tel = read_telemetry(out)
    sub = tel.filter(pc.equal(tel.column("host"), "node_7"))
    t, p = sub.column("t_ns").to_numpy(), sub.column("power_w").to_numpy()
    from powertrain.importers.energy import energy_between_j

    a = np.array([t[10] + 123_456_789, t[200] + 1])
    b = np.array([t[15] + 7, t[900] + 999_999_999])
    ours, _ = energy_between_j(t, p, a, b)
    for i in range(2):
        ref = signal.trapezoid_j(*signal.clip_interp(t, p, int(a[i]), int(b[i])))
        assert ours[i] == pytest.approx(ref, rel=1e-9)


def test_stop_marker_with_the_start_timestamp_keeps_every_reading(tmp_path):
    with pytest.warns(ImportWarning_, match="power_measurement_stop"):
        out = import_sources("mlperf", [FIXTURE], tmp_path / "run")
    tel = read_telemetry(out)
    assert tel.num_rows == 100  # all readings of the excerpt, none dropped by the bogus stop marker
    assert set(tel.column("host").to_pylist()) == {"node_0"}
    info = json.loads((out / "run.json").read_text())
    assert any("power_measurement_stop" in w for w in info["import"]["warnings"])
    node0 = FIXTURE / "power_ac" / "node_0.txt"
    srcs = {Path(s["path"]).name: s["sha256"] for s in info["import"]["sources"]}
    assert srcs["node_0.txt"] == hashlib.sha256(node0.read_bytes()).hexdigest()
    ev = read_events(out)
    assert "run" in ev.column("name").to_pylist()
    assert ev.filter(pc.equal(ev.column("kind"), "eval")).num_rows == 5


def test_full_1node_quirk_file_keeps_all_818_readings():
    src = real("llama2-70b-lora_1node_8gpu")
    with pytest.warns(ImportWarning_):
        b = import_mlperf([src])
    # 818 readings in the log, one of them an exact repeat (same time, same value): dropped and counted
    assert b.telemetry().num_rows == 817
    assert b.info["data_quality"]["devices"][0]["readings_in_log"] == 818
    assert b.info["data_quality"]["readings"]["duplicate_readings_dropped"] == 1


def test_malformed_line_names_file_and_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "src"
    shutil.copytree(FIXTURE, bad)
    node = bad / "power_ac" / "node_0.txt"
    lines = node.read_text().splitlines(keepends=True)
    lines[41] = ':::MLLOG {"namespace": "", "time_ms": 1715278071, "key": "power_reading", "value": 28\n'
    node.write_text("".join(lines))
    with pytest.raises(SourceFormatError) as exc:
        import_sources("mlperf", [bad], tmp_path / "run")
    assert exc.value.path.endswith("node_0.txt") and exc.value.line == 42
    assert "not valid JSON" in str(exc.value)
    assert not (tmp_path / "run").exists()


def test_dc_side_of_the_same_run_from_gzipped_logs(tmp_path):
    src = real("gpt3-175b_64node_512gpu")
    b = import_mlperf([src / "power_dc_gz", next(src.glob("result_*.txt"))])
    ml = b.info["mlperf"]
    assert ml["nodes"] == 64 and ml["reported_energy_kwh"] == 408.44
    assert abs(ml["energy_run_kwh"] / 408.44 - 1) < 1e-3


def test_gpt3_per_device_throughput_divides_by_the_512_gpus(gpt3):
    """The log is rank 0's view of the whole job: per device = job tokens/s ÷ 512 (system_*.json)."""
    from powertrain.analyze.summary import summarize_run

    _, out = gpt3
    info = json.loads((out / "run.json").read_text())
    assert info["job_device_count"] == 512  # 64 nodes × 8 accelerators
    assert "number_of_nodes × accelerators_per_node" in info["job_device_count_source"]
    ev = read_events(out)
    steps = ev.filter(pc.equal(ev.column("kind"), "step"))
    assert set(steps.column("window").to_pylist()) == {"measured"}  # all 288 lie inside run_start → run_stop
    m = summarize_run(out, probe_cpu_peak=False)["metrics"]
    dur = (steps.column("t_end_ns").to_numpy() - steps.column("t_start_ns").to_numpy()) / 1e9
    job = 288 * 2048 * 2048 / dur.sum()
    assert m["step_time_mean_s"] == pytest.approx(dur.mean(), rel=1e-9)
    assert m["tokens_per_s"] == pytest.approx(job, rel=1e-9)
    assert m["tokens_per_s_per_device"] == pytest.approx(job / 512, rel=1e-9)
    assert 700 < m["tokens_per_s_per_device"] < 850  # ≈ 395 k tokens/s over 512 H100s
    assert m["energy_integral_j"] is not None  # node power inside the measured window


def test_without_a_system_description_per_device_is_unknown_not_the_job_total(tmp_path):
    from powertrain.analyze.summary import summarize_run

    src = real("gpt3-175b_64node_512gpu")
    out = import_sources("mlperf", [next(src.glob("result_*.txt"))], tmp_path / "run", warmup_steps=3)
    info = json.loads((out / "run.json").read_text())
    assert info["job_device_count"] is None and "system_*.json" in info["job_device_count_source"]
    s = summarize_run(out, probe_cpu_peak=False)
    assert s["metrics"]["tokens_per_s"] is not None
    assert s["metrics"]["tokens_per_s_per_device"] is None
    assert "device count is unknown" in s["why_null"]["tokens_per_s_per_device"]
    windows = read_events(out).filter(pc.equal(read_events(out).column("kind"), "step")).column("window").to_pylist()
    assert windows == ["warmup"] * 3 + ["measured"] * 285
