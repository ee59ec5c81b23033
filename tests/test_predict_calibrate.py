"""Calibration from measured run directories: read them, fit, and predict held-out layouts.

The run directories are synthesised here with known step times: the "truth" is the model itself
with hidden coefficients plus 2% noise, so a correct reader and fitter must recover them well
enough to predict layouts it was not fitted on within 20% (the issue's CPU acceptance bar).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.hardware import HostProbe, probe_host
from powertrain.predict import (
    collect_runs,
    fit_calibration,
    load_calibration,
    predict,
    read_measured_run,
    write_prediction,
)
from powertrain.predict.calibration import Calibration
from powertrain.predict.case import case_from_run_config
from powertrain.schema import EVENTS_SCHEMA
from powertrain.spec.run import RunConfig
from powertrain.store import RunDir

# the truth is representable by what a CPU calibration fits (GEMM efficiency, layer overhead, gloo latency):
# a fit that cannot represent it runs into a bound, which now fails loudly (issue 15)
TRUTH = Calibration(name="truth").with_coefficients(gemm_eff_fp32=0.22, layer_overhead_s=0.004, comm_latency_scale=10.0)
# the base a fit of it starts from: the same coefficients outside the three it fits (the shipped profile's move with
# every refit on published runs, and a truth they cannot reach says nothing about the fitter)
BASE = Calibration(name="base")
# What the launcher records in run.json for a CPU run (powertrain.hardware.record_host_probe): one
# lone rank runs the host's two threads, two ranks one thread each (torchrun's default).
PROBES = {1: {"matmul_flops": 1.5e11, "copy_bytes_per_s": 2.0e10, "threads": 1, "cores": 2, "method": "fixture"},
          2: {"matmul_flops": 2.6e11, "copy_bytes_per_s": 4.5e10, "threads": 2, "cores": 2, "method": "fixture"}}


def _probe(cfg: RunConfig) -> dict:
    # what the launcher would record here: the ranks' thread count as torchrun sets it (the suite's
    # conftest pins OMP_NUM_THREADS=1, so then a lone rank runs one thread too)
    from powertrain.hardware import rank_threads

    return PROBES[min(2, rank_threads(cfg.hardware.devices_per_node))]


def _truth_case(cfg: RunConfig):
    return case_from_run_config(cfg, host_probe=HostProbe.from_dict(_probe(cfg), "fixture"))


def _cfg(name: str, world: int = 1, **layout: object) -> RunConfig:
    knobs = layout.pop("knobs", {})
    return RunConfig(name=name, model="llama3-tiny", layout=layout,
                     knobs={"global_batch": 8, "micro_batch": 1, **knobs},  # type: ignore[dict-item]
                     hardware={"nodes": 1, "devices_per_node": world, "device": "cpu"})


LAYOUTS = {
    "dp1": _cfg("dp1"),
    "dp2": _cfg("dp2", 2),
    "tp2": _cfg("tp2", 2, tp=2),
    "pp2": _cfg("pp2", 2, pp=2),
    "dp1-mb4": _cfg("dp1-mb4", knobs={"micro_batch": 4}),
    "dp2-full": _cfg("dp2-full", 2, knobs={"recompute": "full"}),
    "tp2-sp": _cfg("tp2-sp", 2, tp=2, sequence_parallel=True),
}


def _write_run(root, cfg: RunConfig, step_s: float, rng: np.random.Generator, world: int) -> RunDir:
    rd = RunDir(root / cfg.name).create()
    rd.write({"kind": "run", "status": "ok", "name": cfg.name, "config": cfg.model_dump(mode="json"),
              "host_probe": _probe(cfg)})
    t = 1_000_000_000
    for rank in range(world):
        rows = []
        for step in range(8):
            dur = step_s * (1 + rng.normal(0, 0.02)) * (0.97 if rank else 1.0)
            rows.append({"rank": rank, "kind": "step", "name": "step", "step": step, "t_start_ns": t + int(step * 10e9),
                         "t_end_ns": t + int(step * 10e9 + dur * 1e9), "window": "warmup" if step < 2 else "measured"})
        pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), rd.events_file(rank))
    return rd


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    truth = {}
    for name, cfg in LAYOUTS.items():
        truth[name] = predict(_truth_case(cfg), TRUTH).metrics["step_time_mean_s"]
        _write_run(root, cfg, truth[name], rng, cfg.hardware.world)
    return root, truth


def test_reads_step_time_as_the_slowest_rank_of_measured_steps(measured) -> None:
    root, truth = measured
    run = read_measured_run(root / "dp2")
    assert run.step_time_s == pytest.approx(truth["dp2"], rel=0.03)
    assert run.case.dp == 2 and run.power_mean_w is None


def test_calibrate_on_three_predicts_four_others_within_20_percent(measured) -> None:
    root, truth = measured
    train = collect_runs([root / "dp1", root / "dp2", root / "tp2"])
    # all three CPU step terms (the default leaves the per-layer overhead alone): the truth sets each
    prof = fit_calibration(train, name="cpu-test", base=BASE,
                           params=["gemm_eff", "layer_overhead_s", "comm_latency_scale"])
    assert prof.error["step_time_mape"] < prof.error["step_time_mape_before"]
    assert prof.error["step_time_mape"] < 0.05
    for name in ("pp2", "dp1-mb4", "dp2-full", "tp2-sp"):
        # a RunConfig: the profile's probe (the fitted runs'), no fresh probe of this host
        got = predict(LAYOUTS[name], prof).metrics["step_time_mean_s"]
        assert got == pytest.approx(truth[name], rel=0.20), name


def test_predictions_are_not_calibration_data(tmp_path) -> None:
    write_prediction(tmp_path / "p", _cfg("p"))
    with pytest.raises(ValueError, match="prediction"):
        read_measured_run(tmp_path / "p")


def test_cli_calibrate_then_predict_with_the_profile(measured, tmp_path, monkeypatch) -> None:
    root, _ = measured
    monkeypatch.setenv("POWERTRAIN_PROFILES", str(tmp_path / "profiles"))
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", str(root / "dp1"), str(root / "dp2"), str(root / "tp2"), "--name", "cpu-x"])
    assert res.exit_code == 0, res.output
    assert "MAPE" in res.output and (tmp_path / "profiles" / "cpu-x.yaml").is_file()
    assert "host probe kept for 1-thread ranks: fp32 matmul 150.0 GFLOP/s" in res.output
    assert load_calibration("cpu-x").error["n_runs"] == 3
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(_cfg("pp2", 2, pp=2).model_dump(mode="json")))
    res = runner.invoke(app, ["predict", str(spec), "--profile", "cpu-x", "--out", str(tmp_path / "pred")])
    assert res.exit_code == 0, res.output
    info = json.loads((tmp_path / "pred" / "run.json").read_text())
    summ = json.loads((tmp_path / "pred" / "summary.json").read_text())
    assert info["kind"] == summ["kind"] == "prediction" and info["status"] == "ok"
    assert summ["profile"] == "cpu-x" and summ["metrics"]["step_time_mean_s"] > 0
    assert summ["metrics"]["power_mean_w"] is None and summ["why_null"]["power_mean_w"]


def test_cli_errors_name_the_fix(tmp_path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", str(tmp_path / "nothing"), "--name", "x"])
    assert res.exit_code == 2 and "run directory" in res.output
    res = runner.invoke(app, ["predict", "--profile", "no-such-profile", "--study"])
    assert res.exit_code == 2 and "powertrain calibrate" in res.output


def test_host_cpu_ranks_split_the_cores_and_gloo_pays_per_collective_call() -> None:
    from dataclasses import replace

    from powertrain.hardware import cpu_device, get_device
    from powertrain.predict.calibration import Coefficients
    from powertrain.predict.steptime import step_time

    one_thread = HostProbe.from_dict(PROBES[1], "fixture")
    # ranks whose threads fit in the cores each keep the probe's rates (2 ranks × 1 thread on 2 cores);
    # beyond that they share the cores evenly (4 ranks × 1 thread: half each)
    two, four = cpu_device(one_thread, 2), cpu_device(one_thread, 4)
    assert two.peak("fp32") == one_thread.matmul_flops and two.memory_bw == one_thread.copy_bytes_per_s
    assert four.peak("fp32") == pytest.approx(one_thread.matmul_flops / 2)
    assert four.memory_bw == pytest.approx(one_thread.copy_bytes_per_s / 2)
    c = Coefficients()
    tp, sp = _truth_case(LAYOUTS["tp2"]), _truth_case(LAYOUTS["tp2-sp"])
    # SP's all-gather + reduce-scatter move what one all-reduce moves, but on gloo each call pays a
    # rendezvous: twice the calls cost more; on a GPU link (NCCL) the two are the same
    assert step_time(sp, c).breakdown["tp_comm_exposed_s"] > step_time(tp, c).breakdown["tp_comm_exposed_s"]
    gpu = get_device("h100-sxm")
    assert step_time(replace(sp, device=gpu), c).breakdown["tp_comm_exposed_s"] == pytest.approx(
        step_time(replace(tp, device=gpu), c).breakdown["tp_comm_exposed_s"])


def test_calibrating_the_same_runs_twice_gives_identical_coefficients(measured) -> None:
    root, _ = measured
    paths = [root / "dp1", root / "dp2", root / "tp2"]
    first = fit_calibration(collect_runs(paths), name="a")
    probe_host.cache_clear()  # a second process would probe afresh: the runs' records must be what counts
    second = fit_calibration(collect_runs(paths), name="a")
    assert first.coefficients == second.coefficients
    assert first.error["per_run"] == second.error["per_run"]
    # the profile keeps the probes it was fitted with: the runs' own records, per rank thread count
    by_threads = {r["threads"]: r for r in first.host_probes}
    assert set(by_threads) == {_probe(LAYOUTS[n])["threads"] for n in ("dp1", "dp2", "tp2")}
    for t, rec in by_threads.items():
        assert rec["matmul_flops"] == PROBES[t]["matmul_flops"]
        assert rec["copy_bytes_per_s"] == PROBES[t]["copy_bytes_per_s"]
        assert "recorded in run.json" in rec["how"]


def test_a_run_without_a_recorded_probe_gets_a_fresh_one_labelled_so(tmp_path) -> None:
    rd = _write_run(tmp_path, _cfg("old", 2), 0.5, np.random.default_rng(1), 2)
    info = json.loads((rd.path / "run.json").read_text())
    del info["host_probe"]
    rd.write(info)
    run = read_measured_run(rd.path)
    assert run.case.device.probe is not None and "recorded none" in run.case.device.probe.source
    assert "recorded none" in run.case.device.source


def test_predict_three_times_on_a_cpu_spec_gives_identical_step_times(measured, tmp_path) -> None:
    """Three separate `powertrain predict` processes on the CPU example sweep, with a profile fitted
    on CPU runs: every step time is identical to the last digit (the profile's probe, not a fresh one)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from powertrain.predict.calibration import save_calibration

    root, _ = measured
    prof = fit_calibration(collect_runs([root / "dp1", root / "dp2", root / "tp2"]), name="cpu-fixture")
    path = save_calibration(prof, tmp_path / "cpu-fixture.yaml")
    spec = Path(__file__).resolve().parents[1] / "examples" / "cpu-sweep.yaml"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # 2 ranks: torchrun's 1 thread
    outs = []
    for _ in range(3):
        res = subprocess.run([sys.executable, "-m", "powertrain.cli", "predict", str(spec), "--profile", str(path),
                              "--json"], capture_output=True, text=True, env=env, timeout=300, check=False)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert len(lines) == 8  # JSON lines: one compact object per configuration
        rows = [json.loads(line) for line in lines]
        assert all(r["breakdown"]["host_probe"]["source"].startswith("calibration profile") for r in rows)
        assert "note:" not in res.stderr  # no fresh probe was needed
        outs.append([(r["config"]["name"], repr(r["metrics"]["step_time_mean_s"])) for r in rows])
    assert outs[0] == outs[1] == outs[2]


def _profile_with(**coefficients: object) -> dict:
    import yaml

    raw = yaml.safe_load(yaml.safe_dump(load_calibration("default").to_dict()))
    raw["coefficients"].update(coefficients)
    return raw


@pytest.mark.parametrize(("name", "value", "says"), [
    ("mem_eff", 0, r"mem_eff = 0 is outside 0\.01-1: it is the fraction of memory bandwidth"),
    ("overlap_eff", 1.7, r"overlap_eff = 1\.7 is outside 0-1"),
    ("moe_imbalance", 0.5, r"moe_imbalance = 0\.5 is outside 1-64: it is the busiest expert's load"),
    ("layer_overhead_s", -1e-5, r"layer_overhead_s = -1e-05 is outside 0-1"),
    ("gemm_eff_16", "fast", r"gemm_eff_16 = 'fast' is not a number"),
    ("power_limiter_window_s", float("nan"), r"power_limiter_window_s = nan is not a number"),
])
def test_a_profile_coefficient_outside_where_it_means_anything_is_refused_naming_the_range(name, value, says) -> None:
    """A hand-edited profile fails when loaded, in one line naming the coefficient, its range and meaning,
    not mid-prediction (mem_eff 0 divided by zero) or silently (overlap_eff 1.7 hid more than there is)."""
    from powertrain.predict.calibration import calibration_from_dict

    with pytest.raises(ValueError, match=r"site\.yaml: coefficient " + says):
        calibration_from_dict(_profile_with(**{name: value}), "site.yaml")


def test_a_retired_coefficient_in_an_old_profile_is_named_not_ignored() -> None:
    from powertrain.predict.calibration import calibration_from_dict

    with pytest.raises(ValueError, match=r"old\.yaml: moe_dispatch_passes no longer change.*predict/moe\.py.*delete the line"):
        calibration_from_dict(_profile_with(moe_dispatch_passes=8.0), "old.yaml")


def test_every_coefficient_has_a_validity_range_that_holds_its_default_and_every_fit_bound() -> None:
    """One table says where each coefficient means something; the defaults, the shipped profile, the CPU
    fit's clamps and the published-run refit's literature ranges all lie inside it, and every coefficient
    changes some prediction (a retired one is refused, above)."""
    import importlib.util
    from pathlib import Path

    from powertrain.predict import calibrate
    from powertrain.predict.calibration import COEFFICIENT_NAMES, VALID_RANGES, Coefficients

    assert set(VALID_RANGES) == set(COEFFICIENT_NAMES)
    shipped = load_calibration("default").coefficients
    for k, (lo, hi, _) in VALID_RANGES.items():
        assert lo <= getattr(Coefficients(), k) <= hi and lo <= getattr(shipped, k) <= hi, k
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("predict_accuracy", root / "benchmarks" / "predict_accuracy.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for bounds in (calibrate.BOUNDS, bench.BOUNDS):
        for k, (lo, hi) in bounds.items():
            assert VALID_RANGES[k][0] <= lo < hi <= VALID_RANGES[k][1], k
    src = "".join(p.read_text() for p in (root / "src" / "powertrain").rglob("*.py"))
    assert [k for k in COEFFICIENT_NAMES if f".{k}" not in src] == []  # each is read somewhere


def _write_phased_run(root, cfg: RunConfig, fixed_s: float, micro: int = 2, optimizer: bool = True,
                      optimizer_after: bool = False) -> RunDir:
    """A run whose steps are ``micro`` forward/backward spans, an optimizer span, then ``fixed_s`` of other time
    (``optimizer_after``: the optimizer span is timed after the step's span ends, as some trainers do)."""
    rd = RunDir(root / cfg.name).create()
    rd.write({"kind": "run", "status": "ok", "name": cfg.name, "config": cfg.model_dump(mode="json"),
              "host_probe": _probe(cfg)})
    rows = []
    t = 1_000_000_000
    for step in range(6):
        start = t
        for mb in range(micro):
            for kind, d in (("forward", 0.010), ("backward", 0.020)):
                rows.append({"rank": 0, "kind": kind, "step": step, "microbatch": mb, "t_start_ns": t,
                             "t_end_ns": t + int(d * 1e9), "window": "warmup" if step < 2 else "measured"})
                t += int(d * 1e9)
        if optimizer and not optimizer_after:
            rows.append({"rank": 0, "kind": "optimizer", "step": step, "t_start_ns": t, "t_end_ns": t + 5_000_000,
                         "window": "warmup" if step < 2 else "measured"})
            t += 5_000_000
        t += int((fixed_s if step >= 2 else 1.0) * 1e9)  # warm-up steps are slow: they must not count
        rows.append({"rank": 0, "kind": "step", "name": "step", "step": step, "t_start_ns": start, "t_end_ns": t,
                     "window": "warmup" if step < 2 else "measured"})
        if optimizer and optimizer_after:
            rows.append({"rank": 0, "kind": "optimizer", "step": step, "t_start_ns": t, "t_end_ns": t + 5_000_000,
                         "window": "warmup" if step < 2 else "measured"})
            t += 5_000_000
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), rd.events_file(0))
    return rd


