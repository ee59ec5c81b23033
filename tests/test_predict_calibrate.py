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
from powertrain.predict import (
    collect_runs,
    fit_profile,
    load_profile,
    predict,
    read_measured_run,
    write_prediction,
)
from powertrain.predict.case import case_from_run_config
from powertrain.predict.profile import Profile
from powertrain.schema import EVENTS_SCHEMA
from powertrain.spec.run import RunConfig
from powertrain.store import RunDir

TRUTH = Profile(name="truth").with_coefficients(gemm_eff_fp32=0.22, layer_overhead_s=0.004, comm_eff_intra=0.3)


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
    rd.write({"kind": "run", "status": "ok", "name": cfg.name, "config": cfg.model_dump(mode="json")})
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
        truth[name] = predict(case_from_run_config(cfg), TRUTH).metrics["step_time_mean_s"]
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
    prof = fit_profile(train, name="cpu-test")
    assert prof.error["step_time_mape"] < prof.error["step_time_mape_before"]
    assert prof.error["step_time_mape"] < 0.05
    for name in ("pp2", "dp1-mb4", "dp2-full", "tp2-sp"):
        got = predict(case_from_run_config(LAYOUTS[name]), prof).metrics["step_time_mean_s"]
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
    assert load_profile("cpu-x").error["n_runs"] == 3
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
    import os
    from dataclasses import replace

    from powertrain.hardware import get_device
    from powertrain.predict.profile import Coefficients
    from powertrain.predict.steptime import step_time

    one, two = case_from_run_config(LAYOUTS["dp1"]), case_from_run_config(LAYOUTS["dp2"])
    # two ranks share the all-core matmul rate; each keeps the (one-thread) copy bandwidth while
    # there are cores for both
    assert two.device.peak("fp32") == pytest.approx(one.device.peak("fp32") / 2)
    assert two.device.memory_bw == pytest.approx(one.device.memory_bw * min(1.0, (os.cpu_count() or 1) / 2))
    c = Coefficients()
    tp, sp = case_from_run_config(LAYOUTS["tp2"]), case_from_run_config(LAYOUTS["tp2-sp"])
    # SP's all-gather + reduce-scatter move what one all-reduce moves, but on gloo each call pays a
    # rendezvous: twice the calls cost more; on a GPU link (NCCL) the two are the same
    assert step_time(sp, c).breakdown["tp_comm_exposed_s"] > step_time(tp, c).breakdown["tp_comm_exposed_s"]
    gpu = get_device("h100-sxm")
    assert step_time(replace(sp, device=gpu), c).breakdown["tp_comm_exposed_s"] == pytest.approx(
        step_time(replace(tp, device=gpu), c).breakdown["tp_comm_exposed_s"])