def test_the_step_time_outside_forward_backward_and_optimizer_is_read_from_the_events(tmp_path) -> None:
    run = read_measured_run(_write_phased_run(tmp_path, _cfg("phased"), fixed_s=0.007).path)
    assert run.fixed_time_s == pytest.approx(0.007, abs=1e-6)
    # a pipeline stage waits for the others outside its own spans (the model's bubble): not read
    assert read_measured_run(_write_phased_run(tmp_path, _cfg("pp", 2, pp=2), 0.007).path).fixed_time_s is None
    # a trainer that records no optimizer span cannot say
    assert read_measured_run(_write_phased_run(tmp_path, _cfg("noopt"), 0.007, optimizer=False).path).fixed_time_s is None
    # an optimizer timed outside the step's span is not inside it: the step's own time cannot be split
    after = _write_phased_run(tmp_path, _cfg("after"), 0.007, optimizer_after=True)
    assert read_measured_run(after.path).fixed_time_s is None


def test_calibration_uses_the_measured_step_fixed_time_instead_of_the_base_profiles(tmp_path) -> None:
    runs = [read_measured_run(_write_phased_run(tmp_path, _cfg(f"r{i}"), fixed_s=f).path)
            for i, f in enumerate((0.004, 0.006, 0.020))]
    base = load_calibration("default")
    prof = fit_calibration(runs, name="m", base=base, allow_pinned=True)  # synthetic spans: the fit may pin
    assert prof.coefficients.step_overhead_s == pytest.approx(0.006, abs=1e-6)  # the median, not the mean
    rec = prof.error["measured"]["step_overhead_s"]
    assert rec["runs"] == 3 and rec["base_value"] == base.coefficients_for(runs[0].case.engine).step_overhead_s
    assert "step_overhead_s" not in prof.error["fitted"]
    # named in --params, it is fitted (from the base value) and not measured
    named = fit_calibration(runs, name="n", base=base, params=["gemm_eff", "step_overhead_s"], allow_pinned=True)
    assert "measured" not in named.error and "step_overhead_s" in named.error["fitted"]


def test_cpu_default_fits_per_layer_time_only_where_the_runs_vary_tokens_per_micro_batch(measured) -> None:
    root, truth = measured
    same = fit_calibration(collect_runs([root / n for n in ("dp1", "dp2", "tp2")]), name="same")
    assert same.error["fitted"] == ["gemm_eff_fp32", "comm_latency_scale"]
    assert "another micro-batch size" in same.error["not_fitted"]["layer_overhead_s"]
    varied = fit_calibration(collect_runs([root / n for n in ("dp1", "dp2", "tp2", "dp1-mb4")]), name="varied")
    assert varied.error["fitted"] == ["gemm_eff_fp32", "comm_latency_scale", "layer_overhead_s"]
    assert varied.coefficients.layer_overhead_s == pytest.approx(TRUTH.coefficients.layer_overhead_s, rel=0.5)
    for name in ("pp2", "dp2-full", "tp2-sp"):
        assert predict(LAYOUTS[name], varied).metrics["step_time_mean_s"] == pytest.approx(truth[name], rel=0.20), name


def test_cpu_default_leaves_gloo_latency_alone_without_per_layer_collectives(measured) -> None:
    root, _ = measured
    # DDP and a pipeline only: their few collectives do not pin the latency scale (a real sweep ran it to its bound)
    prof = fit_calibration(collect_runs([root / n for n in ("dp1", "dp2", "pp2", "dp1-mb4")]), name="ddp-pp")
    assert "comm_latency_scale" not in prof.error["fitted"]
    assert "per-layer collectives" in prof.error["not_fitted"]["comm_latency_scale"]
    assert prof.error["fitted"] == ["gemm_eff_fp32", "layer_overhead_s"]
